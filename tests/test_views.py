"""Graph views and provenance: model-explorer's own classes load what `aotpipe show --model-explorer`
writes, for every graph kind; graph.json keeps where each node came from, never an absolute path."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.artifact.provenance import module_path, source_line
from aotpipe.cli import main
from aotpipe.format.records import GraphRecord
from aotpipe.format.source_files import name_files_in, relative_file
from aotpipe.pipeline.views import explorer_graph, explorer_json, view_candidates
from tests.helpers.model_explorer_web import CHROMIUM, load_collection, web_load

graph_builder = pytest.importorskip("model_explorer.graph_builder", reason="model-explorer (ai-edge-model-explorer) "
                                    "is not installed")
from model_explorer import node_data_builder  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def load_graphs(path: Path, label: str | None = None) -> dict[str, "graph_builder.Graph"]:
    """The view file's graphs, by id, as model-explorer's own GraphCollection builds them."""
    collection = load_collection(path)
    if label is not None:
        assert collection.label == label
    return {g.id: g for g in collection.graphs}


def show(*args):
    return CliRunner().invoke(main, ["show", *args])


@pytest.mark.parametrize("kind", ["inference", "forward", "backward", "joint"])
def test_model_explorer_loads_every_graph_kind_with_modules_and_shapes(quickstart_run, tmp_path, kind):
    root, _ = quickstart_run
    out = tmp_path / f"{kind}.json"
    r = show(str(root / "small_cnn"), "--graph", kind, "--model-explorer", str(out))
    assert r.exit_code == 0, r.output
    (g,) = load_graphs(out, label="small_cnn").values()
    assert g.id == kind
    nodes = {n.id: n for n in g.nodes}
    graph = json.loads((root / "small_cnn" / f"small_cnn_{kind}_0" / "graph.json").read_text())
    assert list(nodes) == [n["name"] for n in graph["nodes"]]
    # dtype[shape] on every edge: the source's output metadata for the edge's output id
    for n in g.nodes:
        for e in n.incomingEdges:
            meta = {m.id: m for m in nodes[e.sourceNodeId].outputsMetadata}
            shape = {kv.key: kv.value for kv in meta[e.sourceNodeOutputId].attrs}["tensor_shape"]
            assert shape.split("[")[0] in ("float32", "int64", "bool") and shape.endswith("]"), (n.id, shape)
    # grouped by module path: the convolutions sit in their modules' namespaces
    spaces = {n.namespace for n in g.nodes if n.label == "convolution"}
    spaces |= {n.namespace for n in g.nodes if n.label == "convolution_backward"}
    assert spaces == {"conv1", "conv2"}, spaces
    assert {n.namespace for n in g.nodes if n.label == "input"} == {"inputs"}


def test_joint_view_marks_backward_nodes_with_their_forward_module(quickstart_run, tmp_path):
    root, _ = quickstart_run
    out = tmp_path / "joint.json"
    assert show(str(root / "tiny_transformer"), "--graph", "joint", "--model-explorer", str(out)).exit_code == 0
    (g,) = load_graphs(out).values()
    of_forward = [n for n in g.nodes if any(kv.key == "module_of" for kv in n.attrs)]
    assert of_forward and any(n.namespace.startswith("layers/0") for n in of_forward)


def test_per_node_error_against_the_float64_bound_is_node_data(quickstart_run, tmp_path):
    root, _ = quickstart_run
    out = tmp_path / "cnn.json"
    r = show(str(root / "small_cnn"), "--model-explorer", str(out))
    assert r.exit_code == 0, r.output
    assert set(load_graphs(out)) == set(json.loads((root / "small_cnn" / "manifest.json").read_text())["graphs"])
    data = json.loads((tmp_path / "cnn.node-data.json").read_text())
    model = node_data_builder.ModelNodeData(graphsData={
        k: node_data_builder.GraphNodeData(**{**v, "results": {n: node_data_builder.NodeDataResult(**x)
                                                               for n, x in v["results"].items()},
                                              "thresholds": [node_data_builder.ThresholdItem(**t)
                                                             for t in v["thresholds"]]})
        for k, v in data.items()})
    backward = model.graphsData["backward"].results
    manifest = json.loads((root / "small_cnn" / "manifest.json").read_text())
    items = manifest["graphs"]["backward"]["checks"]["items"]
    inputs = json.loads((root / "small_cnn" / "small_cnn_backward_0" / "inputs.json").read_text())
    graph = json.loads((root / "small_cnn" / "small_cnn_backward_0" / "graph.json").read_text())
    produced = graph["nodes"][-1]["args"][0]["tuple"]
    for item in items:  # each gradient's check is the node that computes it
        target = item["what"].removeprefix("gradient of ")
        index = next(o["index"] for o in inputs["outputs"] if o.get("target") == target)
        node = produced[index]["node"]
        assert backward[node].value == pytest.approx(item["error"] / item["bound"])


def test_views_of_a_tree_go_beside_it_and_leave_artefacts_verifying(quickstart_run, tmp_path):
    import shutil

    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root, tree)
    r = show(str(tree), "--model-explorer-all")
    assert r.exit_code == 0, r.output
    views = sorted(p.relative_to(tree).as_posix() for p in (tree / "views").rglob("*.model-explorer.json"))
    assert "views/mlp/joint.model-explorer.json" in views and len(views) == 20
    for model in ("mlp", "small_cnn", "tiny_transformer", "running_norm"):
        keys = json.loads((tree / model / "manifest.json").read_text())["graphs"]
        for key in keys:  # one collection per graph, labelled with its model
            assert list(load_graphs(tree / "views" / model / f"{key}.model-explorer.json", label=model)) == [key]
    assert r.output.splitlines()[-1] == f"run `aotpipe report {tree}` to link them from report.html"
    assert CliRunner().invoke(main, ["verify", str(tree)]).exit_code == 0


def test_a_view_is_the_graph_collection_model_explorer_s_json_loader_requires(quickstart_run, tmp_path):
    """model-explorer 0.1.34's web app takes a JSON object only with both `label` and `graphs`
    (else "Unsupported JSON format"): the file is one GraphCollection, nothing else at the top."""
    root, _ = quickstart_run
    collection, _ = explorer_json(root / "mlp")
    assert set(collection) == {"label", "graphs", "graphSorting"} and collection["label"] == "mlp"
    out = tmp_path / "mlp.json"
    assert show(str(root / "mlp"), "--model-explorer", str(out)).exit_code == 0
    assert json.loads(out.read_text()) == collection
    assert list(load_graphs(out, label="mlp")) == list(json.loads((root / "mlp" / "manifest.json").read_text())["graphs"])
    # the form written before (graphs alone) is what the loader refused: the check here refuses it too
    (tmp_path / "old.json").write_text(json.dumps({"graphs": collection["graphs"]}))
    with pytest.raises(AssertionError, match="not a GraphCollection"):
        load_collection(tmp_path / "old.json")


def _odd_graph() -> GraphRecord:
    """A graph whose module paths hold what model-explorer's namespaces must escape."""
    def node(name, module=None, args=None, op="call_function"):
        return {"name": name, "op": op, "target": "aten.relu.default" if op == "call_function" else None,
                "args": args, **({"origin": {"module": module}} if module is not None else {})}
    return GraphRecord.model_validate({"format_version": 2, "nodes": [
        node("x", op="placeholder"),
        node("r0", "stages.0.blocks.a/b.inner", [{"node": "x"}]),
        node("r1", "stages.0.blocks.a/b.inner", [{"node": "r0"}]),  # two ops a layer: one alone is drawn as no layer
        node("r2", "odd\\.tail", [{"node": "r1"}]),
        node("r3", "odd\\.tail", [{"node": "r2"}]),
        node("r4", "", [{"node": "r3"}]),
        node("r5", None, [{"node": "r4"}]),
        {"name": "output", "op": "output", "args": [{"node": "r5"}]}]})


