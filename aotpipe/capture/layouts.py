"""Layouts the CPU kernels read or make that the trace cannot see.

torch's meta kernels, which the trace runs, and its CPU kernels, which a written graph
runs, do not always agree on strides. Two cases aotpipe routes around, each where it is met:

- **Batch norm over a permuted input** (PatchTST's BatchNorm1d over a transposed [batch,
  time, channels]): the CPU kernel returns its output contiguous, the meta kernel keeps the
  input's strides. Ops after it were traced on the meta layout (a ``view`` where eager's
  ``reshape`` copied) and fail on the CPU's. :func:`pin_batch_norm_layouts` lays the output
  out as the trace saw it (permute, contiguous copy, permute back).
- **Group norm on a channels-last [1, C, H, W]** (diffusers' VAE, after its attention block):
  a ``view`` of an ``expand`` on the CPU keeps an old stride in a size-1 dimension where meta
  computes the canonical one. The CPU group norm picks its memory format from its input's
  strides, that one included (``suggest_memory_format``): it calls the tensor contiguous-format,
  in which it is not contiguous, and stops ("Expected X.is_contiguous(memory_format) to be
  true"). In eager, group_norm copies its input into that format first; the trace, whose fake
  input was canonical channels-last, kept no copy. :func:`pin_group_norm_layouts` gives such an
  input a channels-last copy, canonical in every dimension.

One copy each, only there.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

aten = torch.ops.aten

# op -> the positions of the arguments its CPU kernel requires contiguous in its input's
# suggested memory format (input, and the incoming gradient for the backward).
_CHECKED_LAYOUT = {
    aten.native_group_norm.default: (0,),
    aten.native_group_norm_backward.default: (0, 1),
}


def _needs_pinning(val: object) -> bool:
    return (isinstance(val, torch.Tensor) and val.dim() == 4 and 1 in val.shape
            and not val.is_contiguous() and val.is_contiguous(memory_format=torch.channels_last))


# Batch norms whose CPU kernel returns its output in the input's suggested memory format
# (contiguous, or channels-last), where the meta kernel keeps a permuted input's strides.
_FORMAT_OF_INPUT = frozenset({
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit_functional.default,
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
})


def _dense_order(val: object) -> list[int] | None:
    """For a dense tensor in neither contiguous nor channels-last layout (a permuted one), its
    dimensions from the largest stride to the smallest; else None."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.is_contiguous():
        return None
    if val.dim() in (4, 5) and val.is_contiguous(memory_format=torch.channels_last if val.dim() == 4
                                                  else torch.channels_last_3d):
        return None
    order = sorted(range(val.dim()), key=lambda d: (-val.stride(d), -val.shape[d]))
    if not val.permute(order).is_contiguous():
        return None  # not a permutation of a dense layout: leave it
    return order


def pin_batch_norm_layouts(gm: torch.fx.GraphModule) -> int:
    """Give each batch norm output the trace's (permuted) layout, in place; how many.

    The CPU batch norm returns its output contiguous (or channels-last) whatever its input's
    layout; its meta kernel keeps a permuted input's strides (PatchTST's BatchNorm1d over a
    transposed [batch, time, channels]). Ops after it were traced on the meta layout (a
    ``view`` where eager's ``reshape`` copied), and fail on the CPU's. The output is laid
    out as the trace saw it: permuted to its dense order, made contiguous, permuted back
    (one copy, only there)."""
    graph = gm.graph
    pinned = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _FORMAT_OF_INPUT:
            continue
        for user in list(node.users):
            if user.op != "call_function" or user.target is not operator.getitem or user.args[1] != 0:
                continue
            val = user.meta.get("val")
            order = _dense_order(val)
            if order is None:
                continue
            inverse = [order.index(d) for d in range(len(order))]
            with graph.inserting_after(user):
                forward = graph.call_function(aten.permute.default, (user, order))
            with graph.inserting_after(forward):
                dense = graph.call_function(aten.clone.default, (forward,), {"memory_format": torch.contiguous_format})
            with graph.inserting_after(dense):
                back = graph.call_function(aten.permute.default, (dense, inverse))
            for new, v in ((forward, val.permute(order)), (dense, val.permute(order).contiguous()), (back, val)):
                new.meta.update({k: x for k, x in user.meta.items() if k in _KEPT_META})
                new.meta["val"] = v
            user.replace_all_uses_with(back, delete_user_cb=lambda n: n is not forward)
            pinned += 1
    if pinned:
        gm.recompile()
    return pinned


_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack")


def pin_group_norm_layouts(gm: torch.fx.GraphModule) -> int:
    """Insert the channels-last clones (see the module's docstring), in place; how many."""
    graph = gm.graph
    pinned = 0
    for node in list(graph.nodes):
        positions = _CHECKED_LAYOUT.get(node.target) if node.op == "call_function" else None
        if not positions:
            continue
        args = list(node.args)
        for i in positions:
            arg = args[i] if i < len(args) else None
            if not isinstance(arg, torch.fx.Node) or not _needs_pinning(arg.meta.get("val")):
                continue
            with graph.inserting_before(node):
                copy = graph.call_function(aten.clone.default, (arg,), {"memory_format": torch.channels_last})
            copy.meta.update({k: v for k, v in arg.meta.items() if k in ("val", "tensor_meta", "stack_trace",
                                                                          "nn_module_stack", "source_fn_stack")})
            args[i] = copy
            pinned += 1
        node.args = tuple(args)
    if pinned:
        gm.recompile()
    return pinned
