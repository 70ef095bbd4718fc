"""A training step run eagerly: what a ``train_step`` graph starts from and is checked against.

The eager step is what a user writes: ``zero_grad``; the loss of the model's outputs
(:func:`aotpipe.models.eager.model_loss`, the loss the training graphs differentiate);
``backward``; ``clip_grad_norm_`` when asked; the torch optimizer's own ``step()``. Each
step runs seeded (:func:`aotpipe.runtime.determinism.run_reproducibly`), as each run of a
graph is, so a model that draws dropout masks draws the same ones in the graph's steps
and in eager's, one step after another.

:func:`warm_start` takes ``warmup_steps`` such steps on a copy of the model: the state a
captured step starts from is a real one (Adam's moments not zero, SGD's momentum buffers
made). :class:`StepReference` runs one or more further steps from there, in float32 and,
for the float64 rule, in float64: the model, its inputs and the optimizer's state in
float64, the same optimizer class and arguments.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from aotpipe.errors import exception_line
from aotpipe.models.eager import Float32Draws, _model_to64, _to64, model_loss, nudge, traced_branches
from aotpipe.runtime.determinism import run_reproducibly
from aotpipe.runtime.global_state import preserved
from aotpipe.spec.optim import OptimizerSpec

# A parameter's optimizer state entry, as a train_step graph's input and output name it.
STATE_SEPARATOR = ":"
# The target of a train_step's learning-rate input (role lr: a scheduler's value for the step).
LR_TARGET = "lr"


def state_target(param: str, key: str) -> str:
    """The target of a state input or output: ``fc.weight:exp_avg``."""
    return f"{param}{STATE_SEPARATOR}{key}"


def split_state_target(target: str) -> tuple[str, str]:
    """``fc.weight:exp_avg`` -> ("fc.weight", "exp_avg")."""
    param, _, key = target.rpartition(STATE_SEPARATOR)
    return param, key


def make_optimizer(params: list[torch.Tensor], spec: OptimizerSpec) -> torch.optim.Optimizer:
    """The torch optimizer `spec` names, over `params`, with its arguments."""
    cls = getattr(torch.optim, spec.info.cls)
    return cls(params, **spec.kwargs())


def lr_schedule(spec: OptimizerSpec, steps: int) -> list[float] | None:
    """The learning rate of each of the first `steps` optimizer steps (the warm-up's first)
    under `spec`'s scheduler, as torch's scheduler class sets it step by step; None without one.

    The scheduler steps an optimizer of its own over one parameter that never has a gradient:
    the rates depend only on the step count, and the steps of the model's optimizer then take
    them (set on its param group before each step, as the scheduler would have)."""
    if spec.scheduler is None:
        return None
    opt = make_optimizer([torch.zeros(1, requires_grad=True)], spec)
    scheduler = getattr(torch.optim.lr_scheduler, spec.scheduler.info.cls)(opt, **spec.scheduler.args)
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no gradient, no update
        for _ in range(steps):
            rates.append(float(opt.param_groups[0]["lr"]))
            opt.step()
            scheduler.step()
    return rates


def set_lr(opt: torch.optim.Optimizer, rates: list[float] | None, step: int) -> None:
    """Before step `step` (counting the warm-up's): the schedule's learning rate, where there is one."""
    if rates is not None:
        for group in opt.param_groups:
            group["lr"] = rates[step]


def autocast_device(values: object) -> str:
    """The device type torch.autocast is entered for: cuda where any of `values` (a pytree of a
    model's tensors and inputs) is on it, else cpu."""
    leaves = [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor)]
    return "cuda" if any(t.device.type == "cuda" for t in leaves) else "cpu"


def autocast_in(dtype: str | None, values: object) -> contextlib.AbstractContextManager:
    """torch.autocast in `dtype` (a dtype's name: ``autocast:``'s) for the device of `values` (a
    model's tensors and inputs); nothing for None. The capture's joint and eager's steps enter it alike."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(autocast_device(values), dtype=getattr(torch, dtype))


def mixed_precision(spec: OptimizerSpec, values: object) -> contextlib.AbstractContextManager:
    """torch.autocast as `spec` asks (its ``autocast:`` dtype); nothing without one."""
    return autocast_in(spec.autocast, values)


# Ops that only move a value into a dtype (autocast's casts): not computing in it.
CASTS = frozenset({"_to_copy", "to", "copy_", "copy", "clone", "_copy_from", "_copy_from_and_resize"})


class LoweredOps(TorchDispatchMode):
    """While active: the ops that compute a real (not fake, not meta) value in `dtype`, by
    name (autocast's casts not counted). A TorchDispatchMode sees ops after autocast has
    cast their inputs, so under autocast it sees what eager computes in low precision."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in CASTS and any(isinstance(t, torch.Tensor) and t.dtype == self.dtype
                                      and t.device.type != "meta" and not isinstance(t, FakeTensor)
                                      for t in pytree.tree_leaves(out)):
            self.seen[name] += 1
        return out


def eager_step(model: torch.nn.Module, opt: torch.optim.Optimizer, args: tuple, kwargs: dict, loss: str,
               spec: OptimizerSpec, grads: dict[str, torch.Tensor | None] | None = None,
               fp64: bool = False) -> torch.Tensor:
    """One training step, as a user writes it; the loss (detached). Attention through its
    math composite, as training capture routes it (so dropout in attention draws alike).
    `grads`, if given, gets each parameter's gradient as backward left it (by every name).
    The forward and loss under torch.autocast where `spec` asks, unless `fp64` (the float64
    reference: the exact step mixed precision approximates); backward and update outside it."""
    opt.zero_grad(set_to_none=True)
    amp = mixed_precision(spec, (list(model.parameters()), args, kwargs)) if not fp64 else contextlib.nullcontext()
    with traced_branches([]), sdpa_kernel([SDPBackend.MATH]), amp:
        value = model_loss(model(*args, **kwargs), loss)
    value.backward()
    if grads is not None:
        grads.update({n: (p.grad.detach().clone() if p.grad is not None else None)
                      for n, p in model.named_parameters(remove_duplicate=False)})
    if spec.clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], spec.clip_grad_norm)
    opt.step()
    return value.detach()


