"""Writes one model's artefact folder from captured graphs, atomically.

The writer knows nothing of model sources: it takes :class:`CapturedGraphs` and the model
record (spec and fingerprint) as data. The folder is written under a temporary name, its
files fsynced, then renamed into place, so a folder under its final name is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

import aotpipe
from aotpipe.artifact import codegen, graph_json, input_meta, provenance
from aotpipe.artifact.blobs import BLOB_DIR, BlobStore, encode
from aotpipe.artifact.fsio import OLD_PREFIX, TMP_PREFIX, OutputError, describe_os_error, fsync_dir, write_durable
from aotpipe.artifact.manifest import dump_json, file_sha256, seal, versions
from aotpipe.errors import ArtifactError
from aotpipe.format import records as fmt
from aotpipe.format.graph_keys import graph_folder_name, parse_graph_key
from aotpipe.format.ir import CapturedGraph, CapturedGraphs, DerivedGraph, GraphInput
from aotpipe.format.records import FORMAT_VERSION, GRAPH_JSON, INPUT_SUFFIX, INPUTS_JSON, MANIFEST, MODULE_PY, TRACE
from aotpipe.format.vocabulary import GraphKind
from aotpipe.runtime.determinism import RNG_SEED, environment, intra_op_threads
from aotpipe.runtime.tensors import storage_base, storage_groups


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


def _source(gi: GraphInput, save_values: str) -> str:
    """Where a replay gets an input's value: a stored blob, a tangent made afresh (its loss
    weights; ones, the same, for a scalar), or the forward."""
    if save_values == "full":
        return "blob"
    if gi.role == "tangent":
        return "ones" if gi.meta is not None and not gi.meta.shape else "weights"
    if gi.role in ("saved", "symint"):
        return "forward"
    return "blob"


def inputs_record(
    g: CapturedGraph,
    contract: fmt.Partition | None,
    values: list[Any] | None = None,
    blobs: BlobStore | None = None,
    save_values: str = "minimal",
    saved: bool | None = None,
) -> fmt.InputsRecord:
    """inputs.json: per input its role, name, layout, range, storage and source; per output its role.

    With `values` (the graph's real inputs) and `blobs`, the storages that cannot be
    recomputed are stored as blobs (with save_values "full", all of them). Output reference
    digests are added after the written graph has run (:func:`set_outputs`).
    """
    placeholders = [n for n in g.gm.graph.nodes if n.op == "placeholder"]
    layout_source = values if values is not None else [n.meta.get("val") for n in placeholders]
    groups, member = storage_groups(layout_source)
    bases = storage_base(layout_source, member, groups) if values is not None else None
    sources = [_source(gi, save_values) for gi in g.inputs]
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
        stored = any(m == k and src == "blob" for m, src in zip(member, sources))
        storages.append(fmt.StorageRecord(
            dtype=str(grp.dtype).removeprefix("torch."), device=grp.device, numel=grp.numel, range=rng,
            blob=blobs.put(bases[k]) if stored and bases is not None and blobs is not None else None))
    inputs = []
    for i, (gi, m) in enumerate(zip(g.inputs, member)):
        more: dict[str, Any] = {}
        if gi.meta is None:
            more["type"] = getattr(gi.scalar_type, "__name__", "int")
            if values is not None:
                more["value"] = values[i]
            if gi.sym_expr is not None:
                more["sym_value"] = gi.sym_expr
        else:
            more["type"] = "tensor"
            more.update(_layout_fields(gi.meta.layout()))
        if sources[i] == "forward":
            more["forward_output"] = _forward_index(gi.target)
        inputs.append(fmt.InputRecord(index=i, name=gi.name, role=gi.role, target=gi.target, source=sources[i],
                                      range=list(gi.int_range) if gi.int_range else None, storage=m, **more))

    out_node = next(n for n in g.gm.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    first_seen: dict[str, int] = {}
    ph_index = {n.name: i for i, n in enumerate(placeholders)}
    outputs = []
    for go, arg in zip(g.outputs, out_args):
        same_as = same_as_input = None
        if isinstance(arg, torch.fx.Node):
            if arg.name in first_seen:
                same_as = first_seen[arg.name]  # a de-duplicated output
            else:
                first_seen[arg.name] = go.index
                if arg.op == "placeholder":
                    same_as_input = ph_index[arg.name]
        outputs.append(fmt.OutputRecord(
            index=go.index, role=go.role, target=go.target,
            **(_layout_fields(go.meta.layout()) if go.meta is not None else {}),
            same_as=same_as, same_as_input=same_as_input, blob=None, digest=None, summary=None, spread=None))
    has_values = (values is not None and blobs is not None) if saved is None else saved
    more = {"partition": contract} if contract is not None and g.kind in (GraphKind.FORWARD, GraphKind.BACKWARD) else {}
    return fmt.InputsRecord(
        format_version=FORMAT_VERSION, kind=g.kind, groups=list(g.input_groups) if g.input_groups else None,
        rng_seed=RNG_SEED, values=save_values if has_values else "none", storages=storages, inputs=inputs,
        outputs=outputs, **more)


def _layout_fields(layout: fmt.Layout) -> dict[str, Any]:
    """A layout's fields, to give a record that is a layout (an input, an output)."""
    return {k: getattr(layout, k) for k in layout.model_fields_set}


def _set(record: fmt.Record, **fields: Any) -> None:
    """Set fields of a record being built (each one is then written, None included)."""
    for k, v in fields.items():
        setattr(record, k, v)


def dump(record: fmt.Record) -> dict[str, Any]:
    """A record as the JSON data written: every field that was set, None included."""
    return record.model_dump(mode="json", exclude_unset=True)


def _forward_index(target: str | None) -> int:
    """k of a saved input's target "forward_output[k]"."""
    if target and target.startswith("forward_output[") and target.endswith("]"):
        return int(target[len("forward_output["):-1])
    raise ValueError(f"a saved input names {target!r}, not forward_output[k]")


def set_outputs(record: fmt.InputsRecord, outputs: list[OutputReference], blobs: BlobStore | None,
                values: list[Any] | None) -> None:
    """Put reference digests, summaries and spreads (and with `values`, blobs) into an inputs record."""
    for rec, o in zip(record.outputs, outputs):
        if o.layout is not None:
            _set(rec, **_layout_fields(o.layout))  # the layout the written graph really gives
        _set(rec, digest=o.digest, summary=o.summary, spread=o.spread)
        if o.value is not None:
            _set(rec, value=o.value)  # an int, float or bool output (version 3)
        if o.range is not None:
            _set(rec, range=o.range)  # an integer tensor output's [low, high) (version 3)
        if blobs is not None and o.evidence is not None:
            _set(rec, evidence=fmt.Evidence(blob=blobs.put(o.evidence_values), **o.evidence))
    if blobs is None or values is None:
        return
    for rec, v in zip(record.outputs, values):
        if rec.same_as is None and isinstance(v, torch.Tensor) and (record.values == "full" or rec.spread is not None):
            _set(rec, blob=blobs.put(v))


def _refuse_subgraphs(gm: torch.fx.GraphModule) -> None:
    """One line for a graph that calls graphs of its own (torch.cond, torch.while_loop, a
    map or a checkpoint kept whole: torch's higher-order ops), which graph.json has no place for."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            raise ArtifactError(f"graph calls torch.ops.higher_order.{node.target.name()} (node {node.name!r}), an "
                                "op that runs subgraphs of its own, which graph.json cannot store; write the model "
                                "without it (torch.cond: a torch.where of both branches, where both can run)")


def _refuse_sparse(gm: torch.fx.GraphModule, key: str) -> None:
    """One line for a graph with a tensor that is not strided (sparse COO, CSR, ...: a
    ``x.to_sparse()`` in forward, a sparse parameter), naming the first such node, its op and
    the model's line: the format stores dense tensors (sizes, strides, one storage) only."""
    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        layout = next((v.layout for v in (vals if isinstance(vals, (tuple, list)) else [vals])
                       if isinstance(v, torch.Tensor) and v.layout != torch.strided), None)
        if layout is None:
            continue
        what = f"input {node.name!r}" if node.op == "placeholder" else \
            f"node {node.name!r} ({graph_json.target_name(node.target) if node.op == 'call_function' else node.op})"
        where = node.meta.get(provenance.SOURCE_KEY)
        raise ArtifactError(f"the {key} graph's {what}{f' at {where}' if where else ''} is a {layout} tensor: sparse "
                            "tensors are outside aotpipe's format (dense, strided tensors only); keep that tensor "
                            "dense in the model (drop the to_sparse / to_dense round trip)")


def _strip_paths(gm: torch.fx.GraphModule) -> None:
    """Drop node metadata that holds file paths (stack traces) so artefacts carry none,
    keeping each node's source line relative to its package (graph.json's origin).

    The module is not recompiled: its code's comments still name the files, but that code is
    never written (module.py is rendered afresh from the stripped graph, graph.json holds no
    code), and a recompile of a 23K-node joint graph takes seconds."""
    provenance.keep_source(gm)
    for node in gm.graph.nodes:
        node.meta.pop("stack_trace", None)


_write = write_durable
_fsync_dir = fsync_dir


@dataclass
class OutputReference:
    """What running a written graph recorded of one output (nothing, when it was not recorded)."""

    layout: fmt.Layout | None = None  # the layout the written graph gives
    digest: str | None = None
    summary: fmt.Summary | None = None
    spread: float | None = None  # run-to-run spread of a nondeterministic op
    value: bool | int | float | None = None  # a Python scalar output
    range: list[int] | None = None  # an integer tensor's [low, high)
    evidence: dict[str, Any] | None = None  # records.Evidence's fields but its blob (aotpipe.runtime.evidence.record)
    evidence_values: torch.Tensor | None = None  # the sampled values the evidence blob holds


@dataclass
class GraphOutcome:
    """What running one written graph gave: reference records and check results."""

    outputs: list[OutputReference]
    values: list[Any] | None = None  # the output values (stored as blobs with save_values: full)
    # per node: a sampled summary of its value (checks.written.trace_nodes)
    trace: dict[str, fmt.Summary | fmt.TupleSummary] | None = None
    checks: fmt.GraphChecks | None = None  # into manifest graphs.<key>
    nondeterministic: list[str] | None = None  # ops without a deterministic kernel (graphs.<key>)
    verification: fmt.VerificationEntry | None = None  # manifest verification.<key>


@dataclass
class CheckOutcome:
    """What the check of a written (not yet final) folder decided."""

    graphs: dict[str, GraphOutcome] = field(default_factory=dict)
    drop: list[str] = field(default_factory=list)  # derived graphs whose checks failed: not kept
    verification: dict[str, fmt.VerificationEntry] = field(default_factory=dict)  # extra entries (the chain)
    checks: fmt.CheckTotals | None = None  # the manifest's totals
    dims: fmt.DimsRecord | None = None  # a shape-polymorphic capture's dimensions and size checks


def write_model(
    out_dir: Path,
    captured: CapturedGraphs,
    *,
    model_record: dict[str, Any],
    fingerprint: str,
    inputs: dict[str, list[Any]] | None = None,
    save_values: str = "minimal",
    check: Callable[[Path], CheckOutcome] | None = None,
    pass_failures: list[str] | None = None,
    skipped_passes: list[fmt.SkippedPass] | None = None,
    sign: Callable[[Path], None] | None = None,
) -> WrittenArtifact:
    """Write `<out_dir>/<model>/` from captured graphs; returns what was written.

    `inputs` are each graph's real input values; the ones that cannot be recomputed are
    stored as blobs (all of them with `save_values` "full"). `check`, if given, is called on
    the written folder before it is renamed into place: it runs the written graphs and
    returns their reference outputs and check results, which go into inputs.json, trace.json
    and the manifest. `sign`, if given, is called on the finished folder before it is
    renamed into place (signature.json goes in with the rest, atomically). A caller that
    does its own work between the steps uses :func:`staged_model`, as the job does.
    """
    with staged_model(out_dir, captured, model_record=model_record, fingerprint=fingerprint, inputs=inputs,
                      save_values=save_values, skipped_passes=skipped_passes) as staged:
        outcome = staged.check(check) if check is not None else CheckOutcome()
        written = staged.finish(outcome, pass_failures=pass_failures, sign=sign)
    return written


@dataclass
class StagedModel:
    """A model folder written but not yet in place: :meth:`check` runs a check on it (at the
    thread count the manifest records), :meth:`finish` seals its manifest and signs it, and
    the :func:`staged_model` block renames it into place when it ends."""

    folder: Path
    captured: CapturedGraphs
    header: dict[str, Any]
    written: WrittenArtifact
    graphs_record: dict[str, fmt.GraphEntry]
    records: dict[str, _Written]
    threads: int
    finished: bool = False

    def check(self, check: Callable[[Path], CheckOutcome]) -> CheckOutcome:
        """`check` on the staged folder: the graphs' reference outputs and check results."""
        with intra_op_threads(self.threads):
            return check(self.folder)

    def finish(self, outcome: CheckOutcome | None = None, *, pass_failures: list[str] | None = None,
               sign: Callable[[Path], None] | None = None) -> WrittenArtifact:
        """The manifest sealed with the check's `outcome`, and the folder signed if `sign`;
        what was written (its path is the final one once the block has ended)."""
        _finish(self.folder, self.captured, self.written, self.graphs_record, self.records,
                outcome if outcome is not None else CheckOutcome(), self.header, pass_failures or [])
        if sign is not None:
            sign(self.folder)
        self.finished = True
        return self.written


@contextlib.contextmanager
def staged_model(
    out_dir: Path,
    captured: CapturedGraphs,
    *,
    model_record: dict[str, Any],
    fingerprint: str,
    inputs: dict[str, list[Any]] | None = None,
    save_values: str = "minimal",
    skipped_passes: list[fmt.SkippedPass] | None = None,
) -> Iterator[StagedModel]:
    """`<out_dir>/<model>/`'s graphs written in a folder beside it; the block checks and
    finishes it (:class:`StagedModel`), and it is renamed into place when the block ends
    (removed if the block raises, or ends without finishing it)."""
    final = Path(out_dir) / captured.model
    with _staged(final) as tmp:
        header = dict(
            format_version=FORMAT_VERSION,
            fingerprint=fingerprint,
            versions=versions(),
            # Less its pass chain: each chain is written once, as it ran, in the entry of the
            # graph it made (the fingerprint still covers the configured chain).
            model=fmt.ModelRecord.model_validate({k: v for k, v in model_record.items() if k != "passes"}),
            capture=captured.capture_record(),
            save_values=save_values if inputs is not None else "none",
            # The reference outputs are recorded by the check, in this process, at this thread count.
            environment=(env := environment()),
            # optional passes that failed and were left out (none: the field is not written)
            **({"skipped_passes": list(skipped_passes)} if skipped_passes else {}),
            # one rank of a parallel world (its peers read it before the check: checks/distributed.py)
            **({"distributed": captured.distributed} if captured.distributed is not None else {}),
            # a per-op case mined from a corpus (aotpipe ops --cases)
            **({"case": captured.case} if captured.case is not None else {}),
        )
        written, graphs_record, records = _write_graphs(tmp, captured, inputs, save_values, header)
        staged = StagedModel(tmp, captured, header, written, graphs_record, records, env.threads)
        yield staged
        if not staged.finished:
            raise RuntimeError(f"{final}: the staged model was never finished; nothing was put in place")
    written.path = final


@contextlib.contextmanager
def _staged(final: Path) -> Iterator[Path]:
    """A temporary folder beside `final` to write it in, renamed into place (replacing what
    is there) when the block ends, removed if it raises. OSErrors are OutputErrors."""
    tmp = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as e:
        raise OutputError(describe_os_error(e, e.filename or tmp)) from None
    try:
        yield tmp
        _into_place(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(describe_os_error(e, e.filename or final)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# What every part of one artefact must agree on to be joined (the rest is each part's graphs).
_SHARED_FIELDS = ("format_version", "fingerprint", "versions", "model", "save_values", "environment")


def join_parts(parts: list[Path], out_dir: Path, name: str, *,
               notes: Callable[[list[list[str]]], list[str]] | None = None,
               sign: Callable[[Path], None] | None = None) -> WrittenArtifact:
    """`<out_dir>/<name>/` from folders that each hold some of its graphs; returns what was written.

    Each part is a model folder write_model wrote from a capture of the same model (same
    fingerprint, versions, environment and capture options) with some of its graph kinds,
    checked. Their graph folders and blobs are moved into one folder, which gets one
    manifest: the parts' graphs, verification entries and pass failures together, the
    capture notes of each part in turn less those an earlier part has (or as `notes` joins
    the parts' lists: what a capture mode knows of its own notes), the check totals summed,
    the files hashed again. The folder is signed (`sign`) and renamed into place as
    write_model does. The parts are consumed. An ArtifactError if they disagree on anything
    but their graphs.
    """
    out_dir = Path(out_dir)
    manifests = [fmt.parse(fmt.Manifest, json.loads((p / MANIFEST).read_bytes()), p / MANIFEST) for p in parts]
    first = manifests[0]
    for p, m in zip(parts[1:], manifests[1:]):
        for f in _SHARED_FIELDS:
            if getattr(m, f) != getattr(first, f):
                raise ArtifactError(f"{p}: its manifest's {f} is not {parts[0]}'s: the parts of one artefact "
                                    "must come from one model, spec and machine")
        if (m.capture.mode, m.capture.options) != (first.capture.mode, first.capture.options):
            raise ArtifactError(f"{p}: captured with other options than {parts[0]}")
    if any(m.capture.subgraphs or m.capture.fallback or m.passes for m in manifests):
        raise ArtifactError("the parts hold subgraphs, a fallback capture or old pass records: only parts of a "
                            "one-graph-per-kind capture are joined")
    graphs: dict[str, fmt.GraphEntry] = {}
    partition = None
    verification: dict[str, fmt.VerificationEntry] = {}
    trusted: dict[str, fmt.TrustedNamespace] = {}
    for p, m in zip(parts, manifests):
        for key, entry in m.graphs.items():
            if key in graphs or any(e.folder == entry.folder for e in graphs.values()):
                raise ArtifactError(f"{p}: graph {key} ({entry.folder}) is in another part too")
            graphs[key] = entry
        if m.partition is not None:
            if partition is not None:
                raise ArtifactError(f"{p}: a second forward/backward partition")
            partition = m.partition
        verification.update(m.verification or {})
        for ns, t in (m.capture.trusted_ops or {}).items():
            ops = sorted(set(t.ops) | set(trusted[ns].ops)) if ns in trusted else t.ops
            trusted[ns] = fmt.TrustedNamespace(module=t.module, ops=ops)
    joined_notes = (notes or _notes_in_turn)([list(m.capture.notes) for m in manifests])
    totals = [m.checks for m in manifests if m.checks is not None]
    checks = None
    if totals:
        checks = fmt.CheckTotals(**{
            f: None if all(getattr(t, f) is None for t in totals) else sum(getattr(t, f) or 0 for t in totals)
            for f in fmt.CheckTotals.model_fields})
    written = WrittenArtifact(path=out_dir / name)
    with _staged(out_dir / name) as tmp:
        for p, m in zip(parts, manifests):
            for entry in m.graphs.values():
                os.rename(p / entry.folder, tmp / entry.folder)
                _fsync_dir(tmp / entry.folder)
            if (p / BLOB_DIR).is_dir():
                (tmp / BLOB_DIR).mkdir(exist_ok=True)
                for blob in (p / BLOB_DIR).iterdir():  # content-addressed: a name in both parts is one blob
                    os.replace(blob, tmp / BLOB_DIR / blob.name)
        capture = fmt.updated(first.capture, notes=joined_notes, **({"trusted_ops": trusted} if trusted else {}))
        _seal(tmp, written, **{f: getattr(first, f) for f in _SHARED_FIELDS}, capture=capture, graphs=graphs,
              partition=partition, pass_failures=[f for m in manifests for f in m.pass_failures],
              verification=verification or None, **({"checks": checks} if checks is not None else {}))
        written.graphs = [WrittenGraph(key, e.folder, e.nodes, e.inputs, e.outputs) for key, e in graphs.items()]
        if sign is not None:  # after counting, as write_model counts
            sign(tmp)
    return written


def _notes_in_turn(parts: list[list[str]]) -> list[str]:
    """Each part's notes in turn, less those an earlier part has (one capture says a note once)."""
    out: list[str] = []
    for part in parts:
        earlier = set(out)
        out += [n for n in part if n not in earlier]
    return out


def _into_place(tmp: Path, final: Path) -> None:
    """A complete folder `tmp` renamed to `final` (replacing what is there), fsynced."""
    _fsync_dir(tmp)
    old = final.parent / f"{OLD_PREFIX}{final.name}-{os.getpid()}"
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


def graph_entries(captured: CapturedGraphs) -> list[tuple[str, GraphKind, str, CapturedGraph, DerivedGraph | None]]:
    """(key, kind, folder, graph, derived or None) of every graph to write, raw graphs first.

    Folders are graph_dumper_aot's <model>_<kind>_<subgraph>, then .<chain> for a derived graph.
    """
    entries: list[tuple[str, GraphKind, str, CapturedGraph, DerivedGraph | None]] = [
        (key, g.kind, graph_folder_name(captured.model, key), g, None) for key, g in captured.graphs.items()]
    entries += [(dg.key, dg.graph.kind, graph_folder_name(captured.model, dg.key), dg.graph, dg)
                for dg in captured.derived.values()]
    return entries


def _write_graphs(
    root: Path,
    captured: CapturedGraphs,
    inputs: dict[str, list[Any]] | None,
    save_values: str,
    header: dict[str, Any],
) -> tuple[WrittenArtifact, dict[str, fmt.GraphEntry], dict[str, _Written]]:
    blobs = BlobStore(root)
    v = versions()
    written = WrittenArtifact(path=root)
    graphs_record: dict[str, fmt.GraphEntry] = {}
    records: dict[str, _Written] = {}
    for key, kind, folder, g, derived in graph_entries(captured):
        d = root / folder
        d.mkdir()
        _strip_paths(g.gm)
        _refuse_subgraphs(g.gm)
        _refuse_sparse(g.gm, key)
        constants = {}
        layouts = {}
        computed: dict[str, tuple[str, torch.Tensor]] = {}
        for node in g.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(g.gm, node.target) if "." not in node.target else g.gm.get_buffer(node.target)
                # Flat, like input storages: a frozen weight shares the blob of the weight it was.
                flat = value.reshape(-1)
                digest = encode(flat)[0]
                if derived is not None and save_values == "minimal" and inputs is not None \
                        and not blobs.has(digest):
                    computed[node.target] = (digest, flat)  # made by the passes from stored weights
                else:
                    constants[node.target] = blobs.put(flat)
                layouts[node.target] = (list(value.shape), list(value.stride()))
        recompute = _worth_recomputing(computed, blobs)
        for target, (digest, flat) in computed.items():
            constants[target] = digest if target in recompute else blobs.put(flat)
        symbolic = {"symbols": {k: dump(r) for k, r in g.symbols.items()}, "guards": g.guards or None} \
            if g.symbols else {}
        graph = fmt.parse(fmt.GraphRecord, {**graph_json.graph_to_json(g.gm, constants), "kind": kind,
                                            "input_groups": list(g.input_groups) if g.input_groups else None,
                                            **symbolic},
                          d / GRAPH_JSON)
        for node in graph.nodes:
            if node.op == "get_attr" and node.target in recompute:
                _set(node, recompute=True)
        _write(d / GRAPH_JSON, dump_json(dump(graph), compact=True))
        src = codegen.module_source(
            g.gm,
            title=f"{folder}: the {kind} graph of model {captured.model} ({captured.mode} capture"
            + (f", subgraph {parse_graph_key(key).subgraph})" if captured.subgraphs else ")")
            + (f" after passes {derived.chain.replace('+', ', ')}" if derived else ""),
            input_lines=[_input_line(gi) for gi in g.inputs],
            constants={t: (h, *layouts[t]) for t, h in constants.items()},
            version=aotpipe.__version__,
            torch_version=v.torch,
        )
        _write(d / MODULE_PY, src.encode("utf-8"))
        _write(d / f"{folder}{INPUT_SUFFIX}", input_meta.dumps(input_meta.input_meta(g.inputs, g.input_groups)))
        values = inputs.get(key) if inputs else None
        contract = captured.contract_of(key) if derived is None else None
        record = inputs_record(g, contract, values, blobs if values is not None else None, save_values,
                               saved=inputs is not None)
        if derived is not None:
            _set(record, passes=[s.name for s in derived.steps])
        _write(d / INPUTS_JSON, dump_json(dump(record), compact=True))  # complete enough to load; outputs filled in later
        records[key] = _Written(record, graph)
        chain: dict[str, Any] = {"base": derived.base, "passes": list(derived.steps)} if derived is not None else {}
        graphs_record[key] = fmt.GraphEntry(
            folder=folder, nodes=g.num_nodes, inputs=len(g.inputs), outputs=len(g.outputs),
            ops=sum(1 for n in g.gm.graph.nodes if n.op == "call_function"), **chain)
        written.graphs.append(WrittenGraph(key, folder, g.num_nodes, len(g.inputs), len(g.outputs)))
    # Enough of a manifest for the loader (no file list yet), so the check can run the written
    # graphs; the final one replaces it (a killed run leaves only a .tmp- folder, which is removed).
    _write(root / MANIFEST, _sealed(**header, graphs=graphs_record, files={}))
    return written, graphs_record, records


@dataclass
class _Written:
    """One graph folder's records as written: inputs.json's (outputs filled in after the
    check) and graph.json's."""

    inputs: fmt.InputsRecord
    graph: fmt.GraphRecord


def _sealed(**fields: Any) -> bytes:
    """manifest.json's bytes: a Manifest of `fields`, sealed with the checksum of its content."""
    return seal(dump(fmt.Manifest(checksum="0" * 64, **fields)))


# Constants the passes computed are recomputed at load (not stored) only when that saves
# real bytes: at least this much, and this share of what is stored already.
RECOMPUTE_MIN_BYTES = 1 << 20
RECOMPUTE_MIN_SHARE = 0.05


def _worth_recomputing(computed: dict[str, tuple[str, torch.Tensor]], blobs: BlobStore) -> set[str]:
    """The targets whose values the loader will recompute: all of them, or none when they
    are too small to repay a pass-chain run at every load."""
    size = sum(t.numel() * t.element_size() for _, t in computed.values())
    stored = sum(p.stat().st_size for p in blobs.dir.glob("*.safetensors")) if blobs.dir.is_dir() else 0
    if size >= RECOMPUTE_MIN_BYTES and size >= RECOMPUTE_MIN_SHARE * stored:
        return set(computed)
    return set()


def _finish(
    root: Path,
    captured: CapturedGraphs,
    written: WrittenArtifact,
    graphs_record: dict[str, fmt.GraphEntry],
    records: dict[str, _Written],
    outcome: CheckOutcome,
    header: dict[str, Any],
    pass_failures: list[str],
) -> None:
    """Reference outputs and traces into the graph folders, then the sealed manifest."""
    blobs = BlobStore(root)
    for key in outcome.drop:
        shutil.rmtree(root / graphs_record[key].folder, ignore_errors=True)
        graphs_record.pop(key)
        records.pop(key)
    written.graphs = [g for g in written.graphs if g.kind in graphs_record]
    verification: dict[str, fmt.VerificationEntry] = {}
    for key, w in records.items():
        record, entry = w.inputs, graphs_record[key]
        d = root / entry.folder
        go = outcome.graphs.get(key)
        if go is not None:
            set_outputs(record, go.outputs, blobs if record.values != "none" else None, go.values)
            _write(d / INPUTS_JSON, dump_json(fmt.check_written(fmt.InputsRecord, dump(record), d / INPUTS_JSON),
                                              compact=True))
            if go.trace is not None:
                trace = dump(fmt.TraceRecord(format_version=FORMAT_VERSION, sampled=True, nodes=go.trace))
                _write(d / TRACE, dump_json(fmt.check_written(fmt.TraceRecord, trace, d / TRACE), compact=True))
            if go.checks is not None:
                _set(entry, checks=go.checks)
            if go.nondeterministic is not None:
                _set(entry, nondeterministic=go.nondeterministic)
            if go.verification is not None:
                verification[key] = go.verification
        _fsync_dir(d)
    verification.update(outcome.verification)
    _remove_unused_blobs(root, records)
    _seal(root, written, **header, graphs=graphs_record, partition=captured.contract, pass_failures=pass_failures,
          verification=verification or None, **({"checks": outcome.checks} if outcome.checks is not None else {}),
          **({"dims": outcome.dims} if outcome.dims is not None else {}))


def _seal(root: Path, written: WrittenArtifact, **fields: Any) -> None:
    """The final manifest.json of the folder `root`: `fields` and every other file's sha256,
    sealed, checked as readers will check it; `written` gets the folder's size."""
    files = {p.relative_to(root).as_posix(): file_sha256(p)
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}
    sealed = _sealed(**fields, files=files)
    fmt.parse(fmt.Manifest, json.loads(sealed), root / MANIFEST)  # what readers will check
    _write(root / MANIFEST, sealed)
    if (root / BLOB_DIR).exists():
        _fsync_dir(root / BLOB_DIR)
    written.bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    written.files = sum(1 for p in root.rglob("*") if p.is_file())


def _remove_unused_blobs(root: Path, records: dict[str, _Written]) -> None:
    """Blobs only a dropped graph used go with it."""
    used = set()
    for w in records.values():
        used |= {s.blob for s in w.inputs.storages if s.blob}
        used |= {o.blob for o in w.inputs.outputs if o.blob}
        used |= {o.evidence.blob for o in w.inputs.outputs if o.evidence is not None}
        used |= {n.blob for n in w.graph.nodes if n.op == "get_attr" and n.blob and not n.recompute}
    blob_dir = root / BLOB_DIR
    if blob_dir.is_dir():
        for p in blob_dir.iterdir():
            if p.name.removesuffix(".safetensors") not in used:
                p.unlink()


__all__ = ["write_model", "join_parts", "graph_folder_name", "graph_entries", "BLOB_DIR", "CheckOutcome", "GraphOutcome",
           "OutputReference", "WrittenArtifact", "WrittenGraph"]
