"""`aotpipe verify`: is an artefact folder exactly what its manifest says, and safe to load?

Checks, per model folder: the manifest parses, is of a format version this aotpipe reads,
and its own checksum matches; every file it lists exists with the recorded sha256; no
file is there that it does not list; every graph loads through the safe loader.
"""

from __future__ import annotations

import json
from pathlib import Path

from aotpipe.artifact.manifest import MANIFEST, READABLE_VERSIONS, file_sha256, seal_ok
from aotpipe.errors import ArtifactError


def verify_artifact(folder: Path, *, load_graphs: bool = True) -> list[str]:
    """Every problem with one model folder, one line each naming the file; [] if none."""
    folder = Path(folder)
    mpath = folder / MANIFEST
    if mpath.is_symlink() or (mpath.exists() and not mpath.is_file()):
        return [f"{mpath}: not a regular file (a link or device)"]
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{mpath}: missing (an incomplete artefact: run the pipeline again)"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"{mpath}: unreadable ({e.__class__.__name__}: {e})"]
    if not isinstance(manifest, dict):
        return [f"{mpath}: not a manifest"]
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        return [f"{mpath}: format version {version!r}; this aotpipe reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"]
    problems = []
    if not seal_ok(manifest):
        problems.append(f"{mpath}: its checksum does not match its content (the file was changed)")
    files = manifest.get("files")
    if not isinstance(files, dict):
        return problems + [f"{mpath}: no file list"]
    for rel, digest in sorted(files.items()):
        p = folder / rel
        if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts:
            problems.append(f"{mpath}: bad file name {rel!r}")
            continue
        if p.is_symlink() or (p.exists() and not p.is_file()):
            problems.append(f"{p}: not a regular file (a link or device)")
            continue
        if not p.is_file():
            problems.append(f"{p}: missing")
            continue
        if file_sha256(p) != digest:
            problems.append(f"{p}: sha256 differs from the manifest (the file was changed or truncated)")
    listed = set(files) | {MANIFEST}
    for p in sorted(folder.rglob("*")):
        if (p.is_file() or p.is_symlink() or not p.is_dir()) and p.relative_to(folder).as_posix() not in listed:
            problems.append(f"{p}: not listed in the manifest")
    if load_graphs and not problems:
        from aotpipe.artifact.load import load

        try:
            load(folder)
        except ArtifactError as e:
            problems.append(str(e))
        except Exception as e:  # a bug in the loader must not hide the verdict
            problems.append(f"{folder}: failed to load ({e.__class__.__name__}: {e})")
    return problems


def find_artifacts(root: Path) -> tuple[list[Path], list[Path]]:
    """(model folders with a manifest, folders that look like unfinished model folders)."""
    root = Path(root)
    if (root / MANIFEST).exists():
        return [root], []
    models, unfinished = [], []
    for mpath in sorted(root.rglob(MANIFEST)):
        rel = mpath.parent.relative_to(root)
        if not any(part.startswith(".") for part in rel.parts):
            models.append(mpath.parent)
    known = set(models)
    for d in sorted(root.rglob("*_0")):
        parent = d.parent
        if d.is_dir() and parent not in known and not any(part.startswith(".") for part in parent.relative_to(root).parts):
            if (d / "graph.json").exists() or (d / "inputs.json").exists():
                unfinished.append(parent)
                known.add(parent)
    return models, unfinished


def verify_tree(root: Path) -> dict[Path, list[str]]:
    """Problems of every artefact under `root`, by model folder."""
    models, unfinished = find_artifacts(root)
    out = {m: verify_artifact(m) for m in models}
    for u in unfinished:
        out[u] = [f"{u / MANIFEST}: missing (an incomplete artefact: run the pipeline again)"]
    return out
