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

The convolution's result must have no other user than the epilogue. With ``linears``
(the default), a linear layer ``addmm(B, x, W^T)`` (or ``mm(x, W^T)``, without bias) on a
2-d float32 CPU input with constant W and B becomes ``aten.linear(x, W, B)``: the same arithmetic (linear runs addmm), in the
form whose weight the loader can pack. So does a linear layer on a 3-d input that the
matmul decomposition wrote as ``bmm(x, expand(W^T))`` (+ bias): one GEMM on x reshaped to
2-d instead of a batch of small ones (float noise: other summation blocks).

Weights stay dense constants in the artefact: graph.json stores only dense tensors, and
packed layouts are specific to a CPU. The loader packs them for the CPU it runs on
(:mod:`aotpipe.artifact.prepack`), from the input shapes this pass records on each
convolution's and linear's input node (its "val").

This is what torch's own mkldnn fusion does for inference (jit's frozen conv-add-relu
fusion, inductor's mkldnn_fusion), written for a saved, reviewed op set: the loader
checks each string argument of these ops against the values listed here.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from aotpipe.passes.base import Facts, FactsLike, GraphUnderPass, PassResult, ShapeFacts, constant_value, \
    is_constant, layout_facts, single_user
from aotpipe.passes.options import MkldnnFuseOptions

_aten = torch.ops.aten
_CONV = _aten.convolution.default
_ADDMM = _aten.addmm.default
CONV_POINTWISE = torch.ops.mkldnn._convolution_pointwise.default
CONV_BINARY = torch.ops.mkldnn._convolution_pointwise.binary

# aten op -> (oneDNN unary attr, scalars from the node's args, algorithm)
def unary_epilogue(node: torch.fx.Node) -> Optional[tuple[str, list[Any], Optional[str]]]:
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


def _record_shape(node: Any, facts: FactsLike, only_if_missing: bool = False) -> None:
    """Give `node` a "val" (a meta tensor of its layout as it is now, after layout passes;
    capture's may be stale): graph.json writes it, and the loader packs weights for it.
    A linear's input needs only its shape, which a capture "val" has right."""
    if only_if_missing and isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor):
        return
    f = facts.get(node.name) if isinstance(node, torch.fx.Node) else None
    if f is not None:
        node.meta["val"] = torch.empty_strided(f.shape, f.stride, dtype=f.dtype, device="meta")


