"""Whole training steps: the train_step graph beside the eager step it was captured from.

What a user would otherwise run is the eager step itself: ``zero_grad``, forward, loss,
``backward``, ``optimizer.step()`` on the model (rebuilt from the artefact's manifest, the
optimizer its pipeline names). Beside it: the captured graph run as saved (ATen, eagerly:
what a backend starts from) and the graph compiled by inductor (``torch.compile``). One
intra-op thread; the three are timed in interleaved rounds and each ratio is the median of
the rounds' ratios, so a busy machine slows all three alike. Also the pass rate of the runs
(run.json) and each step graph's size.

    python benchmarks/train_step_bench.py [ARTIFACT_ROOT ...] [--markdown [FILE]]
    # default: pipelines/quickstart-train.yaml, zoo-hf-train.yaml and zoo-hf-train-bf16.yaml (mixed
    # precision: the eager step runs under the same autocast), run first
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from _markdown import take_markdown_option, tee_page  # noqa: E402

from aotpipe.artifact.load import load  # noqa: E402
from aotpipe.models.train_step import eager_step, make_optimizer  # noqa: E402
from aotpipe.replay.eager import artifact_loss, artifact_optimizer, rebuild_model  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 7
PER_ROUND = 3


def _seconds(fn, n: int = PER_ROUND) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n


def bench_model(folder: Path) -> dict | None:
    art = load(folder)
    key = next((k for k, g in art.graphs.items() if g.kind == "train_step"), None)
    if key is None:
        return None
    ga = art.graphs[key]
    rebuilt = rebuild_model(art, trust_code=True)
    spec = artifact_optimizer(art)
    if rebuilt is None or spec is None:
        return None
    model, args, kwargs = rebuilt
    model.train()
    opt = make_optimizer(list(model.parameters()), spec)
    loss = artifact_loss(art)
    inputs = ga.saved_inputs()

    def eager() -> None:
        eager_step(model, opt, args, kwargs, loss, spec)

    def graph() -> None:
        with torch.no_grad():
            ga.module(*inputs)

    t0 = time.perf_counter()
    compiled = torch.compile(ga.module, backend="inductor")
    with torch.no_grad():
        compiled(*inputs)
    compile_s = time.perf_counter() - t0

    def inductor() -> None:
        with torch.no_grad():
            compiled(*inputs)

    for fn in (eager, graph, inductor):  # warm
        fn()
    rounds = []
    for _ in range(ROUNDS):
        e, g, i = _seconds(eager), _seconds(graph), _seconds(inductor)
        rounds.append((e, g, i))
    return {
        "model": art.name, "optimizer": spec.info.cls + (f", autocast {spec.autocast}" if spec.autocast else ""),
        "mixed": spec.autocast is not None, "nodes": len(ga.module.graph.nodes),
        "eager_ms": statistics.median(r[0] for r in rounds) * 1e3,
        "graph_ms": statistics.median(r[1] for r in rounds) * 1e3,
        "inductor_ms": statistics.median(r[2] for r in rounds) * 1e3,
        "graph_vs_eager": statistics.median(r[0] / r[1] for r in rounds),
        "inductor_vs_eager": statistics.median(r[0] / r[2] for r in rounds),
        "compile_s": compile_s,
    }


def pass_rate(root: Path) -> tuple[int, int]:
    """(ok, models) of every run.json under `root`."""
    ok = total = 0
    for run in root.rglob("run.json"):
        models = json.loads(run.read_text()).get("models", [])
        total += len(models)
        ok += sum(m.get("status") == "ok" for m in models)
    return ok, total


def main(roots: list[Path]) -> None:
    torch.set_num_threads(1)
    rows = []
    for root in roots:
        for manifest in sorted(root.rglob("manifest.json")):
            row = bench_model(manifest.parent)
            if row is not None:
                rows.append(row)
                print(f"  {row['model']}: done", file=sys.stderr)
    ok, total = (sum(x) for x in zip(*(pass_rate(r) for r in roots), strict=True)) if roots else (0, 0)
    print(f"{ok}/{total} models ok (train_step with its checks, one step and three chained, against eager)\n")
    print("| model | optimizer | step graph nodes | eager step ms | graph ms (ATen, as saved) | eager / graph "
          "| inductor ms | eager / inductor | inductor compile s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['optimizer']} | {r['nodes']} | {r['eager_ms']:.2f} | {r['graph_ms']:.2f} "
              f"| {r['graph_vs_eager']:.2f}x | {r['inductor_ms']:.2f} | {r['inductor_vs_eager']:.2f}x "
              f"| {r['compile_s']:.1f} |")
    for label, kept in (("float32", [r for r in rows if not r["mixed"]]),
                        ("mixed-precision (autocast)", [r for r in rows if r["mixed"]])):
        if kept:
            geo = lambda k: statistics.geometric_mean(r[k] for r in kept)  # noqa: E731, B023
            print(f"\ngeometric mean over {len(kept)} {label} steps: eager / graph {geo('graph_vs_eager'):.2f}x, "
                  f"eager / inductor {geo('inductor_vs_eager'):.2f}x (CPU time, one thread, median of {ROUNDS} "
                  "interleaved rounds' ratios)")


if __name__ == "__main__":
    page = take_markdown_option("train_step_bench")
    with tee_page(page, "train_step_bench"):
        if len(sys.argv) > 1:
            main([Path(a) for a in sys.argv[1:]])
        else:
            from aotpipe.pipeline.config import load_pipeline
            from aotpipe.pipeline.runner import run_pipeline

            with tempfile.TemporaryDirectory() as tmp:
                for name in ("quickstart-train", "zoo-hf-train", "zoo-hf-train-bf16"):
                    run_pipeline(load_pipeline(REPO / "pipelines" / f"{name}.yaml"), output=tmp, progress=False)
                main([Path(tmp)])