@dataclass
class StepStart:
    """Where a captured step starts: the model after the warm-up steps and its optimizer's state.

    `state` maps each parameter name (every name of a tied one) to its state entries that
    are tensors, by key; `params` and `buffers` hold every name too."""

    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    state: dict[str, dict[str, torch.Tensor]]
    losses: list[float] = field(default_factory=list)  # the warm-up steps' losses


def optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer's per-parameter tensor state by parameter name (every name of a tied one)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        entries = opt.state.get(p, {})
        tensors = {k: v.detach().clone() for k, v in sorted(entries.items()) if isinstance(v, torch.Tensor)}
        if tensors:
            out[name] = tensors
    return out


def load_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, dict[str, torch.Tensor]],
               dtype: torch.dtype | None = None) -> None:
    """Put `state` (optimizer_state's form) into `opt` for `model`'s parameters, as copies
    (floating ones in `dtype` if given)."""
    for name, p in model.named_parameters():
        if name in state:
            opt.state[p] = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).clone()
                            for k, v in state[name].items()}


def warm_start(model: torch.nn.Module, args: tuple, kwargs: dict, loss: str, spec: OptimizerSpec) -> StepStart:
    """A copy of `model` after `spec.warmup_steps` eager steps on the example inputs, and its
    optimizer's state then. The model itself is left as it was."""
    with preserved():
        m = copy.deepcopy(model)
        m.train()
        inputs = copy.deepcopy((args, kwargs))
        opt = make_optimizer(list(m.parameters()), spec)
        rates = lr_schedule(spec, spec.warmup_steps)
        losses = []
        for i in range(spec.warmup_steps):
            set_lr(opt, rates, i)
            losses.append(float(run_reproducibly(lambda: eager_step(m, opt, *inputs, loss, spec))))
    params = {n: p.detach().clone() for n, p in m.named_parameters(remove_duplicate=False)}
    buffers = {n: b.detach().clone() for n, b in m.named_buffers(remove_duplicate=False)}
    m.zero_grad(set_to_none=True)
    return StepStart(m, params, buffers, optimizer_state(m, opt), losses)


