"""`aotpipe ops` coverage counts, pinned on a tiny tree: the format v2 fixture's mlp and
running_norm with only their inference graphs (the captured one, and the one the passes made,
where reinplace turned relu into relu_ and add into add_). core ATen lists relu and add but
not their in-place forms: so every count below is known. Fast (no model is captured)."""

import csv
import difflib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus import opcov
from aotpipe.corpus.opcov import MAX_COUNTED, MAX_SIGNATURES, OpRow
from aotpipe.errors import AotpipeError

FIXTURE = Path(__file__).resolve().parent / "data" / "format_v2"
DERIVED = "inference.freeze+fold_conv_bn+channels_last+reinplace"


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _tiny(root, models=("mlp", "running_norm")):
    for m in models:
        shutil.copytree(FIXTURE / m, root / m, ignore=shutil.ignore_patterns("blobs", "*.input"))
        path = root / m / "manifest.json"
        data = json.loads(path.read_text())
        data["graphs"] = {k: v for k, v in data["graphs"].items() if k.startswith("inference")}
        path.write_text(json.dumps(data))
    return root


@pytest.fixture()
def tiny(tmp_path):
    return _tiny(tmp_path / "t")


@pytest.fixture()
def mlp(tmp_path):
    return _tiny(tmp_path / "m", ("mlp",))


def plant(root, model, folder, node, target):
    """Make node `node` of one graph call `target`."""
    path = root / model / folder / "graph.json"
    g = json.loads(path.read_text())
    next(n for n in g["nodes"] if n["name"] == node)["target"] = target
    path.write_text(json.dumps(g))


def supported_file(tmp_path, *lines):
    path = tmp_path / "supported.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def ops_json(*args):
    r = cli("ops", *args, "--json")
    return r.exit_code, json.loads(r.stdout)


# ---------------------------------------------------------------------------------------
# Counts


def test_core_aten_counts_the_in_place_ops_as_unsupported_and_the_rest_as_covered(tiny):
    code, data = ops_json(tiny, "--backend", "core_aten")
    assert code == 1  # an op not covered
    how = {o["op"]: (o["count"], o["supported"], o["how"]) for o in data["ops"]}
    assert how["aten.relu.default"] == (2, True, "core") and how["aten.relu_.default"] == (2, False, None)
    assert how["aten.add.Tensor"] == (3, True, "core") and how["aten.add_.Tensor"] == (1, False, None)
    assert sum(not s for _, s, _ in how.values()) == 2
    assert data["coverage"] == [
        {"model": "mlp", "calls": 16, "supported_calls": 14, "graphs": 2, "graphs_fully_supported": 1,
         "distinct": 4, "distinct_supported": 3},
        {"model": "running_norm", "calls": 14, "supported_calls": 13, "graphs": 2, "graphs_fully_supported": 1,
         "distinct": 7, "distinct_supported": 6}]
    firsts = {(g["model"], g["graph"]): (g["calls"], g["supported_calls"], g["first_unsupported"]) for g in data["graphs"]}
    assert firsts == {("mlp", "inference"): (8, 8, None),
                      ("mlp", DERIVED): (8, 6, {"node": "relu", "op": "aten.relu_.default"}),
                      ("running_norm", "inference"): (7, 7, None),
                      ("running_norm", DERIVED): (7, 6, {"node": "add", "op": "aten.add_.Tensor"})}
    assert data["models"] == 2 and data["supported_by"] == "backend core_aten" and data["problems"] == []


