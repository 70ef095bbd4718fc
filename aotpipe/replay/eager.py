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
from aotpipe.eager import sum_loss


def median_seconds(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rebuild_model(art: Artifact, *, trust_code: bool = False) -> Optional[tuple[torch.nn.Module, tuple, dict]]:
    """The source model and example inputs, rebuilt from the manifest's spec; None if impossible.

    Rebuilding imports and calls the source the manifest names: only the builtin zoo and
    transformers classes are rebuilt unless `trust_code` (a hostile manifest could name
    any callable).
    """
    from aotpipe.config import ModelSpec
    from aotpipe.errors import AotpipeError
    from aotpipe.sources import build_model, make_example_inputs

    try:
        spec = ModelSpec.model_validate(art.manifest["model"])
        if not trust_code and not (spec.source.startswith("hf:") or spec.source.startswith("aotpipe.zoo:")):
            return None
        model = build_model(spec)
        args, kwargs = make_example_inputs(spec)
    except (AotpipeError, KeyError, ValueError, TypeError, ImportError):
        return None
    return model, args, kwargs


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
            sum_loss(model(*args, **kwargs)).backward()
    step()  # warm-up
    return median_seconds(step, n)
