"""Which folder a path names: an artefact's model folder (it holds manifest.json) or one of
its graph folders (graph.json, and no manifest.json). Decided here, and only here."""

from __future__ import annotations

from pathlib import Path

from aotpipe.format.records import GRAPH_JSON, MANIFEST


def is_model_folder(path: str | Path) -> bool:
    """Whether `path` is a model folder: it holds manifest.json."""
    return (Path(path) / MANIFEST).exists()


def is_graph_folder(path: str | Path) -> bool:
    """Whether `path` is one graph's folder inside a model folder: graph.json, no manifest.json."""
    p = Path(path)
    return (p / GRAPH_JSON).exists() and not (p / MANIFEST).exists()


def model_folder(path: str | Path) -> Path:
    """The model folder `path` names: its parent for a graph folder, else `path` itself
    (which need not be one: callers that require a manifest say so in their own words)."""
    p = Path(path)
    return p.parent if is_graph_folder(p) else p
