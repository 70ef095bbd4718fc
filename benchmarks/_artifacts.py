"""Shared by the benchmarks that measure saved artefacts: where they come from."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent


def run_on_artifacts(main: Callable[[list[Path]], None]) -> None:
    """Call main() on the artefact roots given on the command line, or on fresh runs of
    quickstart and zoo-hf in a temporary folder."""
    if len(sys.argv) > 1:
        main([Path(a) for a in sys.argv[1:]])
        return
    from aotpipe.pipeline.config import load_pipeline
    from aotpipe.pipeline.runner import run_pipeline

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("quickstart", "zoo-hf"):
            run_pipeline(load_pipeline(REPO / "pipelines" / f"{name}.yaml"), output=tmp, progress=False)
        main([Path(tmp)])
