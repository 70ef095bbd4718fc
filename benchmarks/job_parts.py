"""Where a model's job spends its CPU: capture's traces, the checks, the writer, by timers.

A profiler misleads here: cProfile's per-call overhead inflates torch's fake-tensor
dispatch (deep Python call stacks per op) about five times more than the rest, so its
shares put the checks' fake-tensor precheck at 12% of a job where timers measured 9%. This
script wraps a few functions with CPU timers (``time.process_time``) and runs
``run_model`` on each model, as a worker does (the model's module imported and the model
built before the clock starts; a first model run before any is timed, so that torch's lazy
imports are not charged to the first), in this process:

    python benchmarks/job_parts.py [--pipeline pipelines/hf-zoo.yaml] [--sample 6 | --only MODEL ...] [--warm bert]
                                   [--meta-layers N] [--markdown [FILE]]

Parts (CPU seconds; nested parts are inside their parents, so the shares do not add up to
100%): the two torch.export traces, the inference decomposition, AOTAutograd's joint and
partition, the eager model's runs (float32, float64 and nudged noise samples), the written
graphs' runs and, inside them, the precheck of each before it runs (meta, then fake tensors), rebuilding graphs
from graph.json, rendering and compiling graphs' Python code (anywhere, torch's own included),
module.py's text. With ``--meta-layers N``: the same for mode meta's Llama-3-70B-size config
at N layers (benchmarks/meta_bench.py's model) instead of the pipeline's models.
"""

from __future__ import annotations

import argparse
import collections
import functools
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's aotpipe, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _markdown import add_markdown_option, tee_page  # noqa: E402

CPU: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()


def _timed(owner: Any, name: str, label: str) -> None:
    """Charge the CPU seconds of owner.name's calls to `label` (an outer call only, when it recurses)."""
    f: Callable = getattr(owner, name)
    depth = [0]

    @functools.wraps(f)
    def wrapper(*a: Any, **k: Any) -> Any:
        depth[0] += 1
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                CPU[label] += time.process_time() - t
                CALLS[label] += 1

    setattr(owner, name, wrapper)


PARTS = [  # (module, attribute, label), in the order the table lists them
    ("aotpipe.capture.export", "_export", "torch.export, eval and train"),
    ("aotpipe.capture.export", "_inference_graph", "inference graph (run_decompositions)"),
    ("aotpipe.capture.export", "_training_graphs", "training graphs (AOTAutograd joint, partition)"),
    ("aotpipe.models.eager.EagerReference", "_run", "checks: eager model runs (float32, float64, nudged)"),
    ("aotpipe.checks.written", "run_with_summaries", "checks: written graphs run (per-node summaries)"),
    ("aotpipe.artifact.precheck", "check_graph", "checks: precheck of written graphs (meta, fake)"),
    ("aotpipe.artifact.graph_json", "_graph_from_json", "checks: graphs rebuilt from graph.json"),
    ("aotpipe.artifact.codegen", "module_source", "writer: module.py text"),
    ("aotpipe.artifact.graph_json", "graph_to_json", "writer: graph.json records"),
    ("torch.fx.graph.Graph", "python_code", "Python code of graphs rendered (anywhere)"),
    ("torch.fx.GraphModule", "recompile", "Python code rendered and compiled (anywhere)"),
]


def _install() -> None:
    import importlib

    for module, attr, label in PARTS:
        try:
            owner = importlib.import_module(module)
        except ModuleNotFoundError:  # a class: module.Class
            mod_name, cls = module.rsplit(".", 1)
            owner = getattr(importlib.import_module(mod_name), cls)
        _timed(owner, attr, label)


def _zoo_jobs(pipeline: Path, names: list[str], warm: str) -> list[dict[str, Any]]:
    from aotpipe.models.sources import build_model
    from aotpipe.pipeline.config import load_pipeline
    from aotpipe.pipeline.job import run_model

    specs = {s.name: s for s in load_pipeline(pipeline, check_sources=False).models}
    rows = []
    for i, name in enumerate([warm] + names):
        spec = specs[name]
        out = Path(tempfile.mkdtemp(prefix="job_parts-"))
        try:
            build_model(spec, pipeline.parent)
            CPU.clear()
            CALLS.clear()
            cpu = time.process_time()
            r = run_model(spec, out, pipeline.parent, force=True)
            cpu = time.process_time() - cpu
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if i == 0:  # the untimed warm-up run
            continue
        rows.append({"name": name, "status": r.status, "cpu_s": cpu, "parts": dict(CPU),
                     "stages": {k: getattr(r, f"{k}_seconds") or 0.0 for k in ("capture", "write", "checks")}})
        print(f"  {name}: {r.status}, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    return rows


def _meta_job(layers: int) -> list[dict[str, Any]]:
    import meta_bench

    CPU.clear()
    cpu = time.process_time()
    r = meta_bench.child_aotpipe(layers, 128, None)
    cpu = time.process_time() - cpu
    stages = {k: p["cpu_s"] for k, p in r["phases"].items()}
    return [{"name": f"llama70b_meta ({layers} layers)", "status": "ok" if not r["problems"] else "problems",
             "cpu_s": cpu, "parts": dict(CPU), "stages": stages}]


def report(rows: list[dict[str, Any]]) -> str:
    total = sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} job(s), {total:.1f} s CPU in all: " + ", ".join(f"{r['name']} {r['cpu_s']:.1f} s ({r['status']})"
                                                                          for r in rows), ""]
    stages: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        for k, v in r["stages"].items():
            stages[k] += v
    lines.append("stages (wall s as the job records them): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    lines.append("")
    lines.append(f"  {'part (CPU s; nested parts are inside others)':58s} {'CPU s':>8s} {'share':>7s}")
    for _, _, label in PARTS:
        s = sum(r["parts"].get(label, 0.0) for r in rows)
        lines.append(f"  {label:58s} {s:8.1f} {100 * s / total if total else 0:6.1f}%")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", type=Path, default=REPO / "pipelines" / "hf-zoo.yaml")
    p.add_argument("--sample", type=int, default=6, help="models evenly spaced over the pipeline (default 6)")
    p.add_argument("--only", nargs="+", metavar="MODEL", help="these models of the pipeline instead of a sample")
    p.add_argument("--warm", default=None, help="the model run first, untimed (default: the pipeline's first)")
    p.add_argument("--meta-layers", type=int, help="time mode meta's 70B-size config at this many layers instead")
    add_markdown_option(p, "job_parts")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    _install()
    if a.meta_layers:
        rows = _meta_job(a.meta_layers)
    else:
        from zoo_speed_bench import sample_names  # the same evenly spaced sample as the zoo's speed page

        names, _ = sample_names(a.pipeline.resolve(), None)
        sample = a.only or sample_names(a.pipeline.resolve(), a.sample)[0]
        unknown = sorted(set(sample) - set(names))
        if unknown:
            p.error(f"--only: {', '.join(unknown)} not in {a.pipeline} (its models: {', '.join(names)})")
        warm = a.warm or next((x for x in names if x not in sample), names[0])  # every model sampled: the first twice
        rows = _zoo_jobs(a.pipeline.resolve(), sample, warm)
    with tee_page(a.markdown, "job_parts", preformatted=True):
        print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
