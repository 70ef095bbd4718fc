"""The speedup's verdict at its bounds (the band around 1.0x, the noisy mark), and how the table,
the CSV and the scores report it: just inside and just outside each bound."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus.bench import command
from aotpipe.corpus.bench.graph import BAND, NOISY, WARMUP, GraphResult, time_interleaved
from aotpipe.corpus.bench.output import result_line, speedup_text, table, verdict_counts, write_csv
from aotpipe.corpus.bench.run import Bench
from aotpipe.corpus.bench.scores import score, scores


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def timed(ratios: list[float], rounds: int = 10):
    """time_interleaved with eager at 1 ms a call and the backend at 1 ms / ratio, the ratios
    taken in turn per timed sample of the backend (cycled; a sample is 2 calls of 1 ms, after
    WARMUP calls)."""
    clock, k = Clock(), [0]

    def eager():
        clock.t += 1e-3

    def backend():
        sample = max(0, k[0] - WARMUP) // 2
        clock.t += 1e-3 / ratios[sample % len(ratios)]
        k[0] += 1

    return time_interleaved(eager, backend, rounds, clock=clock)


@pytest.mark.parametrize("ratio, verdict", [
    ((1 + BAND) * 1.02, "faster"), ((1 + BAND) * 0.98, "within noise"),  # the band's upper edge
    (1 / ((1 + BAND) * 1.02), "slower"), (1 / ((1 + BAND) * 0.98), "within noise"),  # its lower edge
])
def test_a_steady_speedup_is_a_verdict_only_outside_the_band(ratio, verdict):
    t = timed([ratio])
    assert t.speedup == pytest.approx(ratio) and t.verdict == verdict and not t.noisy
    assert t.low == pytest.approx(ratio / (1 + BAND)) and t.high == pytest.approx(ratio * (1 + BAND))


@pytest.mark.parametrize("spread, noisy", [(0.9 * NOISY, False), (1.1 * NOISY, True)])
def test_rounds_are_noisy_only_when_their_spread_is_over_the_noisy_share_of_the_median(spread, noisy):
    # per-round ratios 1 - s/2 and 1 + s/2 by turns: IQR s, median 1
    lo, hi = 1 - spread / 2, 1 + spread / 2
    t = timed([lo, hi])
    assert t.noisy is noisy
    assert t.speedup == pytest.approx(1.0)


def passing(graph: str, speedup: float, low: float, high: float, verdict: str, **kw) -> GraphResult:
    return GraphResult("m", graph, "inference", "pass", "1 outputs within the bound", compile_s=0.5,
                       eager_s=2e-3, backend_s=2e-3 / speedup, speedup=speedup, speedup_low=low,
                       speedup_high=high, verdict=verdict, **kw)


def test_a_speedup_is_a_number_with_its_interval_or_within_noise_with_the_interval_holding_one():
    assert speedup_text(passing("a", 1.5, 1.36, 1.65, "faster")) == "1.50x (1.36-1.65x)"
    assert speedup_text(passing("a", 0.5, 0.45, 0.55, "slower")) == "0.50x (0.45-0.55x)"
    assert speedup_text(passing("a", 1.05, 0.95, 1.16, "within noise")) == "within noise (0.95-1.16x)"
    assert speedup_text(GraphResult("m", "a", "inference", "pass", speedup=2.0)) == "2.00x"
    assert speedup_text(GraphResult("m", "a", "inference", "pass", speedup=2.0, speedup_low=1.0)) == "2.00x"
    assert speedup_text(GraphResult("m", "a", "inference", "compile_error")) == ""


def test_the_table_gives_each_graph_its_line_a_reason_under_a_failure_and_the_scores():
    rs = [passing("a", 1.5, 1.36, 1.65, "faster"), passing("b", 1.05, 0.95, 1.16, "within noise", noisy=True),
          GraphResult("m", "c", "inference", "compile_error", "NotImplementedError: no lowering", compile_s=0.25),
          passing("d", 0.5, 0.45, 0.55, "slower", rescaled=["output 0"], wall_s=2.0, in_backend_s=0.5)]
    lines = table(Bench("eager", rs, scores(rs), 3.0))
    assert lines[0].startswith("graph                status        compile         speedup (eager / eager: median of "
                               "the rounds' ratios, 95% interval widened by 10%), median per call")
    assert lines[1] == ("m a                  pass          compile 0.50 s  1.50x (1.36-1.65x)          eager 2 ms  "
                        "1.333 ms")
    assert lines[2].endswith("within noise (0.95-1.16x)   eager 2 ms  1.905 ms  (noisy)")
    assert lines[3] == "m c                  compile_error compile 0.25 s"
    assert lines[4] == "    NotImplementedError: no lowering"
    assert lines[5].startswith("m d ") and lines[6] == "    1 outputs within the bound"  # rescaled: reason shown
    assert lines[7] == ""
    assert lines[8].startswith("scores     graphs   pass   rate  geomean faster/noise/slower  compile s  S(-5)/ES(-5)")
    assert lines[9].startswith("inference       4      3    75%    0.92x               1/1/1        1.8  ")
    assert lines[10].startswith("all             4      3    75%    0.92x               1/1/1        1.8  ")
    assert lines[11] == "bench's own time (outside eager's compile and run): 75% of the workers' 2.0 s; wall 3.0 s"
    assert len(lines) == 12


def test_verdict_counts_are_of_passing_graphs_only():
    rs = [passing("a", 1.5, 1.36, 1.65, "faster"), passing("b", 1.5, 1.36, 1.65, "faster"),
          passing("c", 1.05, 0.95, 1.16, "within noise"),
          GraphResult("m", "d", "inference", "fail_accuracy", speedup=3.0, verdict="faster")]
    s = score(rs)
    assert s.verdicts == {"faster": 2, "within noise": 1, "slower": 0}
    assert verdict_counts(s) == "2/1/0"


def test_the_csv_row_carries_the_interval_verdict_and_noisy_mark(tmp_path):
    rs = [passing("b", 1.05, 0.95, 1.16, "within noise", noisy=True),
          GraphResult("m", "a", "inference", "timeout", "timed out after 60 s")]
    p = tmp_path / "r.csv"
    write_csv(p, Bench("eager", rs, scores(rs), 1.0))
    rows = p.read_text().splitlines()
    assert rows[0].split(",")[:12] == ["artifact", "graph", "status", "kind", "reason", "compile_s", "eager_ms",
                                       "backend_ms", "speedup", "speedup_low", "speedup_high", "verdict"]
    assert rows[1] == "m,a,timeout,inference,timed out after 60 s,,,,,,,,,,,,,0"
    assert rows[2] == "m,b,pass,inference,1 outputs within the bound,0.500,2,1.905,1.05,0.95,1.16,within noise,,,yes,,,0"


def test_result_line_pads_the_name_to_the_width_given():
    r = GraphResult("m", "a", "inference", "crashed", "SIGSEGV")
    assert result_line(r, 5) == "m a   crashed"


def test_the_cli_prints_the_verdicts_and_exits_0_when_all_pass(tmp_path, monkeypatch):
    rs = [passing("a", 1.5, 1.36, 1.65, "faster"), passing("b", 1.05, 0.95, 1.16, "within noise")]
    monkeypatch.setattr(command, "bench", lambda paths, backend, **kw: Bench(backend, rs, scores(rs), 1.0,
                                                                             ["a note"]))
    r = CliRunner().invoke(main, ["bench", str(tmp_path), "--backend", "eager", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "1.50x (1.36-1.65x)" in r.output and "within noise (0.95-1.16x)" in r.output
    assert "note: a note" in r.output
