"""Libraries' own custom ops, decomposed into ATen at capture where a decomposition exists.

torch.export keeps an op registered with ``torch.library`` as one opaque node, which no
backend, and no aotpipe loader, can run without the library that defined it. Capture
therefore rewrites each such op with a decomposition from :data:`DECOMPOSITIONS`
(static-shape ATen, differentiable, so the training graphs come out ATen too), and
records which it rewrote. An op with none stays, and must be trusted by name
(``trusted_ops`` in the pipeline; ``--trust-ops`` at load), or capture refuses it.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Iterable

import torch
import torch.fx

from aotpipe.format.records import TrustedNamespace
from aotpipe.errors import CaptureError
from torch._library.custom_ops import OPDEFS


def _grouped_mm_dense(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """transformers::grouped_mm_fallback(input [S, i], weight [E, i, o], offs [E]) -> [S, o].

    Row t of `input` belongs to the expert e with offs[e-1] <= t < offs[e] (offs holds
    cumulative row counts); its output is input[t] @ weight[e]. The library's kernel loops
    over ``offs.tolist()`` (data-dependent); this computes every expert's product for every
    row and picks each row's own, with static shapes (E times the flops, fine for the
    shrunk configs of a zoo; a graph to study, not to serve).
    """
    rows = torch.arange(input.shape[0], device=input.device, dtype=offs.dtype)
    expert = torch.searchsorted(offs, rows, right=True).clamp(max=weight.shape[0] - 1)
    every = torch.einsum("si,eio->seo", input, weight)
    return every[torch.arange(input.shape[0], device=input.device), expert]


# Library op (namespace::name) -> an ATen implementation with the same signature.
DECOMPOSITIONS: dict[str, Callable[..., Any]] = {
    "transformers::grouped_mm_fallback": _grouped_mm_dense,
}

_CORE_NAMESPACES = frozenset({"aten", "prims", "_operator", "builtins", "math"})


def library_ops(gm: torch.fx.GraphModule) -> list[torch._ops.OpOverload]:
    """The ops of `gm` (and its submodules) that are neither ATen nor prims, in order of first use."""
    seen: dict[str, torch._ops.OpOverload] = {}
    for mod in gm.modules():
        if not isinstance(mod, torch.fx.GraphModule):
            continue
        for n in mod.graph.nodes:
            t = n.target
            if n.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.namespace not in _CORE_NAMESPACES:
                seen.setdefault(str(t), t)
    return list(seen.values())


def qualname(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}::{op._schema.name.split('::')[-1]}"


def decomposition_table(ops: list[torch._ops.OpOverload]) -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Decompositions of those of `ops` that have one."""
    return {op: DECOMPOSITIONS[qualname(op)] for op in ops if qualname(op) in DECOMPOSITIONS}


def decompose(ep: "torch.export.ExportedProgram", *, training: bool = False
              ) -> tuple["torch.export.ExportedProgram", list[str]]:
    """`ep` with every library op that has a decomposition rewritten into ATen; and their names.

    Inference: ``run_decompositions`` with those entries. Training: each call is pointed at
    the decomposition itself, which AOTAutograd then traces (and differentiates) as ATen;
    ``run_decompositions`` would functionalise the training graph first, turning in-place
    copies into ``aten.copy``, which has no derivative.
    """
    table = decomposition_table(library_ops(ep.graph_module))
    if not table:
        return ep, []
    names = sorted(qualname(op) for op in table)
    if not training:
        return ep.run_decompositions(table), names
    replace_calls(ep.graph_module)
    return ep, names


def replace_calls(gm: torch.fx.GraphModule) -> list[str]:
    """Point every call of a library op that has a decomposition (an OpOverload, or the
    packet a dynamo graph calls) at the decomposition itself, in `gm` and its submodules;
    tracing `gm` then gives ATen. Returns the ops replaced."""
    done: set[str] = set()
    for mod in gm.modules():
        if not isinstance(mod, torch.fx.GraphModule):
            continue
        hit = False
        for node in mod.graph.nodes:
            t = node.target
            if node.op != "call_function":
                continue
            if isinstance(t, torch._ops.OpOverloadPacket):
                t = getattr(t, "default", None)
            if isinstance(t, torch._ops.OpOverload) and qualname(t) in DECOMPOSITIONS:
                node.target = DECOMPOSITIONS[qualname(t)]
                done.add(qualname(t))
                hit = True
        if hit:
            mod.recompile()
    return sorted(done)


def defining_module(op: torch._ops.OpOverload) -> str | None:
    """The module that registers `op`, as far as torch can tell: a ``torch.library.custom_op``
    knows its function's module; for an op defined another way, the package named like its
    namespace if there is one. None: a loader must be told which module to import."""
    opdef = OPDEFS.get(qualname(op))
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
    if isinstance(module, str) and module != "__main__":
        return module
    try:
        found = importlib.util.find_spec(op.namespace)
    except (ImportError, ValueError):
        found = None
    return op.namespace if found is not None else None


def trust(gms: Iterable[torch.fx.GraphModule], trusted: Iterable[str]) -> dict[str, TrustedNamespace]:
    """The library ops `gms` still call (after decomposition), by namespace, as the manifest
    records them (the module that defines them, and the ops). A CaptureError if a namespace is
    not in `trusted` (the pipeline's ``trusted_ops``): an artefact never holds a library's op
    that nobody vouched for."""
    by_ns: dict[str, dict[str, torch._ops.OpOverload]] = {}
    for gm in gms:
        for op in library_ops(gm):
            by_ns.setdefault(op.namespace, {})[qualname(op)] = op
    trusted = set(trusted)
    refused = sorted(ns for ns in by_ns if ns not in trusted)
    if refused:
        ns = refused[0]
        ops = ", ".join(sorted(by_ns[ns]))
        raise CaptureError(
            f"the graphs call {ops}, an op of the library namespace {ns!r} that aotpipe has no ATen "
            f"decomposition for (aotpipe/capture/custom_ops.py); to keep it, trust that library in the "
            f"pipeline: trusted_ops: [{ns}] (a loader then needs --trust-ops {ns})"
        )
    return {ns: TrustedNamespace(module=defining_module(next(iter(ops.values()))), ops=sorted(ops))
            for ns, ops in sorted(by_ns.items())}
