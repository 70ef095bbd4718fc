"""The report's plots: matplotlib figures as inline SVG (no pyplot, no display, no files)."""

from __future__ import annotations

import io
import math
import re
from typing import Optional, Sequence

# Deterministic SVG: the same data give the same bytes (ids from a fixed salt, no date).
_RC = {"svg.hashsalt": "aotpipe", "svg.fonttype": "path", "font.size": 9}


def _figure(width: float = 5.6, height: float = 3.4, left_chars: int = 6, legend_below: bool = False):
    """A figure with fixed margins (a layout engine draws each figure twice more: 2-3x the
    time); `left_chars`: the longest y tick label, in characters."""
    import matplotlib

    matplotlib.rcParams.update(_RC)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    inch = 1.0 / width
    fig.subplots_adjust(left=min(0.5, (0.35 + 0.08 * left_chars) * inch), right=1 - 0.2 * inch,
                        top=1 - 0.35 / height, bottom=(0.75 if legend_below else 0.5) / height)
    return fig


def _svg(fig, title: str) -> str:
    """The figure as an <svg> element to inline in HTML: no XML prolog, no comments, and a
    <title> (escaped) saying what it shows. matplotlib escapes every text it writes; with
    svg.fonttype "path" labels are drawn as glyph outlines, never as markup."""
    from markupsafe import escape

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S)
    head_end = svg.index(">") + 1
    head = svg[:head_end].replace("<svg ", f'<svg class="plot" role="img" aria-label="{escape(title)}" ', 1)
    return head + f"<title>{escape(title)}</title>" + svg[head_end:]


def _label(name: str, width: int = 22) -> str:
    return name if len(name) <= width else name[: width - 1] + "\u2026"


def _count(x: float, _pos: object = None) -> str:
    """A tick label for a count: 500, 20k, 1.5M, 2G."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:g}{unit}"
    return f"{x:g}"


def capture_vs_parameters(points: Sequence[tuple[str, int, float]]) -> Optional[str]:
    """Capture seconds against parameter count, one point per model (name, params, seconds)."""
    points = [p for p in points if p[1] and p[1] > 0]
    if not points:
        return None
    fig = _figure()
    ax = fig.subplots()
    xs = [p[1] for p in points]
    ys = [p[2] for p in points]
    ax.scatter(xs, ys, color="#3366cc")
    for name, x, y in points[:40]:
        ax.annotate(_label(name), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.margins(x=0.2)  # room for the labels of the outermost points
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))  # 1-2-5 ticks, labelled 20k, 5M, ...
    ax.xaxis.set_major_formatter(FuncFormatter(_count))
    ax.xaxis.set_minor_formatter(FuncFormatter(_count))
    ax.set_xlabel("parameters (elements)")
    ax.set_ylabel("capture seconds")
    ax.set_title("Capture time against parameter count")
    ax.grid(True, alpha=0.3)
    return _svg(fig, "Capture time against parameter count")


STAGES = ("capture", "passes", "checks", "write")
_STAGE_COLOURS = ("#3366cc", "#ff9900", "#109618", "#990099")


def seconds_per_stage(rows: Sequence[tuple[str, Sequence[float]]]) -> Optional[str]:
    """Seconds per stage, stacked, one bar per model: (name, [capture, passes, checks, write])."""
    rows = [r for r in rows if sum(r[1]) > 0]
    if not rows:
        return None
    fig = _figure(5.6, max(2.4, 0.32 * len(rows) + 1.2), max(len(_label(r[0])) for r in rows), legend_below=True)
    ax = fig.subplots()
    left = [0.0] * len(rows)
    ys = list(range(len(rows)))
    for i, (stage, colour) in enumerate(zip(STAGES, _STAGE_COLOURS)):
        widths = [r[1][i] for r in rows]
        ax.barh(ys, widths, left=left, color=colour, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [_label(r[0]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("Checks against the other stages: seconds per model")
    fig.legend(loc="lower center", ncol=4, fontsize=7, frameon=False)
    return _svg(fig, "Seconds per stage per model: capture, passes, checks against eager, write")


def ratio_histogram(ratios: Sequence[float]) -> Optional[str]:
    """Histogram of error / bound over every check with a float bound (1 = at the bound)."""
    ratios = [r for r in ratios if r is not None and math.isfinite(r) and r >= 0]
    if not ratios:
        return None
    fig = _figure()
    ax = fig.subplots()
    floor = 1e-6
    logs = [math.log10(max(r, floor)) for r in ratios]
    lo = min(min(logs), -1.0)
    hi = max(max(logs), 0.5)
    bins = max(10, min(40, int((hi - lo) * 4)))
    ax.hist(logs, bins=bins, range=(lo, hi), color="#3366cc")
    ax.axvline(0.0, color="#cc0000", linestyle="--", label="bound (ratio 1)")
    ax.set_xlabel(f"log10(error / bound)   (0 error shown at {math.log10(floor):.0f})")
    ax.set_ylabel("checks")
    ax.set_title(f"Errors against their bound, {len(ratios)} checks")
    ax.legend(fontsize=7)
    return _svg(fig, "Histogram of check error / bound ratios")


def bench_speedups(rows: Sequence[tuple[str, str, Optional[float]]]) -> Optional[str]:
    """Speedup of each benchmarked graph (label, status, speedup or None); failed ones at 0."""
    if not rows:
        return None
    rows = list(rows)[:60]
    fig = _figure(5.6, max(2.4, 0.26 * len(rows) + 1.2), max(len(_label(f"{r[0]} ({r[1]})", 36)) for r in rows))
    ax = fig.subplots()
    ys = list(range(len(rows)))
    values = [r[2] if r[2] is not None and r[2] > 0 else 0.0 for r in rows]
    colours = ["#109618" if r[1] in ("ok", "pass", "passed") else "#cc0000" for r in rows]
    ax.barh(ys, values, color=colours)
    failed = [y for y, r in zip(ys, rows) if r[2] is None or r[2] <= 0]
    ax.scatter([0.0] * len(failed), failed, marker="x", color="#cc0000", clip_on=False, zorder=3)
    ax.axvline(1.0, color="#555555", linestyle="--")
    ax.set_yticks(ys, [_label(f"{r[0]} ({r[1]})", 36) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("speedup over eager (x)")
    ax.set_title("Bench: speedup per graph")
    return _svg(fig, "Bench results: speedup per graph")
