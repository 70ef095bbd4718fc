"""Capture modes and the options each records: in the manifest, and in the fingerprint.

No torch import: the up-to-date check of a warm re-run reads these, and nothing else of
capture, to see that nothing changed.
"""

from __future__ import annotations

from typing import Any

MODES = ("export", "dynamo", "meta", "auto")

# How export mode captures (aotpipe/capture/export.py).
EXPORT_OPTIONS: dict[str, Any] = {
    "strict": False,
    "decompositions": "core_aten",
    "partitioner": "default_partition",
    "loss": "sum",
    "sdpa_training_backend": "math",
}


def capture_options(mode: str) -> dict[str, Any]:
    """The options a model captured in `mode` records (part of its fingerprint)."""
    return {"mode": mode, **EXPORT_OPTIONS}
