"""A pass chain has one form from the YAML to the pass manager: typed steps (spec.PassStep),
parsed once by the config, written as {"name", "options"} in the manifest and fingerprint."""

from __future__ import annotations

import json
import textwrap

from aotpipe.passes.options import ChannelsLastOptions, FreezeOptions
from aotpipe.pipeline import config
from aotpipe.pipeline.incremental import model_fingerprint
from aotpipe.spec import PassStep

YAML = textwrap.dedent("""
    version: 1
    name: chains
    defaults: {passes: [freeze, {channels_last: {activations: true}}]}
    models:
      - {name: a, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 32]}]}
      - {name: b, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 32]}]}
      - {name: c, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 32]}]}
      - {name: d, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 32]}], passes: [reinplace]}
""")


def test_each_entry_of_the_yaml_is_parsed_once_however_many_models_inherit_it(monkeypatch):
    parsed = []
    real = config.parse_pass_entry

    def counting(entry):
        parsed.append(entry)
        return real(entry)

    monkeypatch.setattr(config, "parse_pass_entry", counting)
    pipeline = config.parse_pipeline(YAML, "p.yaml", check_sources=False)
    assert parsed == ["freeze", {"channels_last": {"activations": True}}, "reinplace"]
    a, b, c, d = pipeline.models
    assert a.passes == b.passes == c.passes == [
        PassStep("freeze", FreezeOptions()), PassStep("channels_last", ChannelsLastOptions(activations=True))]
    assert a.passes[0] is b.passes[0]  # the one parsed step, shared: not parsed again per model
    assert [s.name for s in d.passes] == ["reinplace"]


def test_the_chain_is_written_as_before_in_the_manifest_form():
    (a, *_) = config.parse_pipeline(YAML, "p.yaml", check_sources=False).models
    written = a.to_json()["passes"]
    assert written == [{"name": "freeze", "options": {"fold": True, "cse": True, "graphs": ["inference"]}},
                       {"name": "channels_last", "options": {"activations": True, "graphs": ["inference"]}}]
    assert json.dumps(written) == ('[{"name": "freeze", "options": {"fold": true, "cse": true, "graphs": ["inference"]}}, '
                                   '{"name": "channels_last", "options": {"activations": true, "graphs": ["inference"]}}]')


def test_the_fingerprint_sees_the_chain():
    a, _, _, d = config.parse_pipeline(YAML, "p.yaml", check_sources=False).models
    assert model_fingerprint(a) != model_fingerprint(a.model_copy(update={"passes": d.passes}))