def test_module_names_with_a_slash_stay_one_model_explorer_layer():
    g = explorer_graph(_odd_graph(), None, [], "forward")
    spaces = {n.id: n.namespace for n in g.nodes}
    # "/" separates layers in a namespace; "\\/" is model-explorer's escape for one inside a name
    assert spaces == {"x": "inputs", "r0": "stages/0/blocks/a\\/b/inner", "r1": "stages/0/blocks/a\\/b/inner",
                      "r2": "odd\u2216/tail", "r3": "odd\u2216/tail", "r4": "", "r5": "", "output": ""}
    module = {n.id: {kv.key: kv.value for kv in n.attrs}.get("module") for n in g.nodes}
    assert module["r2"] == "odd\\.tail"  # the exact path stays in the node's attributes


def test_a_views_folder_that_is_a_model_folder_is_refused_in_one_line(tmp_path):
    tree = tmp_path / "tree"
    (tree / "views").mkdir(parents=True)
    (tree / "views" / "manifest.json").write_text("{}")
    r = show(str(tree), "--model-explorer-all")
    assert r.exit_code == 2, r.output
    assert r.output.splitlines() == [
        f"error: {tree / 'views'}: the views folder would be inside the model folder {tree / 'views'} (a model named "
        "'views'), whose files its manifest lists; write each view with --model-explorer FILE instead"]
    assert sorted(p.name for p in (tree / "views").iterdir()) == ["manifest.json"]


