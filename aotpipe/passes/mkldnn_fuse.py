"""mkldnn_fuse: convolutions with their bias and pointwise epilogue as one oneDNN call.

Accepts: inference graphs whose convolution weights are constants (run `freeze` first;
without it nothing matches). CPU only: the ops it emits have no CUDA kernels, so a graph
it changed replays on CPU (a `to_device` to cuda after it is refused by the checks).

Matches a 2-d float32 ``aten.convolution`` (not transposed) on CPU tensors whose weight
is a constant and whose bias is a constant or none, and rewrites it, with what follows it,
as ``mkldnn._convolution_pointwise``:

- a unary epilogue used by nothing else: relu, sigmoid, tanh, hardswish, silu,
  gelu (exact or tanh), hardtanh and leaky_relu with their scalars;
- or a residual ``add`` of a tensor of the same shape, dtype and strides (``x + conv`` or
  ``conv + x``, alpha 1), optionally followed by a relu: ``mkldnn._convolution_pointwise
  .binary`` with "add" (never the in-place "sum", which writes into the residual);
- or nothing: the convolution alone (oneDNN still saves the framework's dispatch).

The convolution's result must have no other user than the epilogue. Weights stay dense
constants (no prepacked blocked layout: graph.json stores only dense tensors), so the
artefact replays on any CPU with oneDNN.

This is what torch's own mkldnn fusion does for inference (jit's frozen conv-add-relu
fusion, inductor's mkldnn_fusion), written for a saved, reviewed op set: the loader
checks each string argument of these ops against the values listed here.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from aotpipe.passes.base import Facts, GraphUnderPass, PassResult, constant_value, is_constant, single_user, \
    tensor_facts
from aotpipe.passes.options import MkldnnFuseOptions

_aten = torch.ops.aten
_CONV = _aten.convolution.default
CONV_POINTWISE = torch.ops.mkldnn._convolution_pointwise.default
CONV_BINARY = torch.ops.mkldnn._convolution_pointwise.binary

# aten op -> (oneDNN unary attr, scalars from the node's args, algorithm)
def _unary(node: torch.fx.Node) -> Optional[tuple[str, list[Any], Optional[str]]]:
    t, args, kwargs = node.target, node.args, node.kwargs
    if t is _aten.relu.default:
        return "relu", [], None
    if t is _aten.sigmoid.default:
        return "sigmoid", [], None
    if t is _aten.tanh.default:
        return "tanh", [], None
    if t is _aten.hardswish.default:
        return "hardswish", [], None
    if t is _aten.silu.default:
        return "swish", [], None
    if t is _aten.gelu.default:
        approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        return ("gelu", [], approximate) if approximate in ("none", "tanh") else None
    if t is _aten.hardtanh.default:
        lo = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
        hi = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
        return "hardtanh", [float(lo), float(hi)], None
    if t is _aten.leaky_relu.default:
        slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
        return "leaky_relu", [float(slope)], None
    return None


def _fusable_conv(gm: torch.fx.GraphModule, node: torch.fx.Node, facts: dict[str, Facts]) -> bool:
    if node.op != "call_function" or node.target is not _CONV or node.kwargs:
        return False
    x, w, b, _stride, _padding, _dilation, transposed, _output_padding, _groups = node.args
    if transposed or not is_constant(w) or (b is not None and not is_constant(b)):
        return False
    fx, fo = facts.get(x.name) if isinstance(x, torch.fx.Node) else None, facts.get(node.name)
    weight = constant_value(gm, w)
    return (fx is not None and fo is not None and fx.dtype == torch.float32 and fx.device == "cpu"
            and len(fx.shape) == 4 and weight.dim() == 4 and weight.dtype == torch.float32)


def _residual(add: torch.fx.Node, conv: torch.fx.Node, facts: dict[str, Facts]) -> Optional[torch.fx.Node]:
    """The other operand of `add` if it is a residual add the binary kernel can take."""
    if add.target is not _aten.add.Tensor or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is conv else a if b is conv else None
    if not isinstance(other, torch.fx.Node) or other is conv:
        return None
    fo, fc = facts.get(other.name), facts.get(conv.name)
    if fo is None or fc is None or (fo.shape, fo.stride, fo.dtype) != (fc.shape, fc.stride, fc.dtype):
        return None
    return other


def mkldnn_fuse(g: GraphUnderPass, options: MkldnnFuseOptions) -> PassResult:
    gm = g.gm
    if not torch.backends.mkldnn.is_available():
        return PassResult(g, modified=False, stats={"skipped": "this torch has no oneDNN"})
    facts = tensor_facts(gm, g.values)
    stats = {"conv": 0, "conv_unary": 0, "conv_add": 0, "conv_add_relu": 0}
    for conv in list(gm.graph.nodes):
        if not _fusable_conv(gm, conv, facts):
            continue
        x, w, b, stride, padding, dilation, _t, _op, groups = conv.args
        geometry = (list(padding), list(stride), list(dilation), groups)
        user = single_user(conv)
        last, replaced = conv, [conv]
        unary = _unary(user) if user is not None and options.epilogues else None
        other = _residual(user, conv, facts) if user is not None and unary is None and options.epilogues else None
        if unary is not None:
            attr, scalars, algorithm = unary
            target, args = CONV_POINTWISE, (x, w, b, *geometry, attr, scalars, algorithm)
            last, replaced = user, [conv, user]
            stats["conv_unary"] += 1
        elif other is not None:
            relu = single_user(user)
            if relu is not None and relu.target is _aten.relu.default:
                target, args = CONV_BINARY, (x, other, w, b, *geometry, "add", None, "relu", [], None)
                last, replaced = relu, [conv, user, relu]
                stats["conv_add_relu"] += 1
            else:
                target, args = CONV_BINARY, (x, other, w, b, *geometry, "add", None, None, [], None)
                last, replaced = user, [conv, user]
                stats["conv_add"] += 1
        else:
            target, args = CONV_POINTWISE, (x, w, b, *geometry, "none", [], None)
            stats["conv"] += 1
        with gm.graph.inserting_before(last):
            fused = gm.graph.call_function(target, args)
        fused.meta = dict(last.meta)
        last.replace_all_uses_with(fused)
        for n in reversed(replaced):
            gm.graph.erase_node(n)
        facts[fused.name] = facts[last.name]
    gm.recompile()
    return PassResult(g, modified=any(stats.values()), stats=stats)
