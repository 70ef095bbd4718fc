"""Scores of a bench: per graph kind and overall.

- pass rate: graphs that pass over graphs benched (skipped ones, whose loaded graph does not
  run, are not counted);
- geometric-mean speedup of the graphs that pass (their median ratios), and how many of them
  are faster, within noise or slower by their speedup's interval (graph.time_interleaved);
- total compile seconds;
- GraphNet's S(t) and ES(t) (graph_net_bench/analysis_util.py, ``calculate_scores``, with its
  defaults p = 0, b = 0.1, t from -10 to 4 under its default tolerance interpretation):
  per graph a rectified speedup, then their geometric mean. A graph that failed (our statuses
  mapped to GraphNet's error kinds: fail_accuracy -> accuracy, compile_error ->
  compile_fail, runtime_error / timeout / crashed -> runtime) or whose outputs are not
  allclose to eager's at level t counts b; a correct one its speedup (speedup**(p+1) below 1).
  ES(t) equals S(t) for t < 1; for t >= 1 a graph that was not correct at t = 1 counts 1 where
  its error kind is tolerated at t (accuracy from t = 1, runtime and compile failures from t
  = 3: the eager fallback's speed) and b otherwise; a correct one its speedup at t = 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from aotpipe.corpus.bench.graph import GRAPHNET_T, GraphResult
from aotpipe.format.vocabulary import GRAPH_KINDS

P = 0.0
B = 0.1
_GRAPHNET_ERROR = {"fail_accuracy": "accuracy", "compile_error": "compile_fail", "runtime_error": "runtime_fail",
                   "timeout": "runtime_fail", "crashed": "runtime_fail"}
_TOLERATED_FROM = {"accuracy": 1, "runtime_fail": 3, "compile_fail": 3}


def geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _correct_at(r: GraphResult, t: int) -> tuple[bool, Optional[str]]:
    """GraphNet's check_sample_correctness for our result: (correct at t, error kind)."""
    if r.status in ("compile_error", "runtime_error", "timeout", "crashed"):
        return False, _GRAPHNET_ERROR[r.status]
    if r.graphnet_t is not None and r.graphnet_t <= t and r.speedup is not None:
        return True, None
    return False, "accuracy"


def _rectified(speedup: float) -> float:
    return speedup ** (P + 1) if speedup < 1 else speedup


def graphnet_scores(results: Sequence[GraphResult]) -> tuple[dict[int, Optional[float]], dict[int, Optional[float]]]:
    """({t: S(t)}, {t: ES(t)}) over `results` (skipped graphs left out)."""
    rs = [r for r in results if r.status != "skipped"]
    s: dict[int, Optional[float]] = {}
    es: dict[int, Optional[float]] = {}
    at1 = [_correct_at(r, 1) for r in rs]
    for t in GRAPHNET_T:
        sv, ev = [], []
        for r, (ok1, kind1) in zip(rs, at1):
            ok, _ = _correct_at(r, t)
            value = _rectified(r.speedup) if ok and r.speedup is not None else B
            sv.append(value)
            if t < 1:
                ev.append(value)
            elif ok1 and r.speedup is not None:
                ev.append(_rectified(r.speedup))
            else:
                ev.append(1.0 if kind1 is not None and t >= _TOLERATED_FROM[kind1] else B)
        s[t] = geomean(sv) if sv else None
        es[t] = geomean(ev) if ev else None
    return s, es


@dataclass
class Score:
    """The scores of a group of graphs (one kind, or all)."""

    graphs: int
    passed: int
    by_status: dict[str, int]
    pass_rate: Optional[float]
    geomean_speedup: Optional[float]
    compile_s: float
    # Of the passing graphs: faster, within noise, slower (by their speedup's interval).
    verdicts: dict[str, int] = field(default_factory=dict)
    s_t: dict[int, Optional[float]] = field(default_factory=dict)
    es_t: dict[int, Optional[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["s_t"] = {str(k): v for k, v in self.s_t.items()}
        d["es_t"] = {str(k): v for k, v in self.es_t.items()}
        return d


def score(results: Sequence[GraphResult]) -> Score:
    counted = [r for r in results if r.status != "skipped"]
    passed = [r for r in counted if r.status == "pass"]
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    s, es = graphnet_scores(results)
    return Score(len(counted), len(passed), by_status, len(passed) / len(counted) if counted else None,
                 geomean([r.speedup for r in passed if r.speedup is not None]),
                 sum(r.compile_s or 0.0 for r in results),
                 {v: sum(r.verdict == v for r in passed) for v in ("faster", "within noise", "slower")}, s, es)


def scores(results: Sequence[GraphResult]) -> dict[str, Score]:
    """Scores per graph kind (inference, forward, backward, joint) and "all"."""
    kinds = sorted({r.kind for r in results}, key=lambda k: GRAPH_KINDS.index(k) if k in GRAPH_KINDS else 9)
    out = {k: score([r for r in results if r.kind == k]) for k in kinds}
    out["all"] = score(results)
    return out


@dataclass
class OpScore:
    """One op's per-op cases (aotpipe ops --cases) benched: how many, the corpus calls they
    stand for, those of them that pass, the calls by status, and the geometric-mean speedup of
    the passing cases weighted by their calls."""

    op: str
    cases: int
    calls: int
    passed_cases: int
    passed_calls: int
    calls_by_status: dict[str, int]
    weighted_speedup: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def weighted_geomean(pairs: Sequence[tuple[float, int]]) -> float | None:
    """exp of the `w`-weighted mean of log(x) over (x, w), the unusable x left out."""
    usable = [(x, w) for x, w in pairs if x is not None and x > 0 and math.isfinite(x) and w > 0]
    total = sum(w for _, w in usable)
    return math.exp(sum(w * math.log(x) for x, w in usable) / total) if total else None


def op_scores(results: Sequence[GraphResult]) -> list[OpScore]:
    """Per op, over the results that are per-op cases (skipped ones left out), most calls first;
    then the whole ("all")."""
    cases = [(r.case_op, r.case_calls, r) for r in results
             if r.case_op is not None and r.case_calls is not None and r.status != "skipped"]
    groups: dict[str, list[tuple[int, GraphResult]]] = {}
    for op, calls, r in cases:
        groups.setdefault(op, []).append((calls, r))
    if cases:
        groups["all"] = [(calls, r) for _, calls, r in cases]
    out = []
    for op, rs in groups.items():
        by_status: dict[str, int] = {}
        for calls, r in rs:
            by_status[r.status] = by_status.get(r.status, 0) + calls
        passed = [(calls, r) for calls, r in rs if r.status == "pass"]
        out.append(OpScore(op, len(rs), sum(calls for calls, _ in rs), len(passed), sum(calls for calls, _ in passed),
                           by_status, weighted_geomean([(r.speedup, calls) for calls, r in passed
                                                        if r.speedup is not None])))
    return sorted(out, key=lambda s: (s.op == "all", -s.calls, s.op))
