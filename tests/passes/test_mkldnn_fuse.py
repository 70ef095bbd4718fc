import pytest
import torch
from torch import nn

from aotpipe.models import zoo
from tests.passes.helpers import apply, assert_same_results, count, graph_of, ops

CONV = torch.ops.aten.convolution.default
POINTWISE = torch.ops.mkldnn._convolution_pointwise.default
BINARY = torch.ops.mkldnn._convolution_pointwise.binary

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


class _Block(nn.Module):
    """conv-relu, a residual conv-add-relu, and a conv with a gelu."""

    def __init__(self, c=4):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.relu(self.b(y) + x)
        return nn.functional.gelu(self.c(y), approximate="tanh")


def _frozen(model, *args):
    g = graph_of(model, *args)
    return g, apply("freeze", g).graph


def test_conv_epilogues_fuse_into_onednn_calls():
    g, frozen = _frozen(_Block(), torch.randn(2, 4, 8, 8))
    r = apply("mkldnn_fuse", frozen)
    assert r.stats == {"conv": 0, "conv_unary": 2, "conv_add": 0, "conv_add_relu": 1, "linear": 0, "batched_linear": 0}
    assert count(r.graph.gm, CONV) == 0 and count(r.graph.gm, POINTWISE) == 2 and count(r.graph.gm, BINARY) == 1
    assert not any("relu" in o or "gelu" in o or "add" in o for o in ops(r.graph.gm))
    assert_same_results(g, r.graph)


def test_after_channels_last_the_fused_graph_keeps_the_output_layout():
    g, frozen = _frozen(_Block(), torch.randn(2, 4, 8, 8))
    cl = apply("channels_last", frozen, activations=True).graph
    r = apply("mkldnn_fuse", cl)
    assert r.modified
    (before,), (after,) = [torch.fx.Interpreter(x.gm).run(*x.values) for x in (g, r.graph)]
    assert after.stride() == before.stride()
    torch.testing.assert_close(after, before)


def test_without_freeze_nothing_matches():
    g = graph_of(_Block(), torch.randn(2, 4, 8, 8))
    r = apply("mkldnn_fuse", g)
    assert not r.modified and count(r.graph.gm, CONV) == 3


class _Shared(nn.Module):
    """The convolution's result is read twice: the relu cannot be folded into it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y), y * 2


def test_a_result_with_other_users_keeps_its_epilogue():
    g, frozen = _frozen(_Shared(), torch.randn(2, 3, 8, 8))
    r = apply("mkldnn_fuse", frozen)
    assert r.stats["conv"] == 1 and r.stats["conv_unary"] == 0
    assert count(r.graph.gm, torch.ops.aten.relu.default) == 1
    assert_same_results(g, r.graph)


class _Broadcast(nn.Module):
    """A residual that broadcasts (a per-channel bias-like tensor): not the binary kernel's."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, bias):
        return self.conv(x) + bias


def test_a_broadcasting_add_is_not_fused():
    g, frozen = _frozen(_Broadcast(), torch.randn(2, 3, 8, 8), torch.randn(4, 1, 1))
    r = apply("mkldnn_fuse", frozen)
    assert r.stats["conv_add"] == 0 and r.stats["conv"] == 1
    assert count(r.graph.gm, torch.ops.aten.add.Tensor) == 1
    assert_same_results(g, r.graph)


def test_transposed_and_float64_convolutions_are_left_alone():
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(3, 4, 2, stride=2)

        def forward(self, x):
            return torch.relu(self.up(x))

    g, frozen = _frozen(Up(), torch.randn(1, 3, 4, 4))
    assert not apply("mkldnn_fuse", frozen).modified
    g, frozen = _frozen(zoo.small_cnn(channels=4).double(), torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert not apply("mkldnn_fuse", frozen).modified


def test_epilogues_false_fuses_the_convolution_alone():
    g, frozen = _frozen(_Block(), torch.randn(2, 4, 8, 8))
    r = apply("mkldnn_fuse", frozen, epilogues=False)
    assert r.stats == {"conv": 3, "conv_unary": 0, "conv_add": 0, "conv_add_relu": 0, "linear": 0, "batched_linear": 0}
    assert_same_results(g, r.graph)


def test_linears_with_and_without_bias_become_aten_linear():
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4, bias=False))
    g, frozen = _frozen(model, torch.randn(5, 8))
    r = apply("mkldnn_fuse", frozen)
    assert r.stats["linear"] == 2
    assert count(r.graph.gm, torch.ops.aten.linear.default) == 2
    assert count(r.graph.gm, torch.ops.aten.addmm.default) + count(r.graph.gm, torch.ops.aten.mm.default) == 0
    assert_same_results(g, r.graph)


def test_linears_false_leaves_them():
    g, frozen = _frozen(nn.Linear(8, 6), torch.randn(5, 8))
    assert apply("mkldnn_fuse", frozen, linears=False).stats["linear"] == 0
