"""The pipeline spec types: what a validated pipeline is, as the rest of aotpipe sees it.

A leaf: pydantic only. :mod:`aotpipe.pipeline.config` parses the YAML into these; capture, the job,
the runner and the fingerprint read them.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from aotpipe.format.vocabulary import KindField
from aotpipe.spec.distributed import DistributedSpec
from aotpipe.spec.optim import OptimizerSpec

Mode = Literal["export", "dynamo", "meta", "auto"]
Loss = Literal["weighted", "sum", "mean"]  # modes.LOSSES

# Names accepted for `dtype:`; values are torch dtype attribute names.
DTYPES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "int": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


_INPUT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*((\.[A-Za-z_][A-Za-z0-9_]*)|(\[[0-9]+\]))*")
_PATH_PART = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]")


def path_problem(name: str) -> str | None:
    """Why `name` is not an input path (``x``, ``batch.ids``, ``past[0][1]``); None when it is."""
    if _INPUT_PATH.fullmatch(name):
        return None
    return (f"name {name!r} is not an argument name or a path into one; write e.g. x, batch.input_ids or "
            "past[0][1]")


def parse_path(name: str) -> list[str | int]:
    """The parts of an input path: keys as str, tuple positions as int."""
    return [key if key else int(index) for key, index in _PATH_PART.findall(name)]


# `source: aotpipe.zoo:<name>`: a model of the builtin zoo (aotpipe/models/zoo.py), looked up by
# name in its table. The scheme is what users write; it does not name the zoo module's path.
ZOO_PREFIX = "aotpipe.zoo:"


@contextlib.contextmanager
def source_import_path(base_dir: Path | None) -> Iterator[None]:
    """Where a `module:callable` source's module is found, the same for building the model,
    fingerprinting its file and checking the pipeline: the pipeline's folder, then the working
    folder, then sys.path as it was (restored after)."""
    extra = [str(p) for p in (base_dir, Path.cwd()) if p is not None and str(p) not in sys.path]
    sys.path[:0] = extra
    try:
        yield
    finally:
        for p in extra:
            with contextlib.suppress(ValueError):
                sys.path.remove(p)

DATA_SUFFIXES = (".pt", ".safetensors", ".npy")  # the files an input's data: may name


def is_callable_data(data: str) -> bool:
    """Whether an input's `data:` names a ``module:function`` (code) rather than a file."""
    return ":" in data and not data.lower().endswith(DATA_SUFFIXES) and not re.match(r"^[A-Za-z]:[\\/]", data)


_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


def device_problem(device: str) -> str | None:
    """Why `device:` is not one aotpipe captures on (cpu, cuda, cuda:N); None when it is."""
    if _DEVICE.fullmatch(device):
        return None
    return f"device {device!r} is not one capture runs on; use cpu, cuda or cuda:N"


class Strict(BaseModel):
    """Strict, frozen, no unknown fields: every spec type and the YAML's own shape."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _InputFields(Strict):
    """What an example input is, but its shape: the YAML's input entry and the resolved spec share it."""

    name: str | None = Field(None, description="keyword argument name; positional when absent")
    shape: list[int | str] = Field(description="tensor shape, e.g. [8, 3, 32, 32]; a size may name a "
                                         "dimension of dims: ([batch, seq])")
    dtype: str = Field("float32", description="one of: " + ", ".join(DTYPES))
    low: int | float | None = Field(
        None, description="lowest value (inclusive); integers default to 0, floats are N(0, 1) when unset"
    )
    high: int | float | None = Field(
        None, description="highest value (exclusive); integers default to 2"
    )
    requires_grad: bool = Field(
        False, description="a floating-point input that needs its gradient: the backward and joint graphs then "
        "give it, and the checks compare it against eager's")
    data: str | None = Field(
        None, description="load the tensor instead of drawing it: a .pt, .safetensors or .npy file (relative to the "
        "pipeline file; a .pt is read with weights_only) or a module:function returning it; its shape and dtype "
        "must be the ones declared here")
    key: str | None = Field(None, description="with data: the name of the tensor in a file or returned mapping "
                               "that holds several")

    @field_validator("name")
    @classmethod
    def _input_path(cls, v: str | None) -> str | None:
        problem = path_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}; use one of: {', '.join(DTYPES)}")
        return DTYPES[v]

    @model_validator(mode="after")
    def _low_below_high(self) -> _InputFields:
        if self.dtype == "bool" or (self.low is None and self.high is None):
            return self
        integer = self.is_integer
        low = self.low if self.low is not None else 0
        high = self.high if self.high is not None else (2 if integer else 1.0)
        said = lambda name, v, given: f"{name} {v!r}" if given else f"{name} {v!r} (the default)"  # noqa: E731
        lo, hi = said("low", low, self.low is not None), said("high", high, self.high is not None)
        if integer and not low < high:
            raise ValueError(f"{lo} is not below {hi}: an integer input draws from [low, high), high exclusive; "
                             "set low below high")
        if not integer and low > high:
            raise ValueError(f"{lo} is above {hi}: a {self.dtype} input draws from [low, high); set low at most high")
        return self

    @property
    def is_integer(self) -> bool:
        return self.dtype in ("int64", "int32", "int16", "int8", "uint8")


