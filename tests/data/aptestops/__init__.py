"""A library with its own custom op (no ATen decomposition in aotpipe), for trusted_ops tests.

The op namespace is the package's name, as in transformers, so a loader granted
``--trust-ops aptestops`` may import this package on the artefact's word.
"""

import torch


@torch.library.custom_op("aptestops::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return grad * (ctx.scale - y * y / ctx.scale), None  # d/dx s*tanh(x) = s - y^2 / s


scaled_tanh.register_autograd(_backward, setup_context=_setup)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.ops.aptestops.scaled_tanh(self.fc1(x), 2.0))


def tiny():
    return Tiny()
