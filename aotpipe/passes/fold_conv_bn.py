"""fold_conv_bn: eval-mode batch norm after a convolution (or a linear) folded into its weights.

Accepts: inference graphs whose weights are constants (run `freeze` first; without it
nothing matches and the graph is returned unchanged).

Matches ``y = _native_batch_norm_legit_no_training(conv(x, W, B), w, b, mean, var, eps)[0]``
where the convolution's output is used only by the batch norm and W, B, w, b, mean, var
are constants, and rewrites it as ``conv(x, W * s, (B - mean) * s + b)`` with
``s = w / sqrt(var + eps)`` (per output channel). The same for ``addmm(B, x, Wt)`` (a
linear layer with its weight already transposed) followed by a 1-d batch norm.
"""

from __future__ import annotations


import torch
import torch.fx

from aotpipe.passes.base import GraphUnderPass, PassResult, add_constant, constant_value, is_constant, view_of_constant
from aotpipe.passes.options import FoldConvBnOptions

_BN = torch.ops.aten._native_batch_norm_legit_no_training.default
_CONV = torch.ops.aten.convolution.default
_ADDMM = torch.ops.aten.addmm.default


def _only_output_used(bn: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The getitem(bn, 0) users, if nothing else of the batch norm is used."""
    users = list(bn.users)
    if not users or any(u.target.__module__ != "_operator" or u.args[1] != 0 for u in users):
        return None
    return users


def fold_conv_bn(g: GraphUnderPass, options: FoldConvBnOptions) -> PassResult:
    gm = g.gm
    folded = {"conv": 0, "linear": 0}
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not _BN:
            continue
        src, w, b, mean, var, _momentum, eps = bn.args
        getitems = _only_output_used(bn)
        if getitems is None or not isinstance(src, torch.fx.Node) or len(src.users) != 1:
            continue
        if not all(is_constant(t) for t in (w, b, mean, var)):
            continue
        if src.target is _CONV and is_constant(src.args[1]) and (src.args[2] is None or is_constant(src.args[2])) \
                and not src.args[6]:  # not transposed
            weight = constant_value(gm, src.args[1])
            bias = constant_value(gm, src.args[2]) if src.args[2] is not None else None
            kind = "conv"
        elif src.target is _ADDMM and is_constant(src.args[0]) and view_of_constant(gm, src.args[2]) is not None \
                and not src.kwargs and len(src.args) == 3:
            weight = view_of_constant(gm, src.args[2]).t()  # addmm takes W transposed: [in, out]
            bias = constant_value(gm, src.args[0])
            kind = "linear"
        else:
            continue
        cw, cb, cm, cv = (constant_value(gm, t) for t in (w, b, mean, var))
        with torch.no_grad():
            scale = cw / torch.sqrt(cv + eps)
            new_w = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
            new_b = ((bias if bias is not None else torch.zeros_like(cm)) - cm) * scale + cb
        if kind == "conv":
            w_node = add_constant(gm, new_w.contiguous(), f"{src.name}_folded_weight", src)
            b_node = add_constant(gm, new_b.contiguous(), f"{src.name}_folded_bias", src)
            with gm.graph.inserting_before(bn):
                new = gm.graph.call_function(_CONV, (src.args[0], w_node, b_node, *src.args[3:]))
        else:
            w_node = add_constant(gm, new_w.t().contiguous(), f"{src.name}_folded_weight", src)
            b_node = add_constant(gm, new_b.contiguous(), f"{src.name}_folded_bias", src)
            with gm.graph.inserting_before(bn):
                new = gm.graph.call_function(_ADDMM, (b_node, src.args[1], w_node))
        for gi in getitems:
            gi.replace_all_uses_with(new)
            gm.graph.erase_node(gi)
        gm.graph.erase_node(bn)
        gm.graph.erase_node(src)
        folded[kind] += 1
    gm.graph.eliminate_dead_code()
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return PassResult(g, modified=bool(folded["conv"] or folded["linear"]),
                      stats={"conv_bn_folded": folded["conv"], "linear_bn_folded": folded["linear"]})
