"""Replay: make inputs, run a saved graph, compare with what was recorded, time it.

- :func:`get_inputs` regenerates inputs from a `.input` file (and inputs.json beside it).
- :func:`replay_graph` binds inputs (saved or random), runs the graph, copies mutated
  inputs back, re-expands de-duplicated outputs and compares with the reference outputs;
  on a mismatch it interprets the graph node by node and names the first node whose
  value, shape, stride or dtype departs from the trace recorded at capture.
- :func:`replay_chain` runs forward then backward and checks the gradients against the
  joint graph's and, when the source can be rebuilt, eager autograd's.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.artifact import input_meta
from aotpipe.artifact.load import Artifact, GraphArtifact, build_inputs, load, read_json
from aotpipe.capture.values import RNG_SEED
from aotpipe.errors import ArtifactError
from aotpipe.tensors import (
    StorageGroup,
    close,
    equal_exact,
    max_abs_error,
    random_storage,
    stats,
    stats_depart,
    tolerance,
)

# ---------------------------------------------------------------------------------------
# get_inputs


def _entry_meta(entry: Any, where: str) -> dict[str, Any]:
    """A .input entry as a record like inputs.json's (no role, no range)."""
    if not isinstance(entry, tuple) or not entry:
        raise ArtifactError(f"{where}: bad input entry {entry!r}")
    if len(entry) == 1:
        t = entry[0]
        if t not in (int, float, bool):
            raise ArtifactError(f"{where}: bad scalar entry {entry!r}")
        return {"type": t.__name__}
    if len(entry) != 5:
        raise ArtifactError(f"{where}: an entry is (type, shape, stride, dtype, device), got {len(entry)} items")
    _, shape, stride, dtype, device = entry
    if not isinstance(dtype, torch.dtype):
        raise ArtifactError(f"{where}: bad dtype {dtype!r}")
    return {
        "type": "tensor",
        "shape": [int(s) for s in shape],
        "stride": [int(s) for s in stride],
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "storage_offset": 0,
        "range": None,
    }


def _flatten_meta(meta: list) -> tuple[list, Optional[list[int]]]:
    if meta and all(isinstance(m, list) for m in meta):
        return [e for group in meta for e in group], [len(g) for g in meta]
    return meta, None


def _record_from_input_file(meta: list, where: str) -> dict[str, Any]:
    """An inputs.json-like record for a bare .input file: one storage per tensor input."""
    flat, groups = _flatten_meta(meta)
    inputs, storages = [], []
    from aotpipe.tensors import extent

    for e in flat:
        rec = _entry_meta(e, where)
        if rec["type"] == "tensor":
            rec["storage"] = len(storages)
            storages.append({"dtype": rec["dtype"], "device": rec["device"],
                             "numel": extent(tuple(rec["shape"]), tuple(rec["stride"])), "range": None})
        inputs.append(rec)
    return {"inputs": inputs, "storages": storages, "groups": groups}


def _random_inputs(record: dict[str, Any], seed: int, device: Optional[str]) -> list[Any]:
    from aotpipe.artifact.graph_json import decode_dtype

    g = torch.Generator().manual_seed(seed)
    bases = []
    for s in record["storages"]:
        grp = StorageGroup(decode_dtype(s["dtype"]), s["device"], int(s["numel"]))
        rng = tuple(s["range"]) if s.get("range") else None
        base = random_storage(grp, g, rng)  # drawn on the CPU: the same on every machine
        bases.append(base.to(device) if device else base)
    return build_inputs(record, bases)


