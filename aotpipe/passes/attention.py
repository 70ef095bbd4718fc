"""sdpa: decomposed attention back into one ``aten.scaled_dot_product_attention``.

Accepts: inference graphs.

Export decomposes ``scaled_dot_product_attention`` (and eager attention code computes it
by hand) as batched matrix products around a softmax. The pass matches, from the second
product back:

    out = view(bmm(P, V'), [B, H, S, Dv])
    P   = softmax(scores)                   or its "safe" form: where(all -inf row, 0, softmax)
    scores = view(bmm(Q', K'), [B, H, S, L]) [* c | / c] [+ mask]
    Q'  = q [* a], flattened to [B*H, S, D] by views, clones and identity expands
    K'  = transpose(k) [* b] (or transpose(k * b)), flattened to [B*H, D, L]
    V'  = v, flattened to [B*H, L, Dv]

and rewrites ``out`` as ``scaled_dot_product_attention(q, k, v, mask, scale=a*b*c)``, which
on CPU runs a fused kernel and never materialises the [B, H, S, L] probabilities.

It is exact in the math, not bit for bit: the fused kernel sums in another order (float
noise, within the checks' bound). A plain softmax with a mask is not matched: a row the
mask hides entirely is NaN there and 0 in the fused kernel. Nothing is matched where the
probabilities have another user (returned attention weights), where an expand
broadcasts (grouped keys and values), or where q, k and v are not same-dtype
floating-point tensors of rank 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.passes.base import FactsLike, GraphUnderPass, PassResult, ShapeFacts, single_user
from aotpipe.passes.options import SdpaOptions

_aten = torch.ops.aten
SDPA = _aten.scaled_dot_product_attention.default
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _call(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _unflatten(node: Any, facts: FactsLike) -> Optional[torch.fx.Node]:
    """The rank-4 tensor that `node` (rank 3, [B*H, ...]) is a row-major reshape of: back
    through views, then through clones and expands that broadcast nothing."""
    while True:
        f = facts.get(node.name) if isinstance(node, torch.fx.Node) else None
        if f is None:
            return None
        if len(f.shape) == 4:
            break
        if not _call(node, *_VIEWS, _aten.clone.default, _aten.expand.default) or not _same_values(node, facts):
            return None
        node = node.args[0]
    while _call(node, _aten.clone.default, _aten.expand.default) and _same_values(node, facts):
        node = node.args[0]
    return node


def _same_values(node: torch.fx.Node, facts: FactsLike) -> bool:
    """A view, a clone, or an expand that broadcasts nothing: the same elements in the same
    row-major order (an expand that broadcasts, as grouped keys and values do, is not)."""
    if not _call(node, _aten.expand.default):
        return True
    src = node.args[0]
    fs, fn = facts.get(src.name) if isinstance(src, torch.fx.Node) else None, facts.get(node.name)
    return fs is not None and fn is not None and fs.shape == fn.shape


def _scalar_factor(node: torch.fx.Node) -> Optional[tuple[torch.fx.Node, float]]:
    """(x, c) when node is x * c or x / c for a Python number c."""
    if _call(node, _aten.mul.Scalar, _aten.mul.Tensor) and isinstance(node.args[1], (int, float)) \
            and not isinstance(node.args[1], bool):
        return node.args[0], float(node.args[1])
    if _call(node, _aten.div.Scalar, _aten.div.Tensor) and isinstance(node.args[1], (int, float)) \
            and not isinstance(node.args[1], bool) and node.args[1] != 0 and not node.kwargs:
        return node.args[0], 1.0 / float(node.args[1])
    return None


def _transposed(node: Any) -> Optional[torch.fx.Node]:
    """k when node is k with its last two dims swapped (rank 4)."""
    if _call(node, _aten.permute.default) and list(node.args[1]) in ([0, 1, 3, 2], [0, 1, -1, -2]):
        return node.args[0]
    if _call(node, _aten.transpose.int) and sorted(d % 4 for d in node.args[1:3]) == [2, 3]:
        return node.args[0]
    return None


def _scaled(node: Any) -> tuple[Any, float]:
    """(x, c) for x * c, else (node, 1)."""
    found = _scalar_factor(node) if isinstance(node, torch.fx.Node) else None
    return found if found is not None else (node, 1.0)


def _key(kt4: torch.fx.Node) -> Optional[tuple[torch.fx.Node, float]]:
    """(k, scale) for kt4 = transpose(k) [* b] or transpose(k * b)."""
    inner, scale = _scaled(kt4)
    k = _transposed(inner)
    if k is None:
        return None
    k, inner_scale = _scaled(k)
    return k, scale * inner_scale


def _is_safe_softmax(where: torch.fx.Node, sm: torch.fx.Node, logits: torch.fx.Node) -> bool:
    """where(not any(logits != -inf, -1), full_like(sm, 0), sm): softmax that gives 0, not
    NaN, on a row that is -inf throughout."""
    if not _call(where, _aten.where.self) or where.args[2] is not sm:
        return False
    cond, zeros = where.args[0], where.args[1]
    if not (_call(zeros, _aten.full_like.default) and zeros.args[0] is sm and zeros.args[1] == 0):
        return False
    if not _call(cond, _aten.logical_not.default):
        return False
    anyop = cond.args[0]
    if not (_call(anyop, _aten.any.dim) and anyop.args[1] in (-1, 3) and len(anyop.args) > 2 and anyop.args[2]):
        return False
    nz = anyop.args[0]
    if not _call(nz, _aten.logical_not.default):
        return False
    eq = nz.args[0]
    return _call(eq, _aten.eq.Scalar) and eq.args[0] is logits and eq.args[1] == -math.inf


@dataclass
class _Match:
    out: torch.fx.Node
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    mask: Optional[torch.fx.Node]
    scale: float


def _match(bmm2: torch.fx.Node, facts: FactsLike) -> Optional[_Match]:
    out = single_user(bmm2)
    fo = facts.get(out.name) if out is not None else None
    if not _call(out, *_VIEWS) or fo is None or len(fo.shape) != 4:
        return None
    probs, v = _unflatten(bmm2.args[0], facts), _unflatten(bmm2.args[1], facts)
    if probs is None or v is None:
        return None
    if _call(probs, _aten.where.self):
        sm, safe = probs.args[2], True
    else:
        sm, safe = probs, False
    if not _call(sm, _aten._softmax.default) or sm.args[1] not in (-1, 3) or sm.args[2]:
        return None
    logits = sm.args[0]
    if safe and not _is_safe_softmax(probs, sm, logits):
        return None
    # the probabilities feed only this attention (no returned attention weights)
    if safe and len(sm.users) != 2 or not safe and len(sm.users) != 1 or len(probs.users) != 1:
        return None
    mask = None
    scores = logits
    if _call(logits, _aten.add.Tensor) and not logits.kwargs:
        a, b = logits.args
        if isinstance(b, torch.fx.Node) and _call(a, *_VIEWS, _aten.mul.Scalar, _aten.div.Scalar,
                                                  _aten.mul.Tensor, _aten.div.Tensor):
            scores, mask = a, b
        elif isinstance(a, torch.fx.Node) and _call(b, *_VIEWS, _aten.mul.Scalar, _aten.div.Scalar,
                                                    _aten.mul.Tensor, _aten.div.Tensor):
            scores, mask = b, a
        else:
            return None
    if mask is not None and not safe:
        return None  # a fully masked row: NaN here, 0 in the fused kernel
    scores, c = _scaled(scores)
    if not _call(scores, *_VIEWS) or not _call(scores.args[0], _aten.bmm.default):
        return None
    bmm1 = scores.args[0]
    q4, k4t = _unflatten(bmm1.args[0], facts), _unflatten(bmm1.args[1], facts)
    if q4 is None or k4t is None:
        return None
    q, a = _scaled(q4)
    key = _key(k4t)
    if key is None:
        return None
    k, b = key
    fq, fk, fv = (facts.get(n.name) if isinstance(n, torch.fx.Node) else None for n in (q, k, v))
    if fq is None or fk is None or fv is None:
        return None
    if any(len(f.shape) != 4 or f.dtype not in _FLOATS or f.dtype != fq.dtype or f.device != fq.device
           for f in (fq, fk, fv)):
        return None
    (B, H, S, D), (_, _, L, _), Dv = fq.shape, fk.shape, fv.shape[3]
    if fk.shape != (B, H, L, D) or fv.shape != (B, H, L, Dv) or fo.shape != (B, H, S, Dv):
        return None
    # The products must be over [B*H] batches of these very matrices (not a reshape that
    # mixes heads into rows).
    operands = {bmm1.args[0]: (B * H, S, D), bmm1.args[1]: (B * H, D, L), bmm2.args[0]: (B * H, S, L),
                bmm2.args[1]: (B * H, L, Dv)}
    if any(not isinstance(n, torch.fx.Node) or facts.get(n.name) is None or facts[n.name].shape != shape
           for n, shape in operands.items()):
        return None
    if mask is not None:
        fm = facts.get(mask.name)
        # Added to the scores, so a float of their dtype: SDPA reads a bool mask as "keep",
        # where adding one would add 1.0.
        if fm is None or len(fm.shape) > 4 or fm.dtype != fq.dtype or not _broadcasts(fm.shape, (B, H, S, L)):
            return None
    return _Match(out, q, k, v, mask, a * b * c)


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    shape = (1,) * (len(to) - len(shape)) + tuple(shape)
    return all(s in (1, t) for s, t in zip(shape, to))


def sdpa(g: GraphUnderPass, options: SdpaOptions) -> PassResult:
    gm = g.gm
    if not any(_call(n, _aten._softmax.default) for n in gm.graph.nodes):
        return PassResult(g, modified=False, stats={"attention_fused": 0})
    facts = ShapeFacts(gm, g.values)  # shapes and dtypes: no run of the graph
    fused = 0
    for node in list(gm.graph.nodes):
        if not _call(node, _aten.bmm.default):
            continue
        m = _match(node, facts)
        if m is None:
            continue
        with gm.graph.inserting_before(m.out):
            new = gm.graph.call_function(SDPA, (m.q, m.k, m.v, m.mask), {"scale": m.scale})
        new.meta = dict(m.out.meta)
        m.out.replace_all_uses_with(new)
        fused += 1
    if fused:
        gm.graph.eliminate_dead_code()
    gm.recompile()
    return PassResult(g, modified=bool(fused), stats={"attention_fused": fused})

