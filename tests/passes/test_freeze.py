import torch
from torch import nn

from aotpipe.models import zoo
from tests.passes.helpers import apply, assert_same_results, graph_of


class _TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        w = self.a.weight * self.scale  # depends only on constants: folded
        return self.b(x @ w.t()) + self.b(x @ w.t())  # the same call twice: merged


def test_params_become_constants_and_constant_subgraphs_fold():
    g = graph_of(_TwoLinear(), torch.randn(3, 4))
    assert [i.role for i in g.inputs] == ["param", "param", "param", "param", "buffer", "user"]
    r = apply("freeze", g)
    assert r.modified
    assert [i.role for i in r.graph.inputs] == ["user"] and len(r.graph.values) == 1
    assert r.stats["frozen"] == 5 and r.stats["constants_folded"] >= 1 and r.stats["cse_merged"] >= 1
    assert not any(n.target is torch.ops.aten.mul.Tensor for n in r.graph.gm.graph.nodes)  # folded
    assert len(r.graph.gm.graph.nodes) < len(g.gm.graph.nodes)
    assert_same_results(g, r.graph)


def test_mutated_buffer_is_not_frozen():
    g = graph_of(zoo.running_norm(features=4), torch.randn(3, 4))
    r = apply("freeze", g)
    kept = {i.target: i.role for i in r.graph.inputs}
    assert kept == {"running_mean": "buffer", "calls": "buffer", "arg0": "user"}
    assert r.stats["frozen"] == 2 and r.stats["preserved"] == 2
    assert_same_results(g, r.graph)


class _ReturnsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x), self.fc.weight.t()  # an output aliasing a parameter


def test_aliased_output_is_not_frozen():
    g = graph_of(_ReturnsWeight(), torch.randn(2, 3))
    r = apply("freeze", g)
    kept = {i.target for i in r.graph.inputs}
    assert kept == {"fc.weight", "arg0"}
    assert_same_results(g, r.graph)


def test_fold_off_keeps_constant_computations():
    g = graph_of(_TwoLinear(), torch.randn(3, 4))
    r = apply("freeze", g, fold=False, cse=False)
    assert r.stats["constants_folded"] == 0 and r.stats["cse_merged"] == 0
    assert any(n.target is torch.ops.aten.mul.Tensor for n in r.graph.gm.graph.nodes)
    assert_same_results(g, r.graph)


class _Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x + torch.rand_like(self.w)


def test_random_ops_are_not_folded():
    g = graph_of(_Noisy(), torch.randn(4))
    r = apply("freeze", g)
    assert any("rand" in str(n.target) for n in r.graph.gm.graph.nodes)


class _ChunkOfWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        a, b = self.w.chunk(2)  # outputs that are views of a parameter (split_with_sizes)
        return x * 2, a, b


def test_output_aliasing_a_parameter_through_split_is_not_frozen():
    g = graph_of(_ChunkOfWeight(), torch.randn(3))
    r = apply("freeze", g)
    assert {i.target for i in r.graph.inputs} == {"w", "arg0"}


class _ConstantOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x + 1, self.w * 2  # the second output folds to a constant


def test_an_output_that_folds_to_a_constant_is_returned_as_a_copy():
    g = graph_of(_ConstantOutput(), torch.randn(3))
    r = apply("freeze", g)
    gm = r.graph.gm
    first = gm(*r.graph.values)[1]
    first.zero_()  # a caller writing into a result
    second = gm(*r.graph.values)[1]
    torch.testing.assert_close(second, torch.full((3,), 2.0))
