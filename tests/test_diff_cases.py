"""aotpipe diff, case by case, over a tiny pipeline's artefacts: each test plants one change
(an op renamed, added or removed; a graph or a model on one side only; a value just inside or
just outside a bound) and asserts where the diff names it, from the command line where the
user meets it. Where the graphs run (this process or the sandbox) is observed through what
actually ran, whatever decides it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import aotpipe.artifact.load as artifact_load
from aotpipe.artifact.blobs import BlobStore
from aotpipe.cli import main
from aotpipe.corpus.diff import artifacts, trees, values
from aotpipe.corpus.diff.model import Diff, Finding, ValuesComparison
from aotpipe.corpus.diff.paths import diff_paths
from aotpipe.errors import SandboxError, SandboxUnavailable
from aotpipe.format.records import GraphRecord, NodeRecord, Summary
from aotpipe.trust.keyring import own_key
from aotpipe.trust.sandbox import launch
from aotpipe.trust.verify import sign_artifact
from tests.helpers.diff_trees import tiny_tree
from tests.helpers.forge import reseal

GRAPHS = {"inference", "forward", "backward", "inference.freeze"}


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_tree()


@pytest.fixture()
def pair(tiny, tmp_path) -> tuple[Path, Path]:
    """Two copies of the tiny tree (A and B), B to edit."""
    a, b = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    shutil.copytree(tiny, a)
    shutil.copytree(tiny, b)
    return a, b


@pytest.fixture()
def runs(tiny, tmp_path) -> tuple[Path, Path]:
    """Two trees holding only the tiny tree's run.json (A and B), for what run.json alone decides."""
    a, b = tmp_path / "runs-a" / "tiny", tmp_path / "runs-b" / "tiny"
    for tree in (a, b):
        tree.mkdir(parents=True)
        shutil.copy(tiny / "run.json", tree / "run.json")
    return a, b


def cli(*args: str):
    return CliRunner().invoke(main, ["diff", *args])


def cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    r = cli(*args, "--json")
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.output)


def found(data: dict[str, Any], section: str, where: str | None = None) -> list[dict[str, Any]]:
    return [d for d in data["differences"] if d["section"] == section and (where is None or d["where"] == where)]


def texts(data: dict[str, Any], section: str, where: str | None = None) -> list[str]:
    return [d["text"] for d in found(data, section, where)]


def edit_json(path: Path, fn: Callable[[Any], Any]) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def edit_model(model: Path, rel: str, fn: Callable[[Any], Any]) -> None:
    """Edit one JSON file of an artefact and reseal it, as a forger (or a rerun) would."""
    edit_json(model / rel, fn)
    reseal(model)


def node(graph: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in graph["nodes"] if n["name"] == name)


RELU = "relu (aten.relu.default) [module (the model) MLP, aotpipe/models/zoo.py:28]"
CLONE = "clone (aten.clone.default) [module (the model) MLP, aotpipe/models/zoo.py:28]"


# ---------------------------------------------------------------------------------------
# two artefacts: the same


def test_identical_artefacts_are_the_same_exit_0_and_every_graph_ran_alike(pair):
    a, b = pair
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"))
    assert code == 0
    assert data == {"kind": "artifact", "a": str(a / "mlp"), "b": str(b / "mlp"), "same": True,
                    "differences": [], "first_divergence": dict.fromkeys(GRAPHS), "notes": []}
    r = cli(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert r.exit_code == 0
    assert r.output.splitlines() == [f"A: {a / 'mlp'}", f"B: {b / 'mlp'}", "note: values not compared (--no-values)",
                                     "same artefacts"]


# ---------------------------------------------------------------------------------------
# ops and nodes: renamed, added, removed


def test_a_renamed_op_is_named_at_its_node_counted_in_ops_and_is_where_values_diverge(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/graph.json",
               lambda g: node(g, "relu").update(target="aten.sigmoid.default"))
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"))
    assert code == 1
    sigmoid = RELU.replace("aten.relu.default", "aten.sigmoid.default")
    assert found(data, "nodes") == [{
        "section": "nodes", "where": "inference", "text": f"A {RELU} is B {sigmoid}",
        "a": "relu", "b": "relu", "a_target": "aten.relu.default", "b_target": "aten.sigmoid.default"}]
    assert texts(data, "ops") == ["aten.relu.default 1 -> 0 (-1)", "aten.sigmoid.default 0 -> 1 (+1)"]
    assert [(d["op"], d["a"], d["b"]) for d in found(data, "ops")] == [
        ("aten.relu.default", 1, 0), ("aten.sigmoid.default", 0, 1)]
    assert data["first_divergence"] == {**dict.fromkeys(GRAPHS), "inference": "relu"}
    (line,) = found(data, "values")
    assert line["where"] == "inference" and line["a_node"] == "relu" and line["b_node"] == "relu"
    assert line["text"].startswith(f"first diverging node: A {RELU}, B relu: ")
    assert "sum of its sampled elements" in line["why"] and line["compared"] == 3
    assert {d["section"] for d in data["differences"]} == {"nodes", "ops", "values"}


def _add_clone(g: dict[str, Any]) -> None:
    """A copy of relu's value between it and its reader (the values stay the same)."""
    nodes = g["nodes"]
    first = node(g, "relu")
    extra = {**first, "name": "clone", "target": "aten.clone.default", "args": [{"node": "relu"}]}
    nodes.insert(nodes.index(first) + 1, extra)
    node(g, "addmm_1")["args"][1] = {"node": "clone"}


def test_an_added_op_is_named_with_where_it_was_added(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/graph.json", _add_clone)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    extra = CLONE
    assert found(data, "nodes") == [{"section": "nodes", "where": "inference",
                                     "text": f"B has 1 node from {extra} (after A relu, B relu)",
                                     "a": [], "b": ["clone"]}]
    assert texts(data, "ops") == ["aten.clone.default 0 -> 1 (+1)"]


def test_a_removed_op_is_named_on_the_side_that_has_it(pair):
    a, b = pair
    edit_model(a / "mlp", "mlp_inference_0/graph.json", _add_clone)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    assert texts(data, "nodes") == [f"A has 1 node from {CLONE} (after A relu, B relu)"]
    assert found(data, "nodes")[0]["a"] == ["clone"] and found(data, "nodes")[0]["b"] == []
    assert texts(data, "ops") == ["aten.clone.default 1 -> 0 (-1)"]


def test_a_node_whose_arguments_changed_says_how(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/graph.json", lambda g: node(g, "permute").update(args=[
        {"node": "p_layers_0_weight"}, [0, 1]]))
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    (d,) = found(data, "nodes")
    assert d["text"].endswith(': arguments ["%float32[8, 4]", [1, 0]] -> ["%float32[8, 4]", [0, 1]]'), d["text"]
    assert "module layers.0 Linear, aotpipe/models/zoo.py:28" in d["text"]


def test_a_node_whose_value_layout_changed_says_what_it_gives(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/graph.json",
               lambda g: node(g, "relu")["val"].update(dtype="float64"))
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    relu, reader = found(data, "nodes")  # and its reader's argument, replaced with it
    assert relu["text"] == f"A {RELU} is B {RELU}: gives float32[2, 8] -> float64[2, 8]"
    assert reader["a"] == "addmm_1" and '"%float32[2, 8]"' in reader["text"] and '"%float64[2, 8]"' in reader["text"]
    assert data["notes"] == ["values not compared (--no-values)"] and data["first_divergence"] == {}


# ---------------------------------------------------------------------------------------
# graphs on one side only


def _drop_graph(model: Path, key: str) -> None:
    folder = json.loads((model / "manifest.json").read_text())["graphs"][key]["folder"]
    shutil.rmtree(model / folder)

    def drop(m):
        del m["graphs"][key]
        m["files"] = {k: v for k, v in m["files"].items() if not k.startswith(folder + "/")}

    edit_model(model, "manifest.json", drop)


def test_a_graph_present_on_one_side_only_is_named_once_with_its_pass_log(pair):
    a, b = pair
    _drop_graph(b / "mlp", "inference.freeze")
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"))
    assert code == 1
    assert found(data, "graphs") == [{"section": "graphs", "where": "inference.freeze", "text": "only in A",
                                      "graph": "inference.freeze", "side": "a"}]
    assert texts(data, "passes", "inference.freeze") == ["pass log only in A: freeze"]
    # its constants are not weights that differ: the graph is the difference
    assert {d["section"] for d in data["differences"]} == {"graphs", "passes"}
    assert set(data["first_divergence"]) == GRAPHS - {"inference.freeze"}
    code, back = cli_json(str(b / "mlp"), str(a / "mlp"), "--no-values")
    assert [(d["where"], d["text"], d["side"]) for d in found(back, "graphs")] == [
        ("inference.freeze", "only in B", "b")]
    assert texts(back, "passes") == ["pass log only in B: freeze"]


# ---------------------------------------------------------------------------------------
# weights


def _swap_blob(model: Path, old: str, new: str) -> None:
    for p in model.rglob("*.json"):
        if p.name != "manifest.json":
            p.write_text(p.read_text().replace(old, new))
    reseal(model)