def get_inputs(path: str | Path, seed: int = 0, device: str | torch.device | None = None) -> list[Any]:
    """Random inputs for a saved graph, from its `.input` file and inputs.json beside it.

    Same shapes, dtypes, strides and storage offsets as at capture, and the same aliasing
    (inputs that shared a storage share one again); floats N(0, 1) from a generator seeded
    with `seed`; integers inside the recorded range ([0, 2) when none is recorded); random
    booleans; recorded int/float scalars. The joint graph's come nested as
    [[primals...], [tangents...]]. Works on `.input` files torch's graph_dumper_aot wrote.
    `path` may be the `.input` file or its graph folder.
    """
    p = Path(path)
    if p.is_dir():
        candidates = sorted(p.glob("*.input"))
        if len(candidates) != 1:
            raise ArtifactError(f"{p}: expected one .input file, found {len(candidates)}")
        p = candidates[0]
    meta = input_meta.read(p)
    record_path = p.parent / "inputs.json"
    dev = str(device) if device is not None else None
    if record_path.exists():
        record = read_json(record_path)
        flat, groups = _flatten_meta(meta)
        if len(flat) != len(record.get("inputs", [])):
            raise ArtifactError(f"{p}: {len(flat)} entries but inputs.json lists {len(record['inputs'])} inputs")
        groups = record.get("groups") or groups
    else:
        record = _record_from_input_file(meta, str(p))
        groups = record["groups"]
    from aotpipe.artifact.limits import check_record_bytes

    check_record_bytes(record, record_path if record_path.exists() else p)
    try:
        values = _random_inputs(record, seed, dev)
    except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
        raise ArtifactError(f"{p}: cannot make inputs from it ({e.__class__.__name__}: "
                            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    return input_meta.nest(values, groups)


# ---------------------------------------------------------------------------------------
# device rewriting


def to_device(gm: torch.fx.GraphModule, device: str | torch.device) -> torch.fx.GraphModule:
    """A copy of `gm` whose factory ops and device arguments name `device`."""
    dev = torch.device(device)
    gm = copy.deepcopy(gm)

    def rewrite(a: Any) -> Any:
        if isinstance(a, torch.device):
            return dev
        if isinstance(a, (list, tuple)):
            return type(a)(rewrite(x) for x in a)
        return a

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = rewrite(node.args)
            node.kwargs = {k: (dev if k == "device" and v is not None else rewrite(v)) for k, v in node.kwargs.items()}
    # remove_duplicate=False: equal constants loaded from one blob share a tensor.
    for name, buf in list(gm.named_buffers(remove_duplicate=False)):
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        owner.register_buffer(attr, buf.to(dev))
    gm.recompile()
    return gm


def move_inputs(values: list[Any], device: str | torch.device) -> list[Any]:
    """Inputs on `device`, keeping aliasing: views of one storage stay views of one storage."""
    dev = torch.device(device)
    moved_storage: dict[Any, torch.Tensor] = {}
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(v)
            continue
        from torch.multiprocessing.reductions import StorageWeakRef

        key = (StorageWeakRef(v.untyped_storage()), v.dtype)
        if key not in moved_storage:
            n = v.untyped_storage().nbytes() // v.element_size()
            moved_storage[key] = v.as_strided((n,), (1,), 0).to(dev)
        out.append(moved_storage[key].as_strided(v.shape, v.stride(), v.storage_offset()))
    return out


# ---------------------------------------------------------------------------------------
# running and comparing


def _draws_random(module: torch.nn.Module) -> bool:
    from aotpipe.capture.values import uses_rng

    if not isinstance(module, torch.fx.GraphModule):
        return True  # imported module.py: cannot tell, seed to be safe
    cached = module.__dict__.get("_aotpipe_uses_rng")
    if cached is None:
        cached = module.__dict__["_aotpipe_uses_rng"] = uses_rng(module)
    return cached


def run_graph(module: torch.nn.Module, inputs: list[Any]) -> list[Any]:
    """Run a graph on flat inputs, RNG seeded as at capture; outputs as a list. The caller's
    RNG state and grad mode are as they were afterwards."""
    from aotpipe.global_state import preserved

    with preserved(), torch.no_grad():
        if _draws_random(module):
            torch.manual_seed(RNG_SEED)  # ~0.1 ms: only for graphs that draw random numbers
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def copy_mutations_back(record: dict[str, Any], inputs: list[Any], outputs: list[Any]) -> list[str]:
    """Apply the graph's mutation outputs to the inputs they mutate; returns their targets."""
    by_target = {rec["name"]: i for i, rec in enumerate(record["inputs"]) if rec.get("name") is not None}
    # a parameter or buffer mutation names its target; a user-input mutation its placeholder
    by_target.update({rec["target"]: i for i, rec in enumerate(record["inputs"]) if rec.get("target") is not None})
    done = []
    for rec, value in zip(record["outputs"], outputs):
        if rec["role"] == "mutation" and rec["target"] in by_target and isinstance(value, torch.Tensor):
            inputs[by_target[rec["target"]]].copy_(value)
            done.append(rec["target"])
    return done


def expand_outputs(record: dict[str, Any], outputs: list[Any]) -> list[Any]:
    """Outputs with every de-duplicated slot filled from the slot it repeats."""
    out = list(outputs)
    for i, rec in enumerate(record["outputs"]):
        if rec.get("same_as") is not None and i < len(out) and out[i] is None:
            out[i] = out[rec["same_as"]]
    return out


class _CheckingInterpreter(torch.fx.Interpreter):
    """Interprets a graph and stops at the first node that departs from the recorded trace."""

    def __init__(self, gm: torch.fx.GraphModule, trace: dict[str, Any], rtol: float):
        super().__init__(gm)
        self.trace = trace
        self.rtol = rtol
        self.first: Optional[str] = None

    def run_node(self, n: torch.fx.Node) -> Any:
        r = super().run_node(n)
        if self.first is None and n.name in self.trace and self.trace[n.name] is not None:
            recorded = self.trace[n.name]
            pairs = (
                [(r, recorded)] if "items" not in recorded else list(zip(r, recorded["items"]))
            )
            for actual, rec in pairs:
                if rec is None or not isinstance(actual, torch.Tensor):
                    continue
                why = stats_depart(stats(actual), rec, self.rtol)
                if why:
                    target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
                    self.first = f"{n.name} ({target}): {why}"
                    break
        return r


def first_divergence(ga: GraphArtifact, inputs: list[Any], rtol: float = 1e-6) -> Optional[str]:
    """The first node whose value, shape, stride or dtype departs from the capture trace."""
    if not ga.trace or not isinstance(ga.module, torch.fx.GraphModule):
        return None
    from aotpipe.global_state import preserved

    interp = _CheckingInterpreter(ga.module, ga.trace.get("nodes", {}), rtol)
    with preserved(), torch.no_grad():
        torch.manual_seed(RNG_SEED)
        interp.run(*inputs)
    return interp.first


@dataclass
class GraphReplay:
    """The outcome of replaying one graph."""

    kind: str
    status: str  # match (bit-exact) | close (within tolerance, on another device) | mismatch | ran | error
    inputs: str  # saved | random
    max_abs_error: Optional[float] = None
    mismatches: list[str] = field(default_factory=list)
    first_divergence: Optional[str] = None
    mutated: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bench_seconds: Optional[float] = None
    eager_bench_seconds: Optional[float] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status in ("match", "close", "ran")

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if d["max_abs_error"] == float("inf"):
            d["max_abs_error"] = "inf"
        return d


def _compare_outputs(record: dict[str, Any], actual: list[Any], expected: list[Any]) -> tuple[list[str], float]:
    problems, worst = [], 0.0
    if len(actual) != len(expected):
        return [f"{len(actual)} outputs, recorded {len(expected)}"], float("inf")
    for i, (a, e, rec) in enumerate(zip(actual, expected, record["outputs"])):
        if isinstance(a, torch.Tensor) and rec.get("stride") is not None and a.numel() > 1:
            if list(a.stride()) != rec["stride"] and _significant_stride_differs(a, rec):
                problems.append(f"output {i}: stride {list(a.stride())} != recorded {rec['stride']}")
        if not equal_exact(a, e):
            err = max_abs_error(a, e)
            worst = max(worst, err)
            what = f"dtype {a.dtype} != {e.dtype}" if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) \
                and a.dtype != e.dtype else f"max abs error {err:.3g}"
            problems.append(f"output {i} ({rec['role']}{' ' + rec['target'] if rec.get('target') else ''}): {what}")
    return problems, worst


