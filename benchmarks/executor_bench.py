"""Throughput of the executors on a zoo, side by side in one run: the local executor (what
aotpipe did before it had workers), the process executor with one worker, and with N.

Each is the whole `aotpipe run` command, cold (a fresh output folder), on the same
pipeline. Target: N=2 workers at least 1.7x as fast as one worker. A warm re-run (nothing
changed) of the same command is timed too, as a share of the cold one (target: < 5%).

    python benchmarks/executor_bench.py [PIPELINE.yaml] [--workers N] [--repeat R] [--markdown [FILE]]
    # default: pipelines/zoo-hf.yaml, N = 2, R = 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _markdown import add_markdown_option, tee_page

REPO = Path(__file__).resolve().parent.parent


def command_seconds(pipeline: Path, out: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "aotpipe.cli", "run", str(pipeline), "-o", str(out), "--no-progress",
                        *extra], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"aotpipe run {' '.join(extra)} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pipeline", nargs="?", type=Path, default=REPO / "pipelines" / "zoo-hf.yaml")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="cold runs of each (the median is shown)")
    add_markdown_option(ap, "executor_bench")
    a = ap.parse_args()
    configs = [("local", ["--executor", "local"]), ("process, 1 worker", ["--executor", "process", "--workers", "1"]),
               (f"process, {a.workers} workers", ["--executor", "process", "--workers", str(a.workers)])]
    times: dict[str, list[float]] = {name: [] for name, _ in configs}
    warm: list[float] = []
    for _ in range(a.repeat):
        for name, extra in configs:  # interleaved, so that drift in the machine's load hits all alike
            with tempfile.TemporaryDirectory() as tmp:
                times[name].append(command_seconds(a.pipeline, Path(tmp), *extra))
                if name.startswith(f"process, {a.workers}"):
                    warm.append(command_seconds(a.pipeline, Path(tmp), *extra))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    one = med["process, 1 worker"]
    with tee_page(a.markdown, "executor_bench"):
        report(a, med, one, warm)


def report(a: argparse.Namespace, med: dict[str, float], one: float, warm: list[float]) -> None:
    print(f"pipeline: {a.pipeline.name}; whole `aotpipe run` commands, cold, median of {a.repeat}\n")
    print("| executor | seconds | speed-up over 1 worker | speed-up over local |")
    print("|---|---:|---:|---:|")
    for name, s in med.items():
        print(f"| {name} | {s:.1f} | {one / s:.2f}x | {med['local'] / s:.2f}x |")
    n = f"process, {a.workers} workers"
    w = statistics.median(warm)
    print(f"\nwarm re-run (nothing changed), {n}: {w:.2f} s = {w / med[n]:.1%} of the cold run (target < 5%)")
    ratio = one / med[n]
    print(f"{a.workers} workers vs 1: {ratio:.2f}x (target >= 1.7x): {'met' if ratio >= 1.7 else 'NOT met'}")


if __name__ == "__main__":
    main()
