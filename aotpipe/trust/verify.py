"""`aotpipe verify`: is an artefact folder exactly what its manifest says, and safe to load?

Checks, per model folder: the manifest parses, is of a format version this aotpipe reads,
and its own checksum matches; every file it lists exists with the recorded sha256; no
file is there that it does not list (signature.json aside); every graph is rebuilt through
the safe loader (read, never run: constants the loader would recompute are left out), and
its module.py is the file graph.json regenerates, compared whole.

This catches corruption, not forgery: whoever can edit the files can recompute every
hash and the manifest's checksum too. `verify --key` (trust/signing.py) catches that.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from aotpipe.artifact.fsio import write_atomic
from aotpipe.artifact.manifest import file_sha256, seal_ok
from aotpipe.errors import ArtifactError, LimitError, exception_line
from aotpipe.format import limits, records
from aotpipe.format.limits import Breach
from aotpipe.format.records import MANIFEST, SIGNATURE
from aotpipe.trust.signing import check_signature, load_key, manifest_bytes, signature_record


def _problem(e: ArtifactError) -> str:
    """An error as a problem line; a limit breach stays marked as one (the CLI exits 2)."""
    line = e.lines()[0]
    return Breach(line) if isinstance(e, LimitError) else line


def read_manifest(folder: Path) -> tuple[dict | None, list[str]]:
    """(the manifest, []) or (None, [the problem]): read within the limits, never hanging on a
    FIFO or reading a link to a device."""
    mpath = Path(folder) / MANIFEST
    if not os.path.lexists(mpath):
        return None, [f"{mpath}: missing (an incomplete artefact: run the pipeline again)"]
    try:
        manifest = limits.read_json(mpath)
    except ArtifactError as e:
        return None, [_problem(e)]
    if not isinstance(manifest, dict):
        return None, [f"{mpath}: not a manifest"]
    return manifest, []


def verify_artifact(folder: Path, *, load_graphs: bool = True, trust_ops: Sequence[str] = ()) -> list[str]:
    """Every problem with one model folder, one line each naming the file; [] if none.
    `trust_ops`: library op namespaces whose ops the graphs may call (load's).

    Lines that are :class:`~aotpipe.format.limits.Breach` es report a limit breach.
    """
    folder = Path(folder)
    mpath = folder / MANIFEST
    manifest, problems = read_manifest(folder)
    if manifest is None:
        return problems
    try:
        records.check_version(manifest, mpath)
    except ArtifactError as e:
        return [_problem(e)]
    if not seal_ok(manifest):
        problems.append(f"{mpath}: its checksum does not match its content (the file was changed)")
    try:
        files = records.parse(records.Manifest, manifest, mpath).files
    except ArtifactError as e:
        return problems + [_problem(e)]
    lim = limits.current()
    biggest = max(lim.max_record_bytes, lim.tensor_bytes + (1 << 20))  # a blob: one tensor and its header
    for rel, digest in sorted(files.items()):
        if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel in (MANIFEST, SIGNATURE) \
                or not rel.isprintable():
            problems.append(f"{mpath}: bad file name {ascii(rel)}")
            continue
        p = folder / rel
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            problems.append(f"{p}: missing")
            continue
        except (ValueError, UnicodeError) as e:  # a NUL, a lone surrogate: no file can be named so
            problems.append(f"{mpath}: bad file name {ascii(rel)} ({exception_line(e)})")
            continue
        except OSError as e:
            problems.append(f"{p}: cannot read ({e.strerror})")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{p}: not a regular file (a link or device)")
            continue
        if st.st_size > biggest:
            problems.append(Breach(str(limits.breach(p, f"{limits.human(st.st_size)} on disk", "max_tensor_bytes"
                                                     if lim.max_tensor_bytes else "max_bytes", biggest))))
            continue
        if file_sha256(p) != digest:
            problems.append(f"{p}: sha256 differs from the manifest (the file was changed or truncated)")
    listed = set(files) | {MANIFEST, SIGNATURE}
    try:
        for entry in limits.walk(folder):  # within the walk limits: no tree of a million files
            if not entry.is_dir and entry.path.relative_to(folder).as_posix() not in listed:
                problems.append(f"{entry.path}: not listed in the manifest")
    except LimitError as e:
        problems.append(_problem(e))
    if load_graphs and not problems:
        from aotpipe.artifact.load import load  # torch: kept off the torch-free path

        # Read, never run: graphs rebuilt through the allow-list; constants the loader would
        # recompute (by running the pass chain on the base graph) are left out.
        try:
            art = load(folder, trust_ops=trust_ops).build_all()
        except ArtifactError as e:
            return [_problem(e)]
        except Exception as e:  # a bug in the loader must not hide the verdict
            return [f"{folder}: failed to load ({exception_line(e)})"]
        from aotpipe.artifact.codegen import code_mismatch, graph_constants  # torch: kept off the torch-free path
        for ga in art.graphs.values():
            constants = graph_constants(ga.graph) if ga.graph is not None else {}  # load_graph keeps what it read
            why = code_mismatch(ga.folder / "module.py", ga.structure, constants)
            if why:
                problems.append(why)
    return problems


def find_artifacts(root: Path) -> tuple[list[Path], list[Path]]:
    """(model folders with a manifest, folders that look like unfinished model folders)."""
    root = Path(root)
    if (root / MANIFEST).exists():
        return [root], []
    models, unfinished = [], []
    zeros = []  # folders named like a graph folder of subgraph 0
    for entry in limits.walk(root):  # one walk, within the walk limits
        if any(part.startswith(".") for part in entry.path.parent.relative_to(root).parts):
            continue
        if entry.path.name == MANIFEST and not entry.is_dir:
            models.append(entry.path.parent)
        elif entry.is_dir and entry.path.name.endswith("_0"):
            zeros.append(entry.path)
    models.sort()
    known = set(models)
    for d in sorted(zeros):
        parent = d.parent
        if parent not in known and ((d / "graph.json").exists() or (d / "inputs.json").exists()):
            unfinished.append(parent)
            known.add(parent)
    return models, unfinished


def verify_tree(root: Path, key_path: str | Path | None = None, trust_ops: Sequence[str] = ()
                ) -> dict[Path, list[str]]:
    """Problems of every artefact under `root`, by model folder; with `key_path` (a key spec:
    ``ed25519:FILE``, ``hmac:FILE`` or ``FILE``), each artefact's signature is checked first,
    and one whose signature fails is not read any further (its problem is that alone)."""
    check = None
    if key_path is not None:
        load_key(key_path)  # a bad key file is the user's error, once, before any artefact
        check = check_signature
    models, unfinished = find_artifacts(root)
    out = {}
    for m in models:
        # The signature first: an artefact not signed by the key is not read any further.
        out[m] = check(m, key_path) if check is not None else []
        if not out[m]:
            out[m] = verify_artifact(m, trust_ops=trust_ops)
    for u in unfinished:
        out[u] = [f"{u / MANIFEST}: missing (an incomplete artefact: run the pipeline again)"]
    return out


def sign_artifact(folder: str | Path, key: str | Path) -> Path:
    """Sign one model folder: write signature.json beside its manifest; returns its path.

    The folder must verify first (files, checksum, safe load, module.py): a signature
    vouches for what is there, so a damaged artefact is not signed.
    """
    folder = Path(folder)
    signing_key = load_key(key, for_signing=True)
    problems = verify_artifact(folder)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ArtifactError(f"{folder}: not signed, it does not verify: {problems[0]}{more}")
    path = folder / SIGNATURE
    write_atomic(path, signature_record(manifest_bytes(folder), signing_key))
    return path