def _significant_stride_differs(a: torch.Tensor, rec: dict[str, Any]) -> bool:
    return any(st != rs and sz > 1 for st, rs, sz in zip(a.stride(), rec["stride"], a.shape))


def _median_seconds(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def replay_graph(
    ga: GraphArtifact,
    *,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
) -> GraphReplay:
    """Replay one graph and compare it with its recorded outputs (saved inputs only)."""
    result = GraphReplay(ga.name, "error", inputs)
    try:
        if inputs == "saved":
            values = ga.saved_inputs()
        elif inputs == "random":
            flat, _ = _flatten_meta(get_inputs(ga.input_file, seed=seed))
            values = flat
        else:
            raise ArtifactError(f"--inputs must be saved or random, got {inputs!r}")
        module = ga.module
        if device is not None:
            values = move_inputs(values, device)
            if isinstance(module, torch.fx.GraphModule):
                module = to_device(module, device)
        t0 = time.perf_counter()
        outs = run_graph(module, values)
        result.seconds = time.perf_counter() - t0
        outs = expand_outputs(ga.record, outs)
        result.mutated = copy_mutations_back(ga.record, values, outs)
        if bench:
            # The graph is functional: rerunning on inputs updated by copy-back is as fast.
            result.bench_seconds = _median_seconds(lambda: run_graph(module, values), bench)
        if len(outs) != len(ga.record["outputs"]):
            result.status = "mismatch"
            result.mismatches = [f"{len(outs)} outputs, recorded {len(ga.record['outputs'])}"]
            return result
        if inputs == "saved" and (device is None or torch.device(device).type == "cpu") and ga.has_saved_values:
            expected = ga.reference_outputs()
            problems, worst = _compare_outputs(ga.record, outs, expected)
            result.max_abs_error = worst
            result.mismatches = problems
            result.status = "mismatch" if problems else "match"
            if problems:
                result.first_divergence = first_divergence(ga, ga.saved_inputs())
        elif inputs == "saved" and ga.has_saved_values and torch.device(device).type != "meta":
            # Another device runs other kernels: compare within the per-dtype tolerance.
            expected = ga.reference_outputs()
            worst, problems = 0.0, []
            for i, (a, e) in enumerate(zip(outs, expected)):
                err = max_abs_error(a, e)
                worst = max(worst, err)
                if not close(a.cpu() if isinstance(a, torch.Tensor) else a, e):
                    problems.append(f"output {i}: max abs error {err:.3g} beyond tolerance {tolerance(e.dtype)}")
            result.max_abs_error = worst
            result.mismatches = problems
            result.status = "mismatch" if problems else "close"
        else:
            # Nothing recorded to compare values with: check the outputs' shapes and dtypes.
            for i, (o, rec) in enumerate(zip(outs, ga.record["outputs"])):
                if isinstance(o, torch.Tensor) and (list(o.shape) != rec.get("shape")
                                                    or str(o.dtype).removeprefix("torch.") != rec.get("dtype")):
                    result.mismatches.append(f"output {i}: {o.dtype}{list(o.shape)} != recorded "
                                             f"{rec.get('dtype')}{rec.get('shape')}")
            result.status = "mismatch" if result.mismatches else "ran"
    except ArtifactError:
        raise
    except Exception as e:
        result.status = "error"
        result.error = f"{e.__class__.__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return result


def replay(
    path: str | Path | Artifact,
    *,
    graphs: Optional[list[str]] = None,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
    trust_code: bool = False,
) -> list[GraphReplay]:
    """Replay the graphs of an artefact (all, or those named); see replay_graph."""
    art = path if isinstance(path, Artifact) else load(path, trust_code=trust_code)
    kinds = graphs or list(art.graphs)
    unknown = [k for k in kinds if k not in art.graphs]
    if unknown:
        raise ArtifactError(f"{art.path}: no {', '.join(unknown)} graph; it has {', '.join(art.graphs)}")
    if inputs == "saved" and not all(art.graphs[k].has_saved_values for k in kinds):
        inputs = "random"  # captured with save_inputs: false
    return [replay_graph(art.graphs[k], inputs=inputs, seed=seed, device=device, bench=bench) for k in kinds]


# ---------------------------------------------------------------------------------------
# forward -> backward chain


@dataclass
class ChainReplay:
    status: str  # match | mismatch
    compared: int
    max_abs_error_vs_joint: float
    max_abs_error_vs_eager: Optional[float]
    eager_within_tolerance: Optional[bool]
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def replay_chain(path: str | Path | Artifact, *, rebuild_source: bool = True, trust_code: bool = False) -> ChainReplay:
    """Run forward on saved inputs, feed its saved activations to backward, check the gradients.

    Gradients must equal the joint graph's bit for bit, and match eager autograd on the
    rebuilt source model within the per-dtype tolerance.
    """
    art = path if isinstance(path, Artifact) else load(path)
    for k in ("forward", "backward", "joint"):
        if k not in art.graphs:
            raise ArtifactError(f"{art.path}: the chain needs forward, backward and joint graphs; {k} is missing")
    fw, bw, joint = art.graphs["forward"], art.graphs["backward"], art.graphs["joint"]
    contract = fw.record.get("partition")
    if not contract:
        raise ArtifactError(f"{fw.folder}/inputs.json: no partition contract")
    primals = fw.saved_inputs()
    fw_out = run_graph(fw.module, primals)
    saved = fw_out[contract["num_mutated_inputs"] + contract["num_user_outputs"]:]
    from aotpipe.artifact.limits import ones

    tangents = [ones(r, bw.folder / "inputs.json") for r in bw.record["inputs"] if r["role"] == "tangent"]
    grads = run_graph(bw.module, list(saved) + tangents)
    joint_out = run_graph(joint.module, joint.saved_inputs())
    joint_grads = {r["target"]: v for r, v in zip(joint.record["outputs"], joint_out) if r["role"] == "grad"}
    problems, worst, compared = [], 0.0, 0
    for g, target in zip(grads, contract["grad_of"]):
        if target is None:
            continue
        compared += 1
        ref = joint_grads.get(target)
        if not equal_exact(g, ref):
            err = max_abs_error(g, ref)
            worst = max(worst, err)
            problems.append(f"gradient of {target}: differs from the joint graph's (max abs error {err:.3g})")
    eager_err, eager_ok = None, None
    if rebuild_source:
        eager = _eager_grads(art, trust_code=trust_code)
        if eager is not None:
            eager_err, eager_ok = 0.0, True
            for g, target in zip(grads, contract["grad_of"]):
                if target is None or eager.get(target) is None:
                    continue
                eager_err = max(eager_err, max_abs_error(g, eager[target]))
                if not close(g, eager[target]):
                    eager_ok = False
                    rtol, atol = tolerance(g.dtype)
                    problems.append(f"gradient of {target}: off eager autograd by {max_abs_error(g, eager[target]):.3g} "
                                    f"(tolerance rtol={rtol}, atol={atol})")
    return ChainReplay("mismatch" if problems else "match", compared, worst, eager_err, eager_ok, problems)


def rebuild_model(art: Artifact, *, trust_code: bool = False) -> Optional[tuple[torch.nn.Module, tuple, dict]]:
    """The source model and example inputs, rebuilt from the manifest's spec; None if impossible.

    Only builtin zoo models are rebuilt unless `trust_code` (sources.rebuild_refusal says
    why); a model over the byte limit is a LimitError.
    """
    from aotpipe.sources import rebuild_from_manifest

    return rebuild_from_manifest(art.manifest.get("model"), trust_code=trust_code, where=art.path / "manifest.json")


def _eager_grads(art: Artifact, *, trust_code: bool = False) -> Optional[dict[str, Optional[torch.Tensor]]]:
    from aotpipe.capture.values import _sum_loss

    rebuilt = rebuild_model(art, trust_code=trust_code)
    if rebuilt is None:
        return None
    model, args, kwargs = rebuilt
    model.train()
    try:
        _sum_loss(model(*args, **kwargs)).backward()
    except (IndexError, RuntimeError):
        return None  # no floating-point output to differentiate
    return {n: p.grad for n, p in model.named_parameters(remove_duplicate=False)}


def eager_bench(art: Artifact, kind: str, n: int, *, trust_code: bool = False) -> Optional[float]:
    """Median seconds of the eager model on its example inputs (for --bench), if rebuildable."""
    rebuilt = rebuild_model(art, trust_code=trust_code)
    if rebuilt is None:
        return None
    model, args, kwargs = rebuilt
    if kind == "inference":
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(*args, **kwargs)
    else:
        from aotpipe.capture.values import _sum_loss

        model.train()

        def step() -> None:
            _sum_loss(model(*args, **kwargs)).backward()
    step()  # warm-up
    return _median_seconds(step, n)


# ---------------------------------------------------------------------------------------
# verification right after writing


def verify_folder(path: Path) -> dict[str, Any]:
    """Replay every graph of a just-written artefact; a manifest-ready record (no timings)."""
    art = load(path)
    out: dict[str, Any] = {}
    for kind, ga in art.graphs.items():
        r = replay_graph(ga, inputs="saved" if ga.has_saved_values else "random")
        out[kind] = {
            "status": r.status,
            "inputs": r.inputs,
            "mismatches": r.mismatches,
            "first_divergence": r.first_divergence,
            "error": r.error,
        }
    if {"forward", "backward", "joint"} <= set(art.graphs) and all(g.has_saved_values for g in art.graphs.values()):
        c = replay_chain(art, rebuild_source=False)
        out["chain"] = {"status": c.status, "compared": c.compared, "problems": c.problems}
    return out
