import torch
from torch import nn

from aotpipe.models import zoo
from tests.passes.helpers import apply, assert_same_results, graph_of


def _inplace_ops(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "_schema", None)
            is not None and n.target._schema.is_mutable]


class _Chain(nn.Module):
    def forward(self, x):
        y = x * 2  # y is dead after the add: the add can write into it
        z = y + 1
        return z.relu()


def test_dead_intermediate_is_reinplaced():
    g = graph_of(_Chain(), torch.randn(5))
    r = apply("reinplace", g)
    assert r.stats["ops_reinplaced"] >= 1 and _inplace_ops(r.graph.gm)
    assert_same_results(g, r.graph)


class _UsedLater(nn.Module):
    def forward(self, x):
        y = x * 2
        z = y + 1  # y is used again below: must not be overwritten
        return z, y * 3


def test_input_used_later_is_not_reinplaced():
    g = graph_of(_UsedLater(), torch.randn(5))
    r = apply("reinplace", g)
    add = [n for n in r.graph.gm.graph.nodes if "add" in str(n.target)]
    assert add and all(not n.target._schema.is_mutable for n in add)
    assert_same_results(g, r.graph)


class _OnInput(nn.Module):
    def forward(self, x):
        return x + 1  # x is a graph input: never written


def test_graph_input_is_not_reinplaced():
    g = graph_of(_OnInput(), torch.randn(5))
    r = apply("reinplace", g)
    assert not _inplace_ops(r.graph.gm)
    x = g.values[0].clone()
    r.graph.gm(*r.graph.values)
    assert torch.equal(g.values[0], x)


class _SliceScatter(nn.Module):
    def forward(self, x):
        y = x.clone()
        y[1:3] = y[1:3] * 10  # functionalised to slice_scatter
        return y


def test_view_scatter_becomes_an_in_place_copy():
    g = graph_of(_SliceScatter(), torch.randn(5))
    assert any("slice_scatter" in str(n.target) for n in g.gm.graph.nodes)
    r = apply("reinplace", g)
    assert not any("slice_scatter" in str(n.target) for n in r.graph.gm.graph.nodes)
    assert_same_results(g, r.graph)


class _Overlap(nn.Module):
    def forward(self, x):
        c = torch.cat([x[:, :1] - 1, x], -1)
        return c[:, 1:] - c[:, :-1]  # both operands are views of c, offset by one


def test_overlapping_operands_are_not_written_in_place():
    # torch's reinplace turns this sub into an in-place sub_ on one view while the other,
    # overlapping view is still read; our pass reverts it.
    g = graph_of(_Overlap(), torch.arange(8.0).reshape(2, 4))
    r = apply("reinplace", g)
    assert r.stats["unsafe_reverted"] >= 1
    assert_same_results(g, r.graph)


def test_forward_and_backward_graphs_reinplace():
    for kind in ("forward", "backward"):
        g = graph_of(zoo.mlp(in_features=4, hidden=8), torch.randn(2, 4), kind=kind)
        r = apply("reinplace", g, graphs=[kind])
        assert_same_results(g, r.graph)


def test_an_op_whose_result_broadcasts_past_its_first_argument_is_not_reinplaced():
    # torch's reinplace compares element counts only: a 0-d `a` plus a [1, 1, 1] `b` has one
    # element either way, but a.add_(b) cannot hold the [1, 1, 1] result.
    class M(torch.nn.Module):
        def forward(self, x, y):
            a = x.sum()  # 0-d, an intermediate (reinplace never writes into an input)
            return a + y

    g = graph_of(M(), torch.randn(3), torch.randn(1, 1, 1))
    after = apply("reinplace", g).graph
    assert not [n for n in after.gm.graph.nodes if n.op == "call_function" and str(n.target) == "aten.add_.Tensor"]
    assert_same_results(g, after)