def _blob_of(model: Path, target: str) -> str:
    inputs = json.loads((model / "mlp_forward_0" / "inputs.json").read_text())
    entry = next(i for i in inputs["inputs"] if i.get("target") == target)
    return inputs["storages"][entry["storage"]]["blob"]


def test_a_changed_weight_is_named_by_digest_and_its_first_reader_diverges(pair):
    a, b = pair
    old = _blob_of(b / "mlp", "layers.0.weight")
    store = BlobStore(b / "mlp")
    value = store.get(old).clone()
    value[0] += 1.0  # blobs hold flat storages
    new = store.put(value)
    _swap_blob(b / "mlp", old, new)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"))
    assert code == 1
    weights = found(data, "weights")
    assert [(w["name"], w["a"], w["b"], w["where"]) for w in weights] == [
        ("param layers.0.weight", old, new, ""), ("inference.freeze constant _const_layers_0_weight", old, new, "")]
    assert weights[0]["text"] == f"param layers.0.weight: {old[:12]} -> {new[:12]}"
    assert data["first_divergence"]["inference"] == "permute"
    assert data["first_divergence"]["forward"] is not None


def test_a_weight_under_another_name_is_only_in_a_and_only_in_b(pair):
    a, b = pair
    def rename(rec):
        for i in rec["inputs"]:
            if i.get("target") == "head.bias":
                i["target"] = "head.offset"

    for p in (b / "mlp").rglob("inputs.json"):
        edit_json(p, rename)
    reseal(b / "mlp")
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    blob = _blob_of(a / "mlp", "head.bias")
    only = [(w["text"], w.get("a"), w.get("b")) for w in found(data, "weights")]
    assert only == [(f"param head.bias: only in A ({blob[:12]})", blob, None),
                    (f"param head.offset: only in B ({blob[:12]})", None, blob)]


def test_a_weight_whose_storage_is_not_stored_says_so(pair):
    a, b = pair

    def unstored(rec):
        entry = next(i for i in rec["inputs"] if i.get("target") == "head.bias")
        entry["storage"] = len(rec["storages"])  # past the list: no blob

    for rel in ("mlp_inference_0/inputs.json", "mlp_forward_0/inputs.json"):
        edit_json(b / "mlp" / rel, unstored)
    reseal(b / "mlp")
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    blob = _blob_of(a / "mlp", "head.bias")
    assert texts(data, "weights") == [f"param head.bias: {blob[:12]} -> (not stored)"]


# ---------------------------------------------------------------------------------------
# signatures


def test_an_input_of_another_shape_or_stride_is_named_at_that_input(pair):
    a, b = pair

    def reshape(rec):
        x = next(i for i in rec["inputs"] if i["role"] == "user")
        x.update(shape=[3, 4], stride=[4, 1])
        p = next(i for i in rec["inputs"] if i.get("target") == "head.weight")
        p.update(stride=[1, 10])

    edit_model(b / "mlp", "mlp_inference_0/inputs.json", reshape)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    assert texts(data, "signature", "inference") == [
        "input 2 param head.weight: float32[10, 8] -> float32[10, 8] stride [1, 10]",
        "input 4 user arg0: float32[2, 4] -> float32[3, 4]"]


def test_an_input_renamed_is_named_whole_on_both_sides(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/inputs.json",
               lambda rec: next(i for i in rec["inputs"] if i["role"] == "user").update(target="arg9"))
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert texts(data, "signature") == ["input 4 user arg0: float32[2, 4] -> input 4 user arg9: float32[2, 4]"]


def test_an_extra_output_is_only_in_b(pair):
    a, b = pair

    def more(rec):
        rec["outputs"].append({**rec["outputs"][0], "index": 1})

    edit_json(b / "mlp" / "mlp_inference_0" / "inputs.json", more)
    reseal(b / "mlp")
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1 and texts(data, "signature") == ["only in B: output 1 user: float32[2, 10]"]
    _code, back = cli_json(str(b / "mlp"), str(a / "mlp"), "--no-values")
    assert texts(back, "signature") == ["only in A: output 1 user: float32[2, 10]"]


def test_inputs_json_on_one_side_only(pair):
    a, b = pair
    (b / "mlp" / "mlp_inference_0" / "inputs.json").unlink()
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1 and texts(data, "signature", "inference") == ["inputs.json only in A"]
    _code, back = cli_json(str(b / "mlp"), str(a / "mlp"), "--no-values")
    assert texts(back, "signature", "inference") == ["inputs.json only in B"]


def test_a_graph_json_missing_on_both_sides_leaves_its_nodes_uncompared(pair):
    a, b = pair
    (a / "mlp" / "mlp_inference_0" / "graph.json").unlink()
    (b / "mlp" / "mlp_inference_0" / "graph.json").unlink()
    edit_model(b / "mlp", "mlp_inference_0/inputs.json",
               lambda rec: next(i for i in rec["inputs"] if i["role"] == "user").update(shape=[3, 4]))
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert texts(data, "signature") == ["input 4 user arg0: float32[2, 4] -> float32[3, 4]"]
    assert not found(data, "nodes") and not found(data, "ops")


# ---------------------------------------------------------------------------------------
# environment, options, passes, checks


def test_options_environment_passes_and_checks_are_named_by_field(pair):
    a, b = pair

    def change(m):
        m["versions"]["torch"] = "9.9.9"
        m["model"]["args"]["hidden"] = 16
        m["model"]["name"] = "renamed"  # compared directly, two artefacts may be named apart
        m["capture"]["fallback"] = "export"
        m["save_values"] = "full" if m["save_values"] != "full" else "minimal"
        m["checks"]["skipped"] = 99
        m["verification"]["forward"]["status"] = "match"
        m["graphs"]["inference.freeze"]["passes"][0]["stats"]["cse_merged"] = 7
        m["pass_failures"] = ["planted: boom"]

    before = json.loads((a / "mlp" / "manifest.json").read_text())
    edit_model(b / "mlp", "manifest.json", change)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    assert texts(data, "environment") == [f"versions.torch {before['versions']['torch']} -> 9.9.9"]
    assert sorted(texts(data, "options")) == sorted([
        "capture.fallback (absent) -> export",
        f"save_values {before['save_values']} -> {'full' if before['save_values'] != 'full' else 'minimal'}",
        "model.args.hidden 8 -> 16"])
    assert texts(data, "checks") == ["checks.skipped 13 -> 99", "verification.forward recorded -> match"]
    assert sorted(texts(data, "passes")) == sorted([
        "freeze.stats.cse_merged 0 -> 7",
        'failures [] -> ["planted: boom"]'])


def test_another_pass_chain_is_named_as_the_chain(pair):
    a, b = pair
    def other(m):
        m["graphs"]["inference.freeze"]["passes"][0].update(name="reinplace")
        m["model"]["passes"] = ["reinplace"]  # the copy older writers kept in the spec: not compared twice

    edit_model(b / "mlp", "manifest.json", other)
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert [(d["where"], d["text"], d["a"], d["b"]) for d in found(data, "passes")] == [
        ("inference.freeze", "chain freeze -> reinplace", "freeze", "reinplace")]
    assert code == 1 and {d["section"] for d in data["differences"]} == {"passes"}


def test_an_environment_only_one_side_recorded_is_named_field_by_field(pair):
    a, b = pair
    env = json.loads((a / "mlp" / "manifest.json").read_text())["environment"]
    edit_model(b / "mlp", "manifest.json", lambda m: m.pop("environment"))
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1
    lines = [t for t in texts(data, "environment") if t.startswith("environment.")]
    assert len(lines) == len(env) and all(line.endswith(" -> (absent)") for line in lines)
    assert f"environment.device {env['device']} -> (absent)" in lines
    _code, back = cli_json(str(b / "mlp"), str(a / "mlp"), "--no-values")
    assert f"environment.device (absent) -> {env['device']}" in texts(back, "environment")


# ---------------------------------------------------------------------------------------
# where the graphs run: this process or the sandbox, observed through what ran


class Ran:
    """What ran a diff's graphs: the artefacts loaded to run in this process (each answered as
    an artefact without graphs: nothing is built), and the sandboxed tasks started (with the
    paths they were given), the sandbox answering `answer`."""

    def __init__(self, monkeypatch, answer: Any = None, fails: Exception | None = None):
        self.in_process: list[str] = []
        self.sandboxed: list[list[str]] = []
        self.answer = answer if answer is not None else {}
        self.fails = fails
        self.trust_ops: list[Any] = []  # as each run was given them

        def load(path, *args, trust_ops=(), **kwargs):
            self.in_process.append(str(path))
            self.trust_ops.append(tuple(trust_ops))
            return SimpleNamespace(graphs={})

        def run_task(task, args, *, limits=None, read_paths=()):
            self.sandboxed.append(sorted(str(p) for p in read_paths))
            self.trust_ops.append(tuple(args["trust_ops"]))
            if self.fails is not None:
                raise self.fails
            return self.answer

        for module in (values, artifact_load):
            monkeypatch.setattr(module, "load", load)
        for module in (values, launch):
            monkeypatch.setattr(module, "run_task", run_task)


