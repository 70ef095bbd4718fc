"""Real-size models through aotpipe, side by side with what a user would otherwise run, against set targets.

For each model of each pipeline, in one process and one run, one model after another:

- eager: the model's forward+backward in train mode (loss: the sum of its floating-point
  outputs, as aotpipe's joint graph) and its inference forward; median of 3 after a warm-up;
- aotpipe: `run_model(force=True)` into a temporary folder: status, capture (all four
  kinds), checks (reference values + verification), passes, write, total seconds, and the
  bytes of the model's folder (four graph kinds, the optimised graph, blobs);
- torch.export + save: `torch.export.export(model.eval(), strict=False)` and
  `torch.export.save` to a .pt2 (which holds the weights and the example inputs), its bytes;
  then `torch.export.load` + a first run of `ep.module()` on the inputs it holds;
- a graph_dumper_aot-style dynamo backend: `torch.compile(backend=aot_autograd(...))` whose
  compilers save every forward, backward and joint GraphModule (`to_folder` plus a pickled
  .input list of (type, shape, stride, dtype, device)) and return it; one forward+backward
  in train mode, compilation and writing included; then the inference graph the same way
  (eval, no_grad), so that it dumps the same four kinds aotpipe captures;
- aotpipe load + first replay of the inference graph (`aotpipe.load` + `replay(graphs=
  ["inference"])`, which also compares with the saved outputs) against torch.export.load + run.

Headline: ratios against the targets (TARGETS below), each marked met, or its gap (the ratio divided
by the target). Absolute seconds and bytes follow in a second table.

    python benchmarks/realsize_bench.py [PIPELINE.yaml ...] [--markdown [FILE]] [--json FILE]
        [--only MODEL ...] [--tools eager,export,dynamo,aotpipe] [--output DIR] [--threads N]

Default pipelines: pipelines/mid-size.yaml and pipelines/real-size.yaml. `--tools
eager,export,dynamo` measures the alternatives only. The aotpipe measured is the one in
this checkout (it goes first on sys.path). Heavy on real sizes: several GB and minutes
per model on a small CPU machine.

On a machine shared with other work, use `--threads 1`: OpenMP threads that find no free
core slow compute-bound steps (eager runs, checks) several-fold while Python-bound ones
(tracing, compiling) barely change, which skews the ratios. The tables show the load
average seen during the run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's aotpipe, not an installed one

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from _markdown import add_markdown_option, write_page  # noqa: E402

from aotpipe.models.eager import sum_loss  # noqa: E402

DEFAULT_PIPELINES = [REPO / "pipelines" / "mid-size.yaml", REPO / "pipelines" / "real-size.yaml"]
TOOLS = ("eager", "export", "dynamo", "aotpipe")
REPEAT = 3
KINDS = ("inference", "forward", "backward", "joint")

# The targets: (key, label, target); the ratio must be <= the target.
TARGETS = [
    ("bytes_vs_pt2", "bytes: aotpipe folder / .pt2", 1.1),
    ("capture_vs_dynamo", "capture (4 kinds) / dynamo dump (4 kinds)", 1.0),
    ("total_vs_dynamo", "aotpipe whole model / dynamo dump", 2.0),
    ("checks_vs_eager", "checks / eager fwd+bwd", 3.0),
    ("floor_vs_eager", "checks' floor (eager float32 + each graph once) / eager fwd+bwd", None),
    ("replay_vs_export", "load + first replay / export load + run", None),
]


# ---------------------------------------------------------------------------------------
# helpers


class _SumLoss(torch.nn.Module):
    """The model's loss as aotpipe builds it: the sum of every floating-point output."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return sum_loss(self.model(*args, **kwargs))


def _reset_peak() -> None:
    """Reset this process's peak RSS (Linux: VmHWM), so each tool's peak is its own."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_gb() -> Optional[float]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _load_avg() -> Optional[float]:
    """The 1-minute load average: other work on the machine slows every tool's timings."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# The kinds an artefact's bytes are split into (bytes_by_kind), in the order the table lists them.
