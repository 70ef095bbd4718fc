"""Load and replay times per model, side by side with what a user would otherwise do.

The alternative to `aotpipe.load` is importing each graph's module.py (what functorch's
to_folder output offers, and what `--trust-code` does); the alternative to
`aotpipe.get_inputs` is torch's own `torch._functorch.compilers.get_inputs`; a replayed
graph is timed beside the eager model it came from.

    python benchmarks/replay_bench.py [ARTIFACT_ROOT ...] [--markdown [FILE]]     # default: quickstart and zoo-hf

Runs the pipelines first (into a temporary folder) when no root is given.
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch._functorch.compilers import get_inputs as torch_get_inputs  # noqa: E402

from _artifacts import run_on_artifacts  # noqa: E402
from _markdown import take_markdown_option, tee_page  # noqa: E402

from aotpipe.artifact.load import load  # noqa: E402
from aotpipe.replay import eager_bench, get_inputs, replay, run_graph  # noqa: E402

REPEAT = 5


def median_ms(fn, n=REPEAT) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_model(folder: Path) -> dict:
    load_ms = median_ms(lambda: load(folder))
    import_ms = median_ms(lambda: load(folder, trust_code=True))
    art = load(folder)
    ours_inputs = sum(median_ms(lambda g=g: get_inputs(g.input_file)) for g in art.graphs.values())
    theirs_inputs = sum(
        median_ms(lambda g=g: torch_get_inputs(str(g.input_file))) for k, g in art.graphs.items() if k != "joint"
    )
    ours_inputs_nojoint = sum(median_ms(lambda g=g: get_inputs(g.input_file)) for k, g in art.graphs.items()
                              if k != "joint")
    t0 = time.perf_counter()
    results = replay(art)
    replay_all_ms = (time.perf_counter() - t0) * 1e3
    assert all(r.status == "match" for r in results), [(r.kind, r.status) for r in results]
    inf = art.graphs.get("inference")
    graph_ms = eager_ms = None
    if inf is not None:
        values = inf.saved_inputs()
        run_graph(inf.module, values)
        graph_ms = median_ms(lambda: run_graph(inf.module, values), 10)
        e = eager_bench(art, "inference", 10)
        eager_ms = e * 1e3 if e is not None else None
    return {
        "model": art.name,
        "load_ms": load_ms,
        "import_ms": import_ms,
        "inputs_ms": ours_inputs_nojoint,
        "torch_inputs_ms": theirs_inputs,
        "replay_all_ms": replay_all_ms,
        "graph_ms": graph_ms,
        "eager_ms": eager_ms,
        "all_inputs_ms": ours_inputs,
    }


def main(roots: list[Path]) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for root in roots:
        for manifest in sorted(root.rglob("manifest.json")):
            rows.append(bench_model(manifest.parent))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {REPEAT} (graph/eager: 10)")
    print()
    print("| model | load (graph.json, safe) ms | import module.py ms | ratio | get_inputs ms | torch get_inputs ms "
          "| ratio | replay all graphs + compare ms | inference graph ms | eager model ms | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio_e = f"{r['graph_ms'] / r['eager_ms']:.2f}" if r["eager_ms"] else "-"
        eager = f"{r['eager_ms']:.2f}" if r["eager_ms"] else "-"
        print(f"| {r['model']} | {r['load_ms']:.1f} | {r['import_ms']:.1f} | {r['load_ms'] / r['import_ms']:.2f} "
              f"| {r['inputs_ms']:.2f} | {r['torch_inputs_ms']:.2f} | {r['inputs_ms'] / r['torch_inputs_ms']:.2f} "
              f"| {r['replay_all_ms']:.1f} | {r['graph_ms']:.2f} | {eager} | {ratio_e} |")


if __name__ == "__main__":
    page = take_markdown_option("replay_bench")
    with tee_page(page, "replay_bench"):
        run_on_artifacts(main)