def test_show_refuses_an_unknown_graph_in_one_line(quickstart_run, tmp_path):
    root, _ = quickstart_run
    r = show(str(root / "mlp"), "--graph", "jointt", "--model-explorer", str(tmp_path / "x.json"))
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "error: --graph jointt: this artefact has no such graph; it has backward, forward, inference, "
        "inference.freeze+fold_conv_bn+channels_last+reinplace, joint"]
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------------------------
# provenance in graph.json


def test_every_graph_kind_keeps_module_paths_and_relative_sources(quickstart_run):
    root, _ = quickstart_run
    for kind in ("inference", "forward", "backward", "joint"):
        graph = json.loads((root / "tiny_transformer" / f"tiny_transformer_{kind}_0" / "graph.json").read_text())
        calls = [n for n in graph["nodes"] if n["op"] == "call_function"]
        origins = [n["origin"] for n in calls if "origin" in n]
        assert len(origins) > len(calls) / 2, kind
        modules = {o.get("module") for o in origins}
        assert {"layers.0.qkv", "layers.1.ff1", "tok"} <= modules, (kind, modules)
        sources = [o["source"] for o in origins if "source" in o]
        assert len(sources) > len(origins) / 2 and all(s.startswith("aotpipe/models/zoo.py:") for s in sources), kind
        if kind in ("backward", "joint"):
            assert any(o.get("of_forward") for o in origins)


def test_no_absolute_path_or_home_folder_is_written(quickstart_run):
    root, _ = quickstart_run
    needles = {str(REPO), os.path.expanduser("~"), sys.prefix, str(root.parent)}
    sources = set()
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".py", ".md"):
            text = path.read_text(errors="replace")
            for needle in needles:
                assert needle not in text, (path, needle)
            if path.name == "graph.json":
                sources |= {n["origin"]["source"] for n in json.loads(text)["nodes"]
                            if "source" in n.get("origin", {})}
    assert sources and not any(s.startswith("/") or ":\\" in s for s in sources), sources


def test_source_lines_are_relative_to_the_import_root():
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    trace = (f'File "{REPO}/aotpipe/models/zoo.py", line 94, in forward\n    x = self.tok(ids)\n'
             f'  File "{torch_dir}/nn/modules/sparse.py", line 189, in forward\n')
    assert source_line(trace) == "aotpipe/models/zoo.py:94"
    assert relative_file("/nowhere/on/the/path/model.py") == "model.py"
    # code torch.fx generated is no file, and its process-wide counter would make captures differ
    generated = 'File "<eval_with_key>.256", line 12, in forward\n    add = torch.ops.aten.add(x, y)\n'
    assert source_line(generated) is None
    assert source_line(trace.replace("  File", generated + "  File")) == "aotpipe/models/zoo.py:94"