@dataclass
class StepRun:
    """What eager steps gave: each step's loss, then the parameters, buffers and optimizer
    state after the last, and the gradients of the first step (before clipping)."""

    losses: list[torch.Tensor]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    state: dict[str, dict[str, torch.Tensor]]
    grads: dict[str, torch.Tensor | None]


class StepReference:
    """Eager steps from a :class:`StepStart`, made once each and only when asked for."""

    def __init__(self, start: StepStart, args: tuple, kwargs: dict, loss: str, spec: OptimizerSpec):
        self.start, self.args, self.kwargs, self.loss, self.spec = start, args, kwargs, loss, spec
        self._runs: dict[tuple[int, bool, int], StepRun | None] = {}
        self.errors: dict[tuple[int, bool], str] = {}

    def lowered(self) -> collections.Counter[str]:
        """The ops eager's forward and loss compute in the autocast dtype from the start (LoweredOps)."""
        assert self.spec.autocast is not None
        with preserved():
            model = copy.deepcopy(self.start.model)
            model.train()
            args, kwargs = copy.deepcopy((self.args, self.kwargs))
            with LoweredOps(getattr(torch, self.spec.autocast)) as ops, torch.no_grad(), \
                    mixed_precision(self.spec, (list(model.parameters()), args, kwargs)), traced_branches([]), \
                    sdpa_kernel([SDPBackend.MATH]):
                run_reproducibly(lambda: model_loss(model(*args, **kwargs), self.loss))
        return ops.seen

    def run(self, steps: int, fp64: bool = False, nudged: int = 0) -> StepRun | None:
        """`steps` eager steps from the start, in float64 if `fp64`; None if they failed (errors
        says why). `nudged` k > 0: in float32 from a start whose parameters, buffers, inputs and
        state are each moved one ulp (eager.nudge, by a generator seeded with k): another
        sample of eager's own rounding noise (accuracy.compare's samples)."""
        key = (steps, fp64, nudged)
        if key not in self._runs:
            try:
                with preserved():
                    self._runs[key] = self._run(steps, fp64, nudged)
            except Exception as e:  # a model that cannot run in float64, say: the check says so
                self._runs[key] = None
                self.errors[(steps, fp64)] = exception_line(e)
        return self._runs[key]

    def _run(self, steps: int, fp64: bool, nudged: int = 0) -> StepRun:
        model = copy.deepcopy(self.start.model)
        model.train()
        args, kwargs = copy.deepcopy((self.args, self.kwargs))
        if fp64:
            model = _model_to64(model)
            args, kwargs = pytree.tree_map(_to64, (args, kwargs))
        opt = make_optimizer(list(model.parameters()), self.spec)
        load_state(model, opt, self.start.state, torch.float64 if fp64 else None)
        if nudged and not fp64:
            gen = torch.Generator().manual_seed(nudged)
            with torch.no_grad():
                state = [t for entries in opt.state.values() for t in entries.values() if isinstance(t, torch.Tensor)]
                for t in [*model.parameters(), *model.buffers(), *pytree.tree_leaves((args, kwargs)), *state]:
                    if isinstance(t, torch.Tensor):
                        t.data.copy_(nudge(t.data, gen))
        losses: list[torch.Tensor] = []
        grads: dict[str, torch.Tensor | None] = {}
        rates = lr_schedule(self.spec, self.spec.warmup_steps + steps)
        for i in range(steps):
            set_lr(opt, rates, self.spec.warmup_steps + i)
            # the first step's gradients as backward left them, before clipping and the update
            into = grads if i == 0 else None
            with Float32Draws() if fp64 else contextlib.nullcontext():  # dropout draws as float32's
                losses.append(run_reproducibly(functools.partial(eager_step, model, opt, args, kwargs, self.loss,
                                                                 self.spec, grads=into, fp64=fp64)))
        return StepRun(losses, {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)},
                       {n: b.detach() for n, b in model.named_buffers(remove_duplicate=False)},
                       optimizer_state(model, opt), grads)
