"""Checks of a shape-polymorphic artefact at sizes other than the example's.

A graph captured with symbolic sizes claims to run at every size in its dimensions' ranges.
The written checks (checks/written.py) hold it at the example; here every graph is run again,
from its files, at the minimum and the maximum of every range and at one size drawn in range,
and compared with the eager model at those sizes by the same rules: user outputs, the loss,
gradients and mutated buffers against eager by the float64 rule, and the joint against the
forward then backward bit for bit.

The inputs at a point are drawn as the example's were (the model's input generator and seed,
the spec at those sizes: :meth:`aotpipe.spec.ModelSpec.at`), so a replay at a checked size
(replay --sizes) draws the same ones and compares its outputs with the digests and summaries
recorded here. The maximum is checked only as far as the memory budget allows: the graphs'
values at a point are estimated from graph.json's layouts in the symbols, and where the max
needs more, the largest point that fits on the way from the example to the max is checked
instead, and the record says so.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
import torch.utils._pytree as pytree

from aotpipe.artifact.load import Artifact, GraphArtifact, load
from aotpipe.checks.checked import settled_counts
from aotpipe.checks.written import _Checker
from aotpipe.errors import ArtifactError
from aotpipe.format import limits
from aotpipe.format.graph_keys import graph_key, key_order, parse_graph_key
from aotpipe.format.records import CheckTotals, DimRecord, DimsRecord, NodeValue, SizeCheckRecord, SymbolRecord
from aotpipe.format.symbolic import evaluate
from aotpipe.format.vocabulary import TRAINING_KINDS, GraphKind
from aotpipe.models.eager import EagerReference, model_state
from aotpipe.replay.run import chain_problems, expand_outputs
from aotpipe.replay.sizes import bind_at_sizes, capture_symbols, draw_user_inputs
from aotpipe.runtime import accuracy
from aotpipe.runtime.determinism import derived_seed
from aotpipe.runtime.execution import run_graph
from aotpipe.spec import ModelSpec
from aotpipe.spec.modes import LOSSES

# The memory the size checks' graph values may take, when the model has no memory limit.
DEFAULT_BUDGET_BYTES = 4 << 30
_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
             "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}


def dimensions(spec: ModelSpec, symbols: dict[str, SymbolRecord], auto_report: list[str]) -> dict[str, DimRecord]:
    """The manifest's `dims`: each named dimension (dynamic: its symbol; else specialised), or
    with dims: auto each input's leading dimension, keyed by the input dimension it is."""
    out: dict[str, DimRecord] = {}
    if spec.auto_dims:
        reported = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in auto_report}
        for source, status in reported.items():
            sym = next((n for n, r in symbols.items() if source in r.sources), None)
            if sym is not None:
                r = symbols[sym]
                out[source] = DimRecord(min=r.min, max=r.max, example=r.example, status="dynamic", symbol=sym,
                                        sources=r.sources)
            else:
                size = int(status.split("specialised to", 1)[1].split()[0]) if "specialised to" in status else 0
                out[source] = DimRecord(min=size, max=size, example=size, status="specialised", sources=[source],
                                        reason=status)
        return out
    for name, d in spec.dims.items():
        sym = next((n for n, r in symbols.items() if r.dim == name), None)
        sources = [f"{inp.name or f'arg{i}'}.size({k})" for i, inp in enumerate(spec.inputs)
                   for k, n in enumerate(inp.dims) if n == name]
        if sym is not None:
            out[name] = DimRecord(min=d.min, max=d.max, example=d.size, status="dynamic", symbol=sym,
                                  sources=symbols[sym].sources or sources)
        else:
            out[name] = DimRecord(min=d.min, max=d.max, example=d.size, status="specialised", sources=sources,
                                  reason=f"specialised to {d.size}: no graph keeps it symbolic")
    return out


def static_dims(spec: ModelSpec, reason: str) -> DimsRecord:
    """The manifest's `dims` of a capture that kept every size at the example's (`reason`: why)."""
    dims = {name: DimRecord(min=d.min, max=d.max, example=d.size, status="specialised", reason=reason,
                            sources=[f"{inp.name or f'arg{i}'}.size({k})" for i, inp in enumerate(spec.inputs)
                                     for k, n in enumerate(inp.dims) if n == name])
            for name, d in spec.dims.items()}
    return DimsRecord(auto_dims=spec.auto_dims, dims=dims)


