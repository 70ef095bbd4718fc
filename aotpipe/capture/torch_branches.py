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

The same holds for ATen ops whose C++ kernel is a composition that reads values (``aten.cov``,
which ``torch.corrcoef`` calls too: ``DataDependentOutputException: aten.equal``): while
capturing, :data:`KERNELS` gives them a Python kernel where torch's tracing looks for one
(``CompositeImplicitAutograd`` and ``Autograd``, as capture/rnn.py does for the recurrent ops).

:func:`static_library_branches` installs the replacements of :data:`REPLACEMENTS` and
:data:`KERNELS` while a capture traces and puts torch's back afterwards; eager runs outside capture (the
checks against eager included) see torch's own. A replacement that changed a call adds its
note to the model's notes (manifest and report). torch functions are replaced where torch's
code looks them up (a module attribute read at call time). (op_db's OpInfo holds
gaussian_nll_loss's function object itself; the op corpus's capture still took the
replacement, checked by a run, not by a test here.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

from aotpipe.capture.python_kernels import python_kernels

aten = torch.ops.aten

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


def _cov_without_value_reads(applied: Callable[[], None]) -> Callable[..., torch.Tensor]:
    """aten.cov whose checks on the weights' values are graph nodes and whose "degrees of
    freedom <= 0" branch is a select (eager warns and divides by zero there; the graph divides
    by zero without the warning). The checks on sizes and dtypes are not repeated: eager has run
    the example, and the graph holds its sizes and dtypes."""

    def cov(input: torch.Tensor, correction: int = 1, fweights: Optional[torch.Tensor] = None,
            aweights: Optional[torch.Tensor] = None) -> torch.Tensor:
        applied()
        x = input if input.dim() == 2 else input.reshape(1, -1)  # variables x observations
        n = x.shape[1]
        w = None
        for weights, what in ((fweights, "fweights"), (aweights, "aweights")):
            if weights is not None:
                torch._assert_async(torch.logical_not(weights < 0).all(), f"cov(): {what} cannot be negative")
                w = weights if w is None else w * weights
        if w is None:
            total: Any = n
            dof: Any = max(n - correction, 0)  # a count of observations: known when traced
        else:
            total = w.sum()
            torch._assert_async(total != 0, "cov(): weights sum to zero, can't be normalized")
            if correction == 0:
                dof = total
            elif aweights is None:
                dof = total - correction
            elif fweights is None and n == 1 and correction == 1:
                dof = torch.zeros((), dtype=torch.long)  # torch's special case: one observation, aweights only
            else:
                dof = total - correction * (w * aweights).sum() / total
            dof = torch.where(dof > 0, dof, torch.zeros_like(dof))
        mean = (x if w is None else x * w).sum(1) / total
        if n == 1 and (fweights is None) != (aweights is None):
            # torch's special case: one observation and one kind of weights gives exact zeros
            centred = torch.zeros_like(x, dtype=x.dtype if x.is_floating_point() or x.is_complex() else torch.float32)
        else:
            centred = x - mean.unsqueeze(1)
        c = torch.mm(centred, (centred if w is None else centred * w).t().conj())
        if c.is_complex():  # as torch: the diagonal's imaginary rounding noise is zeroed, all of it
            c = torch.complex(c.real, torch.zeros_like(c.real))
        return torch.true_divide(c, dof).squeeze()

    return cov


# ATen ops whose C++ composition reads values, and their Python kernels for capture.
KERNELS: dict[torch._ops.OpOverload, tuple[str, Callable[[Callable[[], None]], Callable[..., Any]]]] = {
    aten.cov.default: (
        "aten.cov (torch.cov, torch.corrcoef) as a Python kernel while capturing: its checks on the weights' "
        "values are graph nodes (aten._assert_async) and its 'degrees of freedom <= 0' branch a select, "
        "where torch's C++ kernel reads the values (aten.equal)",
        _cov_without_value_reads),
}


@contextlib.contextmanager
def static_library_branches(notes: list[str], replacements: tuple[Replacement, ...] = REPLACEMENTS,
                            kernels: Optional[dict] = None) -> Iterator[None]:
    """Within the block, each of `replacements` stands in for torch's function and each of
    `kernels` (default :data:`KERNELS`) is its op's Python kernel; afterwards torch's are back,
    and each that changed a call has its note in `notes`."""
    kernels = KERNELS if kernels is None else kernels
    used: list[Any] = []  # a qualname or op per changed call (a plain list append: dynamo traces through it)
    installed: list[tuple[Any, str, Any]] = []
    try:
        for r in replacements:
            owner = importlib.import_module(r.module)
            original = getattr(owner, r.name)
            installed.append((owner, r.name, original))
            setattr(owner, r.name, r.build(original, functools.partial(used.append, r.qualname)))
        with python_kernels({op: build(functools.partial(used.append, op)) for op, (_, build) in kernels.items()}):
            yield
    finally:
        for owner, name, original in reversed(installed):
            setattr(owner, name, original)
        changed = [r.note for r in replacements if r.qualname in used]
        changed += [note for op, (note, _) in kernels.items() if op in used]
        notes.extend(n for n in changed if n not in notes)
