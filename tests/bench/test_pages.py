"""benchmarks/bench_backend.py's page (docs/benchmarks/bench-*.md) and the CSV beside it carry
each graph's speedup interval and verdict, and the scores' faster / within noise / slower."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from aotpipe.corpus.bench.graph import GraphResult
from aotpipe.corpus.bench.output import CSV_COLUMNS, row, table
from aotpipe.corpus.bench.run import Bench
from aotpipe.corpus.bench.scores import scores

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_backend", REPO / "benchmarks" / "bench_backend.py")
bench_backend = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_backend)


def _bench() -> Bench:
    rs = [GraphResult("m", "inference", "inference", "pass", "1 outputs within the bound", compile_s=1.0,
                      eager_s=2e-3, backend_s=1e-3, speedup=2.0, speedup_low=1.8, speedup_high=2.3, verdict="faster"),
          GraphResult("m", "forward", "forward", "pass", "2 outputs within the bound", compile_s=1.0, eager_s=1e-3,
                      backend_s=0.97e-3, speedup=1.03, speedup_low=0.85, speedup_high=1.2, verdict="within noise")]
    return Bench("inductor", rs, scores(rs), 3.0)


def test_the_page_and_table_give_a_number_only_where_the_interval_supports_one():
    b = _bench()
    page = bench_backend.markdown(b, ["quickstart"], ["bench_backend.py"], (1.0, 1.0, 1.0), 1, "auto")
    assert "| 2.00x (1.80-2.30x) |" in page and "| within noise (0.85-1.20x) |" in page
    forward = next(line for line in page.splitlines() if line.startswith("| m | forward |"))
    assert "1.03" not in forward  # no figure the interval cannot support
    assert "| 1/1/0 |" in page and "the worker's CPU time (--clock auto)" in page
    lines = table(b)
    assert any("within noise (0.85-1.20x)" in line for line in lines)
    assert any(line.startswith("all ") and " 1/1/0 " in line for line in lines)


def test_the_csv_row_keeps_the_median_interval_and_verdict():
    cols = dict(zip(CSV_COLUMNS, row(_bench().results[1])))
    assert (cols["speedup"], cols["speedup_low"], cols["speedup_high"], cols["verdict"]) == \
        ("1.03", "0.85", "1.2", "within noise")
