"""A bench as people read it (a table, the scores) and as files (CSV)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

from aotpipe.corpus.bench.graph import BAND, CONFIDENCE, GraphResult
from aotpipe.corpus.bench.run import Bench
from aotpipe.corpus.bench.scores import Score
from aotpipe.errors import AotpipeError

CSV_COLUMNS = ("artifact", "graph", "status", "kind", "reason", "compile_s", "eager_ms", "backend_ms", "speedup",
               "speedup_low", "speedup_high", "verdict", "eager_iqr_ms", "backend_iqr_ms", "noisy", "worst_ratio",
               "graphnet_t", "nodes")
# Appended with --sizes: the point, graphs compiled on its first call, and whether that was a recompile.
SIZES_COLUMNS = ("sizes", "compiles", "recompiled")


def _ms(x: Optional[float]) -> str:
    return "" if x is None else f"{x * 1e3:.4g}"


def _num(x: Optional[float], fmt: str = ".3g") -> str:
    return "" if x is None else format(x, fmt)


def row(r: GraphResult, sized: bool = False) -> list[str]:
    """A result's CSV row (with `sized`, SIZES_COLUMNS too)."""
    return [r.artifact, r.graph, r.status, r.kind, r.reason, _num(r.compile_s, ".3f"), _ms(r.eager_s),
            _ms(r.backend_s), _num(r.speedup), _num(r.speedup_low), _num(r.speedup_high), r.verdict, _ms(r.eager_iqr), _ms(r.backend_iqr), "yes" if r.noisy else "",
            _num(r.worst_ratio), "" if r.graphnet_t is None else str(r.graphnet_t), str(r.nodes)] + (
        [sizes_text(r), "" if r.compiles is None else str(r.compiles), _yes_no(r.recompiled)] if sized else [])


def _yes_no(x: bool | None) -> str:
    return "" if x is None else "yes" if x else "no"


def sizes_text(r: GraphResult) -> str:
    """A --sizes row's point as people read it, "batch=7 seq=33" ("" without --sizes)."""
    return " ".join(f"{k}={v}" for k, v in (r.sizes or {}).items())


def _order(r: GraphResult) -> tuple[str, str, int]:
    """Rows by artefact and graph, a graph's size points in the order given."""
    return r.artifact, r.graph, r.point or 0


def write_csv(path: Path, bench: Bench) -> None:
    """One row per graph (its first three columns make it a baseline too); with --sizes, one
    per graph and point, SIZES_COLUMNS appended."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    sized = bench.sizes is not None
    w.writerow(CSV_COLUMNS + (SIZES_COLUMNS if sized else ()))
    for r in sorted(bench.results, key=_order):
        w.writerow(row(r, sized))
    try:
        Path(path).write_text(buf.getvalue())
    except OSError as e:
        raise AotpipeError(f"--csv {path}: cannot write it ({e.strerror or e})") from None


def speedup_text(r: GraphResult) -> str:
    """A graph's speedup as people read it: the median ratio and its interval, or "within noise"
    and the interval where that holds 1.0x (no figure it cannot support)."""
    if r.speedup is None:
        return ""
    if r.speedup_low is None or r.speedup_high is None:
        return f"{r.speedup:.2f}x"
    span = f"{r.speedup_low:.2f}-{r.speedup_high:.2f}x"
    if r.verdict == "within noise":
        return f"within noise ({span})"
    return f"{r.speedup:.2f}x ({span})"


def verdict_counts(s: Score) -> str:
    """faster/within noise/slower counts of a score's passing graphs, as "2/5/1"."""
    return "/".join(str(s.verdicts.get(v, 0)) for v in ("faster", "within noise", "slower"))


def compile_text(r: GraphResult) -> str:
    """The compile column: the first call's seconds; at a --sizes point after the first, whether
    the backend compiled again there (and how long that call took) or not."""
    if r.compile_s is None:
        return ""
    if r.recompiled is None:
        return f"compile {r.compile_s:.2f} s"
    return f"recompiled {r.compile_s:.2f} s" if r.recompiled else "no recompile"


def row_name(r: GraphResult) -> str:
    """A row's name: the artefact and graph, and a --sizes row's point."""
    return f"{r.artifact} {r.graph}" + (f" {sizes_text(r)}" if r.sizes else "")


