"""bench --minimize (aotpipe/corpus/bench/minimize.py): a located culprit cut down to the fewest of
its producers that still fail, written as a repro artefact and a standalone script; one that no
longer fails as written is refused; a fault that needs more of the graph keeps the prefix. On the
committed mlp artefact and small inline graphs, with the planted backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.corpus.bench import minimize as minimize_mod
from aotpipe.corpus.bench.backends import Backend
from aotpipe.corpus.bench.crashes import CrashTask, Outcome, try_graph
from aotpipe.corpus.bench.locate import Located, first_faulty_node
from aotpipe.corpus.bench.minimize import MAX_DEPTH, MinimizeTask, cut

from .test_graph import MLP

PLANTED = "tests.bench.backends"


def _task(tmp_path, backend, graph="inference"):
    return MinimizeTask(MLP, "mlp", graph, f"{PLANTED}:{backend}", "saved", 0, str(tmp_path), ())


def test_a_fault_of_one_op_is_cut_to_that_node_alone_and_runs_standalone(tmp_path):
    res = _task(tmp_path, "first_relu_doubled")()
    assert res.found and res.op == "aten.relu.default" and res.repro is None
    m = res.minimized
    assert m.found and (m.depth, m.nodes, m.tries) == (0, 1, 1), m
    art = load(m.repro)
    ga = art.graphs["inference"]
    assert [n.target for n in ga.module.graph.nodes if n.op == "call_function"] == [torch.ops.aten.relu.default]
    # its one input is the value the whole graph's run gave the relu: addmm's
    (inp,) = ga.saved_inputs()
    assert inp.shape == (4, 8) or inp.dim() == 2
    assert "aotpipe bench --minimize: node relu" in " ".join(art.manifest.capture.notes)
    script = Path(m.script)
    assert script.parent == Path(m.repro).parent and script.with_suffix(".inputs.pt").is_file()
    assert not any(p.suffix == ".py" for p in Path(m.repro).iterdir())  # a model folder holds what its manifest lists
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = run.stdout.splitlines()
    err, rms = (float(x) for x in (line.split("RMS error against eager ")[1].split(" ")[0],
                                   line.split("eager's RMS ")[1].rstrip(")")))
    assert err > 0.5 * rms  # doubled: the error is the value itself


def test_a_fault_of_a_pair_keeps_the_producer_it_needs(tmp_path):
    res = _task(tmp_path, "relu_of_addmm_doubled")()
    m = res.minimized
    assert m.found and (m.depth, m.nodes, m.tries) == (1, 2, 2), m
    ops = [n.target for n in load(m.repro).graphs["inference"].module.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.addmm.default, torch.ops.aten.relu.default]


def test_a_repro_that_no_longer_fails_as_written_is_refused_and_not_kept(tmp_path, monkeypatch):
    real = minimize_mod.write_graph

    def healed(pm, *args, **kwargs):  # a fault planted in the writing: the culprit's op changed on the way
        for n in pm.graph.nodes:
            if n.target is torch.ops.aten.relu.default:
                n.target = torch.ops.aten.abs.default
        pm.recompile()
        return real(pm, *args, **kwargs)

    monkeypatch.setattr(minimize_mod, "write_graph", healed)
    res = _task(tmp_path, "first_relu_doubled")()
    m = res.minimized
    assert not m.found and m.repro is None and m.reason.startswith(
        f"refused: the minimised repro, loaded back, no longer fails with {PLANTED}:first_relu_doubled"), m
    assert res.repro is not None  # the located prefix is kept instead
    assert [p.name for p in tmp_path.iterdir()] == [Path(res.repro).name]


def test_a_fault_that_needs_more_than_the_deepest_cut_keeps_the_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(minimize_mod, "MAX_DEPTH", 0)
    res = _task(tmp_path, "relu_of_addmm_doubled")()
    m = res.minimized
    assert not m.found and m.tries == 1 and "no cut of up to 0 producers around relu fails as the graph does" in m.reason
    assert res.repro is not None and Path(res.repro).is_dir()


def test_a_cut_feeds_every_outside_value_as_an_input_and_keeps_the_producers_asked_for():
    def f(x, w):
        a = x * 2
        b = a + w
        return torch.relu(b) * 3

    gm = make_fx(f)(torch.randn(3), torch.randn(3))
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    ops = [[n.target for n in cut(gm, relu, d)[0].graph.nodes if n.op == "call_function"] for d in range(MAX_DEPTH)]
    aten = torch.ops.aten
    assert ops == [[aten.relu.default], [aten.add.Tensor, aten.relu.default],
                   [aten.mul.Tensor, aten.add.Tensor, aten.relu.default]]
    assert [cut(gm, relu, d)[1] for d in range(3)] == [["add"], ["mul", "w_1"], ["x_1", "w_1"]]


def test_bench_minimize_from_the_command_line(tmp_path):
    out = tmp_path / "repros"
    r = CliRunner().invoke(main, ["bench", MLP, "--backend", f"{PLANTED}:first_relu_doubled", "--graphs", "inference",
                                  "--minimize", "--locate-dir", str(out), "--no-progress", "--rounds", "2", "--json"])
    assert r.exit_code == 1, r.output
    data = json.loads(r.output)
    (located,) = data["located"]
    m = located["minimized"]
    assert m["found"] and m["nodes"] == 1 and Path(m["repro"]).parent == out and Path(m["script"]).is_file()
    (bug,) = data["bugs"]
    assert (bug["signature"], bug["graphs"], bug["repro"], bug["repro_nodes"]) == (
        "fail_accuracy at aten.relu.default(float32)", ["mlp inference"], m["repro"], 1)
    r = CliRunner().invoke(main, ["bench", MLP, "--backend", f"{PLANTED}:first_relu_doubled", "--graphs", "inference",
                                  "--minimize", "--locate-dir", str(tmp_path / "again"), "--no-progress", "--rounds",
                                  "2"])
    assert "    minimised: 1 node(s), node aten.relu.default with 0 level(s) of producers, 1 cut(s) tried: " in r.output
    tail = r.output.splitlines()[-4:]
    assert tail[0] == "1 unique bug(s) among 1 failing graph(s)" and tail[1] == \
        "bug 1: fail_accuracy at aten.relu.default(float32)"


def test_first_faulty_node_then_minimise_on_an_inline_graph(tmp_path):
    def f(x):
        return torch.nn.functional.gelu(x * 3) + 1

    x = torch.randn(16)
    gm = make_fx(f)(x)
    b = Backend(f"{PLANTED}:gelu_as_relu")
    res = Located("m", "inference", False, "")
    culprit, tensors = first_faulty_node(res, gm, [x], ["user"], b, b.resolve())
    task = MinimizeTask("m", "m", "inference", f"{PLANTED}:gelu_as_relu", "saved", 0, str(tmp_path), ())
    m = minimize_mod.minimized_repro(gm, culprit, [x], tensors, b, task)
    assert m.found and m.nodes == 1 and m.op == "aten.gelu.default"


# each try a process forked from the fork server (torch imported once): the bisection and the cuts take ~7 s
def test_a_graph_that_crashes_the_backend_is_cut_to_the_node_it_crashes_on(tmp_path):
    task = CrashTask(MLP, "mlp", "backward", f"{PLANTED}:segfault_on_relu_backward", "saved", 0, str(tmp_path), ())
    res = task()
    assert res.found and res.op == "aten.le.Scalar" and res.reason == "crashed: SIGSEGV, in the backend's compile or run", res
    m = res.minimized
    assert m.found and (m.depth, m.nodes) == (0, 1) and m.reason.startswith("crashed"), m
    ops = [n.target for n in load(m.repro).graphs["inference"].module.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.le.Scalar]
    # the repro's own try crashes the same way; the whole graph with eager does not
    ga = load(m.repro).graphs["inference"]
    assert try_graph(ga.module, ga.saved_inputs(), f"{PLANTED}:segfault_on_relu_backward").status == "crashed"
    assert try_graph(ga.module, ga.saved_inputs(), "eager").status == "pass"


def test_a_try_that_exits_names_its_last_line_and_one_that_hangs_is_stopped_at_its_bound():
    ga = load(MLP).graphs["backward"]
    exits = try_graph(ga.module, ga.saved_inputs(), f"{PLANTED}:exits_on_relu_backward")
    assert exits == Outcome("crashed", "", "backend: cannot go on"), exits
    hangs = try_graph(ga.module, ga.saved_inputs(), f"{PLANTED}:hang_on_relu_backward", timeout=3)
    assert hangs == Outcome("timeout", "", "did not return within 3 s"), hangs
    # the graph itself, the inputs and the backend are sound: the same try with eager passes
    assert try_graph(ga.module, ga.saved_inputs(), "eager") == Outcome("pass")


def test_a_graph_that_does_not_compile_is_cut_and_one_that_passes_alone_is_said_so(tmp_path):
    res = CrashTask(MLP, "mlp", "inference", f"{PLANTED}:fails_to_compile", "saved", 0, str(tmp_path), ())()
    assert res.found and res.minimized.found and res.minimized.nodes == 1
    assert res.reason.startswith("compile_error: NotImplementedError: no lowering for this graph") or \
        res.reason.startswith("compile_error: BackendCompilerFailed"), res.reason
    res = CrashTask(MLP, "mlp", "inference", "eager", "saved", 0, str(tmp_path / "b"), ())()
    assert not res.found and res.reason == "the graph does not fail by itself in a fresh process (pass)"


@pytest.mark.slow  # the quickstart captured, benched, and each of its failing graphs cut down (~3 min)
def test_quickstart_with_a_wrong_op_and_a_crash_is_two_bugs_each_cut_to_a_node(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "AOTPIPE_NO_SANDBOX": "1"}
    run = subprocess.run([sys.executable, "-m", "aotpipe", "run", str(root / "pipelines" / "quickstart.yaml"), "--output",
                          str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-2000:]
    bench = subprocess.run([sys.executable, "-m", "aotpipe", "bench", str(tmp_path / "out" / "quickstart"), "--backend",
                            f"{PLANTED}:gelu_as_relu_and_segfault_on_relu_backward", "--minimize", "--locate-dir",
                            str(tmp_path / "repros"), "--rounds", "2", "--json", "--no-progress"],
                           capture_output=True, text=True, timeout=1800, env=env, cwd=root)
    assert bench.returncode == 1, bench.stderr[-2000:]
    data = json.loads(bench.stdout)
    failing = [g for g in data["graphs"] if g["status"] != "pass"]
    assert failing and {g["status"] for g in failing} == {"fail_accuracy", "crashed"}
    assert len(data["located"]) == len(failing)
    for loc in data["located"]:
        assert loc["minimized"]["found"] and loc["minimized"]["nodes"] <= 3, loc
    bugs = data["bugs"]
    assert sorted(b["signature"].split(":")[0] for b in bugs) == ["crashed", "fail_accuracy at aten.gelu.default(float32)"]
    assert sum(len(b["graphs"]) for b in bugs) == len(failing)
    assert all(b["repro_nodes"] == 1 for b in bugs)


def test_aotpipe_minimize_is_bench_minimize_without_the_timing_table(tmp_path):
    out = tmp_path / "repros"
    r = CliRunner().invoke(main, ["minimize", MLP, "--backend", f"{PLANTED}:first_relu_doubled", "--graphs",
                                  "inference", "-o", str(out), "--no-progress"])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    assert lines[0] == f"1 of 2 graphs pass with {PLANTED}:first_relu_doubled; 1 fail:"  # the pass chain made its relu relu_
    assert "scores" not in r.output and "speedup" not in r.output
    assert "minimised: 1 node(s), node aten.relu.default" in r.output and "1 unique bug(s) among 1 failing" in r.output
    assert (out / "mlp-inference-relu-min" / "manifest.json").is_file()
    r = CliRunner().invoke(main, ["minimize", MLP, "--backend", "eager", "--graphs", "inference", "-o",
                                  str(tmp_path / "none"), "--no-progress"])
    assert r.exit_code == 0 and r.output.splitlines() == ["2 of 2 graphs pass with eager"], r.output
    assert not (tmp_path / "none").exists()
