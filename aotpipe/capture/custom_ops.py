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


def _lce_logits(input: torch.Tensor, linear_weight: torch.Tensor, linear_bias: torch.Tensor | None,
                acc_dtype: torch.dtype) -> torch.Tensor:
    """The [N, C] logits of torch_nn's linear-cross-entropy ops, in `acc_dtype` (the op's
    accumulation dtype: float32 for half inputs, else the input's own)."""
    bias = None if linear_bias is None else linear_bias.to(acc_dtype)
    return torch.nn.functional.linear(input.to(acc_dtype), linear_weight.to(acc_dtype), bias)


def _lce_loss(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
              linear_bias: torch.Tensor | None, weight: torch.Tensor | None, reduction: str,
              ignore_index: int, acc_dtype: torch.dtype) -> torch.Tensor:
    """cross_entropy(linear(input), target), which is what the chunked loop computes chunk by
    chunk; in the input's dtype, as the op returns it."""
    logits = _lce_logits(input, linear_weight, linear_bias, acc_dtype)
    w = None if weight is None else weight.to(acc_dtype)
    loss = torch.nn.functional.cross_entropy(logits, target, weight=w, reduction=reduction,
                                             ignore_index=ignore_index)
    return loss.to(input.dtype)


def _linear_cross_entropy_reduced(
    input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
    linear_bias: torch.Tensor | None, weight: torch.Tensor | None, reduction: str,
    ignore_index: int, label_smoothing: float, batch_chunk_size: int, acc_policy: str,
    acc_dtype: torch.dtype, allow_retain_graph: bool, compute_input_grad: bool,
    compute_linear_weight_grad: bool, compute_linear_bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch_nn::_linear_cross_entropy_batch_chunked (reduction mean or sum) -> (loss,
    grad_input, grad_linear_weight, grad_linear_bias).

    The loss is linear then cross_entropy on the whole batch (batch_chunk_size and acc_policy
    only say how the op's loop splits the work and where it keeps fp32); autograd
    differentiates it, so the training graphs get ordinary ATen backward ops. The op also
    returns the loss's gradients, precomputed, for its own backward to scale; here they are
    written out (d loss / d logits = row weight * (softmax - one-hot)), detached as the op's
    backward ignores them, and empty where the op leaves them empty (its compute_* flags).
    """
    if label_smoothing != 0.0:  # the op refuses it too; F.linear_cross_entropy never passes it
        raise NotImplementedError("torch_nn::_linear_cross_entropy_batch_chunked does not support label smoothing")
    if reduction not in ("mean", "sum"):
        raise NotImplementedError(f"torch_nn::_linear_cross_entropy_batch_chunked does not support {reduction=}")
    loss = _lce_loss(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, acc_dtype)

    x, lw = input.detach(), linear_weight.detach()
    logits = _lce_logits(x, lw, None if linear_bias is None else linear_bias.detach(), acc_dtype)
    kept = target != ignore_index
    safe_target = torch.where(kept, target, 0)  # an ignore_index outside [0, C) must not index
    row_weight = kept.to(acc_dtype) if weight is None else \
        torch.where(kept, weight.detach().to(acc_dtype).index_select(0, safe_target), 0)
    if reduction == "mean":
        row_weight = row_weight / row_weight.sum()  # all ignored: 0/0, nan, as the op gives
    classes = torch.arange(logits.shape[1], device=logits.device)
    one_hot = (safe_target.unsqueeze(1) == classes).to(acc_dtype)
    grad_logits = (torch.softmax(logits, dim=1) - one_hot) * row_weight.unsqueeze(1)
    dtype, device = input.dtype, input.device
    grad_input = (grad_logits @ lw.to(acc_dtype)).to(dtype) if compute_input_grad else \
        torch.empty((0, 0), dtype=dtype, device=device)
    grad_weight = (grad_logits.T @ x.to(acc_dtype)).to(dtype) if compute_linear_weight_grad else \
        torch.empty((0, 0), dtype=dtype, device=linear_weight.device)
    grad_bias = grad_logits.sum(0).to(dtype) if compute_linear_bias_grad else \
        torch.empty((0,), dtype=dtype, device=device)
    return loss, grad_input, grad_weight, grad_bias


def _linear_cross_entropy_unreduced(
    input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
    linear_bias: torch.Tensor | None, weight: torch.Tensor | None, ignore_index: int,
    batch_chunk_size: int, acc_policy: str, acc_dtype: torch.dtype,
) -> torch.Tensor:
    """torch_nn::_linear_cross_entropy_batch_chunked_no_reduction -> the [N] per-row loss
    (0 where the target is ignore_index): linear then cross_entropy, reduction none."""
    return _lce_loss(input, linear_weight, target, linear_bias, weight, "none", ignore_index, acc_dtype)


# Library op (namespace::name) -> an ATen implementation with the same signature.
DECOMPOSITIONS: dict[str, Callable[..., Any]] = {
    "transformers::grouped_mm_fallback": _grouped_mm_dense,
    "torch_nn::_linear_cross_entropy_batch_chunked": _linear_cross_entropy_reduced,
    "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction": _linear_cross_entropy_unreduced,
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
