"""The optimizers a ``train_step`` graph may hold, and the YAML's ``optimizer:`` block.

One table (:data:`OPTIMIZERS`): the YAML name, the torch.optim class, and the arguments of
its constructor aotpipe passes through. Written out, not read from torch (a pipeline is
validated in a process that never imports torch); tests/test_train_step_spec.py holds it
to ``inspect.signature`` of the installed classes, so it cannot drift from them.

A learning-rate scheduler (``scheduler:`` inside the block, :data:`SCHEDULERS`, held to
torch's classes the same way) makes the learning rate an input of the graph (role ``lr``):
the schedule is computed in Python between steps, as torch's schedulers do it, and each step
is fed its value.

``capturable``, ``differentiable`` and ``fused`` are refused on purpose
(:data:`REFUSED_ARGS` says why to the user): the step is traced the way torch.compile traces
an optimizer (its step count a tensor, as ``capturable`` would make it); ``differentiable``
asks autograd to record the update itself, which a captured step has no use for; and the
loader refuses the fused kernels, which trust their arguments' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aotpipe.format.records import RawYaml

_NUMBER = "a number"
_FLAG = "true or false"
_PAIR = "a pair of numbers"
_COUNT = "a whole number"
_COUNTS = "a list of whole numbers"


@dataclass(frozen=True)
class OptimizerInfo:
    """One optimizer aotpipe captures: its torch.optim class and the arguments it takes."""

    cls: str  # the class's name in torch.optim
    args: dict[str, str]  # argument -> the kind of value it takes (_NUMBER, _FLAG, _PAIR)


_COMMON = {"lr": _NUMBER, "weight_decay": _NUMBER, "maximize": _FLAG, "foreach": _FLAG}
_ADAM = {**_COMMON, "betas": _PAIR, "eps": _NUMBER, "amsgrad": _FLAG}

OPTIMIZERS: dict[str, OptimizerInfo] = {
    "sgd": OptimizerInfo("SGD", {**_COMMON, "momentum": _NUMBER, "dampening": _NUMBER, "nesterov": _FLAG}),
    "adam": OptimizerInfo("Adam", {**_ADAM, "decoupled_weight_decay": _FLAG}),
    "adamw": OptimizerInfo("AdamW", dict(_ADAM)),
    "adagrad": OptimizerInfo("Adagrad", {**_COMMON, "lr_decay": _NUMBER, "initial_accumulator_value": _NUMBER,
                                         "eps": _NUMBER}),
    "rmsprop": OptimizerInfo("RMSprop", {**_COMMON, "alpha": _NUMBER, "eps": _NUMBER, "momentum": _NUMBER,
                                         "centered": _FLAG}),
}
# Constructor arguments aotpipe refuses, and why (the table's test checks these too).
REFUSED_ARGS: dict[str, str] = {
    "capturable": "the step is traced as torch.compile traces it, its step count a tensor already",
    "differentiable": "it records the update itself for autograd, which a captured step has no use for",
    "fused": "torch 2.13 cannot trace the fused kernels into a functional graph (Adam's and AdamW's fail "
             "functionalization, SGD's and Adagrad's have no meta kernel), and aotpipe's loader refuses them (they "
             "trust their arguments' sizes: artifact/ops.py); use foreach: true",
}
# The optimizer state a random input must draw in a range (replay.inputs): counts from 1, and
# the running averages of squares, which are never negative (a square root is taken of them).
STATE_RANGES: dict[str, tuple[int, int]] = {
    "step": (1, 100),
    "exp_avg_sq": (0, 1), "max_exp_avg_sq": (0, 1), "square_avg": (0, 1), "sum": (0, 1),
}
# aotpipe's own keys of the block (the rest are the optimizer's arguments).
STEP_KEYS = ("name", "clip_grad_norm", "warmup_steps", "scheduler", "autocast")
# The dtypes a step's forward may run in under torch.autocast (``autocast:``), and why the others are not.
AUTOCAST_DTYPES = ("bfloat16",)
AUTOCAST_REFUSED = {
    "float16": "float16 training needs a gradient scaler (torch.amp.GradScaler), whose skipped steps on inf "
               "gradients are control flow on values a graph cannot hold; use bfloat16",
}
MAX_WARMUP_STEPS = 100

# The learning-rate schedulers a train_step takes: YAML name -> torch.optim.lr_scheduler class
# and its arguments (besides the optimizer). Those that take a function (LambdaLR), a metric
# (ReduceLROnPlateau), other schedulers (SequentialLR) or cycle the momentum too (OneCycleLR,
# CyclicLR: the step would change more than the learning rate) are not among them.
SCHEDULERS: dict[str, OptimizerInfo] = {
    "step": OptimizerInfo("StepLR", {"step_size": _COUNT, "gamma": _NUMBER}),
    "multistep": OptimizerInfo("MultiStepLR", {"milestones": _COUNTS, "gamma": _NUMBER}),
    "exponential": OptimizerInfo("ExponentialLR", {"gamma": _NUMBER}),
    "cosine": OptimizerInfo("CosineAnnealingLR", {"T_max": _COUNT, "eta_min": _NUMBER}),
    "cosine_restarts": OptimizerInfo("CosineAnnealingWarmRestarts", {"T_0": _COUNT, "T_mult": _COUNT,
                                                                     "eta_min": _NUMBER}),
    "linear": OptimizerInfo("LinearLR", {"start_factor": _NUMBER, "end_factor": _NUMBER, "total_iters": _COUNT}),
    "constant": OptimizerInfo("ConstantLR", {"factor": _NUMBER, "total_iters": _COUNT}),
    "polynomial": OptimizerInfo("PolynomialLR", {"total_iters": _COUNT, "power": _NUMBER}),
}
# The range a random learning-rate input draws from (replay.inputs), as STATE_RANGES.
LR_RANGE = (0, 1)


def _kind_problem(value: Any, kind: str) -> bool:
    if kind == _FLAG:
        return not isinstance(value, bool)
    if kind == _NUMBER:
        return isinstance(value, bool) or not isinstance(value, (int, float))
    if kind == _COUNT:
        return isinstance(value, bool) or not isinstance(value, int)
    if kind == _COUNTS:
        return not (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    return not (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


class SchedulerSpec(BaseModel):
    """The block's ``scheduler:``: a torch.optim.lr_scheduler class by its YAML name, and its
    arguments written beside the name (``{name: cosine, T_max: 100}``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Literal["step", "multistep", "exponential", "cosine", "cosine_restarts", "linear", "constant",
                  "polynomial"] = Field(description="the torch.optim.lr_scheduler class: " + ", ".join(SCHEDULERS))
    args: dict[str, Any] = Field({}, description="the class's arguments, written beside name in the YAML")

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: RawYaml) -> RawYaml:
        if not isinstance(data, dict) or "args" in data:
            return data
        name = data.get("name")
        if name not in SCHEDULERS:
            said = "names no scheduler" if name is None else f"unknown scheduler {name!r}"
            raise ValueError(f"{said}; choose one of {', '.join(SCHEDULERS)}")
        info = SCHEDULERS[name]
        args = {k: v for k, v in data.items() if k != "name"}
        for k, v in args.items():
            if k not in info.args:
                raise ValueError(f"scheduler {name} ({info.cls}) has no argument {k!r}; its arguments: "
                                 f"{', '.join(sorted(info.args))}")
            if _kind_problem(v, info.args[k]):
                raise ValueError(f"scheduler {name}'s {k} takes {info.args[k]}, not {v!r}")
        return {"name": name, "args": args}

    @property
    def info(self) -> OptimizerInfo:
        return SCHEDULERS[self.name]

    def describe(self) -> str:
        return f"{self.info.cls}({', '.join(f'{k}={v}' for k, v in sorted(self.args.items()))})"


