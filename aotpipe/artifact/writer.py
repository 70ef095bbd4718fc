"""Writes one model's artefact folder from captured graphs, atomically.

The writer knows nothing of model sources: it takes :class:`CapturedGraphs` and the model
record (spec and fingerprint) as data. The folder is written under a temporary name, its
files fsynced, then renamed into place, so a folder under its final name is complete.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.fx

from aotpipe.artifact import codegen, graph_json, input_meta
from aotpipe.artifact.blobs import BLOB_DIR, BlobStore
from aotpipe.artifact.manifest import FORMAT_VERSION, MANIFEST, dump_json, file_sha256, versions
from aotpipe.capture.types import CapturedGraph, CapturedGraphs, GraphInput

TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


def graph_folder_name(model: str, kind: str, index: int = 0) -> str:
    """The graph_dumper_aot folder name: <model>_<kind>_<index>."""
    return f"{model}_{kind}_{index}"


@dataclass
class WrittenGraph:
    kind: str
    folder: str
    nodes: int
    num_inputs: int
    num_outputs: int


@dataclass
class WrittenArtifact:
    path: Path
    graphs: list[WrittenGraph] = field(default_factory=list)
    bytes: int = 0
    files: int = 0


def _input_line(gi: GraphInput) -> str:
    if gi.meta is None:
        return f"{gi.name}: {gi.role} {getattr(gi.scalar_type, '__name__', 'int')}"
    m = gi.meta
    rng = f" range [{gi.int_range[0]}, {gi.int_range[1]})" if gi.int_range else ""
    target = f" {gi.target}" if gi.target else ""
    return f"{gi.name}: {gi.role}{target} {str(m.dtype).removeprefix('torch.')}{list(m.shape)}{rng}"


def inputs_record(g: CapturedGraph, contract: dict[str, Any] | None) -> dict[str, Any]:
    """inputs.json: per input its role, name, layout, range; per output its role."""
    inputs = []
    for i, gi in enumerate(g.inputs):
        rec: dict[str, Any] = {"index": i, "name": gi.name, "role": gi.role, "target": gi.target}
        if gi.meta is None:
            rec["type"] = getattr(gi.scalar_type, "__name__", "int")
        else:
            rec["type"] = "tensor"
            rec.update(gi.meta.to_json())
        rec["range"] = list(gi.int_range) if gi.int_range else None
        inputs.append(rec)
    outputs = []
    for go in g.outputs:
        rec = {"index": go.index, "role": go.role, "target": go.target}
        if go.meta is not None:
            rec.update(go.meta.to_json())
        outputs.append(rec)
    out: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": g.kind,
        "groups": list(g.input_groups) if g.input_groups else None,
        "inputs": inputs,
        "outputs": outputs,
    }
    if contract is not None and g.kind in ("forward", "backward"):
        out["partition"] = contract
    return out


def _strip_paths(gm: torch.fx.GraphModule) -> None:
    """Drop node metadata that holds file paths (stack traces) so artefacts carry none."""
    for node in gm.graph.nodes:
        node.meta.pop("stack_trace", None)
    gm.recompile()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_model(
    out_dir: Path,
    captured: CapturedGraphs,
    *,
    model_record: dict[str, Any],
    fingerprint: str,
) -> WrittenArtifact:
    """Write `<out_dir>/<model>/` from captured graphs; returns what was written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = captured.model
    final = out_dir / name
    tmp = out_dir / f"{TMP_PREFIX}{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        written = _write_contents(tmp, captured, model_record, fingerprint)
        _fsync_dir(tmp)
        old = out_dir / f"{OLD_PREFIX}{name}-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(out_dir)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    written.path = final
    return written


def _write_contents(
    root: Path, captured: CapturedGraphs, model_record: dict[str, Any], fingerprint: str
) -> WrittenArtifact:
    import aotpipe

    blobs = BlobStore(root)
    v = versions()
    contract = captured.contract.to_json() if captured.contract else None
    written = WrittenArtifact(path=root)
    graphs_record: dict[str, Any] = {}
    for kind, g in captured.graphs.items():
        folder = graph_folder_name(captured.model, kind)
        d = root / folder
        d.mkdir()
        _strip_paths(g.gm)
        constants = {}
        for node in g.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(g.gm, node.target) if "." not in node.target else g.gm.get_buffer(node.target)
                constants[node.target] = blobs.put(value)
        gj = graph_json.graph_to_json(g.gm, constants)
        gj["kind"] = kind
        gj["input_groups"] = list(g.input_groups) if g.input_groups else None
        _write(d / "graph.json", dump_json(gj))
        src = codegen.module_source(
            g.gm,
            title=f"{folder}: the {kind} graph of model {captured.model} ({captured.mode} capture)",
            input_lines=[_input_line(gi) for gi in g.inputs],
            constants=constants,
            version=aotpipe.__version__,
            torch_version=v["torch"],
        )
        _write(d / "module.py", src.encode("utf-8"))
        _write(d / f"{folder}.input", input_meta.dumps(input_meta.input_meta(g.inputs, g.input_groups)))
        _write(d / "inputs.json", dump_json(inputs_record(g, contract)))
        graphs_record[kind] = {
            "folder": folder,
            "nodes": g.num_nodes,
            "inputs": len(g.inputs),
            "outputs": len(g.outputs),
            "ops": sum(1 for n in g.gm.graph.nodes if n.op == "call_function"),
        }
        written.graphs.append(WrittenGraph(kind, folder, g.num_nodes, len(g.inputs), len(g.outputs)))

    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            files[p.relative_to(root).as_posix()] = file_sha256(p)
    manifest = {
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "versions": v,
        "model": model_record,
        "capture": {"mode": captured.mode, "options": captured.options, "notes": captured.notes},
        "graphs": graphs_record,
        "partition": contract,
        "passes": [],
        "files": files,
    }
    _write(root / MANIFEST, dump_json(manifest))
    total = 0
    count = 0
    for p in root.rglob("*"):
        if p.is_file():
            total += p.stat().st_size
            count += 1
    written.bytes = total
    written.files = count
    return written


__all__ = ["write_model", "graph_folder_name", "BLOB_DIR", "WrittenArtifact", "WrittenGraph"]
