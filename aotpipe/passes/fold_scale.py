"""fold_scale: a constant scale or shift after a matmul, convolution or layer norm folded
into its weights.

Accepts: inference graphs whose weights are constants (run `freeze` first; without it
nothing matches).

Matches a producer with constant weights:

- a linear layer, ``addmm(B, x, W^T)`` (seen through the views that reshape its [M, N]
  result, as long as they keep N last);
- a 2-d convolution, ``convolution(x, W, B, ...)`` (not transposed);
- a layer norm over the last dim, ``native_layer_norm(x, [N], w, b, eps)[0]``;

followed by ``* c``, ``/ c``, ``+ c`` or ``- c`` where c is a number or a constant tensor
that varies along the output channel only (the last dim of a linear's or layer norm's
result, dim 1 of a convolution's, shapes [N], [1, ..., N] or [C, 1, 1]), and rewrites the
pair as the producer alone with new weights: W * c and B * c for a scale, B + c for a
shift. Chains (scale then shift, as a layer scale or an affine after a norm) fold one
step at a time. The producer and every view between it and the scale must have no other
user, so no one else sees the unscaled value. Folding reorders float rounding only.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
import torch.fx

from aotpipe.passes.base import FactsLike, GraphUnderPass, PassResult, add_constant, constant_value, is_constant, \
    ShapeFacts, single_user, view_of_constant
from aotpipe.passes.freeze import drop_unused_constants
from aotpipe.passes.options import FoldScaleOptions

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)
_SCALE = {_aten.mul.Tensor: "mul", _aten.mul.Scalar: "mul", _aten.div.Tensor: "div", _aten.div.Scalar: "div",
          _aten.add.Tensor: "add", _aten.add.Scalar: "add", _aten.sub.Tensor: "sub", _aten.sub.Scalar: "sub"}


def _factor(gm: torch.fx.GraphModule, node: torch.fx.Node, value: torch.fx.Node,
            channels: int, channel_dim: int, rank: int) -> Optional[tuple[str, torch.Tensor]]:
    """(op, per-channel vector of length `channels`) if `node` is value (op) c with c
    constant along every dim but the channel dim; None otherwise."""
    op = _SCALE.get(node.target) if node.op == "call_function" else None
    if op is None or len(node.args) != 2 or node.args[0] is not value or node.kwargs.get("alpha", 1) != 1 \
            or node.kwargs.get("rounding_mode") is not None:
        return None
    c = node.args[1]
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return op, torch.full((channels,), float(c))
    tensor = view_of_constant(gm, c) if isinstance(c, torch.fx.Node) else None
    if tensor is None or not tensor.is_floating_point() or tensor.dim() > rank:
        return None
    shape = (1,) * (rank - tensor.dim()) + tuple(tensor.shape)
    if any(s != 1 for d, s in enumerate(shape) if d != channel_dim % rank) \
            or shape[channel_dim % rank] not in (1, channels):
        return None
    return op, tensor.reshape(-1).expand(channels).clone() if tensor.numel() == 1 else tensor.reshape(channels)


def _through_views(node: torch.fx.Node, facts: FactsLike, channels: int,
                   channel_dim: int) -> Optional[tuple[torch.fx.Node, torch.fx.Node]]:
    """(last view, its single user) going down from `node` through views that keep the
    channel dim; every node passed has one user."""
    last = node
    while True:
        user = single_user(last)
        if user is None:
            return None
        if user.op == "call_function" and user.target in _VIEWS:
            f = facts.get(user.name)
            if f is None or channel_dim != -1 or not f.shape or f.shape[-1] != channels:
                return None
            last = user
            continue
        return last, user


@dataclass(frozen=True)
class _Producer:
    """A foldable producer: its kind, the dim its `channels` lie along, its weights, and for a
    layer norm the norm node itself."""

    kind: Literal["linear", "conv", "norm"]
    channels: int
    dim: int
    weight: torch.Tensor
    bias: torch.Tensor
    norm: Optional[torch.fx.Node] = None


def _producer(gm: torch.fx.GraphModule, node: torch.fx.Node, facts: FactsLike) -> Optional[_Producer]:
    """What a foldable producer is: its kind, channel count and dim, weights."""
    if node.op != "call_function" or node.target not in (_aten.addmm.default, _aten.convolution.default,
                                                          operator.getitem):
        return None
    f = facts.get(node.name)
    if f is None or not f.dtype.is_floating_point:
        return None
    if node.target is _aten.addmm.default and len(node.args) == 3 and not node.kwargs and is_constant(node.args[0]):
        wt = view_of_constant(gm, node.args[2])
        if wt is None or wt.dim() != 2:
            return None
        return _Producer("linear", wt.shape[1], -1, wt.t(), constant_value(gm, node.args[0]))
    if node.target is _aten.convolution.default and not node.kwargs and not node.args[6] \
            and is_constant(node.args[1]) and (node.args[2] is None or is_constant(node.args[2])):
        w = constant_value(gm, node.args[1])
        if w.dim() != 4:
            return None
        bias = constant_value(gm, node.args[2]) if node.args[2] is not None else torch.zeros(w.shape[0], dtype=w.dtype)
        return _Producer("conv", w.shape[0], 1, w, bias)
    if node.target is operator.getitem and node.args[1] == 0:
        ln = node.args[0]
        if (ln.op == "call_function" and ln.target is _aten.native_layer_norm.default and len(ln.args[1]) == 1
                and is_constant(ln.args[2]) and is_constant(ln.args[3]) and len(ln.users) == 1):
            return _Producer("norm", ln.args[1][0], -1, constant_value(gm, ln.args[2]),
                             constant_value(gm, ln.args[3]), norm=ln)
    return None


def _rebuild(gm: torch.fx.GraphModule, node: torch.fx.Node, p: _Producer, w: torch.Tensor,
             b: torch.Tensor) -> None:
    """Point the producer at new weight and bias constants."""
    if p.kind == "linear":
        wn = add_constant(gm, w.contiguous(), f"{node.name}_scaled_weight", node)  # [N, K], as nn.Linear keeps it
        with gm.graph.inserting_before(node):
            wt = gm.graph.call_function(_aten.permute.default, (wn, [1, 0]))
        bn = add_constant(gm, b.contiguous(), f"{node.name}_scaled_bias", node)
        node.args = (bn, node.args[1], wt)
    elif p.kind == "conv":
        old = constant_value(gm, node.args[1])
        wn = add_constant(gm, w.contiguous(memory_format=torch.channels_last) if old.is_contiguous(
            memory_format=torch.channels_last) and not old.is_contiguous() else w.contiguous(),
            f"{node.name}_scaled_weight", node)
        bn = add_constant(gm, b.contiguous(), f"{node.name}_scaled_bias", node)
        node.args = (node.args[0], wn, bn, *node.args[3:])
    else:
        ln = p.norm
        wn = add_constant(gm, w.contiguous(), f"{ln.name}_scaled_weight", ln)
        bn = add_constant(gm, b.contiguous(), f"{ln.name}_scaled_bias", ln)
        ln.args = (ln.args[0], ln.args[1], wn, bn, *ln.args[4:])


def _maybe_constant(c: Any) -> bool:
    """A number, or a node that may be a constant (or a view of one): worth a closer look."""
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return True
    while isinstance(c, torch.fx.Node) and c.op == "call_function" and isinstance(c.target, torch._ops.OpOverload) \
            and c.target.is_view:
        c = c.args[0]
    return isinstance(c, torch.fx.Node) and c.op == "get_attr"


def fold_scale(g: GraphUnderPass, options: FoldScaleOptions) -> PassResult:
    gm = g.gm
    if not any(n.op == "call_function" and n.target in _SCALE and len(n.args) == 2 and _maybe_constant(n.args[1])
               for n in gm.graph.nodes):
        return PassResult(g, modified=False, stats={f"{k}_scales_folded": 0 for k in ("linear", "conv", "norm")})
    facts = ShapeFacts(gm, g.values)  # shapes and dtypes: no run of the graph
    folded = {"linear": 0, "conv": 0, "norm": 0}
    changed = True
    while changed:
        changed = False
        for node in list(gm.graph.nodes):
            p = _producer(gm, node, facts)
            if p is None:
                continue
            down = _through_views(node, facts, p.channels, p.dim)
            if down is None:
                continue
            last, user = down
            fl, fu = facts.get(last.name), facts.get(user.name)
            if fl is None or fu is None or (fl.shape, fl.dtype) != (fu.shape, fu.dtype):
                continue  # the constant broadcasts the result to a larger shape, or changes its dtype
            found = _factor(gm, user, last, p.channels, p.dim, len(fl.shape))
            if found is None:
                continue
            op, c = found
            c = c.to(p.weight.dtype)
            if op == "div" and bool((c == 0).any()):
                continue
            w, b = p.weight, p.bias
            shape = (-1,) + (1,) * (w.dim() - 1)
            with torch.no_grad():
                if op == "mul":
                    w, b = w * c.reshape(shape), b * c
                elif op == "div":
                    w, b = w / c.reshape(shape), b / c
                elif op == "add":
                    b = b + c
                else:
                    b = b - c
            _rebuild(gm, node, p, w, b)
            user.replace_all_uses_with(last)
            gm.graph.erase_node(user)
            folded[p.kind] += 1
            changed = True
        gm.graph.eliminate_dead_code()
    drop_unused_constants(gm)
    gm.recompile()
    return PassResult(g, modified=any(folded.values()), stats={f"{k}_scales_folded": v for k, v in folded.items()})
