"""Reproducible runs: one seed, one definition of "draws random numbers", deterministic kernels.

Capture, checks and replay all run graphs (and the eager model) through :func:`reproducible`:
the global generator is seeded with :data:`RNG_SEED` so random ops (dropout) draw the same
numbers in the graph as in eager, and ``torch.use_deterministic_algorithms`` picks the
deterministic kernel of ops that have two (``index_put_`` with accumulate: an embedding's
backward). Ops that torch says have no deterministic kernel are reported, not hidden.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.fx

# Seed set before every seeded run (graph or eager), at capture and at replay.
RNG_SEED = 0

_NONDETERMINISTIC = re.compile(r"^(\S+) does not have a deterministic implementation")


def op_draws_random(target: Any) -> bool:
    """Whether an FX call target draws from the random generator (torch's own tag)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def draws_random(gm: torch.fx.GraphModule) -> bool:
    """Whether any node of the graph draws random numbers."""
    return any(n.op == "call_function" and op_draws_random(n.target) for n in gm.graph.nodes)


@dataclass
class RunLog:
    """What a reproducible run found: kernels torch could not make deterministic."""

    nondeterministic: list[str] = field(default_factory=list)


@contextlib.contextmanager
def reproducible(seed: bool = True) -> Iterator[RunLog]:
    """Deterministic kernels (and a seeded generator) for the duration; restores the caller's settings.

    Yields a :class:`RunLog` that lists the ops torch warned have no deterministic kernel.
    """
    log = RunLog()
    was_det = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    rng = torch.random.get_rng_state() if seed else None
    # torch.use_deterministic_algorithms would also set inductor's flag, importing
    # torch._inductor; aotpipe runs no inductor code and loads without it: ATen's flag only.
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            if seed:
                torch.manual_seed(RNG_SEED)
            yield log
        for w in caught:
            m = _NONDETERMINISTIC.match(str(w.message))
            if m and m.group(1) not in log.nondeterministic:
                log.nondeterministic.append(m.group(1))
            elif not m:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    finally:
        torch._C._set_deterministic_algorithms(was_det, warn_only=was_warn)
        if rng is not None:
            torch.random.set_rng_state(rng)