@pytest.fixture()
def keys(tmp_path) -> dict[str, str]:
    """Key specs by name: K (the one --key names), O (another HMAC secret), own (the user's own)."""
    out = {"own": str(own_key())}
    for name, byte in (("K", 1), ("O", 2)):
        path = tmp_path / f"{name}.key"
        path.write_bytes(bytes([byte]) * 64)
        out[name] = f"hmac:{path}"
    return out


@pytest.fixture()
def sandboxed(monkeypatch):
    """As a user runs diff: the sandbox is the default (the suite otherwise runs in process)."""
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)


@pytest.mark.parametrize("signed_a, signed_b, key, where", [
    (None, None, None, "sandbox"),      # made elsewhere: the sandbox
    ("K", "K", "K", "process"),         # both signed by the key the user names
    ("K", None, "K", "sandbox"),        # one side signed is not both
    (None, "K", "K", "sandbox"),
    ("O", "O", "K", "sandbox"),         # signed, by another key
    ("K", "O", "K", "sandbox"),
    ("own", "own", None, "process"),    # signed by the user's own key: no --key needed
    ("own", None, None, "sandbox"),
    (None, "own", None, "sandbox"),
    ("own", "own", "K", "sandbox"),     # --key names the key: the user's own does not stand in for it
])
def test_the_graphs_run_in_process_only_when_both_sides_are_trusted(pair, sandboxed, monkeypatch, keys,
                                                                     signed_a, signed_b, key, where):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    for side, signer in ((a, signed_a), (b, signed_b)):
        if signer is not None:
            sign_artifact(side, keys[signer])
    ran = Ran(monkeypatch, answer={"inference": {"status": "same", "compared": 3}})
    code, data = cli_json(str(a), str(b), *(("--key", keys[key]) if key else ()))
    assert code == 0
    if where == "process":
        assert ran.sandboxed == [] and sorted(ran.in_process) == sorted([str(a), str(b)])
        assert data["notes"] == [] and data["first_divergence"] == {}
    else:
        assert ran.in_process == [], "an untrusted side's graphs ran in this process"
        assert ran.sandboxed == [sorted([str(a.resolve()), str(b.resolve())])]
        assert data["first_divergence"] == {"inference": None}
        if key is None:
            assert data["notes"] == []  # without --key, the sandbox is simply the default
        else:
            (note,) = data["notes"]
            assert note.startswith(f"not both signed by {keys[key]}, so their graphs ran in the sandbox: "), note
            untrusted = a if signed_a != key else b
            assert str(untrusted) in note


@pytest.mark.parametrize("key", [None, "K"])
def test_no_sandbox_runs_both_in_process_signed_or_not(pair, sandboxed, monkeypatch, keys, key):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    sign_artifact(a, keys["K"])
    ran = Ran(monkeypatch)
    code, data = cli_json(str(a), str(b), "--no-sandbox", *(("--key", keys[key]) if key else ()))
    assert code == 0 and ran.sandboxed == [] and sorted(ran.in_process) == sorted([str(a), str(b)])
    assert data["notes"] == []


@pytest.mark.parametrize("where", ["sandbox", "process"])
def test_trusted_op_namespaces_reach_whatever_runs_the_graphs(pair, sandboxed, monkeypatch, where):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    ran = Ran(monkeypatch)
    code, _ = cli_json(str(a), str(b), "--trust-ops", "aptestops", "--trust-ops", "other",
                       *(("--no-sandbox",) if where == "process" else ()))
    assert code == 0 and set(ran.trust_ops) == {("aptestops", "other")}
    assert len(ran.sandboxed if where == "sandbox" else ran.in_process) == (1 if where == "sandbox" else 2)


