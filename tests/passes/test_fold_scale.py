import torch
from torch import nn

from tests.passes.helpers import apply, assert_same_results, count, graph_of

MUL = torch.ops.aten.mul.Tensor
ADD = torch.ops.aten.add.Tensor


class _LayerScale(nn.Module):
    """A linear, then a learned per-channel scale and a shift (a layer scale); a layer
    norm, then a constant scale; a convolution, then a per-channel scale."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.conv = nn.Linear(6, 8), nn.LayerNorm(8), nn.Conv2d(3, 4, 3)
        self.gamma = nn.Parameter(torch.rand(8) + 0.5)
        self.beta = nn.Parameter(torch.randn(8))
        self.alpha = nn.Parameter(torch.rand(4, 1, 1) + 0.5)

    def forward(self, x, img):
        y = self.fc(x) * self.gamma + self.beta
        z = self.norm(y) * 3.0
        return z, self.conv(img) * self.alpha


def _args():
    return torch.randn(2, 5, 6), torch.randn(2, 3, 8, 8)


def test_scales_and_shifts_fold_into_linear_norm_and_conv():
    g = graph_of(_LayerScale(), *_args())
    frozen = apply("freeze", g).graph
    r = apply("fold_scale", frozen)
    assert r.stats == {"linear_scales_folded": 2, "conv_scales_folded": 1, "norm_scales_folded": 1}
    assert count(r.graph.gm, MUL) + count(r.graph.gm, torch.ops.aten.mul.Scalar) == 0
    assert count(r.graph.gm, ADD) == 0
    assert_same_results(g, r.graph)


def test_without_freeze_nothing_folds():
    g = graph_of(_LayerScale(), *_args())
    assert not apply("fold_scale", g).modified


class _SeenTwice(nn.Module):
    """The unscaled result is also returned: folding would change it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y * 2.0, y


def test_a_result_read_elsewhere_is_not_scaled():
    g = graph_of(_SeenTwice(), torch.randn(3, 4))
    r = apply("fold_scale", apply("freeze", g).graph)
    assert not r.modified
    assert_same_results(g, r.graph)


class _NotPerChannel(nn.Module):
    """A scale that varies along rows (not the output channel), one that is an input, and
    one that broadcasts the result to a larger shape: none folds."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.rows = nn.Parameter(torch.rand(3, 1) + 0.5)
        self.wide = nn.Parameter(torch.rand(2, 1, 4) + 0.5)

    def forward(self, x, s):
        return self.a(x) * self.rows, self.b(x) * s, self.c(x) * self.wide


def test_scales_that_are_not_per_channel_constants_stay():
    g = graph_of(_NotPerChannel(), torch.randn(3, 4), torch.randn(4))
    r = apply("fold_scale", apply("freeze", g).graph)
    assert not r.modified
    assert_same_results(g, r.graph)


class _DivByZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.d = nn.Parameter(torch.tensor([1.0, 0.0, 2.0, 4.0]))

    def forward(self, x):
        return self.fc(x) / self.d


def test_division_by_a_zero_channel_is_not_folded():
    g = graph_of(_DivByZero(), torch.randn(3, 4))
    r = apply("fold_scale", apply("freeze", g).graph)
    assert not r.modified