def test_a_source_file_is_named_by_its_import_name_from_any_folder(monkeypatch, tmp_path):
    """The CI failure this guards: a run from another working folder named aotpipe's own
    files "zoo.py:28" instead of "aotpipe/models/zoo.py:28", so two runs differed byte for byte."""
    import importlib

    pkg = tmp_path / "src" / "probe_pkg_relfile"
    (pkg / "vision").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "vision" / "__init__.py"):
        init.write_text("")
    (pkg / "vision" / "net.py").write_text("X = 1\n")
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "probe_loose_relfile.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.syspath_prepend(str(loose))
    importlib.import_module("probe_pkg_relfile.vision.net")
    importlib.import_module("probe_loose_relfile")
    named = {}
    for cwd in (tmp_path, REPO, loose, pkg / "vision"):
        monkeypatch.chdir(cwd)
        named[cwd] = (relative_file(str(pkg / "vision" / "net.py")), relative_file(str(pkg / "vision" / "__init__.py")),
                      relative_file(str(loose / "probe_loose_relfile.py")), relative_file(str(REPO / "aotpipe" / "models" / "zoo.py")))
    assert set(named.values()) == {("probe_pkg_relfile/vision/net.py", "probe_pkg_relfile/vision/__init__.py", "probe_loose_relfile.py",
                                    "aotpipe/models/zoo.py")}
    # a file no module was imported from: named from its outermost package, or alone
    (pkg / "vision" / "never_imported.py").write_text("")
    assert relative_file(str(pkg / "vision" / "never_imported.py")) == "probe_pkg_relfile/vision/never_imported.py"
    monkeypatch.setattr(sys, "path", ["", "/nowhere"])
    assert relative_file(str(loose / "not_imported.py")) == "not_imported.py"


@pytest.mark.parametrize("raw, path", [
    ("layers.0.qkv", "layers.0.qkv"), ("", ""), ("L['self'].layers[0].qkv", "layers.0.qkv"),
    ("getattr(L['self'].layers, '0').qkv", "layers.0.qkv"), ("L['self']", ""), ("L['self'].tok", "tok"),
])
def test_module_paths_read_the_same_from_every_capture(raw, path):
    assert module_path(raw) == path


def test_older_graph_files_without_origin_still_view(tmp_path):
    out = tmp_path / "v2.json"
    r = show(str(REPO / "tests" / "data" / "format_v2" / "mlp"), "--graph", "forward", "--model-explorer", str(out))
    assert r.exit_code == 0, r.output
    (g,) = load_graphs(out).values()
    assert g.nodes and {n.namespace for n in g.nodes} <= {"", "inputs"}


# ---------------------------------------------------------------------------------------
# model-explorer's web app loads every view (its JSON loader and its graph worker, in Chromium)


@pytest.fixture(scope="module")
def web_loaded(quickstart_run, tmp_path_factory):
    """Every view of the quickstart tree, of a model nested five deep under odd module names
    (captured through the real CLI), of a hand-made graph with names to escape, and one file
    in the form written before the fix, as model-explorer's web app loads them."""
    import shutil

    from aotpipe.pipeline.views import write_explorer, write_tree_views
    from tests.helpers.pipelines import run_yaml

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    root, _ = quickstart_run
    tmp = tmp_path_factory.mktemp("web")
    tree = tmp / "quickstart"
    shutil.copytree(root, tree)
    files = {f"{m}/{k}": p for m, keys in write_tree_views(tree).items() for k, p in keys.items()}
    r, out = run_yaml(tmp, """
version: 1
name: nest
defaults: {passes: []}
models:
  - name: nested
    source: tests.helpers.view_models:nested_odd_names
    inputs: [{shape: [2, 8], dtype: float32}]
""", "--no-sign")
    assert r.exit_code == 0, r.output
    files |= {f"nested/{k}": p for k, p in write_tree_views(out / "nest")["nested"].items()}
    odd = tmp / "odd.json"
    odd.write_text(json.dumps({"label": "odd", "graphs": [dataclasses.asdict(explorer_graph(_odd_graph(), None, [],
                                                                                            "forward"))]}))
    files["odd/forward"] = odd
    before = tmp / "before.json"
    before.write_text(json.dumps({"graphs": json.loads(files["mlp/joint"].read_text())["graphs"]}))
    files["before"] = before
    node_data = {f"node-data {name}": (p.with_name(p.name.removesuffix(".json") + ".node-data.json"),
                                        [name.split("/", 1)[1]]) for name, p in files.items() if "/" in name}
    node_data = {name: v for name, v in node_data.items() if v[0].exists()}
    return files, web_load(tmp, files, node_data), tree


