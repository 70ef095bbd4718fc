"""Models whose dynamo capture leaves part of the computation outside its graphs (issue 35),
for tests/capture/test_partial.py and its pipelines."""

from __future__ import annotations

import torch
from torch import nn


class CTCHead(nn.Module):
    """A Linear then nn.CTCLoss: torch's `_ctc_loss` has an output size read from the lengths'
    values (export fails, dynamo breaks before it and ran the loss as eager code after its one
    graph); capture/ctc.py's formulation captures it whole."""

    def __init__(self, features: int = 8, classes: int = 5):
        super().__init__()
        self.lin = nn.Linear(features, classes)
        self.ctc = nn.CTCLoss()

    def forward(self, x: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor) -> torch.Tensor:
        return self.ctc(self.lin(x).log_softmax(-1), targets, input_lengths, target_lengths)


def ctc_head() -> nn.Module:
    return CTCHead()


def ctc_inputs() -> tuple[torch.Tensor, ...]:
    """Example inputs for ctc_head(): 12 frames, 2 sequences, targets of 4 and 3 labels."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(12, 2, 8, generator=g), torch.randint(1, 5, (2, 4), generator=g),
            torch.full((2,), 12, dtype=torch.long), torch.tensor([4, 3]))


@torch.compiler.disable
def _eager_loss(h: torch.Tensor) -> torch.Tensor:
    return (h * h).mean()


class DisabledLossHead(nn.Module):
    """A Linear then a loss in a function marked `torch.compiler.disable`: dynamo runs the loss
    outside its graph, as its user asked (torch.export traces through it: use mode dynamo)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _eager_loss(self.lin(x))


def disabled_loss_head() -> nn.Module:
    return DisabledLossHead()


class ConvBNConv(nn.Module):
    """Conv2d -> BatchNorm2d(momentum=None) -> Conv2d: in training, the batch norm's cumulative
    average reads `1.0 / float(num_batches_tracked)`, a value read dynamo breaks the graph on."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4, momentum=None)
        self.c2 = nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.bn(self.c1(x)))


def conv_bn_cumulative() -> nn.Module:
    return ConvBNConv()


class TwoLinearsPrint(nn.Module):
    """A graph break with no tensor computation after it: the two subgraphs hold the whole model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        torch._dynamo.graph_break()
        return self.b(h)


def two_linears_break() -> nn.Module:
    return TwoLinearsPrint()