class OptimizerSpec(BaseModel):
    """The YAML's ``optimizer:``: which torch optimizer a train_step graph runs, its arguments
    (``lr``, ``betas``, ``weight_decay``, ``foreach``, ...: the torch class's own),
    and how the step around it is made. (spec.Strict's settings: spec imports this module.)"""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Literal["sgd", "adam", "adamw", "adagrad", "rmsprop"] = Field(
        description="the torch.optim class: sgd, adam, adamw, adagrad or rmsprop")
    args: dict[str, Any] = Field({}, description="the class's arguments, written beside name in the YAML "
                                 "(lr: 1e-3, weight_decay: 0.01, foreach: true, ...)")
    clip_grad_norm: float | None = Field(
        None, gt=0, description="clip the gradients' total 2-norm to this (torch.nn.utils.clip_grad_norm_) before "
        "the update")
    warmup_steps: int = Field(
        1, ge=1, le=MAX_WARMUP_STEPS, description="eager steps taken before capture, so that the state the graph "
        "starts from is a real one (moments not zero, momentum buffers made)")
    scheduler: SchedulerSpec | None = Field(
        None, description="a learning-rate scheduler ({name: cosine, T_max: 100}): the graph takes the learning "
        "rate as an input, and each step is fed the schedule's value for it")
    autocast: Literal["bfloat16"] | None = Field(
        None, description="mixed precision: the forward and the loss run under torch.autocast in this dtype "
        "(bfloat16), as a mixed-precision training loop runs them; the parameters, gradients and the update stay "
        "float32")

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: RawYaml) -> RawYaml:
        """The YAML writes the optimizer's arguments beside its name: gather them into args,
        each checked against the class's arguments."""
        if not isinstance(data, dict) or "args" in data:
            return data
        name = data.get("name")
        if name is None:
            raise ValueError(f"names no optimizer; add name: one of {', '.join(OPTIMIZERS)}")
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
        info = OPTIMIZERS[name]
        args = {k: v for k, v in data.items() if k not in STEP_KEYS}
        for k, v in args.items():
            if k in REFUSED_ARGS:
                raise ValueError(f"{name} takes no {k} here: {REFUSED_ARGS[k]}; remove it")
            if k not in info.args:
                raise ValueError(f"{name} ({info.cls}) has no argument {k!r}; its arguments: "
                                 f"{', '.join(sorted(info.args))} (and aotpipe's {', '.join(STEP_KEYS[1:])})")
            if _kind_problem(v, info.args[k]):
                raise ValueError(f"{name}'s {k} takes {info.args[k]}, not {v!r}")
        if data.get("scheduler") is not None and name in ("adam", "adamw") and args.get("foreach") is True:
            raise ValueError(f"{name} with foreach: true takes no scheduler here: torch's foreach Adam takes no "
                             "tensor learning rate unless capturable, which a scheduled step needs; set foreach: "
                             "false (the graph's ops are the same: foreach calls are traced per tensor)")
        amp = data.get("autocast")
        if amp is not None and amp not in AUTOCAST_DTYPES:
            why = AUTOCAST_REFUSED.get(amp) if isinstance(amp, str) else None
            raise ValueError(f"autocast {amp!r} is not taken" + (f": {why}" if why else "")
                             + f"; choose one of {', '.join(AUTOCAST_DTYPES)}, or leave autocast out")
        return {**{k: v for k, v in data.items() if k in STEP_KEYS}, "args": args}

    def kwargs(self) -> dict[str, Any]:
        """The class's keyword arguments (betas as a tuple, as torch takes it)."""
        return {k: tuple(v) if isinstance(v, list) else v for k, v in self.args.items()}

    @property
    def info(self) -> OptimizerInfo:
        return OPTIMIZERS[self.name]

    def describe(self) -> str:
        """One line: ``AdamW(lr=0.001, weight_decay=0.01)``, clipping and warm-up."""
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        more = [f"clip_grad_norm {self.clip_grad_norm:g}"] if self.clip_grad_norm else []
        if self.scheduler is not None:
            more.append(f"learning rate by {self.scheduler.describe()}")
        if self.autocast is not None:
            more.append(f"under autocast {self.autocast}")
        more.append(f"after {self.warmup_steps} eager step(s)")
        return f"{self.info.cls}({args}), {', '.join(more)}"
