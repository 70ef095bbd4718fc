"""Failing graphs grouped into unique bugs (aotpipe/corpus/bench/triage.py, aotpipe triage, bench
--minimize's table): one culprit op is one bug whatever the shapes; another op, or another
status or error, is another; what varies between graphs of one crash (numbers, addresses,
names, paths) does not split it. On planted bench results: nothing is run."""

from __future__ import annotations

import json

from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus.bench.graph import GraphResult
from aotpipe.corpus.bench.locate import Located
from aotpipe.corpus.bench.minimize import Minimized
from aotpipe.corpus.bench.triage import lines, normalised, signature, triage


def _graph(artifact, graph, status, reason=""):
    return {"artifact": artifact, "graph": graph, "kind": graph, "status": status, "reason": reason}



def _located(artifact, graph, op, shapes, nodes=None, repro=None):
    minimized = {"repro": f"r/{artifact}-{graph}-min", "nodes": nodes, "found": True, "reason": ""} if nodes else None
    return {"artifact": artifact, "graph": graph, "found": True, "op": op, "input_shapes": shapes,
            "reason": "x", "repro": repro, "minimized": minimized}


GELU = "aten.gelu.default"
CRASH = "the worker died: SIGSEGV (signal 11) at 0x7f3a2c001000 in node 'relu_3' of /tmp/w1/mlp"

BENCH = {
    "graphs": [
        _graph("bert", "forward", "fail_accuracy"), _graph("bert", "joint", "fail_accuracy"),
        _graph("gpt2", "forward", "fail_accuracy"), _graph("mlp", "backward", "crashed", CRASH),
        _graph("cnn", "backward", "crashed", CRASH.replace("11", "11").replace("0x7f3a2c001000", "0x55d0")
               .replace("relu_3", "relu_12").replace("/tmp/w1/mlp", "/tmp/w7/cnn")),
        _graph("vit", "joint", "fail_accuracy"), _graph("mlp", "inference", "pass"),
        _graph("cnn", "forward", "compile_error", "NotImplementedError: no lowering for this graph"),
    ],
    "located": [
        _located("bert", "forward", GELU, ["float32[2, 16, 64]"], nodes=1),
        _located("bert", "joint", GELU, ["float32[2, 16, 64]"], repro="r/bert-joint"),
        _located("gpt2", "forward", GELU, ["float32[4, 128]"], nodes=3),
        _located("vit", "joint", "aten.add.Tensor", ["float32[1, 5, 8]", "float32[8]"]),
    ],
}


def _typed(bench):
    """The planted results as the bench makes them (and triage.read reads them back)."""
    located = []
    for raw in bench["located"]:
        loc = Located(**{k: v for k, v in raw.items() if k != "minimized"})
        if raw["minimized"]:
            loc.minimized = Minimized(**raw["minimized"])
        located.append(loc)
    return [GraphResult(**g) for g in bench["graphs"]], located


def test_one_culprit_op_is_one_bug_whatever_the_shapes_and_each_other_failure_its_own():
    bugs = triage(*_typed(BENCH))
    assert [(b.signature, b.graphs, b.models) for b in bugs] == [
        (f"fail_accuracy at {GELU}(float32)", ["bert forward", "bert joint", "gpt2 forward"], ["bert", "gpt2"]),
        ("crashed: the worker died: SIGSEGV (signal N) at <addr> in node <name> of <path>", ["mlp backward", "cnn backward"],
         ["mlp", "cnn"]),
        ("compile_error: NotImplementedError: no lowering for this graph", ["cnn forward"], ["cnn"]),
        ("fail_accuracy at aten.add.Tensor(float32, float32)", ["vit joint"], ["vit"]),
    ]
    gelu = bugs[0]
    # the smallest minimised repro, though another graph of the bug was seen first
    assert (gelu.repro, gelu.repro_nodes, gelu.first) == ("r/bert-forward-min", 1, "bert forward")
    assert bugs[3].repro is None and bugs[1].repro is None


def test_a_signature_tells_apart_what_grouping_must_not_merge():
    def sig(status, reason="", located=None):
        loc = None if located is None else Located(**{k: v for k, v in located.items() if k != "minimized"})
        return signature(GraphResult("m", "forward", "forward", status, reason), loc)

    gelu = _located("m", "forward", GELU, ["float32[3]"])
    assert sig("fail_accuracy", located=gelu) != sig("fail_accuracy", located={**gelu, "op": "aten.relu.default"})
    assert sig("fail_accuracy", located=gelu) != sig("fail_accuracy", located={**gelu, "input_shapes": ["float16[3]"]})
    assert sig("fail_accuracy", located=gelu) == sig("fail_accuracy", located={**gelu, "input_shapes": ["float32[9, 9]"]})
    assert sig("fail_accuracy", located={**gelu, "input_shapes": ["float32[3]", "2.5"]}).endswith("(float32, scalar)")
    assert sig("crashed", "SIGSEGV") != sig("timeout", "SIGSEGV")
    assert sig("runtime_error", "RuntimeError: bad") != sig("runtime_error", "ValueError: bad")
    not_found = {**gelu, "found": False, "reason": "the graph's prefixes all pass"}
    assert sig("fail_accuracy", located=not_found) == "fail_accuracy, not located: the graph's prefixes all pass"
    assert sig("fail_accuracy") == "fail_accuracy, not located"


