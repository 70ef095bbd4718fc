"""Incremental runs: is a model's artefact on disk up to date, and what to report if so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from aotpipe.artifact.records import FORMAT_VERSION, Manifest
from aotpipe.config import ModelSpec
from aotpipe.errors import AotpipeError
from aotpipe.runner import (GraphResult, ModelResult, checks_summary, eager_cell, failed_last_time,
                            verification_summary, written_manifest)


def model_fingerprint(spec: ModelSpec, base_dir: Path | None = None) -> str:
    """The fingerprint an up-to-date artefact of `spec` carries (spec, source file, options, versions)."""
    from aotpipe.artifact.manifest import file_sha256, fingerprint
    from aotpipe.capture.export import OPTIONS
    from aotpipe.sources import source_file

    src = source_file(spec, base_dir)
    src_hash = file_sha256(src) if src is not None and src.is_file() else None
    return fingerprint(spec.to_json(), src_hash, {"mode": spec.mode, **OPTIONS})


def up_to_date(folder: Path, fp: str, key: Path | None = None) -> Optional[Manifest]:
    """The manifest of `folder` if it carries fingerprint `fp`, its files match their
    digests, it passed its checks, and with a signing `key`, its signature checks."""
    from aotpipe.artifact.signing import check_signature
    from aotpipe.artifact.verify import verify_artifact

    try:
        manifest = written_manifest(folder)
    except (OSError, AotpipeError):
        return None
    if manifest.fingerprint != fp or manifest.format_version != FORMAT_VERSION:
        return None  # another model, options or versions; or an older format: redo it in this one
    if verify_artifact(folder, load_graphs=False):
        return None
    if key is not None and check_signature(folder, key):
        return None  # unsigned, or not by this key: redo it (and sign it)
    if failed_last_time(manifest):
        return None  # try again
    return manifest


def skipped_result(spec: ModelSpec, folder: Path, manifest: Manifest, start: float) -> ModelResult:
    r = ModelResult(name=spec.name, status="ok", skipped=True)
    order = ["inference", "forward", "backward", "joint"]
    graphs = manifest.graphs
    r.graphs = [GraphResult(k, graphs[k].folder, graphs[k].nodes, graphs[k].inputs, graphs[k].outputs)
                for k in sorted(graphs, key=lambda k: order.index(k) if k in order else len(order))]
    r.eager = {k: eager_cell(g.checks) for k, g in graphs.items()}
    r.checks = checks_summary(manifest)
    files = [p for p in folder.rglob("*") if p.is_file()]
    r.bytes, r.files = sum(p.stat().st_size for p in files), len(files)
    r.notes = list(manifest.capture.notes)
    if manifest.verification:
        r.verification = verification_summary(manifest)
    r.total_seconds = time.perf_counter() - start
    return r
