"""Writes one model's artefact folder from captured graphs, atomically.

The writer knows nothing of model sources: it takes :class:`CapturedGraphs` and the model
record (spec and fingerprint) as data. The folder is written under a temporary name, its
files fsynced, then renamed into place, so a folder under its final name is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.fx

from aotpipe.artifact import codegen, graph_json, input_meta
from aotpipe.artifact.blobs import BLOB_DIR, BlobStore
from aotpipe.artifact.fsio import OutputError, describe_os_error, fsync_dir, pid_alive, write_durable
from aotpipe.artifact.manifest import FORMAT_VERSION, MANIFEST, dump_json, file_sha256, seal, versions
from aotpipe.capture.types import CapturedGraph, CapturedGraphs, GraphInput
from aotpipe.tensors import storage_base, storage_groups

TRACE = "trace.json"
INPUTS_JSON = "inputs.json"
GRAPH_JSON = "graph.json"
MODULE_PY = "module.py"

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


def inputs_record(
    g: CapturedGraph,
    contract: dict[str, Any] | None,
    values: Any = None,
    blobs: Optional[BlobStore] = None,
) -> dict[str, Any]:
    """inputs.json: per input its role, name, layout, range and storage; per output its role.

    With `values` (reference values from capture) and `blobs`, each storage's contents and
    each output's reference value are stored as blobs and named by hash.
    """
    from aotpipe.capture.values import RNG_SEED

    placeholders = [n for n in g.gm.graph.nodes if n.op == "placeholder"]
    layout_source = values.inputs if values is not None else [n.meta.get("val") for n in placeholders]
    groups, member = storage_groups(layout_source)
    bases = storage_base(layout_source, member, groups) if values is not None else None
    storages = []
    for k, grp in enumerate(groups):
        rng = None
        for gi, m in zip(g.inputs, member):
            if m == k and gi.int_range is not None:
                rng = list(gi.int_range)
                break
        if rng is None and bases is not None and not grp.dtype.is_floating_point and grp.dtype != torch.bool \
                and not grp.dtype.is_complex and bases[k].numel():
            # e.g. indices a forward saved for its backward: keep random ones as valid
            rng = [int(bases[k].min()), int(bases[k].max()) + 1]
        storages.append({
            "dtype": str(grp.dtype).removeprefix("torch."),
            "device": grp.device,
            "numel": grp.numel,
            "range": rng,
            "blob": blobs.put(bases[k]) if bases is not None and blobs is not None else None,
        })
    inputs = []
    for i, (gi, m) in enumerate(zip(g.inputs, member)):
        rec: dict[str, Any] = {"index": i, "name": gi.name, "role": gi.role, "target": gi.target}
        if gi.meta is None:
            rec["type"] = getattr(gi.scalar_type, "__name__", "int")
            if values is not None:
                rec["value"] = values.inputs[i]
        else:
            rec["type"] = "tensor"
            rec.update(gi.meta.to_json())
        rec["range"] = list(gi.int_range) if gi.int_range else None
        rec["storage"] = m
        inputs.append(rec)

    out_node = next(n for n in g.gm.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    first_seen: dict[str, int] = {}
    ph_index = {n.name: i for i, n in enumerate(placeholders)}
    outputs = []
    for go, arg in zip(g.outputs, out_args):
        rec = {"index": go.index, "role": go.role, "target": go.target}
        if go.meta is not None:
            rec.update(go.meta.to_json())
        rec["same_as"] = None
        rec["same_as_input"] = None
        rec["blob"] = None
        if isinstance(arg, torch.fx.Node):
            if arg.name in first_seen:
                rec["same_as"] = first_seen[arg.name]  # a de-duplicated output
            else:
                first_seen[arg.name] = go.index
                if arg.op == "placeholder":
                    rec["same_as_input"] = ph_index[arg.name]
                if values is not None and blobs is not None and isinstance(values.outputs[go.index], torch.Tensor):
                    rec["blob"] = blobs.put(values.outputs[go.index])
        outputs.append(rec)
    out: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": g.kind,
        "groups": list(g.input_groups) if g.input_groups else None,
        "rng_seed": RNG_SEED,
        "storages": storages,
        "inputs": inputs,
        "outputs": outputs,
        "saved_values": values is not None and blobs is not None,
    }
    if contract is not None and g.kind in ("forward", "backward"):
        out["partition"] = contract
    return out


def _strip_paths(gm: torch.fx.GraphModule) -> None:
    """Drop node metadata that holds file paths (stack traces) so artefacts carry none."""
    for node in gm.graph.nodes:
        node.meta.pop("stack_trace", None)
    gm.recompile()


_write = write_durable
_fsync_dir = fsync_dir


def clean_stale(out_dir: Path) -> list[str]:
    """Remove what killed runs left behind; returns what was done, one line each.

    A `.tmp-<model>-<pid>` folder of a dead process is deleted. A `.old-<model>-<pid>`
    folder is a complete earlier artefact that was being replaced: it is put back if the
    new one never arrived, else deleted.
    """
    done = []
    if not out_dir.is_dir():
        return done
    for p in sorted(out_dir.iterdir()):
        for prefix in (TMP_PREFIX, OLD_PREFIX):
            if not p.name.startswith(prefix) or not p.is_dir():
                continue
            name, _, pid = p.name[len(prefix):].rpartition("-")
            if not pid.isdigit() or (int(pid) != os.getpid() and pid_alive(int(pid))):
                continue
            final = out_dir / name
            if prefix == OLD_PREFIX and not final.exists() and (p / MANIFEST).exists():
                os.rename(p, final)
                done.append(f"restored {name} from an interrupted replacement")
            else:
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed {p.name} left by an interrupted run")
    return done


def write_model(
    out_dir: Path,
    captured: CapturedGraphs,
    *,
    model_record: dict[str, Any],
    fingerprint: str,
    values: Optional[dict[str, Any]] = None,
    save_inputs: bool = True,
    verify: Optional[Callable[[Path], dict[str, Any]]] = None,
    pass_failures: Optional[list[str]] = None,
) -> WrittenArtifact:
    """Write `<out_dir>/<model>/` from captured graphs; returns what was written.

    `values` are the reference values from capture; with `save_inputs` they are stored as
    blobs. `verify`, if given, is called on the finished folder before it is renamed into
    place, and what it returns is recorded in the manifest under "verification".
    """
    out_dir = Path(out_dir)
    name = captured.model
    final = out_dir / name
    tmp = out_dir / f"{TMP_PREFIX}{name}-{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as e:
        raise OutputError(describe_os_error(e, e.filename or tmp)) from None
    try:
        written = _write_contents(tmp, captured, model_record, fingerprint, values if save_inputs else None, values,
                                  pass_failures or [])
        if verify is not None:
            manifest = json.loads((tmp / MANIFEST).read_text(encoding="utf-8"))
            manifest["verification"] = verify(tmp)
            _write(tmp / MANIFEST, seal(manifest))
            written.bytes = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        _fsync_dir(tmp)
        old = out_dir / f"{OLD_PREFIX}{name}-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(out_dir)
        if old.exists():
            shutil.rmtree(old)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(describe_os_error(e, e.filename or final)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    written.path = final
    return written


def _write_contents(
    root: Path,
    captured: CapturedGraphs,
    model_record: dict[str, Any],
    fingerprint: str,
    saved: Optional[dict[str, Any]],
    checked: Optional[dict[str, Any]],
    pass_failures: list[str],
) -> WrittenArtifact:
    import aotpipe

    blobs = BlobStore(root)
    v = versions()
    contract = captured.contract.to_json() if captured.contract else None
    written = WrittenArtifact(path=root)
    graphs_record: dict[str, Any] = {}
    entries = [(kind, kind, graph_folder_name(captured.model, kind), g, None) for kind, g in captured.graphs.items()]
    entries += [(dg.key, dg.base, f"{graph_folder_name(captured.model, dg.base)}.{dg.chain}", dg.graph, dg)
                for dg in captured.derived.values()]
    for key, kind, folder, g, derived in entries:
        d = root / folder
        d.mkdir()
        _strip_paths(g.gm)
        constants = {}
        layouts = {}
        for node in g.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(g.gm, node.target) if "." not in node.target else g.gm.get_buffer(node.target)
                constants[node.target] = blobs.put(value)
                layouts[node.target] = (list(value.shape), list(value.stride()))
        gj = graph_json.graph_to_json(g.gm, constants)
        gj["kind"] = kind
        gj["input_groups"] = list(g.input_groups) if g.input_groups else None
        _write(d / GRAPH_JSON, dump_json(gj))
        src = codegen.module_source(
            g.gm,
            title=f"{folder}: the {kind} graph of model {captured.model} ({captured.mode} capture)"
            + (f" after passes {derived.chain.replace('+', ', ')}" if derived else ""),
            input_lines=[_input_line(gi) for gi in g.inputs],
            constants={t: (h, *layouts[t]) for t, h in constants.items()},
            version=aotpipe.__version__,
            torch_version=v["torch"],
        )
        _write(d / MODULE_PY, src.encode("utf-8"))
        _write(d / f"{folder}.input", input_meta.dumps(input_meta.input_meta(g.inputs, g.input_groups)))
        gv = saved.get(key) if saved else None
        record = inputs_record(g, contract if derived is None else None, gv, blobs if gv is not None else None)
        if derived is not None:
            record["passes"] = [s["name"] for s in derived.steps]
        _write(d / INPUTS_JSON, dump_json(record))
        if gv is not None:
            _write(d / TRACE, dump_json({"format_version": FORMAT_VERSION, "nodes": gv.trace}))
        graphs_record[key] = {
            "folder": folder,
            "nodes": g.num_nodes,
            "inputs": len(g.inputs),
            "outputs": len(g.outputs),
            "ops": sum(1 for n in g.gm.graph.nodes if n.op == "call_function"),
        }
        if derived is not None:
            graphs_record[key].update(base=derived.base, passes=derived.steps)
        cv = checked.get(key) if checked else None
        if cv is not None:
            graphs_record[key]["eager"] = {
                "checks": [c.to_json() for c in cv.eager],
                "within_tolerance": all(c.within_tolerance for c in cv.eager),
                "skipped": cv.eager_skipped,
            }
        written.graphs.append(WrittenGraph(key, folder, g.num_nodes, len(g.inputs), len(g.outputs)))
        _fsync_dir(d)

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
        "passes": {dg.key: dg.steps for dg in captured.derived.values()},
        "pass_failures": pass_failures,
        "files": files,
    }
    _write(root / MANIFEST, seal(manifest))
    _fsync_dir(root / BLOB_DIR)
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