def test_diff_paths_defaults_to_the_sandbox_comparing_values_and_a_threshold_of_half(pair, runs, sandboxed,
                                                                                       monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    ran = Ran(monkeypatch, answer={"inference": {"status": "same", "compared": 1}})
    d = diff_paths(a, b)
    assert ran.sandboxed and not ran.in_process and ran.trust_ops == [()]
    assert d.first_divergence == {"inference": None} and d.notes == []
    ta, tb = runs
    _times(ta, mlp=10.0)
    _times(tb, mlp=15.0)
    assert diff_paths(ta, tb).same
    _times(tb, mlp=15.1)
    assert [f.text for f in diff_paths(ta, tb).findings] == ["10.00 s -> 15.10 s (+51%)"]


def test_a_divergence_in_a_graph_whose_record_a_lacks_is_named_by_the_node_name(pair, sandboxed, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    (a / "mlp_inference_0" / "graph.json").unlink()
    Ran(monkeypatch, answer={"inference": {"status": "diverged", "compared": 1, "a_node": "relu", "b_node": "relu",
                                           "why": "w"}})
    _, data = cli_json(str(a), str(b))
    assert texts(data, "values") == ["first diverging node: A relu, B relu: w"]


def test_where_the_sandbox_cannot_start_the_values_are_not_compared_and_a_note_says_how_to_trust(
        pair, sandboxed, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    ran = Ran(monkeypatch, fails=SandboxUnavailable("bwrap not found"))
    code, data = cli_json(str(a), str(b))
    assert code == 0 and ran.in_process == [] and data["first_divergence"] == {}
    assert data["notes"] == [("values not compared: running the graphs needs the sandbox, which cannot start "
                             "here (bwrap not found); for artefacts you made or trust, pass --no-sandbox or "
                             "--key KEY")]


def test_a_worker_that_crashed_leaves_the_record_diff_standing_with_a_note(pair, sandboxed, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    edit_model(b, "mlp_inference_0/graph.json", lambda g: node(g, "relu").update(target="aten.sigmoid.default"))
    Ran(monkeypatch, fails=SandboxError("the worker crashed   (signal 11)\nsecond line", "crashed"))
    code, data = cli_json(str(a), str(b))
    assert code == 1 and len(found(data, "nodes")) == 1 and data["first_divergence"] == {}
    assert data["notes"] == ["values not compared: the worker crashed (signal 11) second line"]


def test_each_graph_s_values_result_is_said_skipped_same_or_diverged(pair, sandboxed, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    Ran(monkeypatch, answer={
        "inference": {"status": "diverged", "compared": 2, "a_node": "relu", "b_node": "relu_b", "why": "planted"},
        "forward": {"status": "skipped", "reason": "no saved inputs"},
        "backward": {"status": "same", "compared": 9},
        "inference.freeze": {"status": "diverged", "compared": 1, "a_node": "gone", "b_node": "x", "why": "w"},
    })
    code, data = cli_json(str(a), str(b))
    assert code == 1
    assert data["first_divergence"] == {"inference": "relu", "backward": None, "inference.freeze": "gone"}
    assert data["notes"] == ["values of forward not compared: no saved inputs"]
    assert found(data, "values") == [
        {"section": "values", "where": "inference", "text": f"first diverging node: A {RELU}, B relu_b: planted",
         "a_node": "relu", "b_node": "relu_b", "why": "planted", "compared": 2},
        # a node the graph record does not hold is named as the worker named it
        {"section": "values", "where": "inference.freeze", "text": "first diverging node: A gone, B x: w",
         "a_node": "gone", "b_node": "x", "why": "w", "compared": 1}]
    out = cli(str(a), str(b)).output
    assert "values: 3 graphs run on the same inputs, node by node: 2 diverged (inference, inference.freeze)" in out


def test_a_malformed_worker_result_is_a_sandbox_error(pair, sandboxed, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    Ran(monkeypatch, answer={"inference": {"status": "exploded"}})
    with pytest.raises(SandboxError) as e:
        values.compare_values_sandboxed(str(a), str(b), {})
    assert str(e.value) == "the sandboxed worker sent back a malformed diff result" and e.value.kind == "malformed"


def test_the_sandboxed_task_gets_absolute_paths_and_its_arguments(pair, monkeypatch, tmp_path):
    seen = {}

    def run_task(task, args, *, limits=None, read_paths=()):
        seen.update(task=task, args=args, read_paths=list(read_paths))
        return {}

    monkeypatch.setattr(values, "run_task", run_task)
    monkeypatch.chdir(tmp_path)
    values.compare_values_sandboxed("a/tiny/mlp", "b/tiny/mlp", {"inference": {"relu": "relu"}}, rtol=0.25,
                                    trust_ops=("aptestops",))
    a, b = str(tmp_path / "a/tiny/mlp"), str(tmp_path / "b/tiny/mlp")
    assert seen == {"task": "aotpipe.corpus.diff.values:values_task",
                    "args": {"a": a, "b": b, "aligned": {"inference": {"relu": "relu"}}, "rtol": 0.25,
                             "trust_ops": ["aptestops"]},
                    "read_paths": [a, b]}


# ---------------------------------------------------------------------------------------
# what A and B are


def test_a_graph_folder_stands_for_its_model(pair):
    a, b = pair
    code, data = cli_json(str(a / "mlp" / "mlp_inference_0"), str(b / "mlp"), "--no-values")
    assert code == 0 and data["kind"] == "artifact" and data["a"] == str(a / "mlp")


def test_an_output_folder_holding_one_tree_is_that_tree_and_two_must_be_named(pair):
    a, b = pair
    code, data = cli_json(str(a.parent), str(b))
    assert code == 0 and data["kind"] == "tree" and data["a"] == str(a)
    shutil.copytree(a, a.parent / "other")
    r = cli(str(a.parent), str(b))
    assert r.exit_code == 2
    assert "neither an artefact (no manifest.json) nor an output tree (no run.json) (it holds 2 pipeline " \
           "trees: name one)" in r.output


@pytest.mark.parametrize("case", ["missing", "file", "empty", "artefact-then-tree", "tree-then-artefact"])
def test_what_is_neither_or_mixed_exits_2_with_one_line_naming_it(pair, tmp_path, case):
    a, b = pair
    if case == "missing":
        args, expect = (str(a / "mlp"), str(tmp_path / "nope")), f"B {tmp_path / 'nope'}: no such file or folder"
    elif case == "file":
        (tmp_path / "f.txt").write_text("x")
        args, expect = (str(tmp_path / "f.txt"), str(b)), f"A {tmp_path / 'f.txt'}: a file, not a folder"
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        args, expect = (str(a), str(tmp_path / "empty")), (
            f"B {tmp_path / 'empty'}: neither an artefact (no manifest.json) nor an output tree (no run.json); "
            "pass two artefact folders")
    elif case == "artefact-then-tree":
        args, expect = (str(a / "mlp"), str(b)), f"A is an artefact ({a / 'mlp'}) but B is an output tree ({b})"
    else:
        args, expect = (str(a), str(b / "mlp")), f"A is an output tree ({a}) but B is an artefact ({b / 'mlp'})"
    r = cli(*args)
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert line.startswith("error: ") and expect in line, line


# ---------------------------------------------------------------------------------------
# values, node by node (in this process)


def _aligned(a: Path, b: Path) -> dict[str, dict[str, str]]:
    d = Diff("artifact", str(a), str(b))
    return dict(artifacts.compare_artifacts(artifacts.read_side(a), artifacts.read_side(b), d))


def test_identical_graphs_compare_same_at_every_aligned_node(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    aligned = _aligned(a, b)
    result = values.compare_values(str(a), str(b), aligned)
    assert set(result) == GRAPHS
    assert result["inference"] == ValuesComparison(status="same", compared=5)
    assert all(r.status == "same" and r.compared for r in result.values())
    # a graph left out of the alignment is not run
    del aligned["inference"]
    assert set(values.compare_values(str(a), str(b), aligned)) == GRAPHS - {"inference"}


def test_b_runs_on_a_s_user_inputs_but_its_own_weights(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    rec = json.loads((b / "mlp_inference_0" / "inputs.json").read_text())
    x = next(i for i in rec["inputs"] if i["role"] == "user")
    store = BlobStore(b)
    old = rec["storages"][x["storage"]]["blob"]
    new = store.put(store.get(old) + 3.0)
    _swap_blob(b, old, new)
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    # B's own saved input is not what it ran on; nor its backward's activations, which come
    # from B's forward run on A's input
    assert {k: r.status for k, r in result.items()} == dict.fromkeys(GRAPHS, "same")
    w = _blob_of(b, "head.bias")
    _swap_blob(b, w, store.put(store.get(w) + 3.0))
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    assert result["inference"].model_dump() == {
        "status": "diverged", "compared": 5, "a_node": "addmm_1", "b_node": "addmm_1", "reason": None,
        "why": result["inference"].why}
    assert result["inference"].why.startswith("sum of its sampled elements ")


def test_values_departing_by_less_than_rtol_are_the_same(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    store = BlobStore(b)
    w = _blob_of(b, "head.bias")
    _swap_blob(b, w, store.put(store.get(w) + 1e-3))
    aligned = _aligned(a, b)
    assert values.compare_values(str(a), str(b), aligned)["inference"].status == "diverged"
    assert values.compare_values(str(a), str(b), aligned, rtol=0.5)["inference"].status == "same"


def test_a_backward_whose_forward_did_not_run_is_skipped(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    aligned = _aligned(a, b)
    del aligned["forward"]
    result = values.compare_values(str(a), str(b), aligned)
    assert result["backward"] == ValuesComparison(status="skipped", reason="its forward (forward) did not run in both")
    assert set(result) == GRAPHS - {"forward"}  # and the graphs after it still compared


def test_a_graph_that_fails_to_run_is_skipped_and_the_others_compared(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    real = values.run_with_summaries

    def run(module, inputs, summarise):
        if len(inputs) == 1:  # the frozen inference graph: its only input is x
            raise RuntimeError("planted\nsecond line")
        return real(module, inputs, summarise)

    monkeypatch.setattr(values, "run_with_summaries", run)
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    assert result["inference.freeze"] == ValuesComparison(
        status="skipped", reason="running the graphs failed (RuntimeError: planted)")
    assert result["inference"].status == "same" and result["backward"].status == "same"


def test_graphs_without_saved_inputs_are_skipped(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    b_side = str(b)
    monkeypatch.setattr(artifact_load.GraphArtifact, "has_saved_values",
                        property(lambda self: not str(self.folder).startswith(b_side)))
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    assert result["inference"] == ValuesComparison(
        status="skipped", reason="no saved inputs (the model ran with save_inputs: false)")
    assert set(result) == GRAPHS and {r.status for r in result.values()} == {"skipped"}


def test_values_task_passes_its_trusted_ops_to_the_loader(monkeypatch):
    seen = []

    def load(path, *, trust_ops=()):
        seen.append((path, trust_ops))
        return SimpleNamespace(graphs={})

    monkeypatch.setattr(values, "load", load)
    out = values.values_task({"a": "/x/a", "b": "/x/b", "aligned": {}, "rtol": 0.1, "trust_ops": ["aptestops"]}, None)
    assert out == {} and seen == [("/x/a", ("aptestops",)), ("/x/b", ("aptestops",))]


def test_a_copy_added_in_b_leaves_every_aligned_node_the_same(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    edit_model(b, "mlp_inference_0/graph.json", _add_clone)
    aligned = _aligned(a, b)
    assert aligned["inference"]["addmm_1"] == "addmm_1" and "clone" not in aligned["inference"].values()
    assert values.compare_values(str(a), str(b), {"inference": aligned["inference"]}) == {
        "inference": ValuesComparison(status="same", compared=5)}


def test_a_graph_b_lacks_is_not_run_even_when_asked(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    aligned = _aligned(a, b)
    _drop_graph(b, "inference.freeze")
    assert set(values.compare_values(str(a), str(b), aligned)) == GRAPHS - {"inference.freeze"}


def test_graphs_given_another_number_of_inputs_are_skipped(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    real = artifact_load.GraphArtifact.saved_inputs
    b_side = str(b)

    def saved_inputs(self, *args, **kwargs):
        got = real(self, *args, **kwargs)
        return got[:-1] if str(self.folder).startswith(b_side) else got

    monkeypatch.setattr(artifact_load.GraphArtifact, "saved_inputs", saved_inputs)
    result = values.compare_values(str(a), str(b), {"inference": _aligned(a, b)["inference"]})
    assert result == {"inference": ValuesComparison(status="skipped", reason="5 inputs in A, 4 in B")}


def test_values_task_answers_in_json(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    aligned = _aligned(a, b)
    out = values.values_task({"a": str(a), "b": str(b), "aligned": {"inference": aligned["inference"]},
                              "rtol": values.RTOL, "trust_ops": []}, None)
    assert out == {"inference": {"status": "same", "compared": 5, "a_node": None, "b_node": None, "why": None,
                                 "reason": None}}


def S(**kw: Any) -> Summary:
    base = {"shape": [2], "stride": [1], "dtype": "float32", "sum": 0.0, "abs_sum": 1000.0, "nonfinite": 0}
    return Summary(**{**base, **kw})


def test_departs_says_which_field_as_a_against_b():
    d = values._departs
    assert d(None, S(), 1e-5) is None and d(S(), None, 1e-5) is None
    assert d(S(), S(), 1e-5) is None
    assert d(S(dtype="float32"), S(dtype="float64"), 1e-5) == "dtype float32 in A, float64 in B"
    assert d(S(shape=[2]), S(shape=[3], stride=[1]), 1e-5) == "shape [2] in A, [3] in B"
    assert d(S(stride=[1]), S(stride=[2]), 1e-5) is None  # a diff of two graphs leaves strides out
    assert d(S(sum=1.0), S(sum=2.0), 1e-5) == "sum of its sampled elements 1 in A, 2 in B"
    assert d(S(abs_sum=1000.0), S(abs_sum=1000.5), 1e-5) == \
        "absolute sum of its sampled elements 1000 in A, 1000.5 in B"
    assert d(S(nonfinite=0), S(nonfinite=2), 1e-5) == "0 non-finite values in A, 2 in B"
    assert d((S(), S(sum=1.0)), (S(), S(sum=3.0)), 1e-5) == "item 1: sum of its sampled elements 1 in A, 3 in B"
    assert d((S(), S()), (S(), S()), 1e-5) is None
    assert d((S(),), S(), 1e-5) is None  # a tuple against a tensor: nothing aligned to compare


def test_departs_just_inside_and_just_outside_rtol_of_a_s_absolute_sum():
    d = values._departs
    # rtol 1e-5 of A's absolute sum 1000: 0.01
    assert d(S(sum=0.0), S(sum=0.0099), 1e-5) is None
    assert d(S(sum=0.0), S(sum=0.0101), 1e-5) == "sum of its sampled elements 0 in A, 0.0101 in B"
    # B's absolute sum is not the scale: A is the reference
    assert d(S(sum=0.0, abs_sum=1000.0), S(sum=0.0101, abs_sum=1000.005), 1e-5) is not None
    assert d(S(sum=0.0, abs_sum=1000.005), S(sum=0.0099, abs_sum=1000.0), 1e-5) is None
    # the default: 1e-5
    assert d(S(sum=0.0), S(sum=0.0099), values.RTOL) is None and d(S(sum=0.0), S(sum=0.0101), values.RTOL)
    # below an absolute sum of 1, the scale is 1
    assert d(S(sum=0.0, abs_sum=0.5), S(sum=0.9e-5, abs_sum=0.5), 1e-5) is None
    assert d(S(sum=0.0, abs_sum=0.5), S(sum=1.1e-5, abs_sum=0.5), 1e-5) is not None


def test_same_layout_means_same_shape_and_dtype_or_the_same_type():
    same = values._same_layout
    assert same(torch.zeros(2, 3), torch.ones(2, 3))
    assert not same(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not same(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64))
    assert same(1, 2) and not same(1, 2.0) and not same(torch.zeros(1), 1)


# ---------------------------------------------------------------------------------------
# two trees


def model_entry(run: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in run["models"] if m["name"] == name)


def test_identical_trees_are_the_same_exit_0(pair):
    a, b = pair
    code, data = cli_json(str(a), str(b))
    assert code == 0 and data["kind"] == "tree" and data["differences"] == [] and data["notes"] == []
    assert data["first_divergence"] == {}  # a tree's graphs are not run
    assert cli(str(a), str(b)).output.splitlines()[-1] == "same trees"


def test_a_model_on_one_side_only_is_missing_or_new(runs):
    a, b = runs
    edit_json(b / "run.json", lambda r: r.update(models=[m for m in r["models"] if m["name"] != "norm"]))
    code, data = cli_json(str(a), str(b))
    assert code == 1
    assert found(data, "models") == [{"section": "models", "where": "norm", "text": "missing in B (was ok in A)",
                                      "model": "norm", "change": "missing"}]
    code, back = cli_json(str(b), str(a))
    assert found(back, "models") == [{"section": "models", "where": "norm", "text": "new in B (ok)",
                                      "model": "norm", "change": "new"}]


@pytest.mark.parametrize("a_status, b_status, error, text", [
    ("ok", "failed", "capture: planted\nsecond line", "ok -> failed: capture: planted"),
    ("ok", "failed", "  \n", "ok -> failed"),
    ("failed", "ok", None, "failed -> ok"),
    ("failed", "ok", "an error kept from before", "failed -> ok"),  # B's error is said only where B failed
    ("ok", "failed", None, "ok -> failed"),
    ("ok", "partial", "x" * 200, "ok -> partial: " + "x" * 160),
])
def test_a_status_change_names_b_s_error_in_one_line(runs, a_status, b_status, error, text):
    a, b = runs
    edit_json(a / "run.json", lambda r: model_entry(r, "norm").update(status=a_status, error="A's error"))
    edit_json(b / "run.json", lambda r: model_entry(r, "norm").update(status=b_status, error=error))
    code, data = cli_json(str(a), str(b))
    assert code == 1
    assert found(data, "status") == [{"section": "status", "where": "norm", "text": text, "model": "norm",
                                      "a": a_status, "b": b_status}]


def test_check_counts_and_graph_breaks_that_changed_are_named(pair):
    a, b = pair

    def fewer(r):
        model_entry(r, "mlp")["checks"]["skipped"] = 3
        model_entry(r, "norm")["checks"] = None

    edit_json(b / "run.json", fewer)
    edit_model(b / "mlp", "manifest.json", lambda m: m["capture"].update(
        graph_breaks=[{"subgraph": 0, "reason": "planted"}, {"subgraph": 1, "reason": "planted"}]))
    _code, data = cli_json(str(a), str(b))
    checks = [(d["where"], d["text"]) for d in found(data, "checks")]
    assert checks == [("mlp", "skipped 13 -> 3"), ("norm", "run 0 -> None"), ("norm", "passed 0 -> None"),
                      ("norm", "failed 0 -> None"), ("norm", "skipped 16 -> None")]
    assert found(data, "checks", "mlp") == [{"section": "checks", "where": "mlp", "text": "skipped 13 -> 3",
                                             "model": "mlp", "field": "skipped", "a": 13, "b": 3}]
    assert found(data, "breaks") == [{"section": "breaks", "where": "mlp", "text": "graph breaks 0 -> 2",
                                      "model": "mlp", "a": 0, "b": 2}]
    # the model's manifest checks are not named again from its artefact
    assert all(d["where"] in ("mlp", "norm") for d in found(data, "checks"))


def test_graph_breaks_are_not_compared_where_a_manifest_is_missing_or_unreadable(pair):
    a, b = pair
    # (where one side's manifest is missing, the artefacts are not compared either)
    (a / "mlp" / "manifest.json").write_text("{not json")
    (b / "mlp" / "manifest.json").unlink()
    (b / "norm" / "manifest.json").unlink()
    edit_model(a / "norm", "manifest.json", lambda m: m["capture"].update(graph_breaks=[{"subgraph": 0,
                                                                                         "reason": "x"}]))
    _code, data = cli_json(str(a), str(b))
    assert not found(data, "breaks")


def _times(tree: Path, **seconds: float) -> None:
    edit_json(tree / "run.json", lambda r: [model_entry(r, k).update(total_seconds=v) for k, v in seconds.items()])


@pytest.mark.parametrize("ta, tb, threshold, changed", [
    (10.0, 15.0, None, False),    # 1.5x: not beyond 1 + 0.5
    (10.0, 15.1, None, True),
    (15.1, 10.0, None, True),     # symmetric: faster counts as slower does
    (15.0, 10.0, None, False),
    (1.0, 1.9, None, False),      # beyond the ratio but less than a second
    (1.0, 2.0, None, True),       # a second exactly
    (10.0, 15.1, "0.51", False),
    (10.0, 12.0, "0.19", True),
    (10.0, 10.0, "0", False),
    (0.0, 1.0, None, True),       # from nothing: no ratio, a second's move counts
    (0.0, 0.5, None, False),
])
def test_time_counts_only_beyond_the_threshold_and_a_second(runs, ta, tb, threshold, changed):
    a, b = runs
    _times(a, mlp=ta)
    _times(b, mlp=tb)
    code, data = cli_json(str(a), str(b), *(("--threshold", threshold) if threshold else ()))
    times = found(data, "time")
    if not changed:
        assert code == 0 and times == []
        return
    change = f" ({(tb - ta) / ta:+.0%})" if ta else ""
    assert code == 1 and times == [{"section": "time", "where": "mlp", "text": f"{ta:.2f} s -> {tb:.2f} s{change}",
                                    "model": "mlp", "a": ta, "b": tb}]


def test_a_time_measured_on_one_side_only_is_a_note_not_a_difference(runs):
    a, b = runs
    _times(a, mlp=5.0, norm=7.0)
    _times(b, mlp=50.0, norm=70.0)
    edit_json(b / "run.json", lambda r: model_entry(r, "mlp").update(skipped=True, measured_in=None))
    edit_json(a / "run.json", lambda r: model_entry(r, "norm").update(skipped=True, measured_in=None))
    code, data = cli_json(str(a), str(b))
    assert code == 0 and not found(data, "time")
    assert data["notes"] == [('time not compared for 2 model(s) measured on one side only ("-": kept as up to date '
                             'without a measurement): mlp 5.00 s -> -; norm - -> 70.00 s')]
    edit_json(a / "run.json", lambda r: model_entry(r, "mlp").update(skipped=True, measured_in=None))
    code, data = cli_json(str(a), str(b))
    assert data["notes"] == [('time not compared for 1 model(s) measured on one side only ("-": kept as up to date '
                             'without a measurement): norm - -> 70.00 s')]


def test_more_than_five_untimed_models_are_counted(runs):
    a, b = runs

    def many(run, skipped):
        base = model_entry(run, "mlp")
        run["models"] += [{**base, "name": f"m{i}", "total_seconds": 1.0, "skipped": skipped, "measured_in": None}
                          for i in range(7)]

    edit_json(a / "run.json", lambda r: many(r, False))
    edit_json(b / "run.json", lambda r: many(r, True))
    _code, data = cli_json(str(a), str(b))
    (note,) = data["notes"]
    assert note.startswith("time not compared for 7 model(s) measured on one side only")
    assert "m4 1.00 s -> -; and 2 more" in note and "m5" not in note


@pytest.mark.parametrize("za, zb, changed", [
    (1000, 1500, False), (1000, 1501, True), (1501, 1000, True), (1500, 1000, False), (1000, 1000, False),
    (0, 1000, True),  # a model that wrote nothing in A (it failed there) and something in B
    (1, 3, True),
])
def test_bytes_count_only_beyond_the_threshold(runs, za, zb, changed):
    a, b = runs
    edit_json(a / "run.json", lambda r: model_entry(r, "norm").update(bytes=za))
    edit_json(b / "run.json", lambda r: model_entry(r, "norm").update(bytes=zb))
    code, data = cli_json(str(a), str(b))
    found_bytes = [(d["where"], d["text"], d["a"], d["b"]) for d in found(data, "bytes")]
    if not changed:
        assert code == 0 and found_bytes == []
    else:
        change = f" ({(zb - za) / za:+.0%})" if za else ""
        assert code == 1 and found_bytes == [("norm", f"{za} -> {zb}{change}", za, zb)]
        assert found(data, "bytes")[0]["model"] == "norm"


def test_a_model_s_artefact_differences_are_named_under_the_model(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0/graph.json",
               lambda g: node(g, "relu").update(target="aten.sigmoid.default"))
    code, data = cli_json(str(a), str(b))
    assert code == 1
    assert [(d["where"], d["model"], d["a"]) for d in found(data, "nodes")] == [("mlp/inference", "mlp", "relu")]
    assert sorted((d["where"], d["text"]) for d in found(data, "ops")) == [
        ("mlp/inference", "aten.relu.default 1 -> 0 (-1)"), ("mlp/inference", "aten.sigmoid.default 0 -> 1 (+1)")]
    assert data["first_divergence"] == {}


def test_the_same_change_in_two_models_is_one_line_naming_both(pair):
    a, b = pair
    for model in ("mlp", "norm"):
        edit_model(b / model, "manifest.json", lambda m: m["versions"].update(python="3.0.0"))
    _code, data = cli_json(str(a), str(b))
    (env,) = found(data, "environment")
    assert env["where"] == "mlp, norm" and env["models"] == ["mlp", "norm"]
    assert env["text"].startswith("versions.python ") and env["text"].endswith(" -> 3.0.0")


def _finding_diff(model: str, *found_: tuple[str, str, str, dict[str, Any]]) -> Diff:
    d = Diff("artifact", model, model)
    for section, where, text, data in found_:
        d.add(section, where, text, **data)
    return d


def test_merge_counts_a_model_s_weights_past_three_and_groups_what_models_share():
    def weights(model, n):
        return _finding_diff(model, *[("weights", model, f"param w{i}: x -> y", {"name": f"param w{i}"})
                                      for i in range(n)])

    out = Diff("tree", "a", "b")
    trees._merge(out, [weights("three", 3), weights("four", 4)])
    assert [(f.where, f.text) for f in out.findings if f.where == "three"] == [
        ("three", f"param w{i}: x -> y") for i in range(3)]
    (four,) = [f for f in out.findings if f.where == "four"]
    assert four.section == "weights"
    assert four.text == ("4 weights and constants differ (param w0, param w1, ...; diff the model's artefacts for "
                         "each digest)") and four.data == {"names": [f"param w{i}" for i in range(4)],
                                                             "model": "four"}

    out = Diff("tree", "a", "b")
    shared = ("environment", "", "versions.torch 1 -> 2", {})
    graph = ("ops", "/forward", "aten.relu.default 1 -> 0 (-1)", {"op": "aten.relu.default"})
    checks = ("checks", "", "checks.run 1 -> 2", {})
    three = [_finding_diff(m, *[(s, m + w, t, dict(d)) for s, w, t, d in (shared, graph, checks)])
             for m in ("m1", "m2", "m3")]
    trees._merge(out, three + [_finding_diff("m4", (shared[0], "m4", shared[2], {}))])
    by = {(f.section, f.where): f for f in out.findings}
    assert set(by) == {("environment", "4 models"), ("ops", "m1, m2, m3")}
    assert by[("environment", "4 models")].data["models"] == ["m1", "m2", "m3", "m4"]
    assert by[("ops", "m1, m2, m3")].text == "forward: aten.relu.default 1 -> 0 (-1)"
    assert by[("ops", "m1, m2, m3")].data == {"op": "aten.relu.default", "model": "m1", "models": ["m1", "m2", "m3"]}


def test_beyond_is_symmetric_and_needs_both_numbers():
    beyond = trees._beyond
    assert beyond(2, 4, 0.5) and beyond(4, 2, 0.5) and not beyond(2, 3, 0.5) and not beyond(3, 2, 0.5)
    assert not beyond(2, 4, 0.5, floor=2.5) and beyond(2, 4.5, 0.5, floor=2.5)
    assert beyond(0, 1, 0.5) and not beyond(0, 0, 0.5) and beyond(-1, 1, 0.5) and beyond(1, 0, 0.5)
    assert not beyond(0, 0.5, 0.5, floor=1.0) and beyond(0, 1.0, 0.5, floor=1.0)
    assert not beyond(None, 1, 0.5) and not beyond(1, None, 0.5) and not beyond("1", 2, 0.5)
    assert beyond(0.2, 0.9, 0.5)  # no floor by default
    assert not beyond(1, 1.2, 0.5) and not beyond(1.2, 1, 0.5)  # 1 is a size like any other: the ratio decides
    assert beyond(-1, 0.5, 0.5, floor=1.0)  # the move, not the sum


# ---------------------------------------------------------------------------------------
# the diff as text and JSON


def test_the_text_groups_findings_by_section_in_order_and_counts_them():
    d = Diff("artifact", "A", "B", notes=["a note"])
    d.add("values", "forward", "first diverging node: x")
    d.add("unknown", "", "last of all")
    d.add("models", "m", "new in B (ok)")
    d.add("environment", "", "versions.torch 1 -> 2")
    assert d.lines() == ["A: A", "B: B", "models:", "  m: new in B (ok)", "environment:", "  versions.torch 1 -> 2",
                         "values:", "  forward: first diverging node: x", "unknown:", "  last of all",
                         "note: a note", "4 differences"]
    one = Diff("tree", "A", "B")
    one.add("time", "m", "1.00 s -> 3.00 s")
    assert one.lines()[-1] == "1 difference" and not one.same
    assert Diff("tree", "A", "B").lines() == ["A: A", "B: B", "same trees"] and Diff("tree", "A", "B").same
    assert Finding("ops", "g", "t", {"op": "x"}).to_json() == {"section": "ops", "where": "g", "text": "t", "op": "x"}


def test_the_values_line_names_the_graphs_that_diverged_sorted():
    d = Diff("artifact", "A", "B", first_divergence={"forward": "relu", "backward": "mm", "inference": None})
    assert d.lines()[2] == "values: 3 graphs run on the same inputs, node by node: 2 diverged (backward, forward)"
    same = Diff("artifact", "A", "B", first_divergence={"forward": None})
    assert same.lines() == ["A: A", "B: B", ("values: 1 graph run on the same inputs, node by node: no aligned node "
                            "diverged"), "same artefacts"]
    assert d.to_json() == {"kind": "artifact", "a": "A", "b": "B", "same": True, "differences": [],
                           "first_divergence": {"forward": "relu", "backward": "mm", "inference": None}, "notes": []}


# ---------------------------------------------------------------------------------------
# records-level helpers: bounds of lists, lines and layouts


def test_more_than_max_hunks_changed_stretches_are_counted_not_listed():
    rows = [f"row {i}" for i in range(40)]
    for hunks in (artifacts.MAX_HUNKS, artifacts.MAX_HUNKS + 1):
        changed = [r + " changed" if i % 4 == 1 and i // 4 < hunks else r for i, r in enumerate(rows)]
        d = Diff("artifact", "A", "B")
        artifacts._list_diff(d, "signature", "g", rows, changed)
        lines = [f.text for f in d.findings]
        listed = min(hunks, artifacts.MAX_HUNKS)
        assert lines[:listed] == [f"row {4 * i + 1} -> row {4 * i + 1} changed" for i in range(listed)]
        assert lines[listed:] == ([] if hunks == listed else [f"and {hunks - listed} more changed stretches"])


def _chain_graph(targets: list[str], consts: list[Any] | None = None) -> GraphRecord:
    """x, then a chain of nodes op_i(previous, const_i) (the constants keep them apart), then output."""
    val = {"dtype": "float32", "shape": [2]}
    nodes = [{"name": "x", "op": "placeholder", "target": "x", "val": val}]
    for i, t in enumerate(targets):
        nodes.append({"name": f"n{i}", "op": "call_function", "target": t,
                      "args": [{"node": nodes[-1]["name"]}, consts[i] if consts else i], "kwargs": {}, "val": val})
    nodes.append({"name": "output", "op": "output", "args": [{"tuple": [{"node": nodes[-1]["name"]}]}]})
    return GraphRecord.model_validate({"format_version": 2, "nodes": nodes})


def test_more_than_max_hunks_changed_stretches_of_nodes_are_counted():
    base = ["aten.add.Scalar"] * 40
    for hunks in (artifacts.MAX_HUNKS, artifacts.MAX_HUNKS + 1):
        other = [("aten.mul.Scalar" if i % 4 == 1 and i // 4 < hunks else t) for i, t in enumerate(base)]
        d = Diff("artifact", "A", "B")
        aligned = artifacts._compare_nodes(d, "g", _chain_graph(base), _chain_graph(other))
        lines = [f.text for f in d.findings]
        listed = min(hunks, artifacts.MAX_HUNKS)
        assert len(lines) == listed + (hunks > listed)
        assert lines[0] == "A n1 (aten.add.Scalar) is B n1 (aten.mul.Scalar)"
        assert (lines[-1] == f"and {hunks - listed} more changed stretches of nodes") == (hunks > listed)
        # every node aligns: the unchanged ones, and the listed ones changed in place
        assert len(aligned) == 41 - (hunks - listed) and aligned["n1"] == "n1"


def test_a_node_s_changed_arguments_are_shown_in_sixty_characters_a_side():
    d = Diff("artifact", "A", "B")
    long_a, long_b = list(range(30)), list(range(1, 31))
    artifacts._compare_nodes(d, "g", _chain_graph(["aten.add.Scalar"], [long_a]),
                             _chain_graph(["aten.add.Scalar"], [long_b]))
    side = lambda xs: artifacts.shown(["%float32[2]", xs], 60)
    assert [f.text for f in d.findings] == [(f"A n0 (aten.add.Scalar) is B n0 (aten.add.Scalar): arguments "
                                            f"{side(long_a)} -> {side(long_b)}")]
    assert len(side(long_a)) == 60 and side(long_a).endswith("...")


def test_a_node_added_at_the_start_says_so():
    d = Diff("artifact", "A", "B")
    artifacts._compare_nodes(d, "g", _chain_graph(["aten.add.Scalar", "aten.add.Scalar"], [5, 6]),
                             _chain_graph(["aten.mul.Scalar", "aten.add.Scalar", "aten.add.Scalar"], [9, 5, 6]))
    texts_ = [f.text for f in d.findings]
    assert texts_[0] == "B has 1 node from n0 (aten.mul.Scalar) (at the start)", texts_


def test_shown_bounds_a_value_to_one_line():
    assert artifacts.shown("x" * 80) == "x" * 80
    assert artifacts.shown("x" * 81) == "x" * 77 + "..."
    assert artifacts.shown({"b": 1, "a": [1, 2]}) == '{"a": [1, 2], "b": 1}'
    assert artifacts.shown("abcdef", limit=5) == "ab..."


def test_flatten_names_nested_fields_by_dotted_path():
    assert artifacts.flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": {}}) == {"a.b": 1, "a.c.d": [1], "e": {}}
    assert artifacts.flatten({"a": 1}, "p") == {"p.a": 1}
    assert artifacts.flatten({}, "p") == {"p": {}}


def test_a_layout_names_dtype_shape_and_a_stride_only_where_not_contiguous():
    class R:
        def __init__(self, dtype=None, shape=None, stride=None, type=None):
            self.dtype, self.shape, self.stride, self.type = dtype, shape, stride, type

    layout = artifacts._layout
    assert layout(R("float32", [2, 3], [3, 1])) == "float32[2, 3]"
    assert layout(R("float32", [2, 3], None)) == "float32[2, 3]"
    assert layout(R("float32", [2, 3], [1, 2])) == "float32[2, 3] stride [1, 2]"
    assert layout(R("float32", [2, 0, 3], [3, 3, 1])) == "float32[2, 0, 3]"  # a zero size steps as one
    assert layout(R(None, None, type="int")) == "int" and layout(R(None, None, type="tensor")) == "none"
    assert layout(R(None, None)) == "none" and layout(R("float32", None)) == "none"
    assert artifacts._contiguous([4, 3, 2]) == [6, 2, 1] and artifacts._contiguous([]) == []


def test_a_node_value_in_brief():
    v = artifacts._val_layout
    assert v({"dtype": "float32", "shape": [2]}) == "float32[2]"
    assert v([{"dtype": "int64", "shape": []}, None]) == "(int64[], none)"
    assert v({"symbolic": "s0"}) == "sym" and v(3) == "?" and v(None) == "none" and v({"dtype": "f"}) == "?"


# ---------------------------------------------------------------------------------------
# more bounds: buffers, constants, run.json versions, untimed counts, merged checks


def test_a_changed_buffer_is_named_as_a_buffer(pair):
    a, b = pair
    rec = json.loads((b / "norm" / "norm_forward_0" / "inputs.json").read_text())
    entry = next(i for i in rec["inputs"] if i.get("target") == "running_mean")
    old = rec["storages"][entry["storage"]]["blob"]
    store = BlobStore(b / "norm")
    new = store.put(store.get(old) + 1.0)
    _swap_blob(b / "norm", old, new)
    code, data = cli_json(str(a / "norm"), str(b / "norm"), "--no-values")
    assert code == 1 and f"buffer running_mean: {old[:12]} -> {new[:12]}" in texts(data, "weights")


def test_a_constant_renamed_is_a_weight_name_not_a_node_change(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0.freeze/graph.json",
               lambda g: node(g, "_const_head_bias").update(target="_const_head_offset"))
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1 and not found(data, "nodes")
    blob = _blob_of(a / "mlp", "head.bias")
    assert texts(data, "weights") == [f"inference.freeze constant _const_head_bias: only in A ({blob[:12]})",
                                      f"inference.freeze constant _const_head_offset: only in B ({blob[:12]})"]


def test_a_constant_of_another_layout_is_a_node_change(pair):
    a, b = pair
    edit_model(b / "mlp", "mlp_inference_0.freeze/graph.json",
               lambda g: node(g, "_const_head_bias").update(stride=[2]))
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert code == 1 and [d["a"] for d in found(data, "nodes", "inference.freeze")] == ["_const_head_bias"]


def test_a_tree_s_own_versions_are_compared(runs):
    a, b = runs
    before = json.loads((a / "run.json").read_text())["versions"]["torch"]
    edit_json(b / "run.json", lambda r: r["versions"].update(torch="9.9.9"))
    code, data = cli_json(str(a), str(b))
    assert code == 1 and found(data, "environment") == [{
        "section": "environment", "where": "", "text": f"versions.torch {before} -> 9.9.9", "field": "versions.torch",
        "a": before, "b": "9.9.9"}]


@pytest.mark.parametrize("untimed, more", [(5, ""), (6, "; and 1 more")])
def test_five_untimed_models_are_named_and_a_sixth_counted(runs, untimed, more):
    a, b = runs

    def many(run, skipped):
        base = model_entry(run, "mlp")
        run["models"] = [{**base, "name": f"m{i}", "total_seconds": 1.0, "skipped": skipped, "measured_in": None}
                         for i in range(untimed)]

    edit_json(a / "run.json", lambda r: many(r, False))
    edit_json(b / "run.json", lambda r: many(r, True))
    _, data = cli_json(str(a), str(b))
    (note,) = data["notes"]
    assert note.endswith("m4 1.00 s -> -" + more)


def test_a_model_s_manifest_checks_are_counted_from_run_json_only(pair):
    a, b = pair
    edit_model(b / "mlp", "manifest.json", lambda m: m["checks"].update(skipped=99))
    code, data = cli_json(str(a), str(b))
    assert code == 0 and data["differences"] == []
    edit_model(b / "mlp", "mlp_inference_0/graph.json", lambda g: node(g, "relu").update(target="aten.sigmoid.default"))
    code, data = cli_json(str(a), str(b))  # what follows a model's checks is still named
    assert code == 1 and [d["where"] for d in found(data, "nodes")] == ["mlp/inference"] and not found(data, "checks")
    code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert texts(data, "checks") == ["checks.skipped 13 -> 99"]


def test_an_unequal_replacement_is_listed_as_only_in_a_and_only_in_b():
    d = Diff("artifact", "A", "B")
    artifacts._list_diff(d, "signature", "g", ["keep", "x: 1", "y: 2", "end"], ["keep", "z: 3", "end"])
    assert [f.text for f in d.findings] == ["only in A: x: 1", "only in A: y: 2", "only in B: z: 3"]


def test_node_references_are_replaced_by_the_layout_they_name():
    g = GraphRecord.model_validate({"format_version": 2, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x", "val": {"dtype": "float32", "shape": [2]}},
        {"name": "y", "op": "call_function", "target": "aten.add.Tensor",
         "args": [{"tuple": [{"node": "x"}, {"node": "gone"}]}, {"dtype": "float32"}],
         "kwargs": {"b": 1, "a": {"node": "x"}}},
        {"name": "output", "op": "output", "args": [{"node": "y"}]}]})
    y = g.nodes[1]
    layouts = {"x": "float32[2]"}
    assert artifacts._normalise(y.args, layouts) == [{"tuple": ["%float32[2]", "%?"]}, {"dtype": "float32"}]
    normalised = artifacts._normalise(y.kwargs, layouts)
    assert normalised == {"a": "%float32[2]", "b": 1} and list(normalised) == ["a", "b"]


@pytest.mark.parametrize("origin, text", [
    (None, "n (aten.relu.default)"),
    ({"module": "", "module_class": "pkg.M", "source": "m.py:3"}, "n (aten.relu.default) [module (the model) M, m.py:3]"),
    ({"module": "layers.1", "module_class": None, "source": None}, "n (aten.relu.default) [module layers.1]"),
    ({"module": "a", "module_class": "M", "source": None}, "n (aten.relu.default) [module a M]"),
    ({"module": None, "module_class": "pkg.M", "source": "m.py:3"}, "n (aten.relu.default) [m.py:3]"),
    ({"module": None, "module_class": None, "source": None}, "n (aten.relu.default)"),
])
def test_a_node_is_described_by_name_op_module_and_source(origin, text):
    n = NodeRecord.model_validate({"name": "n", "op": "call_function", "target": "aten.relu.default", "args": [],
                                   "origin": origin})
    assert artifacts.describe_node(n) == text
    out = NodeRecord.model_validate({"name": "output", "op": "output", "args": []})
    assert artifacts.describe_node(out) == "output (output)"


def test_stretches_of_several_nodes_are_counted_and_joined():
    d = Diff("artifact", "A", "B")
    artifacts._compare_nodes(d, "g", _chain_graph(["aten.add.Scalar"] * 3, [1, 2, 3]),
                             _chain_graph(["aten.add.Scalar", "aten.mul.Scalar", "aten.mul.Scalar",
                                           "aten.add.Scalar"], [1, 8, 9, 3]))
    assert [f.text for f in d.findings] == [
        "A has 1 node from n1 (aten.add.Scalar) where B has 2 nodes from n1 (aten.mul.Scalar) (after A n0, B n0)"]
    assert d.findings[0].data == {"a": ["n1"], "b": ["n1", "n2"]}


# ---------------------------------------------------------------------------------------
# where each finding is: the whole artefact (""), a graph key, or under a model in a tree


def test_findings_on_the_whole_artefact_are_at_no_graph_and_under_a_model_at_the_model(pair):
    a, b = pair

    def change(m):
        m["versions"]["torch"] = "9.9.9"
        m.pop("environment")
        m["capture"]["fallback"] = "export"
        m["model"]["args"]["hidden"] = 16

    edit_model(b / "mlp", "manifest.json", change)
    edit_model(b / "mlp", "mlp_inference_0/graph.json",
               lambda g: node(g, "relu").update(target="aten.sigmoid.default"))
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    fields = {d["field"].split(".")[0]: (d["section"], d["where"]) for d in data["differences"] if "field" in d}
    assert fields == {"versions": ("environment", ""), "environment": ("environment", ""),
                      "capture": ("options", ""), "model": ("options", "")}
    assert {d["where"] for d in found(data, "nodes")} == {"inference"}
    # called for a model of a tree, each is where that model is
    d = Diff("artifact", "a", "b")
    artifacts.compare_artifacts(artifacts.read_side(a / "mlp"), artifacts.read_side(b / "mlp"), d, model="mlp")
    wheres = {(f.section, f.data["field"].split(".")[0] if "field" in f.data else "", f.where) for f in d.findings}
    assert wheres == {("environment", "versions", "mlp"), ("environment", "environment", "mlp"),
                      ("options", "capture", "mlp"), ("options", "model", "mlp"),
                      ("nodes", "", "mlp/inference"), ("ops", "", "mlp/inference")}


def test_a_graph_only_in_b_is_named_with_its_key(pair):
    a, b = pair
    _drop_graph(a / "mlp", "inference.freeze")
    _code, data = cli_json(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert found(data, "graphs") == [{"section": "graphs", "where": "inference.freeze", "text": "only in B",
                                      "graph": "inference.freeze", "side": "b"}]


@pytest.mark.parametrize("kept", ["graph.json", "inputs.json"])
def test_a_graph_folder_linked_out_of_its_artefact_is_refused(pair, tmp_path, kept):
    a, b = pair
    elsewhere = tmp_path / "elsewhere" / "mlp_inference_0"
    shutil.move(b / "mlp" / "mlp_inference_0", elsewhere)
    for rel in ("graph.json", "inputs.json"):
        if rel != kept:
            (elsewhere / rel).unlink()
    (b / "mlp" / "mlp_inference_0").symlink_to(elsewhere, target_is_directory=True)
    r = cli(str(a / "mlp"), str(b / "mlp"), "--no-values")
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert line == f"error: {b / 'mlp' / 'mlp_inference_0' / kept}: outside the artefact folder"


def test_an_output_folder_holding_one_tree_beside_other_folders_is_that_tree(pair):
    a, b = pair
    (a.parent / "logs").mkdir()
    (a.parent / "notes.txt").write_text("x")
    code, data = cli_json(str(a.parent), str(b))
    assert code == 0 and data["kind"] == "tree" and data["a"] == str(a)


# ---------------------------------------------------------------------------------------
# values: what one graph or one node leaves out does not stop the others


def test_b_runs_its_backward_on_a_s_tangent_not_its_own(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    two = BlobStore(b).put(torch.full((1,), 2.0))

    def own_tangent(rec):
        t = next(i for i in rec["inputs"] if i["role"] == "tangent")
        t["source"] = "blob"
        rec["storages"][t["storage"]]["blob"] = two

    edit_model(b, "mlp_backward_0/inputs.json", own_tangent)
    tangents = [x for x, r in zip(artifact_load.load(str(b)).graphs["backward"].saved_inputs(),
                                  json.loads((b / "mlp_backward_0" / "inputs.json").read_text())["inputs"], strict=True)
                if r["role"] == "tangent"]
    assert [t.item() for t in tangents] == [2.0]  # B's own, which it does not run on
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    assert result["backward"].status == "same" and result["backward"].compared


def _first_graph(model: Path) -> str:
    """The key of the first graph the artefact loads (the first compared)."""
    return next(iter(artifact_load.load(str(model)).graphs))


def test_a_graph_that_fails_to_run_first_leaves_the_later_ones_compared(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    real, calls = values.run_with_summaries, []

    def run(module, inputs, summarise):
        calls.append(module)
        if len(calls) == 1:
            raise RuntimeError("planted")
        return real(module, inputs, summarise)

    monkeypatch.setattr(values, "run_with_summaries", run)
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    first = _first_graph(a)
    assert result[first] == ValuesComparison(status="skipped", reason="running the graphs failed (RuntimeError: planted)")
    assert {k: r.status for k, r in result.items() if k != first} == dict.fromkeys(GRAPHS - {first}, "same")


def test_a_first_graph_given_another_number_of_inputs_leaves_the_later_ones_compared(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    real = artifact_load.GraphArtifact.saved_inputs
    first = b / json.loads((b / "manifest.json").read_text())["graphs"][_first_graph(b)]["folder"]

    def saved_inputs(self, *args, **kwargs):
        got = real(self, *args, **kwargs)
        return got[:-1] if Path(self.folder) == first else got

    monkeypatch.setattr(artifact_load.GraphArtifact, "saved_inputs", saved_inputs)
    result = values.compare_values(str(a), str(b), _aligned(a, b))
    assert result[_first_graph(a)].status == "skipped" and result[_first_graph(a)].reason.endswith(" in B")
    assert {k: r.status for k, r in result.items() if k != _first_graph(a)} == dict.fromkeys(
        GRAPHS - {_first_graph(a)}, "same")


def test_a_node_summarised_on_one_side_only_is_passed_over_and_later_nodes_compared(pair, monkeypatch):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    store = BlobStore(b)
    w = _blob_of(b, "head.bias")
    _swap_blob(b, w, store.put(store.get(w) + 3.0))  # addmm_1, the last node, diverges
    real, calls = values.run_with_summaries, []

    def run(module, inputs, summarise):
        outs, sums = real(module, inputs, summarise)
        calls.append(module)
        if len(calls) % 2 == 0:  # B's run of each graph
            sums.pop("permute", None)
        return outs, sums

    monkeypatch.setattr(values, "run_with_summaries", run)
    result = values.compare_values(str(a), str(b), {"inference": _aligned(a, b)["inference"]})
    assert result["inference"].model_dump() == {
        "status": "diverged", "compared": 4, "a_node": "addmm_1", "b_node": "addmm_1", "reason": None,
        "why": result["inference"].why}


def test_a_node_only_a_has_is_passed_over(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    edit_model(a, "mlp_inference_0/graph.json", _add_clone)
    aligned = _aligned(a, b)
    assert "clone" not in aligned["inference"]
    assert values.compare_values(str(a), str(b), {"inference": aligned["inference"]}) == {
        "inference": ValuesComparison(status="same", compared=5)}


def test_no_aligned_node_compares_same_at_none(pair):
    a, b = pair[0] / "mlp", pair[1] / "mlp"
    assert values.compare_values(str(a), str(b), {"inference": {}}) == {
        "inference": ValuesComparison(status="same", compared=0)}


def test_merge_takes_the_model_before_the_first_slash_and_the_graph_before_the_first_colon():
    # a graph key is any string in a manifest; a model's name is a folder name (no "/")
    out = Diff("tree", "a", "b")
    trees._merge(out, [_finding_diff("m1", ("signature", "m1/odd/key", "input 0 user x: f[2] -> f[3]", {}))])
    (f,) = out.findings
    assert (f.where, f.text, f.data) == ("m1/odd/key", "input 0 user x: f[2] -> f[3]", {"model": "m1"})
    out = Diff("tree", "a", "b")
    trees._merge(out, [_finding_diff(m, ("ops", f"{m}/odd/key", "x 1 -> 2", {})) for m in ("m1", "m2")])
    (f,) = out.findings
    assert (f.where, f.text, f.data["models"]) == ("m1, m2", "odd/key: x 1 -> 2", ["m1", "m2"])