def _graph_bytes(ga: GraphArtifact, sizes: dict[str, int]) -> int:
    """The bytes of every value the graph computes, at `sizes` (symbol -> size), from graph.json's
    layouts: an upper bound of what running it holds at once."""
    total = 0
    for node in ga.graph.nodes if ga.graph is not None else []:
        for v in node.val if isinstance(node.val, list) else [node.val]:
            layout = NodeValue.of(v)
            if layout is None:
                continue
            try:
                n = math.prod(evaluate(s, sizes) for s in layout.shape)
            except ArtifactError:  # a layout that is not size arithmetic: not counted
                continue
            total += max(n, 0) * _ITEMSIZE.get(layout.dtype, 4)
    return total


def _fits(art: Artifact, sizes: dict[str, int], budget: int) -> bool:
    return max((_graph_bytes(ga, sizes) for ga in art.graphs.values()), default=0) <= budget


def check_points(dims: dict[str, DimRecord], art: Artifact, seed: int, budget: int
                 ) -> list[tuple[str, dict[str, int], str | None]]:
    """(point, sizes by dimension, note) to check: min, max (within the budget) and a random
    size in range; the example is held by the written checks."""
    dynamic = {k: d for k, d in dims.items() if d.status == "dynamic" and d.symbol is not None}
    if not dynamic:
        return []
    symbol = {k: d.symbol for k, d in dynamic.items()}

    def by_symbol(sizes: dict[str, int]) -> dict[str, int]:
        return {symbol[k]: v for k, v in sizes.items()}  # type: ignore[misc]

    example = {k: d.example for k, d in dynamic.items()}
    low = {k: d.min for k, d in dynamic.items()}
    # an unbounded range (dims: auto) is checked up to 4x the example
    high = {k: d.max if d.max is not None else 4 * d.example for k, d in dynamic.items()}
    note = None
    if not _fits(art, by_symbol(high), budget):
        lo_t, hi_t = 0.0, 1.0
        for _ in range(20):  # the largest t in [0, 1] whose point example + t * (max - example) fits
            mid = (lo_t + hi_t) / 2
            point = {k: int(example[k] + mid * (high[k] - example[k])) for k in high}
            lo_t, hi_t = (mid, hi_t) if _fits(art, by_symbol(point), budget) else (lo_t, mid)
        fitted = {k: max(example[k], int(example[k] + lo_t * (high[k] - example[k]))) for k in high}
        note = (f"the max ({', '.join(f'{k}={v}' for k, v in high.items())}) needs more than the "
                f"{budget / 2**30:.1f} GiB budget for the graphs' values: checked at the largest size that fits")
        high = fitted
    elif any(d.max is None for d in dynamic.values()):
        note = "an unbounded range: checked at 4x the example"
    rng = random.Random(seed)
    drawn = {k: rng.randint(low[k], high[k]) for k in dynamic}
    for _ in range(16):  # a point none of the others is, where the ranges have one
        if drawn not in (low, high, example):
            break
        drawn = {k: rng.randint(low[k], high[k]) for k in dynamic}
    points: list[tuple[str, dict[str, int], str | None]] = [("min", low, None), ("max", high, note)]
    if drawn not in (low, high, example):
        points.append(("random", drawn, None))
    return points


