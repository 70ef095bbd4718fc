import math

import torch
import torch.nn.functional as F
from torch import nn

from aotpipe.models import zoo
from tests.passes.helpers import apply, assert_same_results, count, graph_of

SDPA = torch.ops.aten.scaled_dot_product_attention.default
SOFTMAX = torch.ops.aten._softmax.default


class _Attention(nn.Module):
    """Projections, then attention in one of the forms models write it."""

    def __init__(self, form, dim=16, heads=2):
        super().__init__()
        self.form, self.heads = form, heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def split(self, x):
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, mask=None):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        if self.form == "sdpa":  # exported through the math backend: the safe-softmax decomposition
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.form == "by_hand":
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores + mask
            out = scores.softmax(-1) @ v
        elif self.form == "weights_returned":
            p = (q @ k.transpose(-1, -2) * 0.25).softmax(-1)
            return p @ v, p
        b, h, s, d = out.shape
        return out.transpose(1, 2).reshape(b, s, h * d)


def _mask(b=2, s=5):
    keep = torch.ones(b, 1, s, s, dtype=torch.bool)
    keep[0, :, :, -2:] = False
    return torch.zeros(b, 1, s, s).masked_fill(~keep, -math.inf)


def _fused(model, *args):
    g = graph_of(model, *args)
    return g, apply("sdpa", apply("freeze", g).graph)


def test_decomposed_sdpa_with_a_mask_becomes_one_call():
    g, r = _fused(_Attention("sdpa"), torch.randn(2, 5, 16), _mask())
    assert r.stats["attention_fused"] == 1
    assert count(r.graph.gm, SDPA) == 1 and count(r.graph.gm, SOFTMAX) == 0
    assert count(r.graph.gm, torch.ops.aten.bmm.default) == 0
    assert_same_results(g, r.graph)


def test_attention_by_hand_without_a_mask_becomes_one_call_with_its_scale():
    g, r = _fused(_Attention("by_hand"), torch.randn(2, 5, 16))
    assert r.stats["attention_fused"] == 1
    (call,) = [n for n in r.graph.gm.graph.nodes if n.target is SDPA]
    assert call.kwargs["scale"] == 1 / math.sqrt(8)
    assert_same_results(g, r.graph)


def test_a_fully_masked_row_keeps_the_safe_softmax_zero():
    mask = _mask()
    mask[1, :, 2, :] = -math.inf  # row 2 of batch 1 sees nothing: 0 in SDPA, NaN in a plain softmax
    g, r = _fused(_Attention("sdpa"), torch.randn(2, 5, 16), mask)
    assert r.stats["attention_fused"] == 1
    assert_same_results(g, r.graph)


def test_plain_softmax_with_a_mask_is_not_matched():
    """A row the mask hides entirely is NaN there and 0 in the fused kernel."""
    g, r = _fused(_Attention("by_hand"), torch.randn(2, 5, 16), _mask())
    assert not r.modified and count(r.graph.gm, SOFTMAX) == 1


def test_returned_attention_weights_are_not_matched():
    g, r = _fused(_Attention("weights_returned"), torch.randn(2, 5, 16))
    assert not r.modified and count(r.graph.gm, SDPA) == 0


class _Grouped(nn.Module):
    """Grouped keys and values: an expand that broadcasts one head to two."""

    def forward(self, q, k, v):
        k, v = k.expand(-1, 2, -1, -1), v.expand(-1, 2, -1, -1)
        return (q @ k.transpose(-1, -2) * 0.5).softmax(-1) @ v


def test_grouped_keys_and_values_keep_their_broadcast():
    """The expand that repeats a head is a value SDPA takes, never stripped as a reshape."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    g = graph_of(_Grouped(), q, k, v)
    r = apply("sdpa", g)
    (call,) = [n for n in r.graph.gm.graph.nodes if n.target is SDPA]
    assert all(a.target is torch.ops.aten.expand.default for a in call.args[1:3])
    assert_same_results(g, r.graph)


def test_a_model_without_attention_is_unchanged():
    g = graph_of(zoo.mlp(in_features=4, hidden=8, depth=1), torch.randn(2, 4))
    assert not apply("sdpa", g).modified


def test_a_masked_fill_before_a_plain_softmax_is_not_matched():
    """The quickstart transformer masks with masked_fill(-inf) and a plain softmax: a fully
    padded row is NaN there, so the fused kernel (0) would change it."""
    model = zoo.tiny_transformer(vocab=50, dim=16, heads=2, layers=1)
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    g, r = _fused(model, ids, mask)
    assert not r.modified and count(r.graph.gm, SOFTMAX) == 1

