"""The bench's timing: interleaved rounds, the speedup as the median of the rounds' ratios, its
interval (order statistics, widened by graph.BAND) and the verdict it supports; the defaults
(one intra-op thread, the CPU-time clock); eager against itself under a background load."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from aotpipe.corpus.bench.graph import BAND, median_interval, resolve_clock, time_interleaved, verdict


def test_the_median_interval_is_the_order_statistics_the_binomial_tails_allow():
    # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024 <= 2.5% < P(<= 2) = 56/1024, so x(2) .. x(9)
    assert median_interval([float(x) for x in range(10)]) == (1.0, 8.0)
    # n = 20: P(<= 5) = 2.07% <= 2.5% < P(<= 6) = 5.77%, so x(6) .. x(15)
    assert median_interval([float(x) for x in range(20)]) == (5.0, 14.0)
    # n = 5: even P(0) = 3.1% is over 2.5%: the whole range
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)


def test_a_verdict_needs_the_whole_interval_on_one_side_of_one():
    assert verdict(1.0 + 1e-9, 3.0) == "faster"
    assert verdict(1.0, 3.0) == "within noise"
    assert verdict(0.2, 1.0 - 1e-9) == "slower"
    assert verdict(0.2, 1.0) == "within noise"


class FakeClock:
    """A clock that moves only when a timed function says how long it took."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _timed(costs_e, costs_b, rounds=10):
    """time_interleaved with each call's cost taken in turn from the cost lists (cycled)."""
    clock, k = FakeClock(), {"e": 0, "b": 0}

    def run(side, costs):
        def fn():
            clock.t += costs[k[side] % len(costs)]
            k[side] += 1
        return fn

    return time_interleaved(run("e", costs_e), run("b", costs_b), rounds, clock=clock)


def test_a_backend_at_half_eagers_cost_is_faster_by_2x_with_the_band_around_it():
    t = _timed([1e-3], [5e-4])
    assert t.speedup == pytest.approx(2.0)
    assert t.low == pytest.approx(2.0 / (1 + BAND)) and t.high == pytest.approx(2.0 * (1 + BAND))
    assert t.verdict == "faster" and not t.noisy


def test_a_gain_smaller_than_the_band_is_within_noise_not_a_number():
    # 5% faster, exactly every round: the band alone (10%) keeps 1.0 in the interval
    t = _timed([1e-3], [1e-3 / 1.05])
    assert t.speedup == pytest.approx(1.05) and t.verdict == "within noise"
    assert t.low < 1.0 < t.high


def test_rounds_that_swing_widen_the_interval_until_it_holds_one():
    # The backend is 1.15x faster by the median round, but rounds swing between 0.8x and 1.6x.
    t = _timed([1e-3], [1e-3 / r for r in (0.8, 1.6, 1.15, 0.85, 1.5, 1.15, 0.9, 1.4, 1.2, 1.15)])
    assert t.verdict == "within noise" and t.noisy
    assert t.low < 1.0 and t.high > 1.4


def test_a_slowdown_of_a_whole_round_cancels_out_of_the_speedup():
    # Every sample of a round is slowed alike (another process took the core for that round):
    # the sides' own medians swing, the rounds' ratios do not.
    clock, state = FakeClock(), {"calls": 0}

    def cost(base):
        def fn():
            state["calls"] += 1
            # warm-up: calls 1-4; after that each round is 2 samples of 2 calls; every third
            # round runs 5x slower
            rnd = max(0, state["calls"] - 5) // 4
            clock.t += base * (5.0 if rnd % 3 == 2 else 1.0)
        return fn

    t = time_interleaved(cost(1e-3), cost(5e-4), 10, clock=clock)
    assert t.speedup == pytest.approx(2.0) and t.verdict == "faster"
    assert t.low == pytest.approx(2.0 / (1 + BAND)) and t.high == pytest.approx(2.0 * (1 + BAND))


def test_auto_clock_is_cpu_time_with_one_thread_and_wall_time_with_more():
    assert resolve_clock("auto", 1) == "cpu"
    assert resolve_clock("auto", 2) == "wall"
    assert resolve_clock("wall", 1) == "wall" and resolve_clock("cpu", 4) == "cpu"


def _bench_defaults(*args):
    """The bench CLI as a user runs it: no --threads, --clock or --rounds."""
    import json

    from click.testing import CliRunner

    from aotpipe.cli import main

    r = CliRunner().invoke(main, ["bench", *args, "--no-progress", "--no-sandbox", "--json"])
    return r, (json.loads(r.output[r.output.index("{"):]) if "{" in r.output else None)


def test_the_cli_benches_one_thread_with_the_auto_clock_unless_told():
    from aotpipe.cli import bench

    defaults = {p.name: p.default for p in bench.params}
    assert defaults["threads"] == 1 and defaults["clock"] == "auto"


@pytest.mark.slow
def test_eager_against_itself_under_a_background_load_stays_within_the_band(quickstart_run):
    """Two busy processes on top of whatever else runs; the bench at its defaults. The truth is
    1.0x: every graph must be reported within noise, and the geometric mean over the graphs
    lie within 1/(1 + BAND) .. 1 + BAND (docs/bench.md states this band)."""
    root, _ = quickstart_run
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        r, data = _bench_defaults(str(root / "mlp"), str(root / "small_cnn"), "--backend", "eager")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert r.exit_code == 0, r.output
    graphs = data["graphs"]
    assert len(graphs) == 10
    for g in graphs:
        assert g["verdict"] == "within noise", g
        assert g["speedup_low"] <= 1.0 <= g["speedup_high"], g
    gm = math.exp(sum(math.log(g["speedup"]) for g in graphs) / len(graphs))
    assert 1 / (1 + BAND) <= gm <= 1 + BAND, gm
    assert data["scores"]["all"]["verdicts"] == {"faster": 0, "within noise": 10, "slower": 0}
    assert {(g["clock"], g["threads"]) for g in graphs} == {("cpu", 1)}  # the defaults, as the worker ran them