BYTE_KINDS = ("weights", "inputs", "outputs", "evidence", "graph.json", "module.py", "trace.json", "inputs.json",
              ".input", "manifest", "other")
_WEIGHT_ROLES = {"param", "buffer", "constant"}


def bytes_by_kind(folder: Path) -> dict[str, int]:
    """A model folder's bytes by what they hold: blobs by their first use (a graph input of role
    param, buffer or constant: `weights`; another input: `inputs`; a recorded output: `outputs`;
    an output's evidence sample: `evidence`), each blob counted once, then each graph folder's
    files by name, manifest.json and signature.json as `manifest`, the rest `other`."""
    rank = {k: i for i, k in enumerate(BYTE_KINDS)}
    blob_kind: dict[str, str] = {}

    def use(blob: Any, kind: str) -> None:
        if isinstance(blob, str) and rank[kind] < rank[blob_kind.get(blob, "other")]:
            blob_kind[blob] = kind

    for rec_path in folder.glob("*/inputs.json"):
        rec = json.loads(rec_path.read_text())
        storages = rec.get("storages") or []
        for i in rec.get("inputs") or []:
            st = i.get("storage")
            if i.get("source") == "blob" and isinstance(st, int) and st < len(storages):
                use(storages[st].get("blob"), "weights" if i.get("role") in _WEIGHT_ROLES else "inputs")
        for o in rec.get("outputs") or []:
            use(o.get("blob"), "outputs")
            use((o.get("evidence") or {}).get("blob"), "evidence")
    out = dict.fromkeys(BYTE_KINDS, 0)
    for f in folder.rglob("*"):
        if not f.is_file():
            continue
        size = f.stat().st_size
        if f.parent.name == "blobs":
            out[blob_kind.get(f.name.split(".")[0], "other")] += size
        elif f.parent == folder:
            out["manifest" if f.name in ("manifest.json", "signature.json") else "other"] += size
        elif f.name in out:
            out[f.name] += size
        else:
            out[".input" if f.suffix == ".input" else "other"] += size
    return out


def _median(fn: Callable[[], Any], n: int = REPEAT, setup: Optional[Callable[[], Any]] = None) -> float:
    """Median seconds of n calls after one warm-up call; `setup` runs untimed before each."""
    times = []
    for i in range(n + 1):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _short(e: BaseException) -> str:
    """One line: the exception, and for a wrapper (dynamo's BackendCompilerFailed) its cause."""
    inner = getattr(e, "inner_exception", None) or e.__cause__
    if inner is not None and str(e).strip().splitlines()[:1] and str(e).strip().splitlines()[0].endswith("raised:"):
        return f"{e.__class__.__name__}: {_short(inner)}"
    text = [t for t in str(e).strip().splitlines() if t.strip()]
    return f"{e.__class__.__name__}: {text[0][:200]}" if text else e.__class__.__name__


def _cell(fn: Callable[..., dict], *args: Any) -> dict:
    """Run one tool's measurement; a failure is recorded in its cell, and the run goes on."""
    _reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001: any tool may fail on any model
        out = {"error": _short(e), "traceback": traceback.format_exc()}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # CPU seconds per wall second per torch thread: well under 1 means the tool waited for
    # a core (other work on the machine), so its seconds are inflated.
    out["cpu_share"] = cpu / wall / torch.get_num_threads() if wall > 0 else None
    out["peak_rss_gb"] = _peak_gb()
    gc.collect()
    return out


# ---------------------------------------------------------------------------------------
# the tools


