"""The eager model behind an artefact, rebuilt from its manifest: for --chain and --bench.

Rebuilding imports and calls the source the manifest names, so only the builtin zoo and
transformers classes are rebuilt unless the user trusts the artefact's code.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Optional

import torch

from aotpipe.artifact.load import Artifact
from aotpipe.format.records import MANIFEST
from aotpipe.models.eager import model_loss
from aotpipe.models.sources import rebuild_from_manifest
from aotpipe.models.train_step import eager_step, make_optimizer
from aotpipe.spec.modes import LOSSES
from aotpipe.spec.optim import OptimizerSpec


def median_seconds(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rebuild_model(art: Artifact, *, trust_code: bool = False) -> tuple[torch.nn.Module, tuple, dict] | None:
    """The source model and example inputs, rebuilt from the manifest's spec; None if impossible.

    Only builtin zoo models are rebuilt unless `trust_code` (sources.rebuild_refusal says
    why); a model over the byte limit is a LimitError.
    """
    return rebuild_from_manifest(art.manifest.model, trust_code=trust_code, where=art.path / MANIFEST)


def artifact_loss(art: Artifact) -> str:
    """The training loss the artefact's graphs differentiate, as its capture options record it
    (sum where they record none: made before the `loss:` setting)."""
    options = art.manifest.capture.options
    if options.get("tangents") == "loss weights":  # dynamo: a tangent per output, its loss weights
        return "weighted"
    loss = options.get("loss", "sum")
    return loss if loss in LOSSES else "sum"


def artifact_optimizer(art: Artifact) -> OptimizerSpec | None:
    """The optimizer a train_step graph's update runs, as the manifest's model entry records it."""
    recorded = (art.manifest.model.model_extra or {}).get("optimizer")
    return OptimizerSpec.model_validate(recorded) if recorded is not None else None


def eager_bench(art: Artifact, kind: str, n: int, *, trust_code: bool = False) -> float | None:
    """Median seconds of the eager model on its example inputs (for --bench), if rebuildable:
    a forward (inference), a forward and backward, or for a train_step the whole eager
    training step (forward, loss, backward, the optimizer's step())."""
    rebuilt = rebuild_model(art, trust_code=trust_code)
    if rebuilt is None:
        return None
    model, args, kwargs = rebuilt
    spec = artifact_optimizer(art) if kind == "train_step" else None
    if spec is not None:  # the eager training step a train_step graph is: forward, loss, backward, step()
        model.train()
        opt = make_optimizer(list(model.parameters()), spec)

        def step() -> None:
            eager_step(model, opt, args, kwargs, artifact_loss(art), spec)
    elif kind == "inference":
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(*args, **kwargs)
    else:
        model.train()

        def step() -> None:
            model_loss(model(*args, **kwargs), artifact_loss(art)).backward()
    step()  # warm-up
    return median_seconds(step, n)
