"""What the default pass chain buys: raw vs optimised inference graph, side by side.

For every model: nodes before and after, and the median time of the raw inference graph
and of its optimised version (freeze, fold_conv_bn, channels_last, reinplace) on the same
saved inputs, beside the eager model (what a user would run without aotpipe).

    python benchmarks/passes_bench.py [ARTIFACT_ROOT ...] [--markdown [FILE]]   # default: run quickstart and zoo-hf first
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from _artifacts import run_on_artifacts  # noqa: E402
from _markdown import take_markdown_option, tee_page  # noqa: E402

from aotpipe.artifact.load import load  # noqa: E402
from aotpipe.replay import eager_bench, run_graph  # noqa: E402

RUNS = 30


def median_ms(fn) -> float:
    fn()
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(roots: list[Path]) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {RUNS} runs")
    print()
    print("| model | nodes raw | nodes optimised | raw graph ms | optimised graph ms | optimised/raw "
          "| eager model ms | optimised/eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for root in roots:
        for manifest in sorted(root.rglob("manifest.json")):
            art = load(manifest.parent)
            raw = art.graphs.get("inference")
            opt = [g for k, g in art.graphs.items() if k.startswith("inference.")]
            if raw is None or not opt:
                continue
            opt = opt[0]
            raw_in, opt_in = raw.saved_inputs(), opt.saved_inputs()
            raw_ms = median_ms(lambda: run_graph(raw.module, raw_in))
            opt_ms = median_ms(lambda: run_graph(opt.module, opt_in))
            eager = eager_bench(art, "inference", RUNS)
            eager_ms = f"{eager * 1e3:.3f}" if eager else "-"
            vs_eager = f"{opt_ms / (eager * 1e3):.2f}" if eager else "-"
            print(f"| {art.name} | {len(raw.module.graph.nodes)} | {len(opt.module.graph.nodes)} | {raw_ms:.3f} "
                  f"| {opt_ms:.3f} | {opt_ms / raw_ms:.2f} | {eager_ms} | {vs_eager} |")


if __name__ == "__main__":
    page = take_markdown_option("passes_bench")
    with tee_page(page, "passes_bench"):
        run_on_artifacts(main)
