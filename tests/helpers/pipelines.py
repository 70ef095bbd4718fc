"""Run a pipeline written inline through the real CLI, in this process."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner


def run_yaml(tmp_path: Path, text: str, *extra: str):
    """Write `text` as a pipeline in `tmp_path`, run it with the local executor (so
    monkeypatches apply) into tmp_path/out; returns (CLI result, the pipeline's output root)."""
    from aotpipe.cli import main

    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(path), "--output", str(out), "--executor", "local",
                                       "--no-progress", *extra])
    return result, out
