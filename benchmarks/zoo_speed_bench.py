"""The zoo's speed targets, measured side by side: aotpipe against torch.export + AOTAutograd alone.

Three targets (2 cores):

- the whole transformers zoo (pipelines/hf-zoo.yaml) in under 30 min with its 2 workers;
- 2 workers at least 1.7x as fast as 1 worker;
- meta capture of a Llama-3-70B-size config in under 60 s with under 2 GiB peak memory.

What runs, for a sample of the zoo's models (evenly spaced over it; ``--sample N``, ``--all``):

1. per model, interleaved (aotpipe, baseline, [before,] next model ...), each tool in a
   long-lived child process of its own that imports torch and transformers once, as a
   worker does:
   - aotpipe: ``run_model`` (capture, passes, write, checks), as a worker runs it;
   - baseline: the work a user would otherwise do for the same four graphs, and nothing
     more: ``torch.export`` in eval mode + ``run_decompositions(core_aten)`` (inference),
     ``torch.export`` in train mode + AOTAutograd's joint export with descriptors + the
     default partitioner (joint, forward, backward). Nothing is checked or written;
   - with ``--before DIR``: aotpipe from another checkout (DIR, e.g. the main branch), so
     that a change's effect is a ratio from the same run;
2. the sample through ``aotpipe run`` with 2 workers, then with 1 (whole commands, cold):
   the 2-worker speed-up is measured; the zoo's time is extrapolated from the 2-worker run
   (its wall time times zoo size / sample size: an extrapolation, named so);
3. the 70B meta capture and torch.export on meta, each in a child (benchmarks/meta_bench.py).

    python benchmarks/zoo_speed_bench.py [--sample 3 | --all] [--before /work/main]
                                         [--meta-layers 80] [--no-meta] [--no-workers]
                                         [--markdown [FILE]]

Each model's time is the job's own (model already built: the transformers module's import
and the model's construction are left out of both tools); CPU seconds are shown beside wall
seconds because a loaded machine stretches wall time. Ratios are within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent


def _repo_from_argv() -> Path:
    """The checkout whose aotpipe a child measures (--repo, for --before), else this one."""
    if "--repo" in sys.argv:
        return Path(sys.argv[sys.argv.index("--repo") + 1])
    return REPO


sys.path.insert(0, str(_repo_from_argv()))  # measure that checkout's aotpipe, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _markdown import add_markdown_option, tee_page  # noqa: E402

ZOO = REPO / "pipelines" / "hf-zoo.yaml"
ZOO_TARGET_S = 30 * 60.0
WORKERS_TARGET = 1.7


# ---------------------------------------------------------------------------------------
# the children: one per tool, fed model names on stdin, one JSON line per model on stdout


def _spec(pipeline: Path, name: str) -> Any:
    from aotpipe.pipeline.config import load_pipeline

    return next(s for s in load_pipeline(pipeline, check_sources=False).models if s.name == name)


def _aotpipe_job(pipeline: Path, name: str) -> dict[str, Any]:
    from aotpipe.pipeline.job import run_model

    spec = _spec(pipeline, name)
    out = Path(tempfile.mkdtemp(prefix="zoo_speed-"))
    try:
        # the model's transformers module imported before the clock starts (baseline does the same)
        from aotpipe.models.sources import build_model

        build_model(spec, pipeline.parent)
        wall, cpu = time.perf_counter(), time.process_time()
        r = run_model(spec, out, pipeline.parent, force=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        shutil.rmtree(out, ignore_errors=True)
    stages = {k: getattr(r, k, None) for k in ("capture_seconds", "passes_seconds", "write_seconds", "checks_seconds")}
    return {"status": r.status, "error": r.error, "wall_s": wall, "cpu_s": cpu, "stages": stages}


def _baseline_job(pipeline: Path, name: str) -> dict[str, Any]:
    import contextlib

    import torch
    import torch.utils._pytree as pytree
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_compile_joint_with_descriptors, aot_export_joint_with_descriptors
    from torch._functorch.partitioners import default_partition
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aotpipe.models.sources import build_model, make_example_inputs

    spec = _spec(pipeline, name)
    model = build_model(spec, pipeline.parent)
    args, kwargs = make_example_inputs(spec)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        model.eval()
        ep = torch.export.export(model, args, kwargs, strict=False)
        ep.run_decompositions(core_aten_decompositions())
        model.train()
        module = torch.export.export(model, args, kwargs, strict=False).module()

        class Loss(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = module

            def forward(self, *a: Any, **k: Any) -> torch.Tensor:
                out = self.model(*a, **k)
                return sum(t.float().sum() for t in pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor) and t.is_floating_point())

        with contextlib.ExitStack() as stack:
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
            jd = aot_export_joint_with_descriptors(stack, Loss(), args, kwargs, decompositions=core_aten_decompositions())
            aot_compile_joint_with_descriptors(jd, partition_fn=default_partition)
        status, error = "ok", None
    except Exception as e:  # a model torch.export cannot take (aotpipe's auto mode falls back to dynamo)
        status, error = "failed", f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"
    return {"status": status, "error": error, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def child(tool: str, pipeline: Path) -> int:
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (imported once, as a worker does)

    job = _baseline_job if tool == "baseline" else _aotpipe_job
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        try:
            out = job(pipeline, name)
        except Exception as e:  # noqa: BLE001 - reported in the table
            out = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:200], "wall_s": None, "cpu_s": None}
        print(json.dumps(out), flush=True)
    return 0


class _Child:
    def __init__(self, tool: str, pipeline: Path, repo: Path):
        env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(repo))
        cmd = [sys.executable, __file__, "--child", tool, "--pipeline", str(pipeline), "--repo", str(repo)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, cwd=str(repo))
        self._read()

    def _read(self) -> dict[str, Any]:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return {"status": "failed", "error": "the child died", "wall_s": None, "cpu_s": None}
            if line.startswith("{"):
                return json.loads(line)

    def run(self, name: str) -> dict[str, Any]:
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ---------------------------------------------------------------------------------------
# the measurements


def sample_names(pipeline: Path, n: Optional[int]) -> tuple[list[str], int]:
    """`n` model names evenly spaced over the pipeline (all of them if n is None), and its size."""
    from aotpipe.pipeline.config import load_pipeline

    names = [s.name for s in load_pipeline(pipeline, check_sources=False).models]
    if n is None or n >= len(names):
        return names, len(names)
    return [names[(2 * i + 1) * len(names) // (2 * n)] for i in range(n)], len(names)


def per_model(pipeline: Path, names: list[str], before: Optional[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    tools = {"aotpipe": REPO, "baseline": REPO, **({"before": before} if before else {})}
    children = {t: _Child("baseline" if t == "baseline" else "aotpipe", pipeline, repo) for t, repo in tools.items()}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        for i, name in enumerate(names):
            order = list(tools) if i % 2 == 0 else list(reversed(tools))  # neither tool always goes first
            results[name] = {}
            for tool in order:
                print(f"  {name}: {tool} ...", file=sys.stderr, flush=True)
                results[name][tool] = children[tool].run(name)
                print(f"  {name}: {tool}: {json.dumps(results[name][tool])}", file=sys.stderr, flush=True)
    finally:
        for c in children.values():
            c.close()
    return results


def runner_wall(pipeline: Path, names: list[str], workers: int) -> dict[str, Any]:
    """`aotpipe run` on the sample with `workers` workers, cold: its wall time and statuses."""
    out = Path(tempfile.mkdtemp(prefix=f"zoo_speed-w{workers}-"))
    cmd = [str(Path(sys.executable).parent / "aotpipe"), "run", str(pipeline), "-o", str(out), "--force", "--no-progress",
           "--workers", str(workers), "--executor", "process"]
    for n in names:
        cmd += ["--only", n]
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO))
    wall = time.perf_counter() - t0
    ok = failed = 0
    try:
        from aotpipe.format.records import load_run

        run = load_run(next(out.rglob("run.json")))  # under the pipeline's name
        ok = sum(1 for m in run.models if m.status in ("ok", "skipped"))
        failed = len(run.models) - ok
    except Exception:  # noqa: BLE001 - a run that wrote no run.json: its exit code says it
        pass
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": wall, "rc": proc.returncode, "ok": ok, "failed": failed, "load_before": load,
            "load_after": os.getloadavg()[0]}


def zoo_run(path: Path) -> dict[str, Any]:
    """What a whole-zoo run's run.json says of its time: wall seconds, workers, models and
    statuses (a merge of shards: the sum of the shards' wall seconds, as if run one after
    another on this machine)."""
    from aotpipe.format.records import load_run

    run = load_run(path.parent if path.name == "run.json" else path)
    ok = sum(1 for m in run.models if m.status == "ok")
    seconds = run.seconds
    if run.merge is not None:  # a merge's own seconds are its longest shard's (shards run side by side)
        seconds = sum(s.seconds or 0.0 for s in run.merge.shards)
    return {"path": str(path), "seconds": seconds, "workers": run.executor.workers, "kind": run.executor.kind,
            "models": len(run.models), "ok": ok, "failed": len(run.models) - ok,
            "shards": len(run.merge.shards) if run.merge is not None else None}


def meta_70b(layers: int) -> dict[str, Any]:
    import meta_bench

    return {tool: meta_bench._child(tool, layers, 128, None) for tool in ("job", "aotpipe", "export")}


# ---------------------------------------------------------------------------------------
# the table


def _f(x: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"x{a / b:.2f}" if a and b else "-"


def report(results: dict[str, Any], zoo_size: int, before: Optional[Path]) -> str:
    lines = [f"{os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.1f}"]
    lines += [f"measured by: {c}" for c in results.get("commands", []) if "--results" not in c] + [""]
    models = results.get("models", {})
    if models:
        lines.append(f"per model ({len(models)} of the zoo's {zoo_size}), the job's own time (wall s / CPU s):")
        head = f"  {'model':28s} {'aotpipe':>15s} {'baseline':>15s} {'ratio cpu':>9s}"
        head += f" {'before':>15s} {'after/before cpu':>16s}" if before else ""
        lines.append(head)
        tot = {"aotpipe": 0.0, "baseline": 0.0, "before": 0.0}
        both = {"aotpipe": 0.0, "baseline": 0.0, "before": 0.0}
        for name, r in models.items():
            a, b, p = r["aotpipe"], r["baseline"], r.get("before")
            cell = lambda x: (f"{_f(x['wall_s'])}/{_f(x['cpu_s'])}" if x["status"] == "ok" else x["status"])  # noqa: E731
            row = f"  {name:28s} {cell(a):>15s} {cell(b):>15s} {_ratio(a['cpu_s'], b['cpu_s']) if b['status'] == 'ok' and a['status'] == 'ok' else '-':>9s}"
            if p:
                row += f" {cell(p):>15s} {_ratio(a['cpu_s'], p['cpu_s']) if a['status'] == p['status'] == 'ok' else '-':>16s}"
            lines.append(row)
            for t, x in r.items():
                if x.get("cpu_s") is not None:
                    tot[t] += x["cpu_s"]
            if a["status"] == b["status"] == "ok":
                both["aotpipe"] += a["cpu_s"]
                both["baseline"] += b["cpu_s"]
            if p and a["status"] == p["status"] == "ok":
                both["before"] += p["cpu_s"]
        lines.append(f"  where both took the model: aotpipe / baseline CPU {_ratio(both['aotpipe'], both['baseline'])}"
                     + (f"; after / before CPU {_ratio(tot['aotpipe'], tot['before'])}" if before else ""))
        failed = {n: r["baseline"]["error"] for n, r in models.items() if r["baseline"]["status"] != "ok"}
        for n, e in failed.items():
            lines.append(f"  baseline failed on {n}: {e}")
        for n, r in models.items():
            if r["aotpipe"]["status"] != "ok":
                lines.append(f"  aotpipe {r['aotpipe']['status']} on {n}: {r['aotpipe'].get('error')}")
        stages: dict[str, float] = {}
        for r in models.values():
            for k, v in (r["aotpipe"].get("stages") or {}).items():
                stages[k] = stages.get(k, 0.0) + (v or 0.0)
        if stages:
            lines.append("  aotpipe's wall time by stage (sum over the sample): "
                         + ", ".join(f"{k.removesuffix('_seconds')} {v:.1f} s" for k, v in stages.items()))
        if before:
            lines.append(f"  before: aotpipe from {before}")
        lines.append("")
    w = results.get("workers")
    lines.append("target                               measured         target     status")
    if w:
        w1, w2 = w["1"], w["2"]
        speedup = w1["wall_s"] / w2["wall_s"]
        n = w.get("n") or len(models) or 1  # the models the worker runs took
        zoo = w2["wall_s"] * zoo_size / n
        lines.append(f"2 workers / 1 worker (measured)      x{speedup:<14.2f}  >= x{WORKERS_TARGET}     "
                     + ("met" if speedup >= WORKERS_TARGET else f"missed (gap x{WORKERS_TARGET / speedup:.2f})"))
        lines.append(f"zoo, 2 workers (EXTRAPOLATED)        {zoo / 60:8.1f} min     < {ZOO_TARGET_S / 60:.0f} min     "
                     + ("met" if zoo < ZOO_TARGET_S else f"missed (gap x{zoo / ZOO_TARGET_S:.2f})"))
        cpu = [r["aotpipe"]["cpu_s"] for r in models.values() if r["aotpipe"].get("cpu_s") is not None]
        if cpu:  # a loaded machine stretches wall time; the jobs' CPU seconds say what idle cores would take
            idle = sum(cpu) / len(cpu) * zoo_size / 2
            lines.append(f"zoo, 2 idle cores (EXTRAPOLATED)     {idle / 60:8.1f} min     < {ZOO_TARGET_S / 60:.0f} min     "
                         + ("met" if idle < ZOO_TARGET_S else f"missed (gap x{idle / ZOO_TARGET_S:.2f})")
                         + "   (mean job CPU s x zoo size / 2 cores)")
        lines.append(f"  (aotpipe run, {n} models: 1 worker {w1['wall_s']:.1f} s ({w1['ok']} ok, {w1['failed']} failed, "
                     f"load {w1['load_before']:.1f}), 2 workers {w2['wall_s']:.1f} s ({w2['ok']} ok, {w2['failed']} "
                     f"failed, load {w2['load_before']:.1f}); zoo = 2-worker wall x {zoo_size}/{n})")
    z = results.get("zoo_run")
    if z:
        whole = z["models"] >= zoo_size
        lines.append(f"zoo, {z['workers']} workers (MEASURED)          {z['seconds'] / 60:8.1f} min     < {ZOO_TARGET_S / 60:.0f} min     "
                     + ("met" if z["seconds"] < ZOO_TARGET_S else f"missed (gap x{z['seconds'] / ZOO_TARGET_S:.2f})")
                     + ("" if whole else f"   (PARTIAL: {z['models']} of {zoo_size} models)"))
        how = (f"{z['shards']} shards run one after another, merged: the sum of their run.json seconds" if z["shards"]
               else "one `aotpipe run`: its run.json's seconds")
        lines.append(f"  ({z['models']} models, {z['kind']} executor, {z['ok']} ok, {z['failed']} failed; {how})")
    m = results.get("meta")
    if m:
        a, e = m["aotpipe"], m["export"]
        j = m.get("job", a)  # the job as `aotpipe run` runs it (results from before it was measured: one process)
        if "error" in j:
            lines.append(f"70B meta capture                     FAILED: {j['error']}")
        if "error" not in j:
            lines.append(f"70B meta, wall (measured)            {j['wall_s']:8.1f} s       < 60 s       "
                         + ("met" if j["wall_s"] < 60 else f"missed (gap x{j['wall_s'] / 60:.2f})")
                         + (f"   ({j['processes']} processes: inference beside training)" if j.get("processes", 1) > 1
                            else ""))
            lines.append(f"70B meta, peak RSS (measured)        {j['peak_rss_gb']:8.2f} GiB     < 2 GiB      "
                         + ("met" if j["peak_rss_gb"] < 2 else f"missed (gap x{j['peak_rss_gb'] / 2:.2f})")
                         + ("   (both processes' peaks, added)" if j.get("processes", 1) > 1 else ""))
        if "error" not in a:
            lines.append(f"70B meta, one process, CPU s         {a['cpu_s']:8.1f} s       < 60 s       "
                         + ("met" if a["cpu_s"] < 60 else f"missed (gap x{a['cpu_s'] / 60:.2f})")
                         + "   (the wall time with one core)")
            phases = ", ".join(f"{k} {p['wall_s']:.1f}/{p['cpu_s']:.1f}" for k, p in a["phases"].items())
            lines.append(f"  (wall/CPU s by phase: {phases}; the meta check {a['check_s']:.1f} s of write; "
                         f"CPU share {a['cpu_share']:.2f})")
            if "error" not in e:
                lines.append(f"  torch.export on meta alone (inference, not decomposed): wall {e['wall_s']:.1f} s, "
                             f"CPU {e['cpu_s']:.1f} s, peak {e['peak_rss_gb']:.2f} GiB; aotpipe (4 kinds, written, "
                             f"checked) / it: wall {_ratio(a['wall_s'], e['wall_s'])}, CPU {_ratio(a['cpu_s'], e['cpu_s'])}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", type=Path, default=ZOO)
    p.add_argument("--sample", type=int, default=3, help="models of the zoo, evenly spaced (default 3)")
    p.add_argument("--all", action="store_true", help="every model of the zoo (hours on 2 cores)")
    p.add_argument("--before", type=Path, help="also run aotpipe from this checkout, side by side")
    p.add_argument("--meta-layers", type=int, default=80)
    p.add_argument("--no-meta", action="store_true")
    p.add_argument("--no-workers", action="store_true", help="skip the 1- and 2-worker aotpipe runs")
    p.add_argument("--no-models", action="store_true", help="skip the per-model comparison")
    p.add_argument("--zoo-run", type=Path, metavar="RUN_JSON",
                   help="the run.json of a whole-zoo `aotpipe run` (its folder's, or a merge's): its wall time is "
                        "the zoo target's measured figure, beside the extrapolation")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--results", type=Path, nargs="+", metavar="JSON",
                   help="measure nothing: print the table of these --json files' results (merged, later ones win)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--repo", type=Path, help=argparse.SUPPRESS)
    add_markdown_option(p, "zoo_speed_bench")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    pipeline = a.pipeline.resolve()
    if a.child:
        return child(a.child, pipeline)
    names, zoo_size = sample_names(pipeline, None if a.all else a.sample)
    results: dict[str, Any] = {"commands": [" ".join(["python", "benchmarks/zoo_speed_bench.py", *sys.argv[1:]])]}
    if a.results:  # runs made apart (the 70B meta one beside the zoo's, say) on one page
        commands: list[str] = []
        for f in a.results:
            saved = json.loads(f.read_text())
            commands += saved.pop("commands", [])
            results.update(saved)
        results["commands"] = commands
        with tee_page(a.markdown, "zoo_speed_bench", preformatted=True):
            print("results of runs made apart, merged (later ones win): each `measured by` line is one run, of its own "
                  "commit and day; the header's are the merge's")
            print(report(results, zoo_size, results.get("before")))
        return 0
    if a.zoo_run:
        results["zoo_run"] = zoo_run(a.zoo_run)
    if not a.no_models:
        print(f"per model: {', '.join(names)}", file=sys.stderr, flush=True)
        results["models"] = per_model(pipeline, names, a.before.resolve() if a.before else None)
        results["before"] = str(a.before) if a.before else None
    if not a.no_workers:
        print("aotpipe run, 2 workers then 1 ...", file=sys.stderr, flush=True)
        results["workers"] = {"2": runner_wall(pipeline, names, 2), "1": runner_wall(pipeline, names, 1),
                              "n": len(names)}
    if not a.no_meta:
        print(f"70B meta ({a.meta_layers} layers) ...", file=sys.stderr, flush=True)
        results["meta"] = meta_70b(a.meta_layers)
    with tee_page(a.markdown, "zoo_speed_bench", preformatted=True):
        print(report(results, zoo_size, a.before))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
