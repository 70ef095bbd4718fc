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
from aotpipe.spec.modes import LOSSES


def median_seconds(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rebuild_model(art: Artifact, *, trust_code: bool = False) -> Optional[tuple[torch.nn.Module, tuple, dict]]:
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


def eager_bench(art: Artifact, kind: str, n: int, *, trust_code: bool = False) -> Optional[float]:
    """Median seconds of the eager model on its example inputs (for --bench), if rebuildable."""
    rebuilt = rebuild_model(art, trust_code=trust_code)
    if rebuilt is None:
        return None
    model, args, kwargs = rebuilt
    if kind == "inference":
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
