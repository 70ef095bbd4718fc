"""Capture modes and the options each records: in the manifest, and in the fingerprint.

No torch import: the up-to-date check of a warm re-run reads these, and nothing else of
capture, to see that nothing changed. The capture modules take their options from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aotpipe.spec.registry import by_name, resolve

if TYPE_CHECKING:
    from aotpipe.format.ir import CapturedGraphs
    from aotpipe.format.vocabulary import GraphKind

# The `loss:` setting: what the training graphs differentiate (eager.model_loss). "weighted",
# the default, weighs every element by a fixed non-uniform weight, so no gradient is zero
# merely because the loss is constant (a sum of LayerNorm outputs is). An artefact that
# records no loss was made with "sum".
LOSSES = ("weighted", "sum", "mean")
DEFAULT_LOSS = "weighted"

# export: torch.export (non-strict), then AOTAutograd (aotpipe/capture/export.py).
EXPORT_OPTIONS: dict[str, Any] = {
    "strict": False,
    "decompositions": "core_aten",
    "partitioner": "default_partition",
    "loss": DEFAULT_LOSS,
    "sdpa_training_backend": "math",
}

# dynamo: torch.compile with a capturing backend, per subgraph (aotpipe/capture/dynamo.py).
DYNAMO_OPTIONS: dict[str, Any] = {
    "backend": "capture (each subgraph's dynamo FX graph, run as is)",
    "dynamic": False,
    "decompositions": "core_aten",
    "partitioner": "default_partition",
    "loss": "none (the joint takes a tangent per differentiable output)",
    "tangents": "loss weights",  # each output's (tensors.loss_weights); artefacts without this key: ones
    "inference": "eval-mode no_grad compile, each subgraph exported",
    "sdpa_training_backend": "math",
}

# meta: export's capture of a model built on the meta device (aotpipe/capture/meta.py).
META_OPTIONS: dict[str, Any] = {**EXPORT_OPTIONS, "values": "none (meta build, fake tensors)"}


@dataclass(frozen=True)
class CaptureMode:
    """One capture mode: how the model and its example inputs are built, what captures it,
    what the artefact then holds, and the options it records. Functions are named
    ``module:attribute`` and imported when first used (they import torch)."""

    name: str
    capture: str  # (model, args, kwargs, *, name, graphs, input_names, int_ranges[, loss]) -> CapturedGraphs
    recorded: Callable[[str], dict[str, Any]]  # the options it records, given the `loss:` setting
    summary: str
    build: str = "aotpipe.models.sources:build_model"  # (spec, base_dir) -> the model
    example_inputs: str = "aotpipe.models.sources:make_example_inputs"  # spec -> (args, kwargs)
    takes_loss: bool = True  # its training graphs differentiate `loss:` (dynamo's joint takes a tangent per output)
    values: bool = True  # False: shapes only: no weights nor inputs stored, no passes, checked on fake tensors
    via_export: bool = True  # it traces with torch.export (what a capture failure's hint says)
    tries_first: str | None = None  # a mode whose capture it tries first, passed as the keyword of that name

    def function(self, which: str = "capture") -> Callable[..., Any]:
        """The mode's `capture`, `build` or `example_inputs` function (imports it, and torch)."""
        return resolve(getattr(self, which))

    def capture_graphs(self, request: CaptureRequest) -> CapturedGraphs:
        """The graphs `request` asks for, by this mode's capture function: given the training
        loss if it takes one, and (auto) the capture of the mode it tries first."""
        extra: dict[str, Any] = {"loss": request.loss} if self.takes_loss else {}
        if request.dynamic is not None:
            extra["dynamic"] = request.dynamic
        if request.step_autocast is not None:  # train_step: export and auto only (spec refuses the others)
            extra["step_autocast"] = request.step_autocast
        if self.tries_first:
            extra[self.tries_first] = capture_mode(self.tries_first).function()
        captured: CapturedGraphs = self.function()(
            request.model, request.args, request.kwargs, name=request.name, graphs=list(request.graphs),
            input_names=list(request.input_names), int_ranges=dict(request.int_ranges), **extra)
        return captured


@dataclass(frozen=True)
class DynamicDims:
    """The sizes a capture keeps symbolic: each named dimension's [min, max], and per user
    input (by name) the named dimension of each of its dimensions (None: static); or `auto`:
    every input's leading dimension, as torch finds it can be (no names, no ranges)."""

    ranges: dict[str, tuple[int, int]]
    inputs: dict[str, tuple[str | None, ...]]
    auto: bool = False


@dataclass(frozen=True)
class CaptureRequest:
    """What a capture is asked for: the model (a torch.nn.Module) and its example inputs, the
    graph kinds to capture, each user input's name, the [low, high) range of each integer
    input, and the `loss:` setting (used by the modes that take one)."""

    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str
    graphs: tuple[GraphKind, ...]
    input_names: tuple[str, ...]
    int_ranges: dict[str, tuple[int, int]]
    loss: str = DEFAULT_LOSS
    dynamic: DynamicDims | None = None  # None: every size static
    # A train_step's mixed precision (spec.optim: "bfloat16"): the export capture also makes the
    # joint the step is built from under torch.autocast in this dtype (CapturedGraphs.step_joint).
    step_autocast: str | None = None


# The one table of capture modes (spec.Mode lists the same names for the YAML's schema).
CAPTURE_MODES: dict[str, CaptureMode] = by_name([
    CaptureMode("export", "aotpipe.capture:capture_export", lambda loss: {**EXPORT_OPTIONS, "loss": loss},
                "torch.export + AOTAutograd"),
    CaptureMode("dynamo", "aotpipe.capture:capture_dynamo", lambda loss: dict(DYNAMO_OPTIONS),
                "torch.compile with a capturing backend: graphs per subgraph, graph breaks recorded",
                takes_loss=False, via_export=False),
    CaptureMode("meta", "aotpipe.capture.meta:capture_meta", lambda loss: {**META_OPTIONS, "loss": loss},
                "export of the model built on the meta device: shapes only, no values, no memory",
                build="aotpipe.capture.meta:build_on_meta", example_inputs="aotpipe.capture.meta:meta_example_inputs",
                values=False),
    CaptureMode("auto", "aotpipe.capture:capture_auto",
                lambda loss: {"export": {**EXPORT_OPTIONS, "loss": loss}, "dynamo": dict(DYNAMO_OPTIONS)},
                "export, else dynamo, recording why (either may be what the artefact holds)",
                via_export=False, tries_first="export"),
], "capture mode")
MODES = tuple(CAPTURE_MODES)


def capture_mode(name: str) -> CaptureMode:
    """The capture mode `name`; a ValueError listing the valid names if there is none."""
    mode = CAPTURE_MODES.get(name)
    if mode is None:
        raise ValueError(f"unknown capture mode {name!r}; use one of: {', '.join(CAPTURE_MODES)}")
    return mode


def capture_options(mode: str, loss: str = DEFAULT_LOSS) -> dict[str, Any]:
    """The options a model captured in `mode` records (part of its fingerprint); `loss` is
    the training loss export differentiates (dynamo has none)."""
    return {"mode": mode, **capture_mode(mode).recorded(loss)}
