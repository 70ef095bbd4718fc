"""Hostile or malformed artefacts: refused with an ArtifactError, and nothing of theirs runs."""

import json
import os
import re
import textwrap

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import replay, replay_chain



def _edit_graph(folder, fn, graph="mlp_inference_0"):
    path = folder / graph / "graph.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _first_call(data):
    return next(n for n in data["nodes"] if n["op"] == "call_function")


def test_code_in_a_kwarg_name_is_refused(mlp_copy, tmp_path):
    marker = tmp_path / "rce.txt"
    key = f"dims=__import__('os').system('touch {marker}') and None or [1, 0], _"
    _edit_graph(mlp_copy, lambda d: _first_call(d).__setitem__("kwargs", {key: 0}))
    with pytest.raises(ArtifactError, match="is not an argument of"):
        replay(mlp_copy)
    assert not marker.exists()


def test_ops_that_reach_files_are_refused(mlp_copy, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")

    def add_from_file(d):
        d["nodes"].insert(1, {"name": "ff", "op": "call_function", "target": "aten.from_file.default",
                              "args": [str(victim), True, 8], "kwargs": {}})

    _edit_graph(mlp_copy, add_from_file)
    with pytest.raises(ArtifactError, match="aten.from_file.default.*not allowed"):
        aotpipe.load(mlp_copy)
    assert victim.read_text() == "original"


def test_replay_never_calls_a_source_the_manifest_names(mlp_copy, tmp_path):
    marker = tmp_path / "pwned.txt"
    m = json.loads((mlp_copy / "manifest.json").read_text())
    m["model"]["source"] = "os:system"
    m["model"]["args"] = {"command": f"touch {marker}"}
    (mlp_copy / "manifest.json").write_bytes(seal(m))
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--chain", "--bench", "2"])
    assert r.exit_code == 0, r.output
    assert not marker.exists()
    assert replay_chain(mlp_copy).max_abs_error_vs_eager is None  # no eager comparison without the source


MALFORMED = {
    "node ref not a name": lambda d: _first_call(d).__setitem__("args", [{"node": []}]),
    "tuple not a list": lambda d: _first_call(d).__setitem__("args", [{"tuple": 5}]),
    "slice of four": lambda d: _first_call(d).__setitem__("args", [{"slice": [1, 2, 3, 4]}]),
    "empty complex": lambda d: _first_call(d).__setitem__("args", [{"complex": []}]),
    "kwargs a list": lambda d: _first_call(d).__setitem__("kwargs", [1, 2]),
    "args an int": lambda d: _first_call(d).__setitem__("args", 5),
    "output args an int": lambda d: d["nodes"][-1].__setitem__("args", 3),
    "nodes not a list": lambda d: d.__setitem__("nodes", {"a": 1}),
    "get_attr named forward": lambda d: d["nodes"].insert(0, {"name": "forward", "op": "get_attr",
                                                              "target": "forward", "blob": "0" * 64}),
    "unknown dtype": lambda d: _first_call(d).__setitem__("kwargs", {"dtype": {"dtype": "Tensor"}}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_graph_json_is_an_artifact_error(mlp_copy, case):
    _edit_graph(mlp_copy, MALFORMED[case])
    with pytest.raises(ArtifactError):
        replay(mlp_copy)
    r = CliRunner().invoke(main, ["show", str(mlp_copy)])
    assert r.exit_code == 2 and "Traceback" not in r.output and r.output.startswith("error: ")


@pytest.mark.parametrize("case", ["storage index", "inputs not a list", "outputs missing"])
def test_malformed_inputs_json_is_an_artifact_error(mlp_copy, case):
    path = mlp_copy / "mlp_forward_0" / "inputs.json"
    rec = json.loads(path.read_text())
    if case == "storage index":
        rec["inputs"][0]["storage"] = -1
    elif case == "inputs not a list":
        rec["inputs"] = 7
    else:
        del rec["outputs"]
    path.write_text(json.dumps(rec))
    with pytest.raises(ArtifactError):
        replay(mlp_copy)


def test_a_record_linked_to_a_device_is_refused(mlp_copy):
    target = mlp_copy / "mlp_inference_0" / "inputs.json"
    target.unlink()
    os.symlink("/dev/zero", target)
    with pytest.raises(ArtifactError, match="not a regular file"):
        aotpipe.load(mlp_copy)
    r = CliRunner().invoke(main, ["verify", str(mlp_copy)])
    assert r.exit_code == 1 and "not a regular file" in r.output


def test_nan_in_a_manifest_is_reported_not_raised(mlp_copy):
    original = (mlp_copy / "manifest.json").read_text()
    text = re.sub(r'"format_version": (\d+)', r'"format_version": \1, "x": NaN', original, count=1)
    assert text != original  # the NaN is really planted
    (mlp_copy / "manifest.json").write_text(text)
    r = CliRunner().invoke(main, ["verify", str(mlp_copy)])
    assert r.exit_code == 1 and "checksum does not match" in r.output and "Traceback" not in r.output


def test_model_that_mutates_its_input_verifies_and_copies_back(tmp_path):
    (tmp_path / "mut.py").write_text(textwrap.dedent("""
        import torch
        class Mut(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
            def forward(self, x):
                x.add_(1)
                return self.lin(x)
        def mut():
            return Mut()
    """))
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: m
        models: [{name: mut, source: mut:mut, inputs: [{shape: [2, 3]}], graphs: [inference]}]
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    (res,) = replay(tmp_path / "out" / "m" / "mut")
    assert res.status == "match" and res.mutated == ["x"]


def test_a_failed_optional_pass_is_recorded_kept_on_a_rerun_and_redone_with_force(tmp_path, monkeypatch):
    import dataclasses

    import aotpipe.passes as passes

    def broken(g, options):
        raise RuntimeError("simulated pass bug")

    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent("""
        version: 1
        name: fp
        defaults: {passes: [remove_noops]}
        models: [{name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 4}, inputs: [{shape: [2, 4]}]}]
    """))
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setitem(passes.PASSES, "remove_noops", dataclasses.replace(passes.PASSES["remove_noops"], fn=broken))
        r = CliRunner().invoke(main, ["run", str(p), "-o", str(out), "--no-progress", "--json",
                                      "--executor", "local"])  # patched in this process
        assert r.exit_code == 0, r.output  # an optional pass: the model is ok without it
    manifest = json.loads((out / "fp" / "mlp" / "manifest.json").read_text())
    (left,) = manifest["skipped_passes"]
    assert left["name"] == "remove_noops" and "simulated pass bug" in left["error"] and not manifest.get("pass_failures")
    assert not any("remove_noops" in key for key in manifest["graphs"])  # no graph claims the pass
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(out), "--no-progress", "--json"])
    run = json.loads(r.output)
    assert r.exit_code == 0 and run["models"][0]["skipped"] is True  # kept, and still says what it lacks
    assert run["models"][0]["skipped_passes"][0]["name"] == "remove_noops"
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(out), "--no-progress", "--json", "--force"])
    run = json.loads(r.output)
    assert r.exit_code == 0 and run["models"][0]["skipped"] is False and not run["models"][0]["skipped_passes"]
    assert any("remove_noops" in key for key in json.loads((out / "fp" / "mlp" / "manifest.json").read_text())["graphs"])


def test_chain_of_graphs_that_do_not_run_is_an_error_result_not_a_traceback(mlp_copy):
    # A backward whose first op gets an argument of the wrong type: it loads, and fails when run.
    def edit(d):
        node = _first_call(d)
        node["target"], node["args"] = "aten.mean.dim", [node["args"][0], {"node": node["args"][0]["node"]}]
        node["kwargs"] = {}
    _edit_graph(mlp_copy, edit, graph="mlp_backward_0")
    chain = replay_chain(mlp_copy)
    assert chain.status == "error" and chain.problems[0].startswith("the graphs do not run: ")
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--graph", "inference", "--chain"])
    assert r.exit_code == 1 and "Traceback" not in r.output and "the graphs do not run" in r.output, r.output
