import torch
from torch import nn

from tests.passes.helpers import apply, assert_same_results, count, graph_of


class _Views(nn.Module):
    def forward(self, x):
        return x.view(4, 3).t().reshape(12) * 2


def test_every_view_becomes_a_reshape():
    g = graph_of(_Views(), torch.randn(3, 4))
    assert count(g.gm, torch.ops.aten.view.default) >= 1
    r = apply("view_to_reshape", g)
    assert count(r.graph.gm, torch.ops.aten.view.default) == 0
    assert r.stats["views_replaced"] >= 1
    assert_same_results(g, r.graph)


def test_graph_without_views_is_unchanged():
    class Add(nn.Module):
        def forward(self, x):
            return x + 1

    r = apply("view_to_reshape", graph_of(Add(), torch.randn(3)))
    assert not r.modified
