"""A graph benched in step with other ranks (graph.Peers, bench --collectives gloo), in process on the
committed mlp artefact with planted peers: every decision a rank takes from its own measurements
is the world's; every reference is run whether an output needs it or not; a rank stops where
another stopped. And what a bench does with a rank's graph besides: its prepared module and
roles are what is compiled; --locate does not bisect it."""

from __future__ import annotations

from pathlib import Path

import pytest

from aotpipe.corpus.bench import graph as graph_mod
from aotpipe.corpus.bench.graph import GraphResult, GraphTask, Peers, Prepared, _stopped, bench_graph, time_interleaved
from aotpipe.corpus.bench.locate import locate_failures
from aotpipe.corpus.bench.run import Bench

from .test_graph import MLP


def test_the_ranks_in_step_agree_on_calls_and_on_timing_again():
    calls = {"n": 0}

    def fn():
        calls["n"] += 1

    asked = []

    def most(v):  # another rank wants 7 calls per sample, and found its timing noisy
        asked.append(v)
        return max(v, 7)

    ticks = iter(range(10 ** 6)).__next__  # each read one tick: this rank's timing is never noisy
    time_interleaved(fn, fn, 2, clock=lambda: float(ticks()), peers=Peers(most))
    # warm-up 3 + 1, then (2 rounds, and 4 more timed again) x 2 sides x 7 calls a sample
    assert calls["n"] == 3 + 1 + (2 + 4) * 2 * 7
    assert asked[1] == 0  # its own timing was not noisy; the world's was
    calls["n"] = 0
    time_interleaved(fn, fn, 2, clock=lambda: float(ticks()))  # alone: its own decisions
    assert calls["n"] < 3 + 1 + (2 + 4) * 2 * 7


def test_a_rank_stops_where_another_rank_of_its_world_failed():
    res = GraphResult("a", "forward", "forward", "pass")
    assert not _stopped(Peers(lambda v: v), False, res, "skipped", "it broke") and res.status == "pass"
    assert _stopped(Peers(lambda v: 1), False, res, "skipped", "it broke")
    assert res.status == "skipped" and res.reason == "another rank of its world stopped the bench: there, it broke"
    res = GraphResult("a", "forward", "forward", "compile_error", reason="mine")
    assert _stopped(Peers(lambda v: 1), True, res, "runtime_error", "x") and res.reason == "mine"
    assert _stopped(None, True, res, "runtime_error", "x") and not _stopped(None, False, res, "runtime_error", "x")


def _references(monkeypatch):
    ran = []
    for name in ("reference64", "sequential_run", "nudged_run"):
        real = getattr(graph_mod, name)

        def counted(*a, _real=real, _name=name, **k):
            ran.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(graph_mod, name, counted)
    return ran


def test_in_step_every_reference_runs_and_every_decision_is_asked(monkeypatch):
    ran = _references(monkeypatch)
    alone = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1))
    assert alone.status == "pass" and "nudged_run" not in ran  # alone: only what an output needs
    ran.clear()
    asked = []
    world = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1),
                        peers=Peers(lambda v: asked.append(v) or v))
    assert world.status == "pass" and world.reason == alone.reason
    assert ran[:2] == ["reference64", "sequential_run"] and ran.count("nudged_run") >= 1
    # ran eagerly, compiled, checked: each agreed on (no rank failed); then the calls a sample makes
    assert asked[:3] == [0, 0, 0] and asked[3] >= 1


def test_a_prepared_graph_is_what_is_compiled_with_its_roles(monkeypatch):
    seen = {}
    real = graph_mod.compile_graph

    def compile_graph(backend, gm, inputs, roles, user=None):
        seen["roles"], seen["gm"] = roles, gm
        return real(backend, gm, inputs, roles, user)

    monkeypatch.setattr(graph_mod, "compile_graph", compile_graph)

    def prepare(ga):
        return Prepared(ga.module, ga.saved_inputs(), ["planted"] * len(ga.record.inputs))

    r = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1), prepare=prepare)
    assert r.status == "pass" and set(seen["roles"]) == {"planted"}


def test_locate_leaves_a_ranks_failing_graph_and_says_so(tmp_path):
    failing = GraphResult("m.rank0", "inference", "inference", "fail_accuracy", path=str(Path(MLP)),
                          collectives="recorded")
    (located,) = locate_failures(Bench("eager", [failing], {}, 0.0), tmp_path, timeout_s=60)
    assert (located.artifact, located.graph, located.found) == ("m.rank0", "inference", False)
    assert located.reason == ("a distributed rank's graph: --locate does not bisect one yet (its collectives run with "
                              "its world's ranks)")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("stage, status, there", [
    (0, "skipped", "the loaded graph does not run eagerly"),
    (1, "runtime_error", "it does not compile and run"),
])
def test_a_rank_whose_world_stopped_says_where_and_goes_no_further(monkeypatch, stage, status, there):
    asked = []

    def most(v):  # another rank failed at the `stage`-th decision
        asked.append(v)
        return 1 if len(asked) == stage + 1 else v

    r = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1), peers=Peers(most))
    assert (r.status, r.reason) == (status, f"another rank of its world stopped the bench: there, {there}")
    assert len(asked) == stage + 1 and r.eager_s is None and r.wall_s > 0
