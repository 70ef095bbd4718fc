import torch
from torch import nn

from tests.passes.helpers import apply, assert_same_results, graph_of


class _Noops(nn.Module):
    def forward(self, x):
        y = x.view(3, 4)  # same shape
        y = y.permute(0, 1)  # identity order
        y = y[:, 0:4]  # whole dimension
        return y.detach() * 2


def test_identity_views_alias_and_detach_are_removed():
    g = graph_of(_Noops(), torch.randn(3, 4))
    before = len(g.gm.graph.nodes)
    r = apply("remove_noops", g)
    assert r.stats["noops_removed"] >= 2
    assert len(r.graph.gm.graph.nodes) == before - r.stats["noops_removed"]
    assert_same_results(g, r.graph)


class _RealViews(nn.Module):
    def forward(self, x):
        return x.view(4, 3).permute(1, 0)[:, 1:] * 2


def test_views_that_change_shape_are_kept():
    g = graph_of(_RealViews(), torch.randn(3, 4))
    r = apply("remove_noops", g)
    assert not r.modified
    assert_same_results(g, r.graph)