def test_the_text_table_shows_the_same_counts(tiny):
    r = cli("ops", tiny, "--backend", "core_aten")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0] == "9 ops, 30 calls, in 4 graphs of 2 models; supported: backend core_aten"
    assert lines[2].split() == ["op", "calls", "models", "graph", "kinds", "supported", "input", "signatures",
                                "(dtype[rank])"]
    relu_ = next(l for l in lines if l.startswith("aten.relu_.default "))
    assert relu_.split()[:5] == ["aten.relu_.default", "2", "1", "inference", "NO"]
    assert next(l for l in lines if l.startswith("aten.addmm.default ")).split()[:5] == [
        "aten.addmm.default", "8", "2", "inference", "core"]
    i = lines.index("Coverage per model (backend core_aten):")
    assert [l.split() for l in lines[i + 2:i + 5]] == [
        ["model", "calls", "covered", "distinct", "ops", "graphs", "covered"],
        ["mlp", "14/16", "(87.5%)", "3/4", "1/2"], ["running_norm", "13/14", "(92.9%)", "6/7", "1/2"]]
    assert lines[i + 5:] == ["", "First unsupported op of each graph:",
                             f"  mlp/{DERIVED}: aten.relu_.default (node relu)",
                             f"  running_norm/{DERIVED}: aten.add_.Tensor (node add)"]


def test_every_op_covered_exits_0_with_every_graph_covered(mlp, tmp_path):
    path = supported_file(tmp_path, "aten.*")
    r = cli("ops", mlp, "--supported", path)
    assert r.exit_code == 0, r.output
    assert "First unsupported" not in r.output
    assert [l.split() for l in r.output.splitlines() if l.startswith("mlp ")] == [["mlp", "16/16", "(100.0%)", "4/4", "2/2"]]


def test_without_a_supported_set_ops_are_listed_and_nothing_is_judged(tiny):
    code, data = ops_json(tiny)
    assert code == 0
    assert "coverage" not in data and "graphs" not in data and data["supported_by"] is None
    assert all(o["supported"] is None and o["how"] is None for o in data["ops"])
    first = [o for o in data["ops"]][:2]
    assert [(o["op"], o["count"]) for o in first] == [("aten.addmm.default", 8), ("aten.permute.default", 8)]
    text = cli("ops", tiny).output.splitlines()
    assert text[0] == "9 ops, 30 calls, in 4 graphs of 2 models" and "supported" not in text[2]
    assert "Coverage per model" not in "\n".join(text)


def test_ops_are_ordered_by_calls_then_name_with_models_and_kinds(tiny):
    table = opcov.op_table(tiny)
    assert [(r.op, r.count) for r in table.ops][:4] == [
        ("aten.addmm.default", 8), ("aten.permute.default", 8), ("aten.add.Tensor", 3), ("aten.mean.dim", 2)]
    addmm = table.ops[0]
    assert (addmm.models, addmm.kinds) == ({"mlp", "running_norm"}, {"inference"})
    assert addmm.signatures == ["float32[1], float32[2], float32[2]"] and addmm.more_signatures == 0


def test_a_forward_graph_counts_under_its_kind(tmp_path):
    root = tmp_path / "f"
    shutil.copytree(FIXTURE / "mlp", root / "mlp", ignore=shutil.ignore_patterns("blobs", "*.input"))
    table = opcov.op_table(root)
    assert {k for r in table.ops for k in r.kinds} == {"inference", "forward", "backward", "joint"}
    assert next(r for r in table.ops if r.op == "aten.le.Scalar").kinds == {"backward", "joint"}


@pytest.mark.parametrize("key, kind", [("inference", "inference"), ("forward_1", "forward"), (DERIVED, "inference"),
                                       ("backward_2.freeze", "backward"), ("not a key", "not a key")])
def test_base_kind_of_each_graph_key(key, kind):
    assert opcov.base_kind(key) == kind


def test_a_model_without_calls_has_no_distinct_counts(tiny):
    for folder in ("mlp_inference_0", f"mlp_inference_0.{DERIVED[len('inference.'):]}"):
        path = tiny / "mlp" / folder / "graph.json"
        g = json.loads(path.read_text())
        g["nodes"] = [n for n in g["nodes"] if n["op"] != "call_function"]
        path.write_text(json.dumps(g))
    code, data = ops_json(tiny, "--backend", "core_aten")
    mlp = data["coverage"][0]
    assert mlp == {"model": "mlp", "calls": 0, "supported_calls": 0, "graphs": 2, "graphs_fully_supported": 2}
    line = next(l for l in cli("ops", tiny, "--backend", "core_aten").output.splitlines() if l.startswith("mlp "))
    assert line.split() == ["mlp", "0/0", "(100.0%)", "0/0", "2/2"]


