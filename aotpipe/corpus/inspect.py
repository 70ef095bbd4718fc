"""`aotpipe ls` and `aotpipe show`: what is in an artefact folder, for people.

`ls` reads manifests only and imports no torch (it answers in a fraction of a second);
`show` loads the graphs."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from aotpipe.artifact.manifest import seal_ok
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format import records
from aotpipe.format.graph_keys import key_order, parse_graph_key
from aotpipe.format.limits import walk
from aotpipe.format.records import MANIFEST, Manifest
from aotpipe.pipeline.report import human_size as _size
from aotpipe.pipeline.results import failed_last_time, is_partial, outside_graphs_lines, why_failed


def artifact_status(manifest: Manifest) -> str:
    """verified, shapes only, unverified, FAILED (a graph did not run as recorded, or a check
    failed), or PARTIAL (part of the model ran outside its graphs: capture.outside_graphs)."""

    rec = manifest.verification
    if not rec:
        return "unverified"
    if failed_last_time(manifest):
        return "FAILED"
    if is_partial(manifest):
        return "PARTIAL"
    if any(r.status == "shapes only" for r in rec.values()):
        return "shapes only"
    skipped = manifest.checks.skipped if manifest.checks is not None else 0
    return f"verified, {skipped} checks skipped" if skipped else "verified"


@dataclass(frozen=True)
class ArtifactRow:
    """One model artefact as `aotpipe ls` lists it."""

    path: str  # relative to the folder listed
    status: str  # what the manifest records ("verified", "FAILED", ...), or why it was not read
    graphs: str  # "<key>(<nodes>), ..."
    size: str
    error: Optional[str] = None  # why the manifest was refused
    outside: tuple[str, ...] = ()  # PARTIAL: what ran outside the graphs (results.outside_graphs_lines)


def list_artifacts(root: Path) -> list[ArtifactRow]:
    """One row per model artefact under `root`: path, status, graphs, size, and the error that
    made a manifest "refused" (a link, a device, a FIFO, over a limit, not of the format),
    else None. The status is what the manifest records; `aotpipe verify` checks the files.

    The tree is walked once, within the walk limits (format/limits.py: a tree too deep or of
    too many files is one LimitError line); each folder's size is summed from that walk."""
    root = Path(root)
    sizes: dict[Path, int] = {root: 0}  # every folder's own files, then (below) with its folders'
    manifests: list[Path] = []
    for entry in walk(root):
        if entry.is_dir:
            sizes[entry.path] = 0
        elif entry.path.name == MANIFEST and \
                not any(part.startswith(".") for part in entry.path.parent.relative_to(root).parts):
            manifests.append(entry.path)  # (a hidden folder: a temporary one of a run in progress)
        if not entry.is_dir and not entry.is_link:
            sizes[entry.path.parent] += entry.size
    for folder in sorted(sizes, key=lambda f: len(f.parts), reverse=True):  # deepest first
        if folder != root:
            sizes[folder.parent] += sizes[folder]
    rows = []
    for manifest_path in sorted(manifests):
        folder = manifest_path.parent
        error, outside = None, ()
        try:
            raw, manifest = records.read(Manifest, manifest_path)  # no FIFO, no /dev/zero, within the limits
            status = artifact_status(manifest) if seal_ok(raw) else "corrupt (checksum)"
            outside = tuple(outside_graphs_lines(manifest))
            graphs = ", ".join(f"{k}({manifest.graphs[k].nodes})" for k in sorted(manifest.graphs, key=key_order))
        except ArtifactError as e:
            status, graphs, error = "refused", "-", str(e)
        except OSError:
            status, graphs = "unreadable", "-"
        rows.append(ArtifactRow(str(folder.relative_to(root)) or ".", status, graphs, _size(sizes.get(folder, 0)),
                                error, outside))
    return rows


def describe(path: Path, trust_ops: Sequence[str] = ()) -> str:
    """A multi-line description of one artefact (`trust_ops`: as load's)."""
    return "\n".join(describe_lines(path, trust_ops))


