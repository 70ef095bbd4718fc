"""Batch norms with `momentum=None` (a cumulative moving average) in training graphs.

In train mode such a batch norm computes its average factor as
``1.0 / float(self.num_batches_tracked)`` after incrementing the buffer: a value read that
torch.export cannot trace (``GuardOnDataDependentSymNode`` on ``aten.item``) and that dynamo
breaks the graph on, running the batch norm itself outside its graphs (a partial capture).
For the training export each such batch norm is given, for the trace only, the factor eager
computes at this step, ``1 / (num_batches_tracked + 1)``: the graph then holds the whole
computation (the buffer's increment included) with that factor a constant, right for the
step captured, as a trace is for the example it ran on.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def cumulative_factors_specialised(model: torch.nn.Module, notes: list[str]) -> Iterator[None]:
    """Within the block, each training batch norm of `model` with momentum=None has the
    factor eager would use at this step as its momentum; a note names them."""
    changed = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.momentum is None and m.training \
                and m.track_running_stats and isinstance(m.num_batches_tracked, torch.Tensor):
            steps = int(m.num_batches_tracked) + 1  # as eager's add_(1) leaves it
            changed.append((m, name or "(the model)", steps))
    for m, _, steps in changed:
        m.momentum = 1.0 / float(steps)
    try:
        yield
    finally:
        for m, _, _ in changed:
            m.momentum = None
    if changed:
        names = ", ".join(f"{n} (1/{s})" for _, n, s in changed[:6]) + (" ..." if len(changed) > 6 else "")
        note = (f"batch norm(s) with momentum=None: the training graphs take the cumulative average's factor "
                f"1/(num_batches_tracked + 1) as a constant of this step: {names}")
        if note not in notes:
            notes.append(note)
