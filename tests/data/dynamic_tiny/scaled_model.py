import torch


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x):
        return torch.tanh(x * self.w).sum(-1)
