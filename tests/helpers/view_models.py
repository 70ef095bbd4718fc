"""Small models for the graph-view tests: modules nested four deep, under names that
model-explorer's namespaces must escape (a `/` inside a name, spaces and brackets)."""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.ModuleDict({"a/b": nn.Linear(width, width), "c-d": nn.Linear(width, width)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.inner["a/b"](x)) + self.inner["c-d"](x)


class NestedOddNames(nn.Module):
    """stages.0.blocks.<x y>.inner.a/b: a Linear four modules down, its path two odd names."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stages = nn.ModuleList([nn.ModuleDict({"blocks": nn.ModuleDict({"<x y>": _Block(width)})})])
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            for block in stage["blocks"].values():
                x = block(x)
        return self.head(x)


def nested_odd_names(width: int = 8) -> nn.Module:
    return NestedOddNames(width)
