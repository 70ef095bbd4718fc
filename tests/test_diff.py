"""aotpipe diff: each test plants the change the diff exists to find and asserts where it is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.blobs import BlobStore
from aotpipe.cli import main
from tests.helpers.forge import reseal
from tests.helpers.pipelines import run_yaml

DATA = Path(__file__).parent / "data"


def diff(*args: str):
    result = CliRunner().invoke(main, ["diff", *args])
    return result


def diff_json(*args: str):
    result = diff(*args, "--json")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


def found(data, section, where=None):
    return [d for d in data["differences"] if d["section"] == section and (where is None or d["where"] == where)]


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


@pytest.fixture()
def two_mlps(quickstart_run, tmp_path):
    root, _ = quickstart_run
    a, b = tmp_path / "a" / "mlp", tmp_path / "b" / "mlp"
    shutil.copytree(root / "mlp", a)
    shutil.copytree(root / "mlp", b)
    return a, b


def test_identical_artefacts_are_the_same_and_exit_0(two_mlps):
    a, b = two_mlps
    code, data = diff_json(str(a), str(b))
    assert code == 0 and data["same"] and data["differences"] == []
    # the values were compared, graph by graph, and nothing diverged
    assert {"inference", "forward", "backward", "joint"} <= set(data["first_divergence"])
    assert not any(data["first_divergence"].values())
    text = diff(str(a), str(b)).output
    assert "same artefacts" in text and "no aligned node diverged" in text


def test_a_changed_op_is_named_at_its_node(two_mlps):
    a, b = two_mlps
    graph = b / "mlp_forward_0" / "graph.json"

    def swap(data):
        node = next(n for n in data["nodes"] if n.get("target") == "aten.relu.default")
        node["target"] = "aten.sigmoid.default"

    edit_json(graph, swap)
    reseal(b)
    code, data = diff_json(str(a), str(b))
    assert code == 1
    nodes = found(data, "nodes", "forward")
    assert len(nodes) == 1, nodes
    assert nodes[0]["a"] == "relu" and nodes[0]["a_target"] == "aten.relu.default"
    assert nodes[0]["b_target"] == "aten.sigmoid.default"
    assert "module (the model) MLP, aotpipe/models/zoo.py:28" in nodes[0]["text"]  # where it came from
    ops = {d["op"]: (d["a"], d["b"]) for d in found(data, "ops", "forward")}
    assert ops == {"aten.relu.default": (2, 1), "aten.sigmoid.default": (0, 1)}
    # no other graph changed, and the values diverge first at that very node (the backward
    # too: its saved activations come from the changed forward)
    assert {d["where"] for d in data["differences"] if d["section"] != "values"} == {"forward"}
    assert data["first_divergence"]["forward"] == "relu"
    assert data["first_divergence"]["inference"] is None and data["first_divergence"]["joint"] is None


def test_a_changed_weight_is_named_by_digest_and_where_values_first_diverge(two_mlps):
    a, b = two_mlps
    inputs = json.loads((b / "mlp_forward_0" / "inputs.json").read_text())
    weight = next(i for i in inputs["inputs"] if i.get("target") == "layers.1.weight")
    old = inputs["storages"][weight["storage"]]["blob"]
    store = BlobStore(b)
    value = store.get(old).clone()
    value[0] += 0.5
    new = store.put(value)
    for p in b.rglob("*.json"):
        if p.name != "manifest.json":
            p.write_text(p.read_text().replace(old, new))
    reseal(b)
    code, data = diff_json(str(a), str(b))
    assert code == 1
    weights = found(data, "weights")
    assert [(w["name"], w["a"], w["b"]) for w in weights if w["name"].startswith("param")] == \
        [("param layers.1.weight", old, new)]
    assert f"param layers.1.weight: {old[:12]} -> {new[:12]}" in diff(str(a), str(b)).output
    # The forward's first node to read that weight is the first that diverges.
    graph = json.loads((b / "mlp_forward_0" / "graph.json").read_text())
    placeholder = graph["nodes"][weight["index"]]["name"]
    reader = next(n["name"] for n in graph["nodes"] if n["op"] == "call_function"
                  and {"node": placeholder} in n["args"])
    assert data["first_divergence"]["forward"] == reader
    line = next(d for d in found(data, "values", "forward"))
    assert line["a_node"] == reader and "module layers.1 Linear" in line["text"]
    assert data["first_divergence"]["inference"] is not None  # the weight is read there too


def test_diff_without_values_runs_no_graph(two_mlps, monkeypatch):
    a, b = two_mlps
    import aotpipe.corpus.diff.values as values

    monkeypatch.setattr(values, "compare_values", lambda *a, **k: pytest.fail("a graph ran"))
    code, data = diff_json(str(a), str(b), "--no-values")
    assert code == 0 and data["first_divergence"] == {}
    assert "values not compared (--no-values)" in data["notes"]


def test_older_format_artefacts_diff_and_their_values_compare(tmp_path):
    for version in ("format_v1", "format_v2"):
        src = DATA / version / "mlp"
        code, data = diff_json(str(src), str(src))
        assert code == 0, data
        assert data["first_divergence"] and not any(data["first_divergence"].values())


def test_a_torch_version_change_is_named_once_for_all_models(quickstart_run, tmp_path):
    root, _ = quickstart_run
    b = tmp_path / "b" / "quickstart"
    shutil.copytree(root, b)
    models = [p.parent for p in b.glob("*/manifest.json")]

    def older(m):
        m["versions"]["torch"] = "2.12.0+cpu"
        m["environment"]["torch"] = "2.12.0+cpu"

    for model in models:
        edit_json(model / "manifest.json", older)
        reseal(model, digests=False)
    edit_json(b / "run.json", lambda r: r["versions"].update(torch="2.12.0+cpu"))
    code, data = diff_json(str(root), str(b))
    assert code == 1
    env = found(data, "environment")
    texts = sorted(d["text"] for d in env)
    assert texts == ["environment.torch 2.13.0+cpu -> 2.12.0+cpu", "versions.torch 2.13.0+cpu -> 2.12.0+cpu",
                     "versions.torch 2.13.0+cpu -> 2.12.0+cpu"]
    per_model = [d for d in env if d.get("models")]
    assert all(sorted(d["models"]) == sorted(m.name for m in models) for d in per_model)
    assert {d["section"] for d in data["differences"]} == {"environment"}


def test_a_flipped_status_and_a_missing_model_in_a_tree(quickstart_run, tmp_path):
    root, _ = quickstart_run
    b = tmp_path / "b" / "quickstart"
    shutil.copytree(root, b)

    def flip(run):
        cnn = next(m for m in run["models"] if m["name"] == "small_cnn")
        cnn.update(status="failed", error="capture: planted failure\nsecond line")
        run["models"] = [m for m in run["models"] if m["name"] != "running_norm"]

    edit_json(b / "run.json", flip)
    code, data = diff_json(str(root), str(b))
    assert code == 1
    status = found(data, "status")
    assert [(d["where"], d["a"], d["b"]) for d in status] == [("small_cnn", "ok", "failed")]
    assert status[0]["text"] == "ok -> failed: capture: planted failure"
    assert [(d["where"], d["change"]) for d in found(data, "models")] == [("running_norm", "missing")]
    code, back = diff_json(str(b), str(root))
    assert [(d["where"], d["a"], d["b"]) for d in found(back, "status")] == [("small_cnn", "failed", "ok")]
    assert [(d["where"], d["change"]) for d in found(back, "models")] == [("running_norm", "new")]


def test_identical_trees_exit_0_and_time_counts_only_beyond_the_threshold(quickstart_run, tmp_path):
    root, _ = quickstart_run
    b = tmp_path / "b" / "quickstart"
    shutil.copytree(root, b)
    assert diff(str(root), str(b)).exit_code == 0

    def slower(run):
        m = run["models"][0]
        m["total_seconds"] = m["total_seconds"] * 1.4 + 1  # within 1.5x? depends on its size
        run["models"][1]["total_seconds"] = run["models"][1]["total_seconds"] * 3 + 2

    edit_json(b / "run.json", slower)
    code, data = diff_json(str(root), str(b))
    times = found(data, "time")
    run_a = json.loads((root / "run.json").read_text())
    assert run_a["models"][1]["name"] in {d["where"] for d in times}
    assert code == 1
    code, data = diff_json(str(root), str(b), "--threshold", "10")
    assert code == 0 and not found(data, "time")


def test_an_output_folder_holding_one_tree_is_that_tree(quickstart_run):
    root, _ = quickstart_run
    assert diff(str(root.parent), str(root)).exit_code == 0


@pytest.mark.parametrize("case", ["missing", "file", "empty", "mixed"])
def test_bad_input_exits_2_with_one_line(quickstart_run, tmp_path, case):
    root, _ = quickstart_run
    a = str(root / "mlp")
    if case == "missing":
        b, expect = str(tmp_path / "nope"), "no such file or folder"
    elif case == "file":
        (tmp_path / "f.txt").write_text("x")
        b, expect = str(tmp_path / "f.txt"), "a file, not a folder"
    elif case == "empty":
        b, expect = str(tmp_path), "neither an artefact (no manifest.json) nor an output tree (no run.json)"
    else:
        b, expect = str(root), "A is an artefact"
    result = diff(a, b)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
    assert "Traceback" not in result.output


def test_values_skip_with_a_reason_where_the_sandbox_cannot_start(two_mlps, monkeypatch):
    a, b = two_mlps
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")
    import aotpipe.trust.sandbox.launch as launch
    from aotpipe.errors import SandboxUnavailable

    def unavailable(*args, **kwargs):
        raise SandboxUnavailable("bwrap not found")

    monkeypatch.setattr(launch, "find_bwrap", unavailable)
    code, data = diff_json(str(a), str(b))
    assert code == 0 and data["first_divergence"] == {}
    assert any("values not compared: running the graphs needs the sandbox" in n and "bwrap not found" in n
               for n in data["notes"])


def run_mlp(where: Path, **fields):
    where.mkdir(parents=True)
    return run_yaml(where, MLP_PIPELINE.format(**fields))


MLP_PIPELINE = """
version: 1
name: one
seed: {seed}
defaults:
  mode: export
  graphs: [inference, forward, backward, joint]
  passes: {passes}
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {{in_features: 16, hidden: 32, depth: 2}}
    inputs: [{{shape: [4, 16], dtype: float32}}]
