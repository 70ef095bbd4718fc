"""Incremental runs: is a model's artefact on disk up to date, and what to report if so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from aotpipe.artifact.manifest import FORMAT_VERSION
from aotpipe.config import ModelSpec
from aotpipe.runner import GraphResult, ModelResult, checks_summary, eager_cell, verification_summary, written_manifest


def model_fingerprint(spec: ModelSpec, base_dir: Path | None = None) -> str:
    """The fingerprint an up-to-date artefact of `spec` carries (spec, source file, options, versions)."""
    from aotpipe.artifact.manifest import file_sha256, fingerprint
    from aotpipe.capture.export import OPTIONS
    from aotpipe.sources import source_file

    src = source_file(spec, base_dir)
    src_hash = file_sha256(src) if src is not None and src.is_file() else None
    return fingerprint(spec.to_json(), src_hash, {"mode": spec.mode, **OPTIONS})


def up_to_date(folder: Path, fp: str, key: Path | None = None) -> Optional[dict[str, Any]]:
    """The manifest of `folder` if it carries fingerprint `fp`, its files match their
    digests, it passed its checks, and with a signing `key`, its signature checks."""
    from aotpipe.artifact.signing import check_signature
    from aotpipe.artifact.verify import verify_artifact

    try:
        manifest = written_manifest(folder)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fp:
        return None
    if verify_artifact(folder, load_graphs=False):
        return None
    if key is not None and check_signature(folder, key):
        return None  # unsigned, or not by this key: redo it (and sign it)
    if manifest.get("format_version") != FORMAT_VERSION:
        return None  # an older format: redo it in the current one
    if verification_summary(manifest)["problems"] or _check_failures(manifest) or manifest.get("pass_failures"):
        return None  # it failed last time: try again
    return manifest


def _check_failures(manifest: dict[str, Any]) -> bool:
    return bool((manifest.get("checks") or {}).get("failed"))


def skipped_result(spec: ModelSpec, folder: Path, manifest: dict[str, Any], start: float) -> ModelResult:
    r = ModelResult(name=spec.name, status="ok", skipped=True)
    graphs = manifest.get("graphs", {})
    order = ["inference", "forward", "backward", "joint"]
    r.graphs = [GraphResult(k, graphs[k]["folder"], graphs[k]["nodes"], graphs[k]["inputs"], graphs[k]["outputs"])
                for k in sorted(graphs, key=lambda k: order.index(k) if k in order else len(order))]
    r.eager = {k: eager_cell(g.get("checks")) for k, g in graphs.items() if isinstance(g, dict)}
    r.checks = checks_summary(manifest)
    files = [p for p in folder.rglob("*") if p.is_file()]
    r.bytes, r.files = sum(p.stat().st_size for p in files), len(files)
    r.notes = list(manifest.get("capture", {}).get("notes", []))
    if manifest.get("verification"):
        r.verification = verification_summary(manifest)
    r.total_seconds = time.perf_counter() - start
    return r
