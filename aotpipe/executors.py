"""Executors: how model jobs are scheduled. `local` runs them in-process, one by one."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from aotpipe.config import ModelSpec
from aotpipe.runner import ModelResult, run_model


def run_local(
    specs: list[ModelSpec], out_root: Path, base_dir: Path | None, *, progress: bool = True, force: bool = False,
    key: Path | None = None,
) -> list[ModelResult]:
    """Run each model in this process, in order, with a progress bar over models."""
    results = []
    bar = tqdm(total=len(specs), unit="model", disable=not progress, dynamic_ncols=True)
    try:
        for spec in specs:
            bar.set_description(spec.name)
            r = run_model(spec, out_root, base_dir, force=force, key=key)
            results.append(r)
            bar.set_postfix_str(f"{spec.name}: {'up to date' if r.skipped else r.status}")
            if r.status != "ok" and progress:
                bar.write(f"FAILED {spec.name} ({r.stage}): {r.error}")
            bar.update(1)
    finally:
        bar.close()
    return results
