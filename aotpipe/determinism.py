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
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.fx

# Seed set before every seeded run (graph or eager), at capture and at replay.
RNG_SEED = 0

_NONDETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")


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
def reproducible(seed: bool = True, strict: bool = False) -> Iterator[RunLog]:
    """Deterministic kernels (and a seeded generator) for the duration; restores the caller's settings.

    `strict`: an op without a deterministic kernel raises (every time; torch warns only once
    per process). Otherwise it runs, and the yielded :class:`RunLog` names it if torch warns.
    """
    log = RunLog()
    was_det = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    rng = torch.random.get_rng_state() if seed else None
    # torch.use_deterministic_algorithms would also set inductor's flag, importing
    # torch._inductor; aotpipe runs no inductor code and loads without it: ATen's flag only.
    torch._C._set_deterministic_algorithms(True, warn_only=not strict)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            if seed:
                torch.manual_seed(RNG_SEED)
            yield log
        for w in caught:
            m = _NONDETERMINISTIC.search(str(w.message))
            if m and m.group(1) not in log.nondeterministic:
                log.nondeterministic.append(m.group(1))
            elif not m:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    finally:
        torch._C._set_deterministic_algorithms(was_det, warn_only=was_warn)
        if rng is not None:
            torch.random.set_rng_state(rng)


T = TypeVar("T")


def run_reproducibly(fn: Callable[[], T], *, seed: bool = True, log: Optional[RunLog] = None) -> T:
    """`fn()` with deterministic kernels and a seeded generator; an op that has no
    deterministic kernel is named in `log` and the run repeated allowing it."""
    try:
        with reproducible(seed, strict=True):
            return fn()
    except RuntimeError as e:
        m = _NONDETERMINISTIC.search(str(e))
        if not m:
            raise
        if log is not None and m.group(1) not in log.nondeterministic:
            log.nondeterministic.append(m.group(1))
        with reproducible(seed, strict=False) as ran:
            out = fn()
        if log is not None:
            log.nondeterministic += [o for o in ran.nondeterministic if o not in log.nondeterministic]
        return out
