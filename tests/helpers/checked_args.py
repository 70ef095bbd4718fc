"""Arguments for the checked-form tests (tests/artifact/test_checked_*.py): where a refusal is
said to be, and small integer and seeded random tensors."""

import torch

WHERE = "g/graph.json: node 'n'"


def _i(*values, dtype=torch.int64):
    """An integer tensor of `values`."""
    return torch.tensor(values, dtype=dtype)


def _r(*shape, seed=0):
    """A random float32 tensor, the same on every run."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