class Scripted:
    """Eager and the backend on an exact clock (dyadic costs, an offset start like
    perf_counter's): each call costs the next of its side's costs, and the sides' calls are
    logged in order."""

    def __init__(self, eager_costs, backend_costs, start=1024.0):
        self.t, self.log = start, []
        self.costs = {"e": list(eager_costs), "b": list(backend_costs)}

    def clock(self) -> float:
        return self.t

    def side(self, name):
        def fn():
            n = sum(1 for x in self.log if x == name)
            costs = self.costs[name]
            self.t += costs[n] if n < len(costs) else costs[-1]
            self.log.append(name)
        return fn

    def timed(self, rounds):
        return time_interleaved(self.side("e"), self.side("b"), rounds, clock=self.clock)


U = 2.0 ** -10  # about 1 ms: SAMPLE_S (2 ms) fits 2 calls of it


def _per_call(per_sample, calls=2):
    return [c for c in per_sample for _ in range(calls)]


def test_rounds_time_samples_of_calls_sized_by_eagers_warm_up_alternating_which_side_goes_first():
    from aotpipe.corpus.bench.graph import WARMUP

    # eager: 1 warm-up call of U (so 2 calls a sample), then rounds whose ratios are 1.25, 1.0,
    # 1.5, 1.125, 1.375: quartiles 1.125, 1.25, 1.375, an IQR of exactly 0.2 of the median (the
    # bound for noisy is "over"). The backend: 3 warm-up calls of 16 U, then U a call.
    ratios = [1.25, 1.0, 1.5, 1.125, 1.375]
    s = Scripted([U] + _per_call([r * U for r in ratios]), [16 * U] * WARMUP + [U])
    t = s.timed(5)
    assert (t.speedup, t.noisy) == (1.25, False)
    assert t.low == pytest.approx(1.0 / (1 + BAND)) and t.high == pytest.approx(1.5 * (1 + BAND))
    assert t.eager == (1.25 * U, 0.25 * U) and t.backend == (U, 0.0)
    assert t.in_backend_s == 3 * 16 * U + 5 * 2 * U  # the warm-up and every timed call
    rounds = ["eebb", "bbee", "eebb", "bbee", "eebb"]
    assert "".join(s.log) == "ebbb" + "".join(rounds)


def test_a_noisy_timing_is_taken_once_more_with_twice_the_rounds():
    # ratios 1.0, 1.5, 1.25, 2.0, 0.5: IQR 0.5 over 0.2 of the median 1.25, on both tries
    ratios = [1.0, 1.5, 1.25, 2.0, 0.5]
    s = Scripted([U] + _per_call([r * U for r in ratios * 3]), [U])
    t = s.timed(5)
    assert t.noisy and t.speedup == 1.25
    assert s.log.count("e") == 1 + (5 + 10) * 2 and s.log.count("b") == 3 + (5 + 10) * 2


def test_a_sample_as_long_as_sample_s_is_one_call():
    s = Scripted([4 * U, 2 * U], [U])  # a warm-up eager call over SAMPLE_S
    t = s.timed(3)
    assert t.speedup == 2.0 and "".join(s.log) == "ebbb" + "eb" + "be" + "eb"


def test_samples_too_short_for_the_clock_to_tick_are_left_out_of_the_ratios():
    # rounds 1 (eager 0 s) and 3 (the backend 0 s) left out: the ratios are 1, 1.125 and 1.25
    e = [1, 0, 1.125, 1, 1.25]
    b = [1, 1, 1, 0, 1]
    s = Scripted([U] + _per_call([x * U for x in e]), [U] * 3 + _per_call([x * U for x in b]))
    t = s.timed(5)
    assert (t.speedup, t.noisy) == (1.125, False) and len(s.log) == 1 + 3 + 5 * 4
    assert t.low == pytest.approx(1.0 / (1 + BAND)) and t.high == pytest.approx(1.25 * (1 + BAND))
    # a clock that never ticks: no ratio at all, the speedup 1.0 and within noise
    t = Scripted([0.0], [0.0]).timed(3)
    assert t.speedup == 1.0 and t.verdict == "within noise"


def test_each_side_is_warmed_up_by_its_own_count(monkeypatch):
    from aotpipe.corpus.bench import graph as graph_mod

    monkeypatch.setattr(graph_mod, "EAGER_WARMUP", 4)
    monkeypatch.setattr(graph_mod, "WARMUP", 2)
    s = Scripted([U], [U])
    s.timed(1)
    assert "".join(s.log) == "ebebee" + "eebb"
    # no eager warm-up call to size the samples by: the most calls a sample makes
    monkeypatch.setattr(graph_mod, "EAGER_WARMUP", 0)
    s = Scripted([U], [U])
    s.timed(1)
    assert s.log.count("e") == graph_mod.MAX_CALLS


def test_auto_clock_without_a_thread_count_reads_torchs():
    from aotpipe.runtime.determinism import intra_op_threads

    with intra_op_threads(1):
        assert resolve_clock("auto", None) == "cpu"
    with intra_op_threads(2):
        assert resolve_clock("auto", None) == "wall"