"""


@pytest.mark.slow
def test_two_seeds_differ_in_weights_inputs_and_values(tmp_path):
    r0, out0 = run_mlp(tmp_path / "s0", seed=0, passes="[freeze]")
    r1, out1 = run_mlp(tmp_path / "s1", seed=1, passes="[freeze]")
    assert r0.exit_code == 0 and r1.exit_code == 0, (r0.output, r1.output)
    code, data = diff_json(str(out0 / "one" / "mlp"), str(out1 / "one" / "mlp"))
    assert code == 1
    assert [d["text"] for d in found(data, "options")] == ["model.seed 0 -> 1"]
    assert {d["name"] for d in found(data, "weights")} >= {"param layers.0.weight", "param head.bias"}
    assert not found(data, "nodes") and not found(data, "ops")  # the same graphs, other numbers
    assert data["first_divergence"]["forward"] is not None
    code, tree = diff_json(str(out0), str(out1))
    assert code == 1 and any(d["text"] == "model.seed 0 -> 1" for d in found(tree, "options"))


@pytest.mark.slow
def test_two_pass_chains_differ_in_graphs_and_pass_logs(tmp_path):
    r0, out0 = run_mlp(tmp_path / "p0", seed=0, passes="[freeze]")
    r1, out1 = run_mlp(tmp_path / "p1", seed=0, passes="[freeze, reinplace]")
    assert r0.exit_code == 0 and r1.exit_code == 0, (r0.output, r1.output)
    code, data = diff_json(str(out0), str(out1))
    assert code == 1
    graphs = {(d["where"], d["text"]) for d in found(data, "graphs")}
    assert graphs == {("mlp/inference.freeze", "only in A"), ("mlp/inference.freeze+reinplace", "only in B")}
    passes = [d["text"] for d in found(data, "passes")]
    assert "pass log only in A: freeze" in passes and "pass log only in B: freeze+reinplace" in passes
    # the captured graphs themselves are the same
    assert not found(data, "nodes") and not found(data, "weights")
