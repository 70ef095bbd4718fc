"""The eager reference takes the branch a trace takes where a library decides by values.

transformers skips building the causal mask in eager for an all-ones attention mask; a
trace always builds it. For attention modules with is_causal=False (Aimv2's text tower) the
two compute different functions, and the check compared nothing meaningful.
"""

from __future__ import annotations

import pytest
import torch

from aotpipe.models.eager import CAUSAL_MASK_NOTE, EagerReference

transformers = pytest.importorskip("transformers")


def _aimv2():
    cfg = transformers.Aimv2Config(
        text_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1,
                         vocab_size=100, eos_token_id=99),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1,
                           image_size=28, patch_size=14))
    torch.manual_seed(0)
    model = transformers.Aimv2Model(cfg).eval()
    kwargs = dict(input_ids=torch.randint(0, 99, (2, 8)), attention_mask=torch.ones(2, 8, dtype=torch.int64),
                  pixel_values=torch.randn(2, 3, 28, 28))
    return model, kwargs


def test_eager_reference_builds_the_causal_mask_as_the_exported_graph_does():
    model, kwargs = _aimv2()
    traced = torch.export.export(model, (), kwargs, strict=False).module()
    with torch.no_grad():
        graph_out = traced(**kwargs)
        plain_eager = model(**kwargs)
    ref = EagerReference(model, (), kwargs)
    run = ref.run("inference")
    assert run is not None
    text = graph_out.text_embeds
    # Plain eager (the shortcut) computes another function; the reference computes the graph's.
    assert (plain_eager.text_embeds - text).abs().max() > 1e-3
    ref_text = next(t for t in run.outputs if t.shape == text.shape and torch.allclose(t, text, atol=1e-5))
    torch.testing.assert_close(ref_text, text)
    assert ref.notes == [CAUSAL_MASK_NOTE]
    # and the library is left as it was
    assert transformers.masking_utils._ignore_causal_mask_sdpa.__name__ == "_ignore_causal_mask_sdpa"


class DrawsAndDiscards(torch.nn.Module):
    """Draws random numbers it never uses (as BigBird does, building a module inside forward),
    then drops out: the forward graph must draw them too, or its dropout mask is another."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        torch.empty(32).uniform_()  # discarded
        return torch.nn.functional.dropout(self.fc(x), 0.5, training=self.training)


def test_the_forward_graph_keeps_the_random_draws_the_model_discards(tmp_path, monkeypatch):
    import json
    import sys
    import textwrap

    from click.testing import CliRunner

    from aotpipe.cli import main

    monkeypatch.setitem(sys.modules, "draws_model", sys.modules[__name__])
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: d
        models:
          - {name: m, source: "draws_model:DrawsAndDiscards", inputs: [{shape: [4, 16]}]}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    (m,) = json.loads(r.stdout)["models"]
    assert m["status"] == "ok" and m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m
    assert any("random draw(s) the model makes but never uses" in n for n in m["notes"]), m["notes"]
    fw = json.loads((tmp_path / "out" / "d" / "m" / "m_forward_0" / "graph.json").read_text())
    assert sum(n.get("target") == "aten.uniform.default" for n in fw["nodes"]) == 1