def _linear(gm: torch.fx.GraphModule, node: torch.fx.Node, facts: FactsLike) -> Optional[tuple]:
    """(x, W, B) when `node` is addmm(B, x, W^T) with constant W, B, or mm(x, W^T) with
    constant W (a linear without bias: B None), on a 2-d float32 CPU x."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is _ADDMM and len(node.args) == 3:
        b, x, wt = node.args
    elif node.target is _aten.mm.default and len(node.args) == 2:
        (x, wt), b = node.args, None
    else:
        return None
    if not ((b is None or is_constant(b)) and _call(wt, _aten.permute.default) and list(wt.args[1]) == [1, 0]
            and is_constant(wt.args[0])):
        return None
    fx = facts.get(x.name) if isinstance(x, torch.fx.Node) else None
    w = constant_value(gm, wt.args[0])
    bias = constant_value(gm, b) if b is not None else None
    if fx is None or len(fx.shape) != 2 or fx.dtype != torch.float32 or fx.device != "cpu" \
            or w.dtype != torch.float32 or w.dim() != 2 or (bias is not None and bias.shape != (w.shape[0],)):
        return None
    return x, wt.args[0], b


def _strip_same(node: Any, facts: FactsLike) -> Any:
    """Back through views and expands that keep the shape (the matmul decomposition's)."""
    while (_call(node, _aten.view.default) or _call(node, _aten.expand.default)) \
            and facts.get(node.name) is not None and facts.get(node.args[0].name) is not None \
            and facts[node.name].shape == facts[node.args[0].name].shape:
        node = node.args[0]
    return node


def _batched_linear(gm: torch.fx.GraphModule, bmm: torch.fx.Node, facts: FactsLike) -> Optional[tuple]:
    """A linear layer on a 3-d input that the matmul decomposition wrote as a bmm with its
    weight broadcast over the batch: (x [B, S, K], W, bias or None, out view, last node)."""
    if not _call(bmm, _aten.bmm.default):
        return None
    x = _strip_same(bmm.args[0], facts)
    wb = bmm.args[1]
    if _call(wb, _aten.view.default):
        wb = wb.args[0]
    if not _call(wb, _aten.expand.default):
        return None
    wt = wb.args[0]
    if not (_call(wt, _aten.permute.default) and list(wt.args[1]) == [1, 0] and is_constant(wt.args[0])):
        return None
    w = constant_value(gm, wt.args[0])
    fx, fo = facts.get(x.name) if isinstance(x, torch.fx.Node) else None, facts.get(bmm.name)
    if fx is None or fo is None or len(fx.shape) != 3 or fx.dtype != torch.float32 or fx.device != "cpu" \
            or w.dim() != 2 or w.dtype != torch.float32 or fx.shape[2] != w.shape[1] \
            or fo.shape != (fx.shape[0], fx.shape[1], w.shape[0]):
        return None
    out = single_user(bmm)
    if not _call(out, _aten.view.default) or facts.get(out.name) is None or facts[out.name].shape != fo.shape:
        out = bmm
    bias, last = None, out
    add = single_user(out)
    if _call(add, _aten.add.Tensor) and add.args[0] is out and is_constant(add.args[1]) and not add.kwargs:
        b = constant_value(gm, add.args[1])
        if b.shape == (w.shape[0],) and b.dtype == torch.float32:
            bias, last = add.args[1], add
    return x, wt.args[0], bias, last


def _call(node: Any, target: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def mkldnn_fuse(g: GraphUnderPass, options: MkldnnFuseOptions) -> PassResult:
    gm = g.gm
    if not torch.backends.mkldnn.is_available():
        return PassResult(g, modified=False, stats={"skipped": "this torch has no oneDNN"})
    stats = {"conv": 0, "conv_unary": 0, "conv_add": 0, "conv_add_relu": 0, "linear": 0, "batched_linear": 0}
    # Convolutions first, on exact layouts (a residual must have the result's strides; the
    # loader packs only channels-last inputs): the run channels_last just took, if it was
    # the pass before, or capture's. Then linears, which need shapes only.
    if any(n.op == "call_function" and n.target is _CONV for n in gm.graph.nodes):
        facts = layout_facts(gm, g.values)
        for conv in list(gm.graph.nodes):
            if not _fusable_conv(gm, conv, facts):
                continue
            x, w, b, stride, padding, dilation, _t, _op, groups = conv.args
            _record_shape(x, facts)
            geometry = (list(padding), list(stride), list(dilation), groups)
            user = single_user(conv)
            last, replaced = conv, [conv]
            unary = unary_epilogue(user) if user is not None and options.epilogues else None
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
    if options.linears:
        facts = ShapeFacts(gm, g.values)
        for node in list(gm.graph.nodes):
            found = _linear(gm, node, facts)
            if found is None:
                continue
            with gm.graph.inserting_before(node):
                linear = gm.graph.call_function(_aten.linear.default, found)
            linear.meta = dict(node.meta)
            node.replace_all_uses_with(linear)
            gm.graph.erase_node(node)
            facts[linear.name] = facts[node.name]
            _record_shape(found[0], facts, only_if_missing=True)
            stats["linear"] += 1
        for node in list(gm.graph.nodes):
            found = _batched_linear(gm, node, facts)
            if found is None:
                continue
            x, w, bias, last = found
            b_, s_, k_ = facts[x.name].shape
            with gm.graph.inserting_before(last):
                flat = gm.graph.call_function(_aten.reshape.default, (x, [b_ * s_, k_]))
                linear = gm.graph.call_function(_aten.linear.default, (flat, w, bias))
                out = gm.graph.call_function(_aten.view.default, (linear, list(facts[last.name].shape)))
            flat.meta["val"] = torch.empty((b_ * s_, k_), dtype=torch.float32, device="meta")
            out.meta = dict(last.meta)
            last.replace_all_uses_with(out)
            stats["batched_linear"] += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return PassResult(g, modified=any(stats.values()), stats=stats)