def describe_lines(path: Path, trust_ops: Sequence[str] = ()) -> list[str]:
    """:func:`describe`'s lines, each as composed (a name the artefact supplies may hold any
    character: the caller escapes each line it prints)."""
    try:
        return _describe(path, trust_ops)
    except ArtifactError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
        raise ArtifactError(f"{path}: malformed artefact ({exception_line(e)})") from None


def _describe(path: Path, trust_ops: Sequence[str]) -> list[str]:
    from aotpipe.artifact.graph_json import target_name  # torch: not for ls, which reads manifests only
    from aotpipe.artifact.load import load  # torch: kept off the torch-free path

    art = load(path, trust_ops=trust_ops)
    m = art.manifest
    lines = [
        f"{art.name}: {m.model.source}  (format {m.format_version}, torch {m.versions.torch}, {artifact_status(m)})",
    ]
    c = m.capture
    if c.subgraphs is not None:
        lines.append(f"capture: {c.mode}, {c.subgraphs} subgraph{'s' if c.subgraphs != 1 else ''}, "
                     f"{len(c.graph_breaks or [])} graph break{'s' if len(c.graph_breaks or []) != 1 else ''}")
        for b in c.graph_breaks or []:
            lines.append(f"  break after subgraph {b.subgraph}: {b.reason}" + (f" at {b.where}" if b.where else "")
                         + (f": {b.code}" if b.code else ""))
    if c.fallback is not None:
        lines.append(f"capture: export failed, dynamo used: {c.fallback}")
    for line in outside_graphs_lines(m):
        lines.append(f"PARTIAL: {line}")
    failed = why_failed(m)
    if failed:
        lines.append(f"FAILED when captured: {failed}; fix the model or pipeline and run it again")
    for kind, ga in art.graphs.items():
        gm = ga.structure  # as graph.json holds it, never run (nothing recomputed)
        ops = collections.Counter(
            target_name(n.target).removeprefix("aten.") for n in gm.graph.nodes if n.op == "call_function")
        rec = ga.record
        lines.append("")
        parsed = parse_graph_key(kind)
        what = f"{kind} graph" if parsed is None or parsed.subgraph == 0 else \
            f"{parsed.kind}{'.' + parsed.chain if parsed.chain else ''} graph of subgraph {parsed.subgraph}"
        lines.append(f"{ga.folder.name}: {what}, {len(gm.graph.nodes)} nodes, {sum(ops.values())} ops")
        top = ", ".join(f"{op} x{n}" for op, n in ops.most_common(12))
        lines.append(f"  ops: {top}" + (f", ... ({len(ops)} kinds)" if len(ops) > 12 else ""))
        roles = collections.Counter(i.role for i in rec.inputs)
        lines.append(f"  inputs ({len(rec.inputs)}): " + ", ".join(f"{n} {r}" for r, n in roles.items()))
        for i in rec.inputs:
            if i.role in ("user", "tangent"):
                rng = f" in [{i.range[0]}, {i.range[1]})" if i.range else ""
                lines.append(f"    {i.name}: {i.role} {i.target or ''} {i.dtype or i.type}{i.shape or ''}{rng}")
        oroles = collections.Counter(o.role for o in rec.outputs)
        lines.append(f"  outputs ({len(rec.outputs)}): " + ", ".join(f"{n} {r}" for r, n in oroles.items()))
        if rec.partition is not None:
            c = rec.partition
            lines.append(f"  partition: {c.num_mutated_inputs} mutated, {c.num_user_outputs} user outputs, "
                         f"{c.num_saved_tensors} saved tensors, {c.num_tangents} tangents")
        entry = m.graphs.get(kind)
        for step in (entry.passes if entry is not None else None) or []:
            did = ", ".join(f"{k} {v}" for k, v in step.stats.items() if v) or "nothing"
            lines.append(f"  pass {step.name}: {step.nodes_before} -> {step.nodes_after} nodes, {did}")
        v = (m.verification or {}).get(kind)
        if v is not None:
            how = f" ({v.inputs} inputs)" if v.inputs is not None else ""
            lines.append(f"  verified: {v.status}{how}" + (f": {v.error}" if v.error else ""))
    if not art.graphs:
        raise ArtifactError(f"{path}: no graphs")
    return lines
