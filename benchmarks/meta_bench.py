"""Capture mode meta at Llama-3-70B size, side by side with plain torch.export on meta.

The target: a Llama-3-70B-size config (80 layers, hidden 8192, 64 heads, 8 KV heads,
intermediate 28672, vocab 128256, 128 tokens) captured in all four kinds (inference,
forward, backward, joint) and written as a metadata-only artefact in < 60 s with < 2 GiB
peak RSS on 2 cores.

Each tool runs in a child process of its own, so its peak RSS (getrusage) is its own:

- the job (the targets' figures): the model's job as `aotpipe run` runs it
  (`aotpipe.pipeline.job.run_model`, the spec built as below): with the child's 2 intra-op threads
  it captures the inference graph in a second process beside the training graphs and joins
  the two folders (`job.beside_kinds`); peak RSS is the two processes' peaks added;
- aotpipe meta in one process, phase by phase (as a job with one core runs): build on the meta device (`build_on_meta`), `capture_meta` (all four
  kinds), `write_model(inputs=None)` with the meta check (`check_meta_written`: each graph
  loaded back from graph.json and run on fake inputs) into a temporary folder;
- torch.export on meta: what a user would otherwise run: the model built under
  `torch.device("meta")` and `torch.export.export(model, strict=False)` on meta inputs:
  the inference graph only, before decomposition, nothing written.

    python benchmarks/meta_bench.py [--layers 80] [--tokens 128] [--tools job,aotpipe,export]
                                    [--keep DIR] [--json FILE] [--markdown [FILE]]

Timings on a shared machine vary with its load: the table shows the load average seen
and each child's CPU share (CPU seconds per wall second; well under 1: it waited for a core).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's aotpipe, not an installed one

from _markdown import add_markdown_option, tee_page  # noqa: E402

TARGET_S = 60.0
TARGET_GB = 2.0
KINDS = ["inference", "forward", "backward", "joint"]


def llama70b_config(layers: int) -> dict[str, Any]:
    # transformers 5 takes the rope base inside rope_parameters (a rope_theta key is refused
    # as one LlamaConfig does not take)
    return dict(num_hidden_layers=layers, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, use_cache=False)


def _spec(layers: int, tokens: int) -> Any:
    from aotpipe.spec import ModelSpec

    data = dict(name="llama70b_meta", source="hf:LlamaForCausalLM", args={}, config=llama70b_config(layers),
                inputs=[{"name": "input_ids", "shape": [1, tokens], "dtype": "int64", "high": 128256}],
                graphs=KINDS, passes=[], save_inputs=False, verify=False, loss="sum", seed=0)
    try:
        return ModelSpec.model_validate({**data, "mode": "meta"})
    except ValueError:  # a config that does not list mode meta yet
        return ModelSpec.model_validate({**data, "mode": "export"})


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


class _Clock:
    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.phases: dict[str, dict[str, float]] = {}

    def lap(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.phases[name] = {"wall_s": wall - self.wall, "cpu_s": cpu - self.cpu, "peak_rss_gb": _peak_gb()}
        self.wall, self.cpu = wall, cpu


# ---------------------------------------------------------------------------------------
# the children


def child_aotpipe(layers: int, tokens: int, keep: str | None) -> dict[str, Any]:
    from aotpipe.pipeline.job import collections_paced

    with collections_paced():  # as run_model runs a job
        return _child_aotpipe(layers, tokens, keep)


def _child_aotpipe(layers: int, tokens: int, keep: str | None) -> dict[str, Any]:
    from aotpipe.artifact.writer import graph_entries, write_model
    from aotpipe.capture.meta import build_on_meta, capture_meta, meta_example_inputs
    from aotpipe.checks.meta import check_meta_written
    from aotpipe.checks.written import graph_structure

    spec = _spec(layers, tokens)
    clock = _Clock()
    model = build_on_meta(spec)
    args, kwargs = meta_example_inputs(spec)
    clock.lap("build")
    cap = capture_meta(model, args, kwargs, name=spec.name, graphs=KINDS, input_names=[],
                       int_ranges={"input_ids": (0, 128256)})
    clock.lap("capture")
    codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(cap)}
    checked: list[Any] = []

    def check(folder: Path) -> Any:
        t0 = time.perf_counter()
        mc = check_meta_written(folder, codes=codes)
        checked.append((mc, time.perf_counter() - t0))
        return mc.outcome

    out = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="meta_bench-"))
    try:
        written = write_model(out, cap, model_record=spec.to_json(), fingerprint="0" * 64, inputs=None, check=check)
        clock.lap("write")
        bytes_ = written.bytes
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    mc, check_s = checked[0]
    return {"phases": clock.phases, "nodes": {k: g.num_nodes for k, g in cap.graphs.items()},
            "check_s": check_s, "problems": mc.problems, "bytes": bytes_, "capture_seconds": cap.seconds}


def child_job(layers: int, tokens: int) -> dict[str, Any]:
    """The model's job as `aotpipe run` runs it (aotpipe.pipeline.job.run_model): with this child's
    2 intra-op threads, the inference graph is captured beside the training graphs in a
    second process (job.beside_kinds). Peak memory: this process's and the second's, added
    (an upper bound of the two together)."""
    from aotpipe.pipeline.job import run_model

    spec = _spec(layers, tokens)
    out = Path(tempfile.mkdtemp(prefix="meta_bench-"))
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        r = run_model(spec, out, force=True)
        wall = time.perf_counter() - wall
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.process_time() - cpu + kids.ru_utime + kids.ru_stime
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if r.status != "ok":
        raise RuntimeError(f"the job failed at {r.stage}: {r.error}")
    return {"wall_s": wall, "cpu_s": cpu, "processes": 2 if kids.ru_maxrss else 1,  # a second process ran
            "peak_rss_gb": _peak_gb() + kids.ru_maxrss / 2**20, "peak_rss_self_gb": _peak_gb(),
            "peak_rss_second_gb": kids.ru_maxrss / 2**20, "bytes": r.bytes,
            "stages": {k: getattr(r, k) for k in ("capture_seconds", "write_seconds", "checks_seconds")}}


def child_export(layers: int, tokens: int) -> dict[str, Any]:
    import torch
    import transformers

    clock = _Clock()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama70b_config(layers)))
    model.eval()
    ids = torch.empty(1, tokens, dtype=torch.int64, device="meta")
    clock.lap("build")
    ep = torch.export.export(model, (), {"input_ids": ids}, strict=False)
    clock.lap("export")
    return {"phases": clock.phases, "nodes": {"inference (pre-decomposition)": len(ep.graph.nodes)}}


def _child(tool: str, layers: int, tokens: int, keep: str | None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, __file__, "--child", tool, "--layers", str(layers), "--tokens", str(tokens)]
    if keep:
        cmd += ["--keep", keep]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # all children so far: peak is the max
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(process_wall_s=wall, load_before=load, load_after=os.getloadavg()[0],
               children_peak_rss_gb=usage.ru_maxrss / 2**20)
    if tool == "job":  # measured by the job's own clocks (benchmarks/meta_bench.py: child_job)
        out["cpu_share"] = out["cpu_s"] / out["wall_s"]
        return out
    work = [p for name, p in out["phases"].items()]
    out["wall_s"] = sum(p["wall_s"] for p in work)
    out["cpu_s"] = sum(p["cpu_s"] for p in work)
    out["peak_rss_gb"] = max(p["peak_rss_gb"] for p in work)
    out["cpu_share"] = out["cpu_s"] / out["wall_s"] if out["wall_s"] else None
    return out


# ---------------------------------------------------------------------------------------
# the table


def _fmt(x: Any, unit: str = "") -> str:
    return "-" if x is None else (f"{x:.2f}{unit}" if isinstance(x, float) else f"{x}{unit}")


def report(results: dict[str, dict[str, Any]], layers: int, tokens: int) -> str:
    lines = [f"meta capture, Llama-3-70B-size config: {layers} layers, hidden 8192, 64 heads / 8 KV, "
             f"intermediate 28672, vocab 128256, {tokens} tokens; {os.cpu_count()} cores, "
             f"torch threads {_threads()}", ""]
    j, a, e = results.get("job"), results.get("aotpipe"), results.get("export")
    if j and "error" not in j:
        lines += target_lines(j)
        lines += [f"  (the job as `aotpipe run` runs it, in {j['processes']} process(es): wall {j['wall_s']:.1f} s, "
                  f"CPU {j['cpu_s']:.1f} s of both, peak RSS {j['peak_rss_self_gb']:.2f} + "
                  f"{j['peak_rss_second_gb']:.2f} GiB; load {j['load_before']:.1f} -> {j['load_after']:.1f})", ""]
    elif j:
        lines += [f"aotpipe meta, the job FAILED: {j['error']}", ""]
    if a and "error" not in a:
        if not j:
            lines += target_lines(a)
        lines.append("aotpipe meta in one process (as with 1 core), by phase:   wall s    cpu s   peak RSS GiB")
        for name, p in a["phases"].items():
            lines.append(f"  {name:22s} {p['wall_s']:8.2f} {p['cpu_s']:8.2f} {p['peak_rss_gb']:10.2f}")
        lines.append(f"  (of write: the meta check {a['check_s']:.2f} s; artefact {a['bytes'] / 2**20:.1f} MiB; "
                     f"problems: {a['problems'] or 'none'})")
        lines.append("  nodes: " + ", ".join(f"{k} {v}" for k, v in a["nodes"].items()))
        lines.append(f"  load average {a['load_before']:.1f} -> {a['load_after']:.1f}, cpu share {a['cpu_share']:.2f}")
    elif a:
        lines.append(f"aotpipe meta FAILED: {a['error']}")
    if e and "error" not in e:
        lines += ["", "torch.export on meta (inference only, not decomposed, nothing written):",
                  f"  wall {e['wall_s']:.2f} s (export {e['phases']['export']['wall_s']:.2f} s), cpu {e['cpu_s']:.2f} s, "
                  f"peak RSS {e['peak_rss_gb']:.2f} GiB, nodes {list(e['nodes'].values())[0]}, "
                  f"load {e['load_before']:.1f} -> {e['load_after']:.1f}"]
    elif e:
        lines.append(f"torch.export on meta FAILED: {e['error']}")
    if a and e and "error" not in a and "error" not in e:
        lines += ["", "ratios aotpipe meta (4 kinds, written) / torch.export on meta (1 kind, in memory):",
                  f"  wall x{a['wall_s'] / e['wall_s']:.2f}   cpu x{a['cpu_s'] / e['cpu_s']:.2f}   "
                  f"peak RSS x{a['peak_rss_gb'] / e['peak_rss_gb']:.2f}   "
                  f"nodes x{sum(a['nodes'].values()) / list(e['nodes'].values())[0]:.1f}"]
    return "\n".join(lines)


def target_lines(r: dict[str, Any]) -> list[str]:
    """The two targets' lines, from one tool's result (wall_s, peak_rss_gb)."""
    total, peak = r["wall_s"], r["peak_rss_gb"]
    return ["target                         measured     target   status",
            f"wall, build+capture+write+check {total:8.1f} s   < {TARGET_S:.0f} s   "
            + ("met" if total < TARGET_S else f"missed (x{total / TARGET_S:.2f})"),
            f"peak RSS                        {peak:8.2f} GiB < {TARGET_GB:.0f} GiB  "
            + ("met" if peak < TARGET_GB else f"missed (x{peak / TARGET_GB:.2f})"), ""]


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=80)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--tools", default="job,aotpipe,export")
    p.add_argument("--keep", help="write the artefact here and keep it")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    add_markdown_option(p, "meta_bench")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    if a.child:
        out = (child_aotpipe(a.layers, a.tokens, a.keep) if a.child == "aotpipe" else
               child_job(a.layers, a.tokens) if a.child == "job" else child_export(a.layers, a.tokens))
        print(json.dumps(out))
        return 0
    results = {}
    for tool in a.tools.split(","):
        print(f"running {tool} ...", file=sys.stderr, flush=True)
        results[tool] = _child(tool, a.layers, a.tokens, a.keep)
    with tee_page(a.markdown, "meta_bench", preformatted=True):
        print(report(results, a.layers, a.tokens))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    ok = all("error" not in r for t, r in results.items() if t != "export")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
