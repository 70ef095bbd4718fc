"""`aotpipe ops`: every op across a tree, read from graph.json (nothing run); coverage against
a supported set (a file or a backend's own tables) and the first unsupported op of each graph."""

import csv
import io
import json
import shutil

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus.opcov import MAX_SIGNATURES, OpRow

PLANTED = "aten.planted_op.default"


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.fixture()
def tree(quickstart_run, tmp_path):
    root, _ = quickstart_run
    dst = tmp_path / "quickstart"
    shutil.copytree(root, dst, ignore=shutil.ignore_patterns("blobs", "*.input"))
    return dst


def _plant(tree, model="mlp", graph="forward", target=PLANTED):
    """Rename the target of one call in one graph; the node's name."""
    path = tree / model / f"{model}_{graph}_0" / "graph.json"
    g = json.loads(path.read_text())
    node = [n for n in g["nodes"] if n["op"] == "call_function"][1]
    node["target"] = target
    path.write_text(json.dumps(g))
    return node["name"]


def _all_ops(tree):
    r = cli("ops", tree, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_a_planted_op_is_listed_with_its_count_model_kind_and_signature(tree):
    _plant(tree)
    data = _all_ops(tree)
    assert data["models"] == 4
    row = next(o for o in data["ops"] if o["op"] == PLANTED)
    assert (row["count"], row["models"], row["graph_kinds"]) == (1, ["mlp"], ["forward"])
    assert row["signatures"] == ["float32[1], float32[2], float32[2]"]  # it replaced mlp's first addmm
    addmm = next(o for o in data["ops"] if o["op"] == "aten.addmm.default")
    assert set(addmm["graph_kinds"]) == {"inference", "forward", "joint"}  # the passes' graph is an inference


def test_the_text_table_and_csv_name_every_op(tree):
    r = cli("ops", tree)
    assert r.exit_code == 0
    first = r.output.splitlines()[0]
    assert first.endswith("in 20 graphs of 4 models")
    assert any(line.startswith("aten.convolution.default ") for line in r.output.splitlines())
    c = cli("ops", tree, "--csv")
    rows = list(csv.DictReader(io.StringIO(c.output)))
    assert {r["op"] for r in rows} == {o["op"] for o in _all_ops(tree)["ops"]}


def test_a_supported_file_gives_coverage_and_the_first_unsupported_op_of_each_graph(tree, tmp_path):
    node = _plant(tree)
    ops = {o["op"] for o in _all_ops(tree)["ops"]} - {PLANTED}
    listed = tmp_path / "supported.txt"
    listed.write_text("# every op the quickstart calls\n" + "\n".join(sorted(ops)) + "\n")
    r = cli("ops", tree, "--supported", listed)
    assert r.exit_code == 1, r.output
    assert f"  mlp/forward: {PLANTED} (node {node})" in r.output
    assert sum(": aten." in line for line in r.output.split("First unsupported op of each graph:")[1].splitlines()) == 1
    data = json.loads(cli("ops", tree, "--supported", listed, "--json").output)
    mlp = next(m for m in data["coverage"] if m["model"] == "mlp")
    assert mlp["supported_calls"] == mlp["calls"] - 1 and mlp["graphs_fully_supported"] == mlp["graphs"] - 1
    listed.write_text(listed.read_text() + f"{PLANTED}\n")
    assert cli("ops", tree, "--supported", listed).exit_code == 0


def test_overload_and_namespace_lines_cover_every_overload(tree, tmp_path):
    listed = tmp_path / "supported.txt"
    listed.write_text("aten.*\n")
    assert cli("ops", tree, "--supported", listed).exit_code == 0  # operator.getitem: every backend's
    listed.write_text("aten.addmm\n")
    data = json.loads(cli("ops", tree, "--supported", listed, "--json").output)
    assert [o["op"] for o in data["ops"] if o["supported"] and o["how"] != "python"] == ["aten.addmm.default"]


def test_a_bad_supported_line_is_one_line_naming_file_and_line(tree, tmp_path):
    listed = tmp_path / "supported.txt"
    listed.write_text("aten.addmm.default\naten add\n")
    r = cli("ops", tree, "--supported", listed)
    assert r.exit_code == 2
    assert r.output == (f"error: {listed}:2: 'aten add' is not an op name; write ns.op.overload (aten.addmm.default), "
                        "ns.op (every overload) or ns.* (a namespace)\n")


def test_an_unknown_backend_lists_the_known_ones(tree):
    r = cli("ops", tree, "--backend", "tvm")
    assert r.exit_code == 2
    assert r.output == "error: --backend 'tvm' is not known; use one of: inductor, core_aten (or --supported FILE)\n"


def test_a_hostile_tree_is_listed_without_running_anything(tree, tmp_path):
    marker = tmp_path / "ran"
    (tree / "mlp" / "mlp_forward_0" / "module.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    _plant(tree, target="os.system")
    _plant(tree, graph="backward", target="aten.\x1b[2Kevil.default")
    r = cli("ops", tree)
    assert r.exit_code == 0, r.output
    assert "os.system " in r.output and "aten.\\x1b[2Kevil.default" in r.output and "\x1b" not in r.output
    assert not marker.exists()


def test_csv_escapes_an_op_name_s_terminal_escape_and_newline_as_the_text_table_does(tree):
    _plant(tree, graph="backward", target="aten.\x1b[31mred\nline.default")
    # color=True: click strips escape sequences itself only when stdout is not a terminal
    r = CliRunner().invoke(main, ["ops", str(tree), "--csv"], color=True)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\r" not in r.output
    rows = list(csv.DictReader(io.StringIO(r.output)))
    assert "aten.\\x1b[31mred\\nline.default" in {row["op"] for row in rows}
    assert len(r.output.splitlines()) == len(rows) + 1  # the newline did not add a line either


def test_an_unreadable_graph_is_named_and_the_rest_still_listed(tree):
    (tree / "small_cnn" / "small_cnn_joint_0" / "graph.json").write_text("{not json")
    r = cli("ops", tree)
    assert r.exit_code == 2
    assert "problem: " in r.output and "small_cnn_joint_0/graph.json" in r.output
    assert "aten.convolution.default" in r.output  # small_cnn's other graphs


def test_signatures_are_bounded():
    row = OpRow("aten.add.Tensor")
    for rank in range(MAX_SIGNATURES + 5):
        row.add_signature(f"float32[{rank}]")
        row.add_signature(f"float32[{rank}]")  # a repeat is not a new one
    assert len(row.signatures) == MAX_SIGNATURES and row.more_signatures == 5


def test_core_aten_backend_marks_inplace_ops_unsupported(tree):
    r = cli("ops", tree, "--backend", "core_aten", "--json")
    assert r.exit_code == 1
    data = json.loads(r.output)
    how = {o["op"]: o["how"] for o in data["ops"]}
    assert how["aten.addmm.default"] == "core" and how["aten.relu_.default"] is None
    first = {(g["model"], g["graph"]): g["first_unsupported"] for g in data["graphs"]}
    assert first[("mlp", "inference.freeze+fold_conv_bn+channels_last+reinplace")] == {
        "node": "relu", "op": "aten.relu_.default"}  # reinplace made it in-place
    assert first[("mlp", "forward")] is None


@pytest.mark.slow
def test_inductor_backend_reads_its_lowering_and_decomposition_tables(tree):
    _plant(tree)
    _plant(tree, graph="backward", target="aten.tanh_.default")  # in place: inductor lowers tanh
    data = json.loads(cli("ops", tree, "--backend", "inductor", "--json").output)
    how = {o["op"]: o["how"] for o in data["ops"]}
    assert how[PLANTED] is None
    assert how["aten.addmm.default"] == "lowered"
    assert how["aten.native_layer_norm.default"] == "decomposed"
    assert how["operator.getitem"] == "python"
    assert how["aten.tanh_.default"] == "functionalized: lowered"


def test_size_arithmetic_counts_as_python_as_artifact_ops_names_it():
    from aotpipe.artifact.ops import SIZE_ARITHMETIC
    from aotpipe.corpus.opcov import _python_op

    assert all(_python_op(name) for name in SIZE_ARITHMETIC)
    assert not _python_op("torch.ops.aten.add") and not _python_op("aten.add.Tensor")


def test_a_tree_is_read_one_model_at_a_time(tree, monkeypatch):
    """`aotpipe ops` on a zoo's tree held every graph.json's nodes at once (7 GB for the
    448-model zoo): the table keeps rows, each model's nodes are let go before the next is read."""
    import gc
    import weakref

    import aotpipe.pipeline.tree as tree_mod

    real_read_model = tree_mod.read_model
    read: list[weakref.ref] = []
    alive_at_read: list[int] = []

    def read_model(folder, root, keep_nodes=True):
        gc.collect()
        alive_at_read.append(sum(r() is not None for r in read))
        view = real_read_model(folder, root, keep_nodes)
        read.extend(weakref.ref(g.nodes) for g in view.graphs if g.nodes is not None)
        return view

    class Nodes(list):  # a list that can be weakly referenced
        pass

    real_read = tree_mod.records.read

    def records_read(cls, path, *root):
        what, rec = real_read(cls, path, *root)
        if cls is tree_mod.GraphRecord:
            rec.nodes = Nodes(rec.nodes)
        return what, rec

    monkeypatch.setattr(tree_mod, "read_model", read_model)
    monkeypatch.setattr(tree_mod.records, "read", records_read)
    data = _all_ops(tree)
    assert data["models"] == 4 and len(alive_at_read) == 4
    assert alive_at_read == [0, 0, 0, 0], alive_at_read  # no earlier model's nodes left when the next is read
