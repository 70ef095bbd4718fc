"""The caller's process-wide torch state, kept across work that must not change it.

Replay seeds the global generator so that graphs drawing random numbers are bit-exact,
and rebuilding a model seeds it for its weights; neither may leak into the caller, who
may be in the middle of their own seeded run.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Restore grad mode and the CPU (and initialised CUDA) RNG states on the way out."""
    grad = torch.is_grad_enabled()
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_grad_enabled(grad)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