def bench_eager(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    loss_module = _SumLoss(model)
    model.train()

    def train_step() -> None:
        loss_module(*args, **kwargs).backward()

    fwd_bwd = _median(train_step, setup=lambda: model.zero_grad(set_to_none=True))
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        fwd = _median(lambda: model(*args, **kwargs))
    return {"fwd_bwd_s": fwd_bwd, "fwd_s": fwd}


def bench_export(model: torch.nn.Module, args: tuple, kwargs: dict, tmp: Path) -> dict:
    path = tmp / "model.pt2"
    model.eval()
    t0 = time.perf_counter()
    ep = torch.export.export(model, args, kwargs, strict=False)
    t1 = time.perf_counter()
    torch.export.save(ep, path)
    t2 = time.perf_counter()
    del ep
    gc.collect()
    with zipfile.ZipFile(path) as z:
        input_bytes = sum(i.file_size for i in z.infolist() if "sample_inputs" in i.filename
                          or "example_inputs" in i.filename)
    t3 = time.perf_counter()
    loaded = torch.export.load(path)
    t4 = time.perf_counter()
    held = loaded.example_inputs
    run_args, run_kwargs = held if held else (args, kwargs)
    with torch.no_grad():
        loaded.module()(*run_args, **run_kwargs)
    t5 = time.perf_counter()
    out = {"export_s": t1 - t0, "save_s": t2 - t1, "pt2_bytes": path.stat().st_size,
           "pt2_holds_inputs": bool(held), "pt2_input_bytes": input_bytes,
           "load_s": t4 - t3, "first_run_s": t5 - t4, "load_run_s": t5 - t3}
    path.unlink()
    return out


class GraphDumper:
    """A graph_dumper_aot-style dump (torch/_functorch/compilers.py, _save_fx_default), made
    to work on torch 2.13: graph indices per dumper, joint args as lists, metadata from
    fake tensors, a separate inference compiler."""

    def __init__(self, folder: Path, name: str):
        self.folder, self.name = folder, name
        self.counts: dict[str, int] = {}

    @staticmethod
    def _meta(args: Any) -> list:
        out: list = []
        for a in args:
            if isinstance(a, torch.Tensor):
                out.append((torch.Tensor, tuple(a.shape), tuple(a.stride()), a.dtype, a.device))
            elif isinstance(a, (int, float, bool, torch.SymInt, torch.SymFloat)):
                out.append((int if isinstance(a, (int, torch.SymInt)) else float,))
            else:
                out.append((type(a),))
        return out

    def save(self, gm: torch.fx.GraphModule, args: Any, kind: str) -> None:
        if len(gm.graph.nodes) == 0:
            return
        index = self.counts.get(kind, 0)
        self.counts[kind] = index + 1
        gm = copy.deepcopy(gm)
        gm.graph.set_codegen(torch.fx.graph.CodeGen())  # plain positional signature
        gm.recompile()
        d = self.folder / f"{self.name}_{kind}_{index}"
        self.folder.mkdir(parents=True, exist_ok=True)
        gm.to_folder(d)
        meta = [self._meta(args[0]), self._meta(args[1])] if kind == "joint" else self._meta(args)
        (d / f"{d.name}.input").write_bytes(pickle.dumps(meta))

    def forward(self, gm, example_inputs):
        self.save(gm, example_inputs, "forward")
        return gm

    def backward(self, gm, example_inputs):
        self.save(gm, example_inputs, "backward")
        return gm

    def inference(self, gm, example_inputs):
        self.save(gm, example_inputs, "inference")
        return gm

    def joint(self, gm, joint_args, **kwargs):
        from torch._functorch.partitioners import default_partition

        self.save(gm, joint_args, "joint")
        return default_partition(gm, joint_args, **kwargs)

    def backend(self):
        from functorch.compile import default_decompositions
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=self.forward, bw_compiler=self.backward, inference_compiler=self.inference,
                            partition_fn=self.joint, decompositions=default_decompositions)


def bench_dynamo(model: torch.nn.Module, args: tuple, kwargs: dict, tmp: Path, name: str) -> dict:
    folder = tmp / "dynamo" / name
    dumper = GraphDumper(folder, name)
    model.zero_grad(set_to_none=True)
    model.train()
    torch._dynamo.reset()
    t0 = time.perf_counter()
    compiled = torch.compile(_SumLoss(model), backend=dumper.backend())
    compiled(*args, **kwargs).backward()
    t1 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    model.eval()
    torch._dynamo.reset()
    t2 = time.perf_counter()
    compiled = torch.compile(model, backend=dumper.backend())
    with torch.no_grad():
        compiled(*args, **kwargs)
    t3 = time.perf_counter()
    del compiled
    torch._dynamo.reset()
    out = {"train_s": t1 - t0, "inference_s": t3 - t2, "total_s": (t1 - t0) + (t3 - t2),
           "graphs": dict(dumper.counts), "bytes": _folder_bytes(folder)}
    shutil.rmtree(folder, ignore_errors=True)
    return out


