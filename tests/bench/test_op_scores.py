"""bench's per-op scores over per-op cases (scores.op_scores): each op's cases and the calls they
stand for, the calls passing, the calls by status, and the speedup weighted by calls."""

from __future__ import annotations

import math

import pytest

from aotpipe.corpus.bench.graph import GraphResult
from aotpipe.corpus.bench.scores import OpScore, op_scores, weighted_geomean


def res(op, calls, speedup=None, status="pass"):
    return GraphResult("a", "inference", "inference", status, speedup=speedup, case_op=op, case_calls=calls)


def test_each_op_and_all_weigh_cases_by_their_calls():
    rs = [res("x", 3, 2.0), res("x", 1, 0.5), res("x", 5, None, "crashed"), res("y", 10, 1.5),
          res("y", 2, None, "skipped"), res("z", 1, None, "fail_accuracy"), res("z", 1, None, "fail_accuracy")]
    y, x, z, total = op_scores(rs)  # most calls first, all last
    assert x == OpScore("x", 3, 9, 2, 4, {"pass": 4, "crashed": 5}, pytest.approx((2.0 ** 3 * 0.5) ** (1 / 4)))
    assert y == OpScore("y", 1, 10, 1, 10, {"pass": 10}, pytest.approx(1.5))  # skipped: not benched, not counted
    assert z == OpScore("z", 2, 2, 0, 0, {"fail_accuracy": 2}, None)
    assert total == OpScore("all", 6, 21, 3, 14, {"pass": 14, "crashed": 5, "fail_accuracy": 2},
                            pytest.approx(math.exp((3 * math.log(2) + math.log(0.5) + 10 * math.log(1.5)) / 14)))
    assert [o.op for o in op_scores([res("b", 1, 1.0), res("a", 1, 1.0), res("c", 5, 1.0)])] == ["c", "a", "b", "all"]
    assert total.to_json() == {"op": "all", "cases": 6, "calls": 21, "passed_cases": 3, "passed_calls": 14,
                               "calls_by_status": {"pass": 14, "crashed": 5, "fail_accuracy": 2},
                               "weighted_speedup": total.weighted_speedup}


def test_graphs_that_are_not_cases_are_left_out():
    plain = GraphResult("a", "inference", "inference", "pass", speedup=1.0)
    half = GraphResult("a", "inference", "inference", "pass", speedup=1.0, case_op="x")  # no count: not a case
    assert op_scores([plain, half]) == [] and op_scores([]) == []
    (x, total) = op_scores([plain, res("x", 2, 3.0)])
    assert (x.cases, x.calls, total.cases) == (1, 2, 1)


def test_a_weighted_geomean_leaves_out_what_has_no_logarithm_or_no_weight():
    assert weighted_geomean([(4.0, 1), (1.0, 3)]) == pytest.approx(4 ** 0.25)
    assert weighted_geomean([(4.0, 1), (0.0, 5), (-1.0, 5), (math.inf, 5), (math.nan, 5), (2.0, 0)]) == pytest.approx(4)
    assert weighted_geomean([(2.0, 0)]) is None and weighted_geomean([]) is None
    assert weighted_geomean([(2.0, 1), (8.0, 1)]) == pytest.approx(4.0)