@pytest.mark.slow
def test_model_explorer_s_web_app_loads_every_view_of_every_graph_kind(web_loaded):
    files, loaded, tree = web_loaded
    seen = set()
    for name, path in files.items():
        if name in ("before", "odd/forward"):
            continue
        model, key = name.split("/", 1)
        (collection,) = loaded[name]["collections"]
        assert collection["label"] == model and list(collection["graphs"]) == [key], name
        g = collection["graphs"][key]
        assert g["errors"] == [], (name, g["errors"])
        view = json.loads(path.read_text())["graphs"][0]
        # every node became an op node of the laid-out graph, every edge kept
        assert g["ops"] == [n["id"] for n in view["nodes"]], name
        assert g["edges"] == sum(len(n["incomingEdges"]) for n in view["nodes"]) > 0, name
        seen.add(key.split(".")[0])
    assert seen == {"inference", "forward", "backward", "joint"}
    assert len(files) == 20 + 4 + 2


@pytest.mark.slow
def test_nested_modules_become_nested_layers_and_an_escaped_slash_stays_one(web_loaded):
    _, loaded, _ = web_loaded
    for kind in ("inference", "forward", "backward", "joint"):
        g = loaded[f"nested/{kind}"]["collections"][0]["graphs"][kind]
        layers = {tuple(x) for x in g["layers"]}
        assert {("", "stages"), ("stages", "0"), ("stages/0", "blocks"), ("stages/0/blocks", "<x y>"),
                ("stages/0/blocks/<x y>", "inner"), ("stages/0/blocks/<x y>/inner", "a/b"),
                ("stages/0/blocks/<x y>/inner", "c-d"), ("", "head"), ("", "inputs")} <= layers, layers
        # "a/b" is one layer inside "inner": model-explorer made no layer "a" (nor "b")
        assert not {label for _, label in layers} & {"a", "b"}, layers
    odd = loaded["odd/forward"]["collections"][0]["graphs"]["forward"]
    assert odd["errors"] == []
    assert {tuple(x) for x in odd["layers"]} == {
        ("", "stages"), ("stages", "0"), ("stages/0", "blocks"), ("stages/0/blocks", "a/b"),
        ("stages/0/blocks/a\\/b", "inner"), ("", "odd\u2216"), ("odd\u2216", "tail")}, odd["layers"]


@pytest.mark.slow
def test_model_explorer_s_web_app_reads_each_node_data_file_for_its_graph(web_loaded):
    files, loaded, _ = web_loaded
    read = {name.removeprefix("node-data "): v for name, v in loaded.items() if name.startswith("node-data ")}
    assert len(read) >= 12, sorted(read)  # every graph with a checked output
    for name, by_graph in read.items():
        (key, nodes), = by_graph.items()
        view = json.loads(files[name].read_text())["graphs"][0]
        assert nodes and set(nodes) <= {n["id"] for n in view["nodes"]}, (name, nodes)


@pytest.mark.slow
def test_the_form_written_before_is_the_one_model_explorer_refused(web_loaded):
    """The planted fault: graphs without the collection's label, as the issue saw it ("Error")."""
    _, loaded, _ = web_loaded
    assert loaded["before"] == {"error": "Unsupported JSON format"}
