"""A pass that fails in a run, from the command line: an optional pass is left out (the model
completes, and says which chain it got and which pass failed and why; -v shows the
traceback); a required pass fails the model; the captured graphs are kept either way.
Each is a run (seconds): one is in the quick suite, the others are slow; test_manager.py
holds the same rules in quick tests of the manager alone."""

import dataclasses
import json
import textwrap

import pytest
from click.testing import CliRunner

import aotpipe.passes as passes
from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.replay import replay

PIPELINE = textwrap.dedent("""\
    version: 1
    name: p
    defaults: {{graphs: [inference], passes: {passes}}}
    models:
      - {{name: cnn, source: "aotpipe.zoo:small_cnn", args: {{channels: 4}}, inputs: [{{shape: [1, 3, 8, 8]}}]}}
    """)
README_CHAIN = "[freeze, fold_conv_bn, channels_last, reinplace]"


def _planted(monkeypatch, name):
    """Pass `name` made to raise, with a marker its traceback shows."""
    def planted_failure(g, options):
        raise RuntimeError(f"planted in {name}")
    monkeypatch.setitem(passes.PASSES, name, dataclasses.replace(passes.PASSES[name], fn=planted_failure))


def _run(tmp_path, chain, *extra):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(passes=chain))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(path), "-o", str(out), "--executor", "local",
                                                  "--no-progress", "--no-sign", *extra])
    return r, out / "p" / "cnn"


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_an_optional_pass_that_fails_is_left_out_and_the_model_completes(monkeypatch, tmp_path):
    _planted(monkeypatch, "channels_last")
    r, folder = _run(tmp_path, README_CHAIN, "-v")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ok      cnn ") and "inference.freeze+fold_conv_bn+reinplace(" in lines[0]
    assert lines[1].split(None, 1)[1] == (
        "pass 'channels_last' (passes before it: freeze, fold_conv_bn) failed: RuntimeError: planted in "
        "channels_last; left out: the inference graph got inference.freeze+fold_conv_bn+reinplace")
    # -v: the pass's own traceback, down to the line that raised
    assert "Traceback (most recent call last)" in r.stderr and 'raise RuntimeError(f"planted in {name}")' in r.stderr
    manifest = _manifest(folder)
    assert manifest["pass_failures"] == []
    assert manifest["skipped_passes"] == [{
        "graph": "inference", "name": "channels_last", "left_out": [], "chain": "freeze+fold_conv_bn+reinplace",
        "error": "pass 'channels_last' (passes before it: freeze, fold_conv_bn) failed: RuntimeError: planted in "
                 "channels_last"}]
    assert [p["name"] for p in manifest["graphs"]["inference.freeze+fold_conv_bn+reinplace"]["passes"]] == [
        "freeze", "fold_conv_bn", "reinplace"]
    run = json.loads((folder.parent / "run.json").read_text())
    (model,) = run["models"]
    assert model["status"] == "ok" and model["skipped_passes"] == manifest["skipped_passes"]
    assert list(model["passes"]) == ["inference.freeze+fold_conv_bn+reinplace"]
    results = replay(load(folder))  # the captured graph and the chain's, from their files
    assert {x.kind: x.status for x in results} == {"inference": "match",
                                                   "inference.freeze+fold_conv_bn+reinplace": "match"}
    assert CliRunner().invoke(main, ["ls", str(folder.parent)]).output.split()[1] == "verified"


@pytest.mark.slow
def test_without_verbose_the_left_out_pass_has_no_traceback_and_a_rerun_keeps_saying_it(monkeypatch, tmp_path):
    _planted(monkeypatch, "reinplace")
    r, folder = _run(tmp_path, "[freeze, reinplace]")
    assert r.exit_code == 0, r.output
    said = "failed: RuntimeError: planted in reinplace; left out: the inference graph got inference.freeze"
    assert said in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    again, _ = _run(tmp_path, "[freeze, reinplace]")  # up to date: kept, and still says what it got without
    assert again.exit_code == 0 and again.stdout.startswith("kept    cnn ") and said in again.stdout, again.output


@pytest.mark.slow
def test_the_passes_that_need_a_failed_pass_are_left_out_with_it(monkeypatch, tmp_path):
    _planted(monkeypatch, "freeze")
    r, folder = _run(tmp_path, README_CHAIN)
    assert r.exit_code == 0, r.output
    assert "left out (and fold_conv_bn, channels_last, which need it): the inference graph got inference.reinplace" \
        in r.stdout
    (skipped,) = _manifest(folder)["skipped_passes"]
    assert (skipped["name"], skipped["left_out"], skipped["chain"]) == ("freeze", ["fold_conv_bn", "channels_last"],
                                                                       "reinplace")


@pytest.mark.slow
def test_when_every_pass_fails_only_the_captured_graphs_are_written(monkeypatch, tmp_path):
    _planted(monkeypatch, "reinplace")
    r, folder = _run(tmp_path, "[reinplace]")
    assert r.exit_code == 0, r.output
    assert "left out: the inference graph got no pass" in r.stdout
    manifest = _manifest(folder)
    assert list(manifest["graphs"]) == ["inference"] and manifest["skipped_passes"][0]["chain"] is None
    assert [x.status for x in replay(load(folder))] == ["match"]


@pytest.mark.slow
def test_a_required_pass_that_fails_fails_the_model_and_keeps_the_captured_graphs(monkeypatch, tmp_path):
    assert not passes.PASSES["to_device"].optional
    _planted(monkeypatch, "to_device")
    r, folder = _run(tmp_path, "[freeze, to_device]", "-v")
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines()[0] == (
        "FAILED  cnn                      passes: inference graph: pass 'to_device' (passes before it: freeze) "
        "failed: RuntimeError: planted in to_device")
    assert 'raise RuntimeError(f"planted in {name}")' in r.stderr
    manifest = _manifest(folder)
    assert list(manifest["graphs"]) == ["inference"] and "skipped_passes" not in manifest
    assert "planted in to_device" in manifest["pass_failures"][0]
    assert [x.status for x in replay(load(folder))] == ["match"]
