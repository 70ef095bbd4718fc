"""Branches on tensor values inside torch's own library code, made static for capture.

Some torch functions read a tensor's values in Python to decide what to do next. torch.export
cannot trace such a read (``GuardOnDataDependentSymNode: Could not guard on data-dependent
expression``) and dynamo breaks the graph there, so a model that calls them was refused or
captured in part. Each such branch is one of two kinds, and is replaced, for the capture only,
by what a graph can hold without changing what the model computes:

- a **validation** (the function raises on invalid values and otherwise goes on): the check
  becomes a node of the graph (``aten._assert_async.msg``) with torch's message, so a replay
  on invalid values raises as eager does (a RuntimeError where eager raised a ValueError).
  Checking once on the example inputs before the trace would leave a graph that silently
  computes something on the values eager refuses: the graph would no longer carry the
  model's contract;
- a **hint** (the values pick a faster route to the same result): the conservative route,
  right for every value, is taken; the graph then computes what eager computes on every
  input, not only on the example's.

:func:`static_library_branches` installs the replacements of :data:`REPLACEMENTS` while a
capture traces and puts torch's functions back afterwards; eager runs outside capture (the
checks against eager included) see torch's own. A replacement that changed a call adds its
note to the model's notes (manifest and report). torch functions are replaced where torch's
code looks them up (a module attribute read at call time); a caller holding the function
object itself (op_db's OpInfo.op) still gets torch's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

# torch's message for a negative variance (torch.nn.functional.gaussian_nll_loss)
NEGATIVE_VAR = "var has negative entry/entries"


@dataclass(frozen=True)
class Replacement:
    """One torch function replaced during capture: where it lives, the kind of branch it
    takes on values, and how to build the replacement from torch's own function and a
    callback to call when the replacement changes a call."""

    module: str  # where torch's callers look it up
    name: str
    kind: str  # "validation" | "hint"
    note: str
    build: Callable[[Callable[..., Any], Callable[[], None]], Callable[..., Any]]

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


def _causal_mask_not_probed(original: Callable[..., Any], applied: Callable[[], None]) -> Callable[..., Any]:
    """transformer._detect_is_causal_mask that never reads the mask's values: a mask given
    without an is_causal hint is taken as not known to be causal, so it is applied as given."""

    def detect_is_causal_mask(mask: Optional[torch.Tensor], is_causal: Optional[bool] = None,
                              size: Optional[int] = None) -> bool:
        if is_causal is None and mask is not None:
            applied()
            return False
        return original(mask, is_causal, size)

    return detect_is_causal_mask


def _var_checked_in_graph(original: Callable[..., Any], applied: Callable[[], None]) -> Callable[..., Any]:
    """functional.gaussian_nll_loss whose check that a variance tensor has no negative entry
    is a graph node; the loss as documented for nn.GaussianNLLLoss."""

    def gaussian_nll_loss(input: torch.Tensor, target: torch.Tensor, var: Any, full: bool = False,
                          eps: float = 1e-6, reduction: str = "mean") -> torch.Tensor:
        if not isinstance(var, torch.Tensor):  # a float variance is checked in Python, without a value read
            return original(input, target, var, full=full, eps=eps, reduction=reduction)
        applied()
        # `not (var < 0)` rather than `var >= 0`: a NaN variance passes, as in eager.
        torch._assert_async(torch.logical_not(var < 0).all(), NEGATIVE_VAR)
        if var.shape != input.shape:
            if var.shape == input.shape[:-1]:  # one variance per row of the last dimension
                var = var.unsqueeze(-1)
            elif not (var.dim() == input.dim()
                      and sum(v for i, v in zip(input.shape, var.shape) if i != v) == 1):
                raise ValueError("var is of incorrect size")
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(reduction + " is not valid")
        # The clamp is not differentiated (as in torch): the gradient reaches var unchanged.
        var = var.clone()
        with torch.no_grad():
            var.clamp_(min=eps)
        loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
        if full:
            loss = loss + 0.5 * math.log(2 * math.pi)
        return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss

    return gaussian_nll_loss


REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        "torch.nn.modules.transformer", "_detect_is_causal_mask", "hint",
        "torch.nn.modules.transformer._detect_is_causal_mask (whether a mask given without is_causal is causal, "
        "read from its values: a hint for a faster route) taken as not known to be causal: the graph applies the "
        "mask as given, which is what eager computes for any mask",
        _causal_mask_not_probed),
    Replacement(
        "torch.nn.functional", "gaussian_nll_loss", "validation",
        "torch.nn.functional.gaussian_nll_loss's check that var has no negative entry (a read of its values) is "
        f"a node of the graph (aten._assert_async): a replay on a negative var raises {NEGATIVE_VAR!r}",
        _var_checked_in_graph),
)


@contextlib.contextmanager
def static_library_branches(notes: list[str],
                            replacements: tuple[Replacement, ...] = REPLACEMENTS) -> Iterator[None]:
    """Within the block, each of `replacements` stands in for torch's function; afterwards
    torch's are back, and each replacement that changed a call has its note in `notes`."""
    used: list[str] = []  # a qualname per changed call (a plain list append: dynamo traces through it)
    installed: list[tuple[Any, str, Any]] = []
    try:
        for r in replacements:
            owner = importlib.import_module(r.module)
            original = getattr(owner, r.name)
            installed.append((owner, r.name, original))
            setattr(owner, r.name, r.build(original, functools.partial(used.append, r.qualname)))
        yield
    finally:
        for owner, name, original in reversed(installed):
            setattr(owner, name, original)
        for r in replacements:
            if r.qualname in used and r.note not in notes:
                notes.append(r.note)
