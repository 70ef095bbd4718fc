"""The bench's scores, timing and baseline files, on planted results (no workers)."""

from __future__ import annotations

import math

import pytest

from aotpipe.corpus.bench import baseline
from aotpipe.corpus.bench.graph import GraphResult, graphnet_tolerance, time_interleaved
from aotpipe.corpus.bench.scores import graphnet_scores, score
from aotpipe.errors import AotpipeError


def result(graph: str, status: str, speedup=None, t=None, kind="inference", compile_s=1.0) -> GraphResult:
    return GraphResult("m", graph, kind, status, "why", compile_s=compile_s, speedup=speedup, graphnet_t=t)


def test_graphnet_s_and_es_follow_its_definition_with_its_defaults():
    rs = [result("a", "pass", 2.0, t=-6), result("b", "compile_error"), result("c", "fail_accuracy", 1.5, t=-2),
          result("d", "crashed")]
    s, es = graphnet_scores(rs)
    g = lambda *xs: math.prod(xs) ** (1 / len(xs))  # noqa: E731
    assert s[-5] == pytest.approx(g(2.0, 0.1, 0.1, 0.1))  # c is not allclose at t = -5: b
    assert s[-1] == pytest.approx(g(2.0, 0.1, 1.5, 0.1))
    assert es[-1] == s[-1]
    assert es[1] == pytest.approx(g(2.0, 0.1, 1.5, 0.1))  # compile and runtime failures not tolerated yet
    assert es[3] == pytest.approx(g(2.0, 1.0, 1.5, 1.0))  # from t = 3 they count as the eager fallback
    assert s[3] == pytest.approx(g(2.0, 0.1, 1.5, 0.1))  # S(t) never tolerates a failure
    assert sorted(s) == list(range(-10, 5))


def test_a_slowdown_is_its_own_speedup_with_p_0():
    s, _ = graphnet_scores([result("a", "pass", 0.5, t=-8)])
    assert s[0] == pytest.approx(0.5)


def test_score_counts_pass_rate_geomean_of_passing_graphs_and_compile_time():
    sc = score([result("a", "pass", 2.0, t=-6), result("b", "pass", 8.0, t=-6), result("c", "fail_accuracy", 100.0),
                result("d", "skipped", compile_s=None)])
    assert (sc.graphs, sc.passed, sc.pass_rate) == (3, 2, pytest.approx(2 / 3))
    assert sc.geomean_speedup == pytest.approx(4.0)  # the failing graph's 100x does not count
    assert sc.compile_s == pytest.approx(3.0)
    assert sc.by_status == {"pass": 2, "fail_accuracy": 1, "skipped": 1}


def test_graphnet_tolerance_is_the_least_level_at_which_outputs_are_allclose():
    import torch

    e = torch.ones(100)
    assert graphnet_tolerance([e.clone()], [e]) == -10
    t = graphnet_tolerance([e + 1e-3], [e])
    # float32 at t: rtol 10**(1.1772 t), atol 10**t; 1e-3 off on 1.0 first fits at t = -3
    # (1e-3 + 3e-4), not at t = -4 (1e-4 + 2e-5)
    assert t == -3
    assert graphnet_tolerance([torch.tensor([1, 2])], [torch.tensor([1, 3])]) is None


class FakeClock:
    """A clock that only moves when the timed functions run."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interleaved_timing_gives_the_ratio_and_marks_a_noisy_backend():
    clock = FakeClock()

    def eager():
        clock.now += 4e-3

    def steady():
        clock.now += 1e-3

    t = time_interleaved(eager, steady, 8, clock=clock)
    (e, e_iqr), (b, b_iqr) = t.eager, t.backend
    assert e == pytest.approx(4e-3) and b == pytest.approx(1e-3) and not t.noisy
    assert t.speedup == pytest.approx(4.0) and e_iqr == pytest.approx(0) and t.in_backend_s > 0
    calls = [0]

    def jumpy():
        calls[0] += 1
        clock.now += 1e-3 if (calls[0] // 7) % 2 else 5e-3

    t = time_interleaved(eager, jumpy, 8, clock=clock)
    (b, b_iqr) = t.backend
    assert t.noisy and b_iqr > 0.2 * b and t.high / t.low > 2
    assert calls[0] > 3 + 8 * 2  # retried with twice the rounds before it was marked


def test_baseline_comparison_lists_regressions_improvements_and_changes():
    expected = {("m", "a"): "pass", ("m", "b"): "compile_error", ("m", "c"): "crashed", ("m", "gone"): "pass"}
    now = [result("a", "fail_accuracy"), result("b", "pass", 1.0), result("c", "timeout"), result("new", "pass")]
    c = baseline.compare(now, expected)
    assert c.regressions == ["m a: pass -> fail_accuracy (why)"] and not c.ok
    assert c.improvements == ["m b: compile_error -> pass"]
    assert c.changed == ["m c: crashed -> timeout"]
    assert c.new == ["m new: pass"] and c.missing == ["m gone: pass"]


def test_baseline_files_round_trip(tmp_path):
    rs = [result("b", "pass"), result("a", "timeout")]
    p = tmp_path / "b.csv"
    baseline.write_baseline(p, rs)
    assert baseline.read_baseline(p) == {("m", "a"): "timeout", ("m", "b"): "pass"}
    assert baseline.compare(rs, baseline.read_baseline(p)).ok


@pytest.mark.parametrize("text, message", [
    ("graph,status\nm,a,pass\n", "b.csv:1: a baseline's first line is the header artifact,graph,status"),
    ("artifact,graph,status\nm,a,passed\n", "b.csv:2: status 'passed' is not one of pass, fail_accuracy"),
    ("artifact,graph,status\nm,a,pass\nm,b\n", "b.csv:3: 2 columns; a row is artifact,graph,status"),
])
def test_a_malformed_baseline_names_its_line(tmp_path, text, message):
    p = tmp_path / "b.csv"
    p.write_text(text)
    with pytest.raises(AotpipeError) as e:
        baseline.read_baseline(p)
    assert message in str(e.value)


def test_artefacts_of_the_same_name_under_two_paths_are_told_apart():
    from pathlib import Path

    from aotpipe.corpus.bench.run import find_models

    data = Path(__file__).resolve().parent.parent / "data"
    both = [label for _, label in find_models([data / "format_v1", data / "format_v2"])]
    assert both == ["format_v1/mlp", "format_v1/running_norm", "format_v2/mlp", "format_v2/running_norm"]
    assert [label for _, label in find_models([data / "format_v1"])] == ["mlp", "running_norm"]
    assert [label for _, label in find_models([data / "format_v2" / "mlp"])] == ["mlp"]