def test_an_unreadable_graph_is_a_problem_and_not_a_covered_graph(tiny):
    (tiny / "mlp" / "mlp_inference_0" / "graph.json").write_text("{ not json")
    code, data = ops_json(tiny, "--backend", "core_aten")
    assert code == 2
    assert data["problems"] == [f"{tiny / 'mlp' / 'mlp_inference_0' / 'graph.json'}: not valid JSON (line 1: "
                                "Expecting property name enclosed in double quotes)"]
    g = next(g for g in data["graphs"] if (g["model"], g["graph"]) == ("mlp", "inference"))
    assert (g["calls"], g["supported_calls"], g["first_unsupported"]) == (0, 0, None) and g["problem"]
    assert data["coverage"][0]["graphs_fully_supported"] == 0
    assert cli("ops", tiny).output.splitlines()[-1] == f"problem: {data['problems'][0]}"


def test_past_an_unreadable_graph_the_model_s_other_graphs_are_counted(mlp):
    (mlp / "mlp" / "mlp_inference_0" / "graph.json").write_text("[")  # the first graph, in key order
    table = opcov.op_table(mlp)
    assert [(g.graph, g.ops, g.problem is not None) for g in table.graphs] == [("inference", 0, True), (DERIVED, 8, False)]
    assert {r.op: r.count for r in table.ops} == {"aten.addmm.default": 3, "aten.permute.default": 3,
                                                  "aten.relu_.default": 2}


def test_a_call_without_a_target_is_counted_as_the_op_question_mark(mlp):
    plant(mlp, "mlp", "mlp_inference_0", "relu_1", None)
    table = opcov.op_table(mlp)
    assert next(r for r in table.ops if r.op == "?").count == 1


def test_the_tree_is_walked_once(tiny, monkeypatch):
    import aotpipe.trust.verify as verify

    walks = []
    find = verify.find_artifacts
    monkeypatch.setattr(verify, "find_artifacts", lambda r: walks.append(r) or find(r))
    assert opcov.op_table(tiny).models == 2 and walks == [tiny]


def test_an_unreadable_manifest_is_a_problem(tiny):
    (tiny / "mlp" / "manifest.json").write_text("[]")
    code, data = ops_json(tiny)
    assert code == 2 and len(data["problems"]) == 1 and data["problems"][0].startswith(str(tiny / "mlp" / "manifest.json"))
    assert {m for o in data["ops"] for m in o["models"]} == {"running_norm"}


def test_a_tree_of_only_incomplete_folders_is_listed_with_its_problem(tiny):
    (tiny / "mlp" / "manifest.json").unlink()
    (tiny / "running_norm" / "manifest.json").unlink()
    code, data = ops_json(tiny)
    assert code == 2 and data["models"] == 0 and len(data["problems"]) == 2


def test_a_folder_with_no_artefact_or_not_a_folder_is_a_user_error(tmp_path):
    with pytest.raises(AotpipeError) as e:
        opcov.op_table(tmp_path)
    assert str(e.value) == (f"{tmp_path}: no artefacts found (looked for manifest.json in it and every folder below); "
                            "pass a pipeline's output folder, e.g. artifacts/quickstart")
    with pytest.raises(AotpipeError, match="not a folder"):
        opcov.op_table(tmp_path / "absent")


# ---------------------------------------------------------------------------------------
# Supported sets


def test_a_supported_file_covers_exact_overloads_packets_and_namespaces_and_python_ops(mlp, tmp_path):
    plant(mlp, "mlp", "mlp_inference_0", "permute_1", "operator.getitem")
    plant(mlp, "mlp", "mlp_inference_0", "permute_2", "torch.sym_max")
    plant(mlp, "mlp", "mlp_inference_0", "relu_1", "prims.convert_element_type.default")
    plant(mlp, "mlp", "mlp_inference_0", "addmm_2", "torch.sym_sqrt")
    path = supported_file(tmp_path, "# my backend", "", "aten.addmm.default  # exact", "aten.relu", "prims.*",
                          "aten.permute.default")
    how = {r.op: r.how for r in opcov.op_table(mlp, opcov.supported_from_file(path), "file").ops}
    assert how == {"aten.addmm.default": "listed", "aten.relu.default": "listed (every overload)",
                   "aten.relu_.default": None, "aten.permute.default": "listed",
                   "prims.convert_element_type.default": "listed (namespace)", "operator.getitem": "python",
                   "torch.sym_max": "python", "torch.sym_sqrt": None}


