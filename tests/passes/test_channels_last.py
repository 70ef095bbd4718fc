import torch
from torch import nn

from aotpipe.models import zoo
from aotpipe.passes.base import constant_value
from tests.passes.helpers import apply, assert_same_results, graph_of, outputs

CONV = torch.ops.aten.convolution.default


def _conv_weights(gm):
    return [constant_value(gm, n.args[1]) for n in gm.graph.nodes if n.op == "call_function" and n.target is CONV]


def test_conv_weights_become_channels_last_and_results_hold():
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    frozen = apply("freeze", g).graph
    r = apply("channels_last", frozen)
    assert r.stats["weights_converted"] == 2
    for w in _conv_weights(r.graph.gm):
        assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    assert_same_results(g, r.graph)


class _ConvOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def test_outputs_keep_their_strides():
    g = graph_of(_ConvOut(), torch.randn(2, 3, 6, 6))
    before = outputs(g)[0]
    r = apply("channels_last", apply("freeze", g).graph)
    after = outputs(r.graph)[0]
    assert after.stride() == before.stride() and after.is_contiguous()
    assert r.stats["layouts_restored"] == 1
    torch.testing.assert_close(after, before)


class _AsStrided(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.as_strided(y, (4, 8), (1, 4)) * 1.0  # reads raw memory: depends on y's layout


def test_as_strided_input_keeps_its_layout():
    g = graph_of(_AsStrided(), torch.randn(1, 3, 4, 4))
    r = apply("channels_last", apply("freeze", g).graph)
    assert r.stats["layouts_restored"] >= 1
    assert_same_results(g, r.graph)


def test_without_freeze_nothing_changes():
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    r = apply("channels_last", g)
    assert not r.modified