@contextlib.contextmanager
def _timing(owner: Any, name: str, seconds: dict[str, float], key: Callable[..., str]) -> Any:
    """While active, the wall seconds of owner.name's calls, added to seconds[key(*args)]."""
    f = getattr(owner, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            label = key(*a, **k)
            seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, f)


def _eager_label(_self: Any, mode: str, fp64: bool, nudged: int = 0) -> str:
    return "eager float64" if fp64 else "eager nudged" if nudged else "eager float32"


def checks_split(seconds: dict[str, float], checks_s: float) -> dict[str, float]:
    """The checks' seconds by what they spent them on: eager float32, float64 and nudged runs,
    the written graphs' runs, and the rest (loading, the precheck, comparing, digests,
    evidence). The float64 run happens inside a comparison, so "other" leaves it out."""
    out = {k: seconds.get(k, 0.0) for k in ("eager float32", "eager float64", "eager nudged", "graph runs")}
    out["other"] = max(0.0, checks_s - sum(out.values()))
    return out


def graph_runs(folder: Path) -> dict[str, float]:
    """Seconds of one plain run of each written graph, as the loader builds it, on its saved
    inputs (a backward on its forward's outputs): no per-node summaries, comparisons or
    digests. With eager's float32 runs, the least a check that runs every graph once
    against the eager model can cost."""
    from aotpipe.artifact.load import load
    from aotpipe.format import limits
    from aotpipe.format.graph_keys import graph_key, key_order, parse_graph_key
    from aotpipe.runtime.execution import runnable

    out: dict[str, float] = {}
    outs: dict[str, list] = {}
    with limits.unbounded_bytes():
        art = load(folder).build_all()
        for key in sorted(art.graphs, key=key_order):
            ga, parsed = art.graphs[key], parse_graph_key(key)
            forward = graph_key("forward", parsed.subgraph) if parsed is not None else None
            inputs = ga.saved_inputs(forward_outputs=outs.get(forward)) if parsed is not None \
                and parsed.kind == "backward" else ga.saved_inputs()
            module = runnable(ga.module, inputs)
            with torch.no_grad():
                t = time.perf_counter()
                result = module(*inputs)
                out[key] = time.perf_counter() - t
            outs[key] = list(result) if isinstance(result, (tuple, list)) else [result]
    return out


def bench_aotpipe(spec: Any, out_dir: Path, base_dir: Optional[Path]) -> dict:
    import aotpipe.checks.written as written
    from aotpipe.models.eager import EagerReference
    from aotpipe.pipeline.job import run_model

    seconds: dict[str, float] = {}
    with _timing(EagerReference, "_run", seconds, _eager_label), \
            _timing(written, "run_with_summaries", seconds, lambda *a, **k: "graph runs"):
        r = run_model(spec, out_dir, base_dir, force=True)
    g = lambda name, default=None: getattr(r, name, default)  # noqa: E731
    checks = r.checks_seconds
    checks_from = "checks_seconds"
    passes = g("passes") or {}
    passes_s = sum(float(p.get("seconds", 0.0)) for p in passes.values() if isinstance(p, dict))
    folder = out_dir / spec.name
    folder_written = folder.is_dir() and (folder / "manifest.json").is_file()
    out = {"status": g("status"), "stage": g("stage"), "model_error": g("error"),
           "capture_s": g("capture_seconds"), "checks_s": checks, "checks_from": checks_from,
           "passes_s": passes_s, "write_s": g("write_seconds"), "total_s": g("total_seconds"),
           "bytes": _folder_bytes(folder) if folder_written else None,
           "blob_bytes": _folder_bytes(folder / "blobs") if folder_written and (folder / "blobs").is_dir() else None,
           "bytes_by_kind": bytes_by_kind(folder) if folder_written else None,
           "graphs": [getattr(x, "kind", str(x)) for x in (g("graphs") or [])],
           "written": folder_written}
    if isinstance(checks, (int, float)):
        out["checks_split"] = checks_split(seconds, checks)
    if folder_written:
        out["graph_runs"] = graph_runs(folder)
    if g("traceback"):
        out["model_traceback"] = g("traceback")
    return out