def check_at(art: Artifact, spec: ModelSpec, model: torch.nn.Module, example_inputs: Any, constants: dict[str, Any],
             user_names: list[str], dims: dict[str, DimRecord], point: str, sizes: dict[str, int],
             note: str | None) -> SizeCheckRecord:
    """Every graph of `art` run at `sizes` (by dimension) and checked against eager there."""
    args, kwargs = draw_user_inputs(spec, dims, sizes, example_inputs)
    user = dict(zip(user_names, pytree.tree_leaves((args, kwargs)), strict=False))
    symbols = {s: v for k, v in sizes.items() if (s := dims[k].symbol) is not None}
    state = model_state(model, constants)
    eager = EagerReference(model, args, kwargs, constants, user_names, loss=spec.loss)
    has_loss = art.manifest.capture.options.get("loss", "sum") in LOSSES
    checker = _Checker(eager, True, has_loss)
    problems: list[str] = []
    digests: dict[str, list[Any]] = {}
    summaries: dict[str, list[Any]] = {}
    scalars: dict[str, list[Any]] = {}
    outs: dict[str, list[Any]] = {}
    checked = []
    keys = set(art.graphs)
    for key in sorted(art.graphs, key=key_order):
        ga = art.graphs[key]
        parsed = parse_graph_key(key)
        sub = parsed.subgraph if parsed is not None else 0
        try:
            saved = None
            if ga.kind == GraphKind.BACKWARD:
                saved = outs.get(graph_key("forward", sub))
                if saved is None:
                    raise ValueError("the forward graph did not run")
            values = expand_outputs(ga.record, run_graph(ga.module, bind_at_sizes(ga, state, user, symbols, saved)))
        except Exception as e:  # the graph does not run at these sizes: a problem, said
            problems.append(f"{key} graph does not run: {accuracy_line(e)}")
            continue
        outs[key] = values
        gc = checker.check_outputs(ga, values, chained={graph_key(k, sub) for k in TRAINING_KINDS} <= keys)
        checked += gc.checks
        failed = [c for c in gc.checks if not c.passed]
        if failed:
            problems.append(f"{key} graph differs from the eager model: " + "; ".join(c.line() for c in failed[:2]))
        digests[key] = [accuracy.digest(v) if isinstance(v, torch.Tensor) else None for v in values]
        summaries[key] = [accuracy.sampled_summary(v) if isinstance(v, torch.Tensor) else None for v in values]
        scalars[key] = [v if isinstance(v, (bool, int, float)) else None for v in values]
    fw, bw, joint = (graph_key(k, 0) for k in TRAINING_KINDS)
    if all(k in outs for k in (fw, bw, joint)):
        contract = art.graphs[fw].record.partition
        if contract is not None:
            chain, _, _ = chain_problems(contract, outs[fw], outs[bw], art.graphs[joint].record, outs[joint])
            problems += [f"chain: {p}" for p in chain[:3]]
    totals = CheckTotals(run=len(checked), passed=sum(c.passed for c in checked),
                         failed=sum(not c.passed for c in checked), skipped=0, **settled_counts(checked))
    return SizeCheckRecord(point=point, sizes=dict(sizes), note=note, checks=totals,  # type: ignore[arg-type]
                           problems=problems, digests=digests, summaries=summaries, values=scalars)


def size_one_hint(failed: SizeCheckRecord, checked: list[SizeCheckRecord]) -> str:
    """What to change when the graphs fail only where a dimension is 1: torch traces a size as if
    it were 2 or more (it specialises 0 and 1 while tracing, and a symbol from an example of 2 or
    more is taken to be neither), so a broadcast or a kernel choice that differs at 1 is not in the
    graphs. Empty unless `failed` has a dimension at 1 and every point without one passed."""
    ones = sorted(k for k, v in failed.sizes.items() if v == 1)
    if not ones or not failed.problems:
        return ""
    others = [c for c in checked if 1 not in c.sizes.values()]
    if not others or any(c.problems for c in others):
        return ""
    return (f"; it holds at every other size checked: torch traced {', '.join(ones)} as 2 or more (sizes 0 and "
            f"1 are specialised while tracing), so the graphs may not hold at 1: set min: 2 for "
            f"{', '.join(ones)}")


def accuracy_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def check_sizes(folder: Any, spec: ModelSpec, model: torch.nn.Module, example_inputs: Any,
                constants: dict[str, Any], user_names: list[str], auto_report: list[str], *,
                budget: int | None = None, trust_ops: Any = (), own_capture: bool = False) -> DimsRecord:
    """The manifest's `dims` for the written `folder`: each dimension's status, and every graph
    checked at min, max and a random size (see the module's doc)."""
    budget = budget if budget is not None else DEFAULT_BUDGET_BYTES
    with limits.unbounded_bytes():
        art = load(folder, trust_ops=trust_ops, own_capture=own_capture).build_all()
        dims = dimensions(spec, capture_symbols(art), auto_report)
        checked = [check_at(art, spec, model, example_inputs, constants, user_names, dims, point, sizes, note)
                   for point, sizes, note in check_points(dims, art, derived_seed(spec.seed, spec.name, "size checks"), budget)]
    return DimsRecord(auto_dims=spec.auto_dims, dims=dims, checked=checked, budget_bytes=budget)