class InputSpec(_InputFields):
    """One example input of a model: a tensor made from a seeded generator, at its example
    sizes; `dims` names the dimensions that are dynamic (a named dimension of the model's)."""

    shape: list[int] = Field(  # type: ignore[assignment]  # the resolved form: numbers only, in its place
        description="tensor shape at the example sizes, e.g. [8, 3, 32, 32]")
    dims: list[str | None] = Field([], description="per dimension: the named dimension it is (dynamic), or "
                                      "null (static); empty: every dimension static")

    @field_validator("shape")
    @classmethod
    def _non_negative(cls, v: list[int]) -> list[int]:
        if any(d < 0 for d in v):
            raise ValueError(f"shape {v} has a negative size; sizes must be >= 0")
        return v

    def at(self, sizes: dict[str, int]) -> InputSpec:
        """This input with its named dimensions at `sizes` (those not given keep the example's)."""
        named = self.dims or [None] * len(self.shape)
        shape = [sizes.get(d, s) if d is not None else s for s, d in zip(self.shape, named, strict=True)]
        return InputSpec(**{**{f: getattr(self, f) for f in type(self).model_fields}, "shape": shape})


class InputEntry(_InputFields):
    """One input as the YAML writes it: its shape's sizes are numbers or the names of the
    model's dimensions (`dims:`)."""

    @field_validator("shape")
    @classmethod
    def _sizes_or_names(cls, v: list[int | str]) -> list[int | str]:
        if any(isinstance(d, int) and d < 0 for d in v):
            raise ValueError(f"shape {v} has a negative size; sizes must be >= 0")
        bad = [d for d in v if isinstance(d, str) and not d.isidentifier()]
        if bad:
            raise ValueError(f"shape {v}: {bad[0]!r} is neither a size nor a dimension name; write a number or a "
                             "name declared in dims: (letters, digits, _)")
        return v


# torch specialises sizes 0 and 1 while it traces: an example below this would be captured static.
MIN_DIM_EXAMPLE = 2


class DimSpec(Strict):
    """A named dimension: the range of sizes the graphs must run at, and the example size
    the inputs are drawn at (captured, saved, checked)."""

    min: int = Field(ge=1, description="smallest size (checked at capture)")
    max: int = Field(ge=1, description="largest size (checked at capture, within the memory limit)")
    example: int | None = Field(
        None, description=f"the size the example inputs have; at least {MIN_DIM_EXAMPLE} (torch specialises sizes "
        f"0 and 1 while tracing); default: the smallest size in range that is at least {MIN_DIM_EXAMPLE}")

    @model_validator(mode="after")
    def _in_range(self) -> DimSpec:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; set min at most max")
        if self.example is not None and not self.min <= self.example <= self.max:
            raise ValueError(f"example {self.example} is outside [{self.min}, {self.max}]; pick an example in range")
        if self.example is not None and self.example < MIN_DIM_EXAMPLE:
            raise ValueError(f"example {self.example} is below {MIN_DIM_EXAMPLE}: torch specialises sizes 0 and 1 "
                             f"while tracing; use an example of {MIN_DIM_EXAMPLE} or more (min may stay lower)")
        if self.example is None and self.max < MIN_DIM_EXAMPLE:
            raise ValueError(f"max {self.max} leaves no example size of {MIN_DIM_EXAMPLE} or more (torch specialises "
                             "sizes 0 and 1 while tracing); raise max, or make the dimension static")
        return self

    @property
    def size(self) -> int:
        """The example size."""
        return self.example if self.example is not None else max(self.min, MIN_DIM_EXAMPLE)


def _dims_branch(v: Any) -> str:
    return "auto" if isinstance(v, str) else "named"


# The YAML's `dims:`: named dimensions, or auto. Discriminated, so a mistake in a dimension is
# reported once, as that dimension's, not also as "should be 'auto'".
DimsField = Annotated[
    Annotated[Literal["auto"], Tag("auto")] | Annotated[dict[str, DimSpec], Tag("named")],
    Discriminator(_dims_branch)]


class ResourceSpec(Strict):
    """What one model asks of the worker it runs in (process and ray executors)."""

    num_cpus: float | None = Field(None, gt=0, description="CPUs to reserve (ray); default 1")
    num_gpus: float | None = Field(None, ge=0, description="GPUs to reserve (ray); default 0")
    memory_gb: float | None = Field(
        None, gt=0, description="memory: the worker's limit (process: killed above it) and reservation (ray)")
    timeout_s: float | None = Field(None, gt=0, description="time limit for this model (process, ray)")


