"""Layouts the CPU kernels read that the trace cannot see.

torch's meta kernels and its CPU kernels may give a size-1 dimension different strides
(a ``view`` of an ``expand`` on the CPU keeps the old stride there; meta computes the
canonical one). Where nothing reads them that is harmless, but the CPU group norm picks its
memory format from its input's strides (``suggest_memory_format``) and then requires the
input to be contiguous in it: a channels-last [1, C, H, W] whose batch stride is not
C*H*W is "contiguous" to neither, and the kernel stops ("Expected
X.is_contiguous(memory_format) to be true"). In eager, group_norm makes its input
contiguous in that format first; the trace, whose fake input was already canonical, kept
no copy. diffusers' VAE (its attention block's output, reshaped back to an image, then a
group norm) is the case seen.

:func:`pin_group_norm_layouts` gives each such input the layout the trace saw: a clone in
channels-last format, whose strides are canonical in every dimension, for a group norm
(or its backward) whose fake input is channels-last with a size-1 dimension. One copy of
that input, only there.
"""

from __future__ import annotations

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