@pytest.mark.parametrize("line", ["aten", "aten.a.b.c", "aten.add-x.default", "aten.*.default", "*.add", "aten.add.*",
                                  "1aten.add", "aten.", "*"])
def test_a_line_that_is_not_an_op_name_is_one_line_naming_file_and_line(tmp_path, line):
    path = supported_file(tmp_path, "aten.add", line)
    with pytest.raises(AotpipeError) as e:
        opcov.supported_from_file(path)
    assert str(e.value) == (f"{path}:2: {line!r} is not an op name; write ns.op.overload (aten.addmm.default), ns.op "
                            "(every overload) or ns.* (a namespace)")


def test_a_supported_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(AotpipeError, match=r"absent.txt: cannot read the supported set \(FileNotFoundError: No such "):
        opcov.supported_from_file(tmp_path / "absent.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"aten.add\xff\n")
    with pytest.raises(AotpipeError, match=r"latin1.txt: cannot read the supported set \(UnicodeDecodeError: "):
        opcov.supported_from_file(bad)


def test_a_supported_set_is_read_as_utf_8_whatever_the_locale_says(tmp_path):
    import locale
    import sys

    if sys.flags.utf8_mode:
        pytest.skip("Python's UTF-8 mode: every locale reads as UTF-8")
    path = supported_file(tmp_path, "aten.add  # caf\u00e9's own list")
    was = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # ASCII: a file read in the locale's encoding fails on the "\u00e9"
    try:
        assert opcov.supported_from_file(path)("aten.add.Tensor") == "listed (every overload)"
    finally:
        locale.setlocale(locale.LC_CTYPE, was)


def test_an_unknown_backend_lists_the_known_ones():
    with pytest.raises(AotpipeError, match=r"--backend 'tvm' is not known; use one of: inductor, core_aten"):
        opcov.supported_by_backend("tvm")


@pytest.mark.parametrize("op", ["aten.relu", "aten.relu.default.x", "mylib.relu.default", "aten.no_such_op.default",
                                "aten.relu.no_such_overload", "aten.re-lu.default"])
def test_a_name_that_is_no_built_in_op_resolves_to_nothing(op):
    assert opcov._resolve(op) is None
    assert opcov.supported_by_backend("core_aten")(op) is None


def test_core_aten_takes_prims_and_python_ops_and_resolves_built_in_ones():
    core = opcov.supported_by_backend("core_aten")
    assert opcov._resolve("aten.relu.default") is not None
    assert (core("prims.convert_element_type.default"), core("operator.getitem"), core("aten.relu.default"),
            core("aten.relu_.default")) == ("prims", "python", "core", None)
    assert torch.Tag.core not in torch.ops.rngprims.philox_rand.default.tags
    assert core("rngprims.philox_rand.default") == "prims"  # the random prims too, core-tagged or not


def test_every_target_in_python_s_operator_namespace_is_python_s_however_many_parts():
    for op in ("operator.getitem", "operator.a.b"):
        assert opcov._python_op(op) and opcov.supported_by_backend("core_aten")(op) == "python"
    assert not opcov._python_op("torch.operator.x") and not opcov._python_op("operatorx.getitem")


@pytest.fixture()
def inductor_tables(monkeypatch):
    """torch._inductor's tables, small and known (importing inductor takes half a minute on a
    loaded machine; tests/test_opcov.py reads the real ones): relu lowered (an overload), add
    (every overload), abs_ and addbmm lowered, addbmm an explicit fallback too, mul and abs
    decomposed."""
    import sys
    from types import SimpleNamespace

    import torch

    aten = torch.ops.aten
    lowering = SimpleNamespace(lowerings={aten.relu.default: 1, aten.add: 1, aten.addbmm.default: 1,
                                          aten.abs_.default: 1}, fallbacks={aten.addbmm.default})
    decomposition = SimpleNamespace(decompositions={aten.mul.Tensor: 1, aten.abs.default: 1})
    monkeypatch.setitem(sys.modules, "torch._inductor", SimpleNamespace(lowering=lowering, decomposition=decomposition))
    return opcov.supported_by_backend("inductor")


@pytest.mark.parametrize("op, how", [
    ("aten.relu.default", "lowered"), ("aten.add.Tensor", "lowered"), ("aten.add.Scalar", "lowered"),
    ("aten.addbmm.default", "fallback kernel"), ("aten.mul.Tensor", "decomposed"), ("aten.mul.Scalar", None),
    ("aten.sub.Tensor", None),
    # in place: covered through the functional form inductor sees after functionalization
    ("aten.relu_.default", "functionalized: lowered"), ("aten.add_.Tensor", "functionalized: lowered"),
    ("aten.mul_.Tensor", "functionalized: decomposed"), ("aten.sub_.Tensor", None),
    ("aten.addbmm_.default", "functionalized: fallback kernel"),
    ("aten.abs_.default", "lowered"),  # its own entry first: inductor lowers abs_ itself
    ("operator.getitem", "python"), ("torch.sym_min", "python"), ("mylib.relu_.default", None),
    ("aten.no_such_op_.default", None), ("aten.relu", None)])
def test_inductor_coverage_from_its_tables(inductor_tables, op, how):
    assert inductor_tables(op) == how


# ---------------------------------------------------------------------------------------
# Signatures, CSV


def test_signatures_are_kept_up_to_the_bound_then_counted():
    row = OpRow("x")
    for i in range(MAX_SIGNATURES):
        row.add_signature(f"s{i}")
    row.add_signature("s0")  # seen: nothing changes
    assert len(row.signatures) == MAX_SIGNATURES and row.more_signatures == 0
    row.add_signature("extra")
    row.add_signature("extra")
    assert len(row.signatures) == MAX_SIGNATURES and row.more_signatures == 1
    for i in range(MAX_COUNTED + 5):
        row.add_signature(f"more{i}")
    assert row.more_signatures == MAX_COUNTED
    assert opcov._sigs(row).endswith(f"; +{MAX_COUNTED} more") and opcov._sigs(row).startswith("(s0); (s1)")


def test_csv_says_yes_no_or_nothing_for_supported(tiny):
    def table(*args):
        r = cli("ops", tiny, "--csv", *args)
        return {row["op"]: row for row in csv.DictReader(io.StringIO(r.stdout))}

    judged = table("--backend", "core_aten")
    assert (judged["aten.relu.default"]["supported"], judged["aten.relu.default"]["how"]) == ("yes", "core")
    assert (judged["aten.relu_.default"]["supported"], judged["aten.relu_.default"]["how"]) == ("no", "")
    assert judged["aten.addmm.default"]["count"] == "8" and judged["aten.addmm.default"]["models"] == "mlp running_norm"
    assert judged["aten.addmm.default"]["graph_kinds"] == "inference"
    assert table()["aten.relu.default"]["supported"] == ""


def test_csv_escapes_every_non_ascii_character_of_a_name_and_ends_each_row_with_a_newline():
    row = OpRow("aten.relu.default", 2, models={"mod\u00e8le", "\u0430lexnet"}, kinds={"inference"})
    text = opcov.to_csv(opcov.OpsTable([row], [], 2, []))
    assert text == ("op,count,models,graph_kinds,signatures,supported,how\n"  # "\n" ends a row, as a terminal takes it
                    "aten.relu.default,2,mod\\xe8le \\u0430lexnet,inference,,,\n")


def test_json_lists_each_op_with_its_kinds_and_signatures():
    row = OpRow("aten.relu.default", 3, models={"b", "a"}, kinds={"forward", "inference"}, signatures=["float32[2]"],
                more_signatures=2)
    assert opcov.to_json(opcov.OpsTable([row], [], 2, []))["ops"] == [
        {"op": "aten.relu.default", "count": 3, "models": ["a", "b"], "graph_kinds": ["forward", "inference"],
         "signatures": ["float32[2]"], "more_signatures": 2, "supported": None, "how": None}]


# ---------------------------------------------------------------------------------------
# The output as a person and a spreadsheet read it, against reviewed copies

GOLDEN = Path(__file__).resolve().parent / "data" / "ops.golden.txt"
HOSTILE_OP = "aten.x\x1b[31m\nred.default"


def test_the_text_table_and_csv_read_as_reviewed(tmp_path):
    """`aotpipe ops` output is read by people and by spreadsheets: a change to its layout is
    deliberate (rewrite the copy with AOTPIPE_UPDATE_GOLDEN=1 and review the diff). The tree:
    a model with a name past the column, an op called from three kinds, a hostile op name, a
    supported set whose `how` is past its column."""
    root = _tiny(tmp_path / "g", ("mlp",))
    shutil.copytree(FIXTURE / "running_norm", root / "running_norm", ignore=shutil.ignore_patterns("blobs", "*.input"))
    path = root / "running_norm" / "manifest.json"
    data = json.loads(path.read_text())
    data["model"]["name"] = "running_norm_with_a_long_name"
    path.write_text(json.dumps(data))
    plant(root, "mlp", "mlp_inference_0", "relu_1", HOSTILE_OP)
    supported = supported_file(tmp_path, "aten.addmm  # every overload", "aten.permute.default", "aten.mean.dim",
                               "prims.*")
    r = cli("ops", root, "--supported", supported)
    csv_out = cli("ops", root, "--supported", supported, "--csv").stdout
    plain = cli("ops", root).output
    text = "\n".join(["== text, --supported", r.output, "== csv", csv_out, "== text", plain]).replace(str(supported), "S")
    if os.environ.get("AOTPIPE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert r.exit_code == 1
    assert text == GOLDEN.read_text(), "".join(difflib.unified_diff(
        GOLDEN.read_text().splitlines(True), text.splitlines(True), "golden", "now"))


def test_an_empty_table_keeps_its_columns(tmp_path):
    root = _tiny(tmp_path / "e", ("mlp",))
    for g in root.glob("mlp/*/graph.json"):
        data = json.loads(g.read_text())
        data["nodes"] = [n for n in data["nodes"] if n["op"] != "call_function"]
        g.write_text(json.dumps(data))
    lines = opcov.text_lines(opcov.op_table(root))
    assert lines[:3] == ["0 ops, 0 calls, in 2 graphs of 1 models", "",
                         "op".ljust(10) + " " + "calls".rjust(6) + " " + "models".rjust(6) + "  " + "graph kinds".ljust(33)
                         + " input signatures (dtype[rank])"]


def test_the_op_column_is_as_wide_as_the_first_500_ops_names():
    ops = [OpRow(f"aten.op{i:03d}.default", 1) for i in range(500)]
    longest = "aten.zz_the_501st_op_and_the_longest.default"
    lines = opcov.text_lines(opcov.OpsTable(ops + [OpRow(longest, 1)], [], 1, []))
    width = len("aten.op000.default")
    assert lines[2].index("calls") == width + 2  # "op" padded to the width, a space, "calls" right in 6
    assert lines[-1].startswith(longest + " ") and lines[3].startswith("aten.op000.default      1")


def test_a_comment_may_hold_another_hash_and_a_long_bad_name_is_cut_to_80(tmp_path):
    path = supported_file(tmp_path, "aten.add  # see #123 # and more")
    assert opcov.supported_from_file(path)("aten.add.Tensor") == "listed (every overload)"
    bad = "aten." + "x" * 100 + "-"
    with pytest.raises(AotpipeError) as e:
        opcov.supported_from_file(supported_file(tmp_path, bad))
    assert f": {bad[:80]!r} is not an op name;" in str(e.value)


def test_an_unknown_backend_s_name_is_cut_to_60_and_the_message_offers_a_file():
    with pytest.raises(AotpipeError) as e:
        opcov.supported_by_backend("b" * 100)
    assert str(e.value) == f"--backend {'b' * 60!r} is not known; use one of: inductor, core_aten (or --supported FILE)"


def test_a_library_namespace_op_is_not_covered_even_where_a_table_lists_it(monkeypatch):
    import sys
    from types import SimpleNamespace

    quantized = torch.ops.quantized.linear.default
    monkeypatch.setitem(sys.modules, "torch._inductor", SimpleNamespace(
        lowering=SimpleNamespace(lowerings={quantized: 1}),  # a torch without `fallbacks`
        decomposition=SimpleNamespace(decompositions={torch.ops.aten.mul.Tensor: 1})))
    inductor = opcov.supported_by_backend("inductor")
    assert opcov._resolve("quantized.linear.default") is None
    assert inductor("quantized.linear.default") is None and inductor("aten.mul.Tensor") == "decomposed"


def test_a_graph_key_no_parser_knows_is_its_own_kind_cut_to_its_column(mlp):
    key = "a_graph_key_that_no_parser_knows_of_yet"  # 39 characters: past the 33 of the column
    path = mlp / "mlp" / "manifest.json"
    data = json.loads(path.read_text())
    data["graphs"] = {key: data["graphs"]["inference"]}
    path.write_text(json.dumps(data))
    table = opcov.op_table(mlp)
    assert {k for r in table.ops for k in r.kinds} == {key}
    line = next(l for l in opcov.text_lines(table) if l.startswith("aten.relu.default "))
    assert f"  {key[:33]} (float32[2])" in line and key[:34] not in line


# A rank of a world of 4 (fsdp2): each collective's output bytes on the rank.
RANK = dict(world_size=4, strategy="fsdp2", mesh=[4], mesh_dims=["dp"], rank=1, coords={"dp": 1},
            groups={"0": {"dim": "dp", "ranks": [0, 1, 2, 3]}}, shards={},
            collectives=[dict(graph=g, node=f"n{i}", op=op, group="0", dim="dp", bytes=b) for i, (g, op, b) in
                         enumerate([("forward", "all_gather_into_tensor", 400), ("backward", "reduce_scatter_tensor", 100),
                                    ("joint", "all_gather_into_tensor", 400), ("inference", "all_gather_into_tensor", 400)])])


def test_a_distributed_ranks_collectives_are_listed_per_step_and_per_inference_call(tmp_path):
    root = _tiny(tmp_path, ("mlp", "running_norm"))
    assert "collectives" not in json.loads(cli("ops", root, "--json").output)
    assert "Collectives per distributed rank" not in cli("ops", root).output
    path = root / "mlp" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "distributed": RANK}))
    r = cli("ops", root, "--json")
    assert r.exit_code == 0, r.output
    # 4 ranks: an all-gather sends 3/4 of its output, a reduce-scatter 3 times it; the joint not counted again
    assert json.loads(r.output)["collectives"] == [{
        "model": "mlp", "rank": 1, "world": 4, "strategy": "fsdp2",
        "step": {"all_gather_into_tensor": {"calls": 1, "bytes": 400, "sent": 300},
                 "reduce_scatter_tensor": {"calls": 1, "bytes": 100, "sent": 300}},
        "inference": {"all_gather_into_tensor": {"calls": 1, "bytes": 400, "sent": 300}}}]
    lines = cli("ops", root).output.splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("Collectives per distributed rank")))
    assert lines[head - 1:] == [
        "",
        "Collectives per distributed rank: a training step's (forward then backward) and an inference call's, by kind; "
        "the bytes the rank sends for them in a ring algorithm (docs/distributed.md)",
        "",
        f"{'model':<24} {'world':<14} {'training step':<58} inference",
        f"{'mlp':<24} {'4 fsdp2':<14} {'all-gather 1, reduce-scatter 1; sends 600 B':<58} all-gather 1; sends 300 B",
    ]
