"""The CTC loss (nn.CTCLoss, F.ctc_loss, torch.ctc_loss) as static-shape ATen ops, for capture.

torch computes the loss with ``aten._ctc_loss``, whose second output (the log-alpha table) is
as wide as the longest target: a size read from the target lengths' values. Its fake kernel
raises ``DynamicOutputShapeException``, so torch.export fails and dynamo breaks the graph,
running the loss outside every graph (a partial capture).

:func:`ctc_loss_formulated` installs, for the duration of a capture, the formulation below as
the Python kernel of ``aten.ctc_loss.IntList`` and ``aten.ctc_loss.Tensor`` (the
``CompositeImplicitAutograd`` ops F.ctc_loss calls, where torch's tracing looks for them; the
same mechanism as capture/rnn.py), and puts torch's back afterwards. It is the forward
(alpha) recursion of Graves et al. (2006) in log space, unrolled over the time steps, over
the targets padded to a width known from shapes alone:

- targets ``[N, S]``: width S; concatenated targets ``[sum(target_lengths)]``: the largest
  target length when the lengths are ints, else the concatenation's own length (a bound on
  it); positions past a target's length read as blank, so padding values never matter;
- lengths as int lists or as tensors (then they stay graph inputs: the graph is right for
  any lengths within the shapes, not only the example's);
- the extended label sequence (blank, l1, blank, l2, ..., blank); a step from s-2 to s only
  onto a label that differs from the one two before (repeated labels need a blank between);
- each sequence's alpha stops at its own input length; the loss is minus the log-sum of the
  last two states of its extended target (one state for an empty target);
- reduction none / mean (each loss over its target length, clamped to 1, then the batch
  mean) / sum, and zero_infinity (an impossible alignment's infinite loss and its gradient
  become 0), as torch documents them.

Its gradients come from autograd through these ops, so the backward and joint graphs are
plain ATen too. Unreachable states hold -inf; the log-sum-exp here gives them a zero
gradient (never the NaN of 0 * inf). Where torch's own backward differs, see
docs/capture-modes.md ("The CTC loss").
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence, Union

import torch
from torch import Tensor

from aotpipe.capture.python_kernels import python_kernels

aten = torch.ops.aten

Lengths = Union[Tensor, Sequence[int]]

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction, as F.ctc_loss passes it


def _logsumexp(x: Tensor) -> Tensor:
    """log(sum(exp(x))) over dim 0; -inf where every x is -inf, with a zero gradient there
    (torch.logsumexp's gradient is NaN where its result is -inf)."""
    # The shift cancels in value, so no gradient goes through it; -inf (nothing reachable)
    # becomes the lowest finite value, under which every exp is 0.
    shift = x.amax(0).detach().clamp(min=torch.finfo(x.dtype).min)
    total = torch.exp(x - shift).sum(0)  # 0, or at least 1 (the maximum's own term)
    reachable = total > 0
    return torch.where(reachable, torch.log(torch.where(reachable, total, 1.0)) + shift, float("-inf"))


def _as_long(lengths: Lengths, like: Tensor) -> Tensor:
    """Lengths as a 1-D int64 tensor: a tensor's own values (a graph input stays one), or an
    int list's values as constants of the graph."""
    if isinstance(lengths, Tensor):
        return lengths.to(torch.long).reshape(-1)
    return torch.stack([torch.full((), int(v), dtype=torch.long, device=like.device) for v in lengths])


def _padded_targets(targets: Tensor, target_lengths: Lengths, tl: Tensor, blank: int) -> Tensor:
    """[N, W] targets, blank past each one's length; W is known from shapes (and int lengths)."""
    n = tl.shape[0]
    if targets.dim() == 2:
        padded = targets.to(torch.long)
    else:  # the concatenation of every target
        flat = targets.to(torch.long).reshape(-1)
        total = flat.shape[0]
        if isinstance(target_lengths, Tensor):
            width = total  # no target is longer than all of them together
        else:
            width = max([int(v) for v in target_lengths] + [0])
        if total == 0 or width == 0:
            return torch.full((n, 0), blank, dtype=torch.long, device=targets.device)
        starts = torch.cumsum(tl, 0) - tl
        index = (starts.unsqueeze(1) + torch.arange(width, device=targets.device)).clamp(0, total - 1)
        padded = flat[index]
    width = padded.shape[1]
    inside = torch.arange(width, device=targets.device).unsqueeze(0) < tl.unsqueeze(1)
    return torch.where(inside, padded, blank)


def ctc_nll(log_probs: Tensor, targets: Tensor, input_lengths: Lengths, target_lengths: Lengths,
            blank: int) -> Tensor:
    """Each sequence's negative log-likelihood, [N] (inf where no alignment exists), for
    batched log_probs [T, N, C]."""
    steps, n, _ = log_probs.shape
    il = _as_long(input_lengths, log_probs)
    tl = _as_long(target_lengths, log_probs)
    padded = _padded_targets(targets, target_lengths, tl, blank)
    width = padded.shape[1]
    states = 2 * width + 1
    # Extended labels: blank at even positions, the target at odd ones.
    ext = torch.full((n, states), blank, dtype=torch.long, device=log_probs.device)
    if width:
        ext = torch.stack([ext[:, :width], padded], dim=2).reshape(n, 2 * width)
        ext = torch.cat([ext, torch.full((n, 1), blank, dtype=torch.long, device=log_probs.device)], dim=1)
    # A skip s-2 -> s lands on a label (odd s >= 3) unlike the one two positions before.
    can_skip = torch.zeros((n, states), dtype=torch.bool, device=log_probs.device)
    if width > 1:
        differs = ext[:, 2:] != ext[:, :-2]
        odd = (torch.arange(2, states, device=log_probs.device) % 2) == 1
        can_skip = torch.cat([can_skip[:, :2], differs & odd], dim=1)
    emit = log_probs.gather(2, ext.unsqueeze(0).expand(steps, n, states))  # [T, N, states]
    neg_inf = float("-inf")
    position = torch.arange(states, device=log_probs.device).unsqueeze(0)
    # Before the first frame only the empty prefix (state 0) is reached: a sequence with no
    # frames aligns an empty target with probability 1, any other with 0.
    alpha = torch.where(position == 0, 0.0, neg_inf).to(log_probs.dtype).expand(n, states)
    alpha = torch.where((il > 0).unsqueeze(1), torch.where(position < 2, emit[0], neg_inf), alpha)
    skip_bias = torch.where(can_skip, 0.0, neg_inf).to(log_probs.dtype)
    running = (torch.arange(steps, device=log_probs.device).unsqueeze(1) < il.unsqueeze(0)).unsqueeze(2)
    for t in range(1, steps):
        sources = [alpha]  # stay at s, come from s-1, skip from s-2 (pads shift right by 1 and 2)
        if states > 1:
            sources.append(torch.nn.functional.pad(alpha, (1, -1), value=neg_inf))
        if states > 2:
            sources.append(torch.nn.functional.pad(alpha, (2, -2), value=neg_inf) + skip_bias)
        stepped = _logsumexp(torch.stack(sources)) + emit[t]
        alpha = torch.where(running[t], stepped, alpha)
    last = (2 * tl).unsqueeze(1)
    end_blank = alpha.gather(1, last).squeeze(1)
    end_label = alpha.gather(1, (last - 1).clamp(min=0)).squeeze(1)
    end_label = torch.where(tl > 0, end_label, neg_inf)
    nll = -_logsumexp(torch.stack([end_blank, end_label]))
    # torch's backward of the CTC loss gives, on each frame within the input length, the
    # gradient with respect to the logits beneath a log_softmax: the gradient with respect to
    # log_probs plus exp(log_probs) (the two agree once a log_softmax's backward is applied).
    # A term of value exactly 0 whose gradient is exp(log_probs) there makes autograd give
    # the gradient eager gives.
    probs = torch.exp(log_probs)
    as_torch = torch.where(running, probs - probs.detach(), 0.0).sum(dim=(0, 2))
    return nll + as_torch


def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths: Lengths, target_lengths: Lengths,
             blank: int = 0, reduction: int = 1, zero_infinity: bool = False) -> Tensor:
    """aten.ctc_loss (both overloads): the loss F.ctc_loss gives, reduced as `reduction` says."""
    batched = log_probs.dim() == 3
    lp = log_probs if batched else log_probs.unsqueeze(1)
    nll = ctc_nll(lp, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = torch.where(nll == float("inf"), torch.zeros_like(nll), nll)
    kind = _REDUCTIONS.get(int(reduction))
    if kind == "mean":
        per_target = _as_long(target_lengths, lp).clamp(min=1).to(nll.dtype)
        return (nll / per_target).mean()
    if kind == "sum":
        return nll.sum()
    if kind is None:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return nll if batched else nll.squeeze(0)


FORMULATED = (aten.ctc_loss.IntList, aten.ctc_loss.Tensor)

NOTE = ("CTC loss captured as a static-shape ATen formulation (capture/ctc.py: the log-space alpha recursion, "
        "targets padded to their static width): torch's aten._ctc_loss has a value-dependent output size")


@contextlib.contextmanager
def ctc_loss_formulated(notes: list[str]) -> Iterator[None]:
    """For the duration, tracing computes aten.ctc_loss with :func:`ctc_loss`; torch's kernels
    are back afterwards, also on error. When a trace used it, `notes` gets :data:`NOTE`."""
    used = []

    def kernel(*args, **kwargs):
        used.append(True)
        return ctc_loss(*args, **kwargs)

    try:
        with python_kernels({op: kernel for op in FORMULATED}):
            yield
    finally:
        if used and NOTE not in notes:
            notes.append(NOTE)
