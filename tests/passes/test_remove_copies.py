import torch
from torch import nn

from tests.passes.helpers import apply, assert_same_results, count, graph_of

CLONE = torch.ops.aten.clone.default
POOL_INDICES = torch.ops.aten.max_pool2d_with_indices.default


class _Copies(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x).clone()  # same layout: removable
        z = y.t().contiguous()  # a layout change: needed
        return z, y.relu()


def test_same_layout_copies_go_and_layout_changes_stay():
    g = graph_of(_Copies(), torch.randn(3, 4))
    frozen = apply("freeze", g).graph
    r = apply("remove_copies", frozen)
    assert r.stats["copies_removed"] == 1
    assert count(r.graph.gm, CLONE) == count(frozen.gm, CLONE) - 1 >= 1
    assert_same_results(g, r.graph)


class _InputCopies(nn.Module):
    """A copy of a graph input, and a copy returned as an output: both protect values a
    caller may write into."""

    def forward(self, x):
        a = x.clone()
        b = (x * 2).clone()
        return a, b


def test_copies_of_inputs_and_returned_copies_stay():
    g = graph_of(_InputCopies(), torch.randn(3, 4))
    r = apply("remove_copies", apply("freeze", g).graph)
    assert r.stats["copies_removed"] == 0
    assert count(r.graph.gm, CLONE) == 2


def test_pool_indices_nobody_reads_are_not_computed():
    pool = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2))
    g = graph_of(pool, torch.randn(1, 3, 9, 9))
    assert count(g.gm, POOL_INDICES) == 1
    r = apply("remove_copies", apply("freeze", g).graph)
    assert r.stats["pool_indices_dropped"] == 1 and count(r.graph.gm, POOL_INDICES) == 0
    assert_same_results(g, r.graph)


def test_a_graph_that_writes_in_place_keeps_its_copies():
    g = graph_of(_Copies(), torch.randn(3, 4))
    inplace = apply("reinplace", apply("freeze", g).graph).graph
    r = apply("remove_copies", inplace)
    assert r.stats["copies_removed"] == 0
    assert_same_results(g, r.graph)
