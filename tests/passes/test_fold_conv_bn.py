import torch
from torch import nn

from aotpipe.models import zoo
from tests.passes.helpers import apply, assert_same_results, count, graph_of

BN = torch.ops.aten._native_batch_norm_legit_no_training.default


def _trained_bn(model):
    # non-trivial running statistics, as a trained model has
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.5, 0.5)
    return model


def test_conv_bn_folds_into_the_convolution():
    g = graph_of(_trained_bn(zoo.small_cnn(channels=4)), torch.randn(2, 3, 8, 8))
    frozen = apply("freeze", g).graph
    assert count(frozen.gm, BN) == 2
    r = apply("fold_conv_bn", frozen)
    assert r.stats["conv_bn_folded"] == 2 and count(r.graph.gm, BN) == 0
    assert len(r.graph.gm.graph.nodes) < len(frozen.gm.graph.nodes)
    assert_same_results(g, r.graph)


class _LinearBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_linear_bn_folds_into_the_linear():
    g = graph_of(_trained_bn(_LinearBn()), torch.randn(4, 5))
    r = apply("fold_conv_bn", apply("freeze", g).graph)
    assert r.stats["linear_bn_folded"] == 1 and count(r.graph.gm, BN) == 0
    assert_same_results(g, r.graph)


def test_without_freeze_nothing_is_folded():
    g = graph_of(_trained_bn(zoo.small_cnn(channels=4)), torch.randn(2, 3, 8, 8))
    r = apply("fold_conv_bn", g)
    assert not r.modified and count(r.graph.gm, BN) == 2


class _ConvUsedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y  # the convolution's output is needed as it is


def test_conv_output_used_elsewhere_is_not_folded():
    g = graph_of(_trained_bn(_ConvUsedTwice()), torch.randn(1, 3, 6, 6))
    r = apply("fold_conv_bn", apply("freeze", g).graph)
    assert not r.modified and count(r.graph.gm, BN) == 1
    assert_same_results(g, r.graph)
