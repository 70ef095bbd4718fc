"""A model of element-wise ops only, whose outputs have the same bits on every CPU."""

import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([0.5, -1.25, 2.0, 0.75]))

    def forward(self, x):
        y = torch.relu(x * self.scale) + 1.0
        return y, y


def tiny():
    return Tiny()