def bench_replay(folder: Path) -> dict:
    import aotpipe
    from aotpipe.replay import replay

    t0 = time.perf_counter()
    art = aotpipe.load(folder)
    t1 = time.perf_counter()
    results = replay(art, graphs=["inference"])
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "replay_s": t2 - t1, "load_replay_s": t2 - t0,
            "status": ",".join(getattr(r, "status", "?") for r in results)}


# ---------------------------------------------------------------------------------------
# one model, one pipeline


def bench_model(spec: Any, base_dir: Optional[Path], out_dir: Path, tools: set[str]) -> dict:
    from aotpipe.models.sources import build_model, make_example_inputs

    row: dict[str, Any] = {"model": spec.name, "load_avg": [_load_avg()]}
    print(f"  {spec.name}: building", file=sys.stderr, flush=True)
    try:
        model = build_model(spec, base_dir)
        args, kwargs = make_example_inputs(spec)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"building the model failed: {_short(e)}"
        return row
    row["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    with tempfile.TemporaryDirectory(prefix="realsize-") as tmp:
        for tool, fn, extra in [("eager", bench_eager, ()), ("export", bench_export, (Path(tmp),)),
                                ("dynamo", bench_dynamo, (Path(tmp), spec.name))]:
            if tool in tools:
                print(f"  {spec.name}: {tool}", file=sys.stderr, flush=True)
                row[tool] = _cell(fn, model, args, kwargs, *extra)
    del model, args, kwargs
    gc.collect()
    if "aotpipe" in tools:
        print(f"  {spec.name}: aotpipe run", file=sys.stderr, flush=True)
        row["aotpipe"] = _cell(bench_aotpipe, spec, out_dir, base_dir)
        if row["aotpipe"].get("written"):
            print(f"  {spec.name}: aotpipe load + replay", file=sys.stderr, flush=True)
            row["replay"] = _cell(bench_replay, out_dir / spec.name)
    gc.collect()
    row["load_avg"].append(_load_avg())
    row["ratios"] = ratios(row)
    return row


def _ok(row: dict, tool: str, *keys: str) -> bool:
    cell = row.get(tool)
    return isinstance(cell, dict) and "error" not in cell and all(
        isinstance(cell.get(k), (int, float)) and cell.get(k) > 0 for k in keys)


def ratios(row: dict) -> dict[str, Optional[float]]:
    r: dict[str, Optional[float]] = {k: None for k, _, _ in TARGETS}
    a = row.get("aotpipe") or {}
    if _ok(row, "aotpipe", "bytes") and _ok(row, "export", "pt2_bytes"):
        r["bytes_vs_pt2"] = a["bytes"] / row["export"]["pt2_bytes"]
    if _ok(row, "dynamo", "total_s"):
        if _ok(row, "aotpipe", "capture_s"):
            r["capture_vs_dynamo"] = a["capture_s"] / row["dynamo"]["total_s"]
        if _ok(row, "aotpipe", "total_s") and a.get("stage") not in ("source", "capture"):
            r["total_vs_dynamo"] = a["total_s"] / row["dynamo"]["total_s"]
    if _ok(row, "aotpipe", "checks_s") and _ok(row, "eager", "fwd_bwd_s"):
        r["checks_vs_eager"] = a["checks_s"] / row["eager"]["fwd_bwd_s"]
    if isinstance(a.get("graph_runs"), dict) and a["graph_runs"] and _ok(row, "eager", "fwd_bwd_s", "fwd_s"):
        e = row["eager"]
        r["floor_vs_eager"] = (e["fwd_bwd_s"] + e["fwd_s"] + sum(a["graph_runs"].values())) / e["fwd_bwd_s"]
    if _ok(row, "replay", "load_replay_s") and _ok(row, "export", "load_run_s"):
        r["replay_vs_export"] = row["replay"]["load_replay_s"] / row["export"]["load_run_s"]
    return r


def bench_pipeline(path: Path, tools: set[str], only: list[str], output: Optional[Path],
                   on_model: Callable[[dict], None] = lambda result: None) -> dict:
    """Every selected model of one pipeline; `on_model` sees the partial result after each."""
    from aotpipe.pipeline.config import load_pipeline

    pipeline = load_pipeline(path)
    specs = [m for m in pipeline.models if not only or m.name in only]
    base_dir = path.resolve().parent
    print(f"{pipeline.name}: {len(specs)} model(s)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    result = {"pipeline": pipeline.name, "path": str(path), "rows": [], "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="realsize-aotpipe-") as tmp:
        out_dir = (output / pipeline.name) if output else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        for spec in specs:
            result["rows"].append(bench_model(spec, base_dir, out_dir, tools))
            if output is None:  # real-size artefacts run to GB: keep one at a time
                shutil.rmtree(out_dir / spec.name, ignore_errors=True)
            result["seconds"] = time.perf_counter() - t0
            on_model(result)
    return result


def warm_up(tools: set[str]) -> None:
    """Pay one-off import and first-use costs of every tool on a tiny model, unmeasured."""
    from aotpipe.pipeline.config import parse_pipeline

    text = ("version: 1\nname: warmup\nmodels:\n  - name: mlp\n    source: aotpipe.zoo:mlp\n"
            "    args: {in_features: 8, hidden: 8, depth: 1}\n    inputs: [{shape: [2, 8]}]\n"
            "    passes: [freeze, fold_conv_bn, channels_last, reinplace]\n")
    spec = parse_pipeline(text, "<warm-up>").models[0]
    with contextlib.redirect_stderr(open(os.devnull, "w")):
        with tempfile.TemporaryDirectory(prefix="realsize-warmup-") as tmp:
            bench_model(spec, None, Path(tmp), tools)


# ---------------------------------------------------------------------------------------
# tables


def _err(cell: Any) -> Optional[str]:
    if cell is None:
        return "-"
    if "error" in cell:
        return f"failed ({cell['error'][:60]})"
    return None


def _ratio_cell(value: Optional[float], target: Optional[float]) -> str:
    if value is None:
        return "-"
    if target is None:
        return f"{value:.2f}"
    return f"{value:.2f} met" if value <= target else f"{value:.2f} gap {value / target:.2f}x"


def _status(row: dict) -> str:
    if "error" in row:
        return row["error"]
    a = row.get("aotpipe")
    if a is None:
        return "-"
    if a.get("error"):
        return f"failed ({a['error'][:60]})"
    if a.get("status") == "ok":
        return "ok"
    return f"{a.get('status')} ({a.get('stage')})"


def _s(cell: Any, key: str, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    e = _err(cell)
    if e:
        return e
    v = cell.get(key)
    return fmt.format(v * scale) if isinstance(v, (int, float)) else "-"


def _mb(cell: Any, key: str) -> str:
    return _s(cell, key, "{:.1f}", 1 / 2**20)


def _split_cell(cell: Any) -> str:
    split = cell.get("checks_split") if isinstance(cell, dict) and not _err(cell) else None
    if not isinstance(split, dict):
        return "-"
    cell = "/".join(f"{split.get(k, 0.0):.1f}" for k in ("eager float32", "eager float64", "graph runs", "other"))
    nudged = split.get("eager nudged", 0.0)  # (further noise samples: only where a check failed at first)
    return cell + (f" (+{nudged:.1f} nudged)" if nudged else "")


def _runs_cell(cell: Any) -> str:
    runs = cell.get("graph_runs") if isinstance(cell, dict) and not _err(cell) else None
    return f"{sum(runs.values()):.2f}" if isinstance(runs, dict) and runs else "-"


def tables(result: dict) -> str:
    rows = result["rows"]
    threads = torch.get_num_threads()
    loads = [x for r in rows for x in r.get("load_avg", []) if x is not None]
    load = f", load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs" if loads else ""
    lines = [f"### {result['pipeline']} ({Path(result['path']).name}): torch {torch.__version__}, "
             f"{threads} threads{load}, {result['seconds']:.0f} s for the whole benchmark", ""]
    head = ["model", "params", "aotpipe status"] + [
        f"{label} (target <= {t})" if t is not None else f"{label} (no target)" for _, label, t in TARGETS]
    lines += ["| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * len(TARGETS)]
    for row in rows:
        params = f"{row['params'] / 1e6:.1f}M" if row.get("params") else "-"
        cells = [row["model"], params, _status(row)] + [
            _ratio_cell(row.get("ratios", {}).get(k), t) for k, _, t in TARGETS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "met: the ratio is within the target; gap Nx: the ratio is N times the target.", ""]

    head2 = ["model", "eager fwd ms", "eager fwd+bwd ms",
             "aotpipe capture s", "checks s", "checks s: eager float32/float64/graph runs/other",
             "each graph once s", "passes s", "write s", "aotpipe total s", "aotpipe MB (blobs)",
             "export s", "save s", ".pt2 MB (inputs)", "export load+run s",
             "dynamo fw+bw+joint s", "dynamo inference s", "dynamo MB",
             "aotpipe load s", "replay inference s", "peak RSS GB eager/export/dynamo/aotpipe",
             "CPU share eager/export/dynamo/aotpipe"]
    lines += ["| " + " | ".join(head2) + " |", "|---|" + "---:|" * (len(head2) - 1)]
    for row in rows:
        e, x, d, a, rp = (row.get(k) for k in ("eager", "export", "dynamo", "aotpipe", "replay"))
        aot_mb = _mb(a, "bytes")
        if a and not _err(a) and isinstance(a.get("blob_bytes"), int):
            aot_mb += f" ({a['blob_bytes'] / 2**20:.1f})"
        pt2_mb = _mb(x, "pt2_bytes")
        if x and not _err(x):
            pt2_mb += f" ({x['pt2_input_bytes'] / 2**20:.1f})" if x.get("pt2_holds_inputs") else " (no inputs)"
        peaks = "/".join(f"{c['peak_rss_gb']:.1f}" if c and c.get("peak_rss_gb") else "-" for c in (e, x, d, a))
        shares = "/".join(f"{c['cpu_share']:.2f}" if c and c.get("cpu_share") else "-" for c in (e, x, d, a))
        cells = [row["model"], _s(e, "fwd_s", "{:.1f}", 1e3), _s(e, "fwd_bwd_s", "{:.1f}", 1e3),
                 _s(a, "capture_s"), _s(a, "checks_s"), _split_cell(a), _runs_cell(a), _s(a, "passes_s"), _s(a, "write_s"), _s(a, "total_s"),
                 aot_mb, _s(x, "export_s"), _s(x, "save_s"), pt2_mb, _s(x, "load_run_s"),
                 _s(d, "train_s"), _s(d, "inference_s"), _mb(d, "bytes"),
                 _s(rp, "load_s"), _s(rp, "replay_s"), peaks, shares]
        lines.append("| " + " | ".join(cells) + " |")
    checks_from = {r["aotpipe"].get("checks_from") for r in rows if r.get("aotpipe") and not _err(r["aotpipe"])}
    lines += ["", "checks: " + (", ".join(sorted(checks_from)) or "-") + " of aotpipe's ModelResult, split by "
              "timers: the eager model's float32 runs (inference and training), its float64 run (made only where "
              "a graph's value is over the float32 noise floor against eager float32), the written graphs' runs "
              "(per-node summaries), the rest (loading, the precheck, comparing, digests, evidence). Each graph "
              "once: one plain run of every written graph as the loader builds it, on its saved inputs. The "
              "checks' floor: eager fwd+bwd + eager fwd + each graph once, what a check that runs every graph "
              "once against eager float32 cannot go below, whatever its overheads; a float64 reference adds "
              "its run to that. "
              "Dynamo dump: graph_dumper_aot-style aot_autograd backend, train step (forward, backward, joint) "
              "plus inference, compilation and writing included; the target ratios use its sum. "
              ".pt2: torch.export.save of the eval-mode export; `(inputs)` is the part holding the example inputs. "
              "Replay: aotpipe.load of the whole artefact + replay of the inference graph against its saved "
              "outputs, vs torch.export.load + ep.module() on the inputs the .pt2 holds. Peak RSS: the process's "
              "VmHWM during each tool. CPU share: CPU seconds per wall second per torch thread; well under 1 "
              "means the tool waited for a core (other work on the machine) and its seconds are inflated."]
    split = [r for r in rows if isinstance((r.get("aotpipe") or {}).get("bytes_by_kind"), dict)]
    if split:
        lines += ["", "aotpipe's bytes by what they hold (MB; blobs by their first use: weights are parameters, "
                  "buffers and constants, inputs the other saved inputs, outputs the recorded outputs, evidence "
                  "the outputs' sampled values), beside the .pt2's:", "",
                  "| model | " + " | ".join(BYTE_KINDS) + " | aotpipe MB | .pt2 MB (inputs) |",
                  "|---|" + "---:|" * (len(BYTE_KINDS) + 2)]
        for row in split:
            kinds, x = row["aotpipe"]["bytes_by_kind"], row.get("export")
            pt2 = _mb(x, "pt2_bytes") + (f" ({x['pt2_input_bytes'] / 2**20:.1f})"
                                         if x and not _err(x) and x.get("pt2_holds_inputs") else "")
            lines.append(f"| {row['model']} | " + " | ".join(f"{kinds[k] / 2**20:.2f}" for k in BYTE_KINDS)
                         + f" | {sum(kinds.values()) / 2**20:.1f} | {pt2} |")
    notes = []
    for row in rows:
        for tool in ("eager", "export", "dynamo", "aotpipe", "replay"):
            c = row.get(tool)
            if isinstance(c, dict) and c.get("error"):
                notes.append(f"- {row['model']} / {tool}: {c['error']}")
        a = row.get("aotpipe") or {}
        if a.get("status") not in (None, "ok") and a.get("model_error"):
            notes.append(f"- {row['model']} / aotpipe {a.get('status')} at {a.get('stage')}: {a['model_error'][:400]}")
        d = row.get("dynamo")
        if isinstance(d, dict) and d.get("graphs"):
            notes.append(f"- {row['model']} / dynamo graphs dumped: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(d["graphs"].items())))
    if notes:
        lines += ["", "Notes:", ""] + notes
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipelines", nargs="*", type=Path, help="pipeline YAML files (default: mid-size and real-size)")
    add_markdown_option(ap, "realsize_bench")
    ap.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    ap.add_argument("--only", action="append", default=[], help="only this model (repeatable)")
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help=f"comma-separated subset of {','.join(TOOLS)} (default: all)")
    ap.add_argument("--output", type=Path, help="keep aotpipe's artefacts here (default: a temporary folder)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's default)")
    ap.add_argument("--no-warm-up", action="store_true", help="skip the unmeasured warm-up on a tiny model")
    ns = ap.parse_args(argv)
    tools = {t.strip() for t in ns.tools.split(",") if t.strip()}
    if tools - set(TOOLS):
        ap.error(f"--tools: unknown {', '.join(sorted(tools - set(TOOLS)))}; choose from {', '.join(TOOLS)}")
    paths = ns.pipelines or DEFAULT_PIPELINES
    if ns.threads:
        torch.set_num_threads(ns.threads)
    if not ns.no_warm_up:
        warm_up(tools)
    results: list[dict] = []
    text = ""

    def save_json(partial: dict) -> None:  # after every model, so that a long run keeps what it measured
        if ns.json:
            ns.json.write_text(json.dumps(results + [partial], indent=1, default=str), encoding="utf-8")
        row = partial["rows"][-1]
        print(f"  {row['model']} done: " + ", ".join(f"{k} {v:.2f}" for k, v in row.get("ratios", {}).items()
                                                     if v is not None), file=sys.stderr, flush=True)

    for path in paths:
        res = bench_pipeline(path, tools, ns.only, ns.output, save_json)
        results.append(res)
        t = tables(res)
        print(t, flush=True)
        text += t + "\n"
    if ns.markdown:
        write_page(ns.markdown, "realsize_bench", text)
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