class ExecutorSpec(Strict):
    """How models are scheduled, and the limits each model runs under."""

    kind: Literal["local", "process", "ray"] = Field(
        "process", description="process: each model in a worker process, isolated (default); local: in this "
        "process, one after another; ray: Ray tasks on a cluster (the ray extra)")
    workers: int = Field(1, ge=1, description="models run at once (process)")
    timeout_s: float | None = Field(
        None, gt=0, description="per-model time limit in seconds; a model past it is killed and reported "
        "(process, ray)")
    memory_gb: float | None = Field(
        None, gt=0, description="per-model memory limit: a worker whose resident memory passes it is killed and "
        "the model reported (process); the memory reserved per task (ray)")
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per model (ray)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved per model (ray)")
    address: str | None = Field(
        None, description="Ray cluster address (ray); default $RAY_ADDRESS, else a local Ray instance")
    max_models_per_worker: int | None = Field(
        None, ge=1, description="replace a worker after it has run this many models (process; Ray: its max_calls); default: never, "
        "a worker lives for the whole run")
    recycle_memory_gb: float | None = Field(
        None, gt=0, description="replace a worker, after the model it ran, when its resident memory has grown by "
        "more than this many GiB since it started (process), so that one model's leak does not push later ones "
        "over memory_gb; default: none, but with memory_gb set a worker whose resident memory is over half of it "
        "after a model is replaced")


@dataclass(frozen=True)
class PassStep:
    """One step of a pass chain: a registered pass and its options, complete and typed (a
    dataclass of aotpipe/passes/options.py). The chain's one form from the YAML, where the
    config parses it once, to the pass manager; written as {"name", "options"} (the
    fingerprint; each step as it ran is the manifest's PassRecord, in the entry of the graph it made)."""

    name: str
    options: Any

    @property
    def graphs(self) -> tuple[str, ...]:
        return tuple(self.options.graphs)


class ModelSpec(Strict):
    """One model with every default resolved: what capture and the fingerprint see."""

    name: str
    source: str
    args: dict[str, Any]
    config: dict[str, Any] | None
    inputs: list[InputSpec]
    mode: Mode
    graphs: list[KindField]
    passes: list[PassStep]
    save_inputs: bool
    save_values: str = "minimal"
    verify: bool
    loss: Loss
    seed: int
    optimizer: OptimizerSpec | None = None  # what a train_step graph's update runs (spec/optim.py)
    trusted_ops: list[str] = []  # the pipeline's: library op namespaces the graphs may call
    # Non-tensor keyword arguments of forward, by name or path (baked into the graphs).
    forward_args: dict[str, Any] = {}
    device: str | None = None  # where capture runs: cuda or cuda:N; None: the CPU
    # Named dynamic dimensions the inputs use (InputSpec.dims); auto_dims: every input's leading one.
    dims: dict[str, DimSpec] = {}
    auto_dims: bool = False
    # Where and with what it runs; not part of what it produces (nor of its fingerprint).
    resources: ResourceSpec | None = None
    # The parallel world the graphs are captured in, one artefact per rank (spec/distributed.py).
    distributed: DistributedSpec | None = None

    def to_json(self) -> dict[str, Any]:
        """The spec as plain JSON data (for manifests and the fingerprint): what decides the artefact.
        No trusted_ops entry when there are none (as before the field existed)."""
        exclude: dict[str, Any] = {"resources": True} if self.trusted_ops else {"resources": True, "trusted_ops": True}
        # requires_grad as before the field existed, unless set: fingerprints stay
        unset = {i: {f for f in ("requires_grad", "data", "key", "dims") if not getattr(inp, f)}
                 for i, inp in enumerate(self.inputs)}
        unset = {i: fields for i, fields in unset.items() if fields}
        if not self.forward_args:
            exclude["forward_args"] = True
        if self.device is None:
            exclude["device"] = True
        if not self.dims:
            exclude["dims"] = True
        if not self.auto_dims:
            exclude["auto_dims"] = True
        if self.distributed is None:
            exclude["distributed"] = True
        elif not self.distributed.sequence_parallel:
            exclude["distributed"] = {"sequence_parallel": True}  # fingerprints of worlds without it stay
        if self.optimizer is None:
            exclude["optimizer"] = True
        else:  # fingerprints of steps without a scheduler or autocast stay as they were
            left = {k: True for k in ("scheduler", "autocast") if getattr(self.optimizer, k) is None}
            if left:
                exclude["optimizer"] = left
        if unset:
            exclude["inputs"] = unset
        return json.loads(self.model_dump_json(exclude=exclude))

    @property
    def dynamic(self) -> bool:
        """Whether the graphs are captured with dynamic sizes (named dims, or dims: auto)."""
        return bool(self.dims) or self.auto_dims

    def at(self, sizes: dict[str, int]) -> ModelSpec:
        """This spec with its inputs at `sizes` (named dimension -> size)."""
        return ModelSpec(**{**{f: getattr(self, f) for f in type(self).model_fields},
                            "inputs": [inp.at(sizes) for inp in self.inputs]})


class Pipeline(Strict):
    """A validated pipeline: what `aotpipe run` executes."""

    name: str
    path: str
    output: str
    seed: int
    executor: ExecutorSpec
    models: list[ModelSpec]
    # Per model: its index in `models:` and the line of its source (for errors found later).
    source_lines: dict[str, tuple[int, int | None]] = {}
