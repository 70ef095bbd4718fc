"""Capture modes and the options each records: in the manifest, and in the fingerprint.

No torch import: the up-to-date check of a warm re-run reads these, and nothing else of
capture, to see that nothing changed. The capture modules take their options from here.
"""

from __future__ import annotations

from typing import Any

MODES = ("export", "dynamo", "meta", "auto")

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


def capture_options(mode: str, loss: str = DEFAULT_LOSS) -> dict[str, Any]:
    """The options a model captured in `mode` records (part of its fingerprint); `loss` is
    the training loss export differentiates (dynamo has none)."""
    if mode == "export":
        return {"mode": mode, **EXPORT_OPTIONS, "loss": loss}
    if mode == "dynamo":
        return {"mode": mode, **DYNAMO_OPTIONS}
    if mode == "meta":
        return {"mode": mode, **META_OPTIONS, "loss": loss}
    if mode == "auto":  # export, else dynamo: either may be what the artefact holds
        return {"mode": mode, "export": {**EXPORT_OPTIONS, "loss": loss}, "dynamo": dict(DYNAMO_OPTIONS)}
    raise ValueError(f"unknown capture mode {mode!r}")