def result_line(r: GraphResult, width: int) -> str:
    """One graph's line of the terminal table (one graph at one point, with --sizes)."""
    timing = ""
    if r.speedup is not None:
        timing = (f"{speedup_text(r):<26}  eager {_ms(r.eager_s)} ms  {_ms(r.backend_s)} ms"
                  f"{'  (noisy)' if r.noisy else ''}")
    compile_s = compile_text(r)
    return f"{row_name(r):<{width}} {r.status:<13} {compile_s:<{17 if r.sizes else 15}} {timing}".rstrip()


def table(bench: Bench, *, t_levels: tuple[int, ...] = (-5, -3, -1, 0, 1, 3)) -> list[str]:
    """The table (one line per graph, a reason under each that did not pass or passed only by
    the second noise sample), then the scores."""
    rs = sorted(bench.results, key=_order)
    width = max([20] + [len(row_name(r)) for r in rs])
    lines = [f"{'graph':<{width}} {'status':<13} {'compile':<{17 if bench.sizes else 15}} speedup (eager / "
             f"{bench.backend}: median of the rounds' ratios, {CONFIDENCE:.0%} interval widened by {BAND:.0%}), "
             "median per call"]
    for r in rs:
        lines.append(result_line(r, width))
        if r.status != "pass" or r.rescaled:
            lines.append(f"    {r.reason}")
    lines.append("")
    lines.append(f"{'scores':<10} {'graphs':>6} {'pass':>6} {'rate':>6} {'geomean':>8} {'faster/noise/slower':>19} "
                 f"{'compile s':>10}  " + "  ".join(f"S({t})/ES({t})" for t in t_levels))
    for kind, s in bench.scores.items():
        rate = "" if s.pass_rate is None else f"{s.pass_rate:.0%}"
        gm = "" if s.geomean_speedup is None else f"{s.geomean_speedup:.2f}x"
        st = "  ".join(f"{_num(s.s_t.get(t), '.2f')}/{_num(s.es_t.get(t), '.2f')}".center(len(f"S({t})/ES({t})"))
                       for t in t_levels)
        lines.append(f"{kind:<10} {s.graphs:>6} {s.passed:>6} {rate:>6} {gm:>8} {verdict_counts(s):>19} "
                     f"{s.compile_s:>10.1f}  {st}")
    lines += op_lines(bench)
    share = bench.overhead_share
    if share is not None:
        lines.append(f"bench's own time (outside {bench.backend}'s compile and run): {share:.0%} of the workers' "
                     f"{sum(r.wall_s for r in bench.results):.1f} s; wall {bench.wall_s:.1f} s")
    return lines


def op_lines(bench: Bench) -> list[str]:
    """The per-op scores of a bench over per-op cases (aotpipe ops --cases): each op's cases,
    the corpus calls they stand for, those that pass, the weighted speedup and the failing
    calls by status; nothing for a bench of no case."""
    ops = bench.op_scores
    if not ops:
        return []
    width = max(20, *(len(o.op) for o in ops))
    lines = ["", "per op (aotpipe ops --cases: each case weighed by the corpus calls it stands for)",
             f"{'op':<{width}} {'cases':>6} {'calls':>7} {'calls passing':>15} {'geomean':>8}  failing calls"]
    for o in ops:
        share = f"{o.passed_calls} ({o.passed_calls / o.calls:.1%})" if o.calls else ""
        gm = "" if o.weighted_speedup is None else f"{o.weighted_speedup:.2f}x"
        failing = ", ".join(f"{status} {n}" for status, n in sorted(o.calls_by_status.items()) if status != "pass")
        lines.append(f"{o.op:<{width}} {o.cases:>6} {o.calls:>7} {share:>15} {gm:>8}  {failing}".rstrip())
    return lines


def failures(bench: Bench) -> list[str]:
    """aotpipe minimize's table: how many graphs passed, then each failing one and its reason."""
    rs = sorted(bench.results, key=_order)
    bad = [r for r in rs if r.status != "pass"]
    width = max([20] + [len(row_name(r)) for r in bad])
    lines = [f"{len(rs) - len(bad)} of {len(rs)} graphs pass with {bench.backend}"
             + (f"; {len(bad)} fail:" if bad else "")]
    for r in bad:
        lines.append(f"{row_name(r):<{width}} {r.status}")
        lines.append(f"    {r.reason}")
    return lines