def test_what_varies_between_graphs_of_one_failure_is_taken_out_of_its_reason():
    assert normalised("x 12 at 0xdeadBEEF in '/a/b c' of /home/u/m.py: 1.5e-3\nsecond line") == \
        "x N at <addr> in <name> of <path>: N"
    assert normalised("") == ""


def test_triage_from_the_command_line(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCH))
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert r.exit_code == 1
    assert r.output.splitlines()[:4] == [
        "4 unique bug(s) among 7 failing graph(s)",
        f"bug 1: fail_accuracy at {GELU}(float32)",
        "    3 graph(s) of 2 model(s); first seen: bert forward",
        "    smallest repro (1 node(s)): r/bert-forward-min",
    ]
    assert lines(triage(*_typed(BENCH))) == r.output.splitlines()
    r = CliRunner().invoke(main, ["triage", str(path), "--json"])
    assert [b["first"] for b in json.loads(r.output)] == ["bert forward", "mlp backward", "cnn forward", "vit joint"]
    path.write_text(json.dumps({"graphs": [_graph("m", "forward", "pass")]}))
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert (r.exit_code, r.output.strip()) == (0, "0 unique bug(s) among 0 failing graph(s)")
    path.write_text("[1, 2]")
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert r.exit_code == 2 and "not a bench's results (no 'graphs' list); write one with aotpipe bench" in r.output


def test_a_result_without_the_fields_a_bench_writes_is_refused(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"graphs": [{"artifact": "m"}]}))
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert r.exit_code == 2 and "a result lacks a field" in r.output


def test_ranks_of_one_distributed_model_are_one_model_and_ties_keep_the_first_repro():
    results = [GraphResult(a, "forward", "forward", "crashed", "boom") for a in
               ("llama.rank0", "llama.rank1", "my.rank.model", "rank3", "x.rank2.rank0")]
    located = [Located(a, "forward", True, "x", minimized=Minimized(True, "", nodes=2, repro=f"r/{a}"))
               for a in ("llama.rank0", "llama.rank1")]
    (bug,) = triage(results, located)
    assert bug.models == ["llama", "my.rank.model", "rank3", "x.rank2"] and bug.status == "crashed"
    assert (bug.repro, bug.repro_nodes) == ("r/llama.rank0", 2)  # the same size later does not replace it
    # a located prefix (no minimised one) is the repro where nothing smaller is
    (bug,) = triage(results[:1], [Located("llama.rank0", "forward", True, "x", repro="r/prefix")])
    assert (bug.repro, bug.repro_nodes) == ("r/prefix", None)
    assert lines([bug])[-1] == "    smallest repro: r/prefix"
    (bug,) = triage(results[:1], [])
    assert lines([bug])[-1] == ("    smallest repro: none written (bench --minimize writes one for a value outside the "
                                "bound)")


def test_a_scalar_argument_reads_as_a_scalar_whatever_its_spelling():
    def kinds(*shapes):
        loc = Located("m", "forward", True, "x", op="aten.add.Tensor", input_shapes=list(shapes))
        return signature(GraphResult("m", "forward", "forward", "fail_accuracy"), loc)

    assert kinds("float32[2]", "1", "-2.5", "1e-05", "True", "False", "inf", "-inf", "nan") == \
        "fail_accuracy at aten.add.Tensor(float32, " + ", ".join(["scalar"] * 8) + ")"
    assert kinds("float32[2]", "device") == "fail_accuracy at aten.add.Tensor(float32, device)"


def test_a_file_that_is_not_json_is_refused_naming_it(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text("not json")
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert r.exit_code == 2
    assert f"{path}: not a bench's results (JSONDecodeError: " in r.output
    assert r.output.rstrip().endswith("write one with aotpipe bench ... --json > FILE")
    path.write_text(json.dumps({"graphs": [1]}))  # an entry that is no object: no field at all
    r = CliRunner().invoke(main, ["triage", str(path)])
    assert r.exit_code == 2 and "a result lacks a field" in r.output and r.output.rstrip().endswith("> FILE")
