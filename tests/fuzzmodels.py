"""A model that takes an input of any shape and dtype: for the fuzzed pipelines."""

import torch


class AnyShape(torch.nn.Module):
    def __init__(self, scale: float = 2.0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(float(scale)))

    def forward(self, *inputs, **named):
        out = self.w * 1.0
        for x in list(inputs) + list(named.values()):
            out = out + (x.float() * self.w).sum()
        return out


def any_shape(scale: float = 2.0) -> torch.nn.Module:
    return AnyShape(scale)
