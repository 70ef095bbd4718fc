"""manifest.json: what a model folder holds, how it was made, and every file's sha256."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

# The format's constants live with its records; these names are kept for callers.
from aotpipe import __version__
from aotpipe.format.records import FORMAT_VERSION, MANIFEST, READABLE_VERSIONS, RawJson, Versions  # noqa: F401


def dump_json(data: Any, *, compact: bool = False) -> bytes:
    """Deterministic JSON bytes: sorted keys, trailing newline; indented for people unless
    `compact` (the per-graph records, which module.py shows in readable form)."""
    if compact:
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False)
    else:
        text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


def seal(manifest: dict[str, Any]) -> bytes:
    """Manifest bytes carrying a checksum of their own content (any changed byte shows)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    body["checksum"] = hashlib.sha256(dump_json({k: v for k, v in body.items() if k != "checksum"})).hexdigest()
    return dump_json(body)


def seal_ok(manifest: RawJson) -> bool:
    """Whether a loaded manifest's checksum matches its content (the JSON as read: what the
    checksum covers, checked before the record is validated)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    try:
        return manifest.get("checksum") == hashlib.sha256(dump_json(body)).hexdigest()
    except (ValueError, TypeError):
        return False  # NaN or other values aotpipe never writes


def versions() -> Versions:
    """aotpipe's, torch's and Python's versions. torch's from its installed metadata, which is
    what ``torch.__version__`` says too, without importing torch: the up-to-date check of a
    warm re-run needs it and nothing else from torch."""
    return Versions(aotpipe=__version__, torch=_torch_version(), python=platform.python_version())


@functools.lru_cache(maxsize=None)  # installed metadata, parsed once per process
def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path: ask torch itself
        import torch  # torch: only where its installed metadata is missing; manifests are read torch-free

        return torch.__version__


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(model_spec: dict[str, Any], source_sha256: str | None, options: dict[str, Any]) -> str:
    """Hash of everything that decides a model's artefact: spec, source code, options, versions."""
    v = versions()
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model_spec,
        "source_sha256": source_sha256,
        "options": options,
        "aotpipe": v.aotpipe,
        "torch": v.torch,
    }
    return hashlib.sha256(dump_json(payload)).hexdigest()
