"""Load an artefact folder without executing any code from it.

Graphs are rebuilt from graph.json (ops resolved only through the allow-list of
artifact/ops.py), `.input` pickles go through a restricted unpickler, tensors come from
safetensors blobs checked against their hashes. ``trust_code=True`` imports module.py
instead of rebuilding from graph.json (once it is checked to be the code graph.json
makes): only for artefacts you made yourself.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
import torch.fx
from torch._library.custom_ops import OPDEFS

from aotpipe.artifact import input_meta, precheck, recompute
from aotpipe.artifact.blobs import BlobStore
from aotpipe.artifact.codegen import code_mismatch, graph_constants
from aotpipe.artifact.graph_json import decode_dtype, graph_from_json, read_graph_json
from aotpipe.artifact.ops import OWN_CAPTURE
from aotpipe.artifact.prepack import PACKABLE_TARGETS, prepack
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format import records
from aotpipe.format.folders import model_folder
from aotpipe.format.graph_keys import graph_key, parse_graph_key
from aotpipe.format.limits import (
    NodeBudget,
    check_graphs,
    check_record_bytes,
    check_regular_file,
    check_tensor_bytes,
    extent,
)
from aotpipe.format.records import (  # noqa: F401 (check_version: the loader's callers)
    GRAPH_JSON,
    INPUTS_JSON,
    MANIFEST,
    MODULE_PY,
    TRACE,
    InputRecord,
    InputsRecord,
    Manifest,
    Summary,
    TraceRecord,
    check_version,
)
from aotpipe.format.vocabulary import GRAPH_KINDS
from aotpipe.runtime.devices import LEGACY_PACKING, PACKING, is_packed
from aotpipe.runtime.execution import run_graph
from aotpipe.runtime.tensors import ones, tangent, view_of


@dataclass
class Expected:
    """One recorded output: its value (version 1, or save_values: full; an int, float or
    bool output's from version 3) or only its digest."""

    digest: Optional[str] = None
    summary: Optional[Summary] = None
    value: Any = None
    has_value: bool = False  # value is meaningful (None may be a recorded None)
    spread: Optional[float] = None  # run-to-run spread of an op without a deterministic kernel
    evidence: Any = None  # records.Evidence (version 3): what a replay elsewhere is judged by


@dataclass
class GraphArtifact:
    """One saved graph: its module, input/output records, and saved values if any."""

    kind: str
    folder: Path
    record: InputsRecord  # inputs.json
    # A GraphModule rebuilt from graph.json, or module.py's with trust_code; or a function
    # that builds it on first use (a graph whose constants the loader recomputes).
    built: Any
    blobs: BlobStore
    trace: Optional[TraceRecord] = None
    name: str = ""  # the manifest's key: the kind, or "<kind>.<passes>" for a transformed graph
    # For a backward graph: the forward graph, whose outputs are its saved activations.
    upstream: Optional["GraphArtifact"] = None
    # Builds the graph as graph.json holds it without running anything (see `structure`).
    structure_builder: Optional[Callable[[], torch.fx.GraphModule]] = None
    graph: Optional[records.GraphRecord] = None  # graph.json, as read (once) and validated
    _structure: Optional[torch.fx.GraphModule] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.kind

    @property
    def module(self) -> torch.nn.Module:
        """The graph as a module to run (built now if the loader deferred it: recomputed
        constants run the pass chain on the base graph)."""
        if not isinstance(self.built, torch.nn.Module):
            self.built = self.built()
        return self.built

    @property
    def structure(self) -> torch.fx.GraphModule:
        """The graph exactly as graph.json holds it, for reading (verify, show): rebuilt
        through the allow-list, never run, nothing recomputed. Constants the loader would
        recompute are meta tensors of their recorded layout; weights are not packed."""
        if self._structure is None:
            if self.structure_builder is None:
                raise ArtifactError(f"{self.folder}: no graph.json view of this graph")
            self._structure = self.structure_builder()
        return self._structure

    @property
    def input_file(self) -> Path:
        return self.folder / f"{self.folder.name}.input"

    @property
    def values_mode(self) -> str:
        """What is stored: "full" (every value), "minimal" (what cannot be recomputed), "none"."""
        return self.record.values_mode

    @property
    def has_saved_values(self) -> bool:
        return self.values_mode in ("minimal", "full")

    def input_meta(self) -> list:
        """The .input metadata, read through the restricted unpickler."""
        return input_meta.read(self.input_file)

    def saved_inputs(self, forward_outputs: Optional[list[Any]] = None) -> list[Any]:
        """The example inputs of capture, with their recorded layout and aliasing.

        Stored inputs come from blobs; tangents are ones; a backward's saved activations
        are the forward graph's outputs on its own saved inputs (`forward_outputs` when the
        caller has them, else the forward is run).
        """
        if not self.has_saved_values:
            raise ArtifactError(f"{self.folder}: no saved inputs (the model ran with save_inputs: false)")
        check_record_bytes(self.record.storages, self.record.inputs, self.folder / INPUTS_JSON)
        try:
            return self._saved_inputs(forward_outputs)
        except ArtifactError:
            raise
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
            raise ArtifactError(f"{self.folder / INPUTS_JSON}: malformed ({exception_line(e)})") from None

    def model_tensors(self) -> dict[str, Any]:
        """Its parameters, buffers and lifted constants as stored, by target: what binds a
        graph at other sizes (the user inputs change with the sizes; these do not)."""
        if not self.has_saved_values:
            raise ArtifactError(f"{self.folder}: no saved inputs (the model ran with save_inputs: false)")
        model = [r for r in self.record.inputs if r.role in ("param", "buffer", "constant")]
        check_record_bytes(self.record.storages, model, self.folder / INPUTS_JSON)
        try:
            values = build_inputs(model, self._bases())
            return {r.target or r.name: v for r, v in zip(model, values, strict=True)}
        except ArtifactError:
            raise
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
            raise ArtifactError(f"{self.folder / INPUTS_JSON}: malformed ({exception_line(e)})") from None

    def _bases(self) -> list[torch.Tensor | None]:
        """Each storage's stored elements (None where it has none)."""
        bases: list[torch.Tensor | None] = []
        for s in self.record.storages:
            if not s.blob:
                bases.append(None)
                continue
            t = self.blobs.get(s.blob)
            if t.dtype != decode_dtype(s.dtype) or t.numel() != s.numel:
                raise ArtifactError(f"{self.folder}: blob {s.blob[:12]} does not match its storage record")
            bases.append(t)
        return bases

    def _saved_inputs(self, forward_outputs: Optional[list[Any]]) -> list[Any]:
        bases = self._bases()
        if forward_outputs is None and any(r.source == "forward" for r in self.record.inputs):
            if self.upstream is None:
                raise ArtifactError(f"{self.folder}: its saved activations come from the forward graph, "
                                    "which this artefact does not have")
            forward_outputs = run_graph(self.upstream.module, self.upstream.saved_inputs())
        return build_inputs(self.record.inputs, bases, forward_outputs)

    def expected_outputs(self) -> list[Expected]:
        """The outputs recorded at capture, one per output (de-duplicated ones re-expanded)."""
        if not self.has_saved_values:
            raise ArtifactError(f"{self.folder}: no reference outputs (save_inputs: false)")
        try:
            return self._expected()
        except ArtifactError:
            raise
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
            raise ArtifactError(f"{self.folder / INPUTS_JSON}: malformed ({exception_line(e)})") from None

    def _expected(self) -> list[Expected]:
        inputs: Optional[list[Any]] = None
        out: list[Expected] = []
        # Each stored value counted, and read, once however many outputs name it.
        self.blobs.check_bytes([r.blob for r in self.record.outputs if r.blob is not None and r.same_as is None],
                               self.folder / INPUTS_JSON, "its recorded outputs")
        loaded: dict[str, torch.Tensor] = {}
        for i, rec in enumerate(self.record.outputs):
            if rec.same_as is not None:
                if rec.same_as >= i:
                    raise ArtifactError(f"{self.folder / INPUTS_JSON}: output {i} repeats output {rec.same_as}, "
                                        "which does not come before it")
                out.append(out[rec.same_as])
                continue
            e = Expected(rec.digest, rec.summary, spread=rec.spread,
                         evidence=rec.evidence)
            if rec.blob is not None:
                # Values only: the recorded stride is in `rec`, compared separately at replay.
                shape = rec.shape if rec.shape is not None else [-1]
                if rec.blob not in loaded:
                    loaded[rec.blob] = self.blobs.get(rec.blob)
                e.value, e.has_value = loaded[rec.blob].reshape(shape), True
            elif rec.value is not None:  # an int, float or bool output (version 3)
                e.value, e.has_value = rec.value, True
            elif rec.same_as_input is not None and e.digest is None:
                inputs = inputs if inputs is not None else self.saved_inputs()
                e.value, e.has_value = inputs[rec.same_as_input], True
            elif e.digest is None and e.summary is None:
                e.has_value = True  # a recorded None
            out.append(e)
        return out

    def reference_outputs(self) -> list[Any]:
        """The recorded output values; only where they are stored (version 1, save_values: full)."""
        exp = self.expected_outputs()
        missing = [i for i, e in enumerate(exp) if not e.has_value]
        if missing:
            raise ArtifactError(f"{self.folder}: outputs {missing[:5]} are recorded as digests only "
                                "(save_values: minimal); replay compares them")
        return [e.value for e in exp]


def build_inputs(inputs: list[InputRecord], bases: list[Optional[torch.Tensor]],
                 forward_outputs: Optional[list[Any]] = None, *, random: bool = False) -> list[Any]:
    """Graph inputs as views over storage bases, with recorded shape, stride and offset.

    Inputs whose source is "ones" are ones, "weights" the loss weights of their shape
    (tensors.tangent); "forward" ones are `forward_outputs[k]`; with
    `random`, every tensor comes from its storage whatever its source, and a size the
    forward computed (an int from the forward) is its recorded value, `forward_outputs[k]`
    (the forward's recorded output values) or the input's own: the saved tensors' recorded
    shapes are that size, so random values of those shapes are consistent with it.
    """
    out: list[Any] = []
    for rec in inputs:
        source = "blob" if random else rec.source
        if random and rec.source == "forward" and rec.type != "tensor":
            out.append(_recorded_size(rec, forward_outputs))
            continue
        if source == "forward":
            k = rec.forward_output
            if forward_outputs is None or k is None or k >= len(forward_outputs):
                raise ArtifactError(f"input {rec.name!r} names forward output {k!r}, which does not exist")
            out.append(forward_outputs[k])
            continue
        if rec.type != "tensor":
            kind = {"int": int, "bool": bool, "float": float}[rec.type]
            out.append(kind(rec.value if rec.value is not None else 1))
            continue
        if rec.shape is None or rec.stride is None or rec.dtype is None:
            raise ArtifactError(f"input {rec.name!r}: a tensor input needs a shape, a stride and a dtype")
        if source in ("ones", "weights"):
            dt = decode_dtype(rec.dtype)
            check_tensor_bytes(extent(tuple(rec.shape), tuple(rec.stride)) * dt.itemsize, INPUTS_JSON,
                               f"input {rec.name!r}")
            out.append((ones if source == "ones" else tangent)(rec.shape, rec.stride, dt))
            continue
        k = rec.storage
        if k is None or k >= len(bases) or bases[k] is None:
            raise ArtifactError(f"input {rec.name!r} names storage {k!r}, which has no stored value")
        out.append(view_of(bases[k], rec.shape, rec.stride, rec.storage_offset or 0))
    return out


def _recorded_size(rec: InputRecord, forward_outputs: Optional[list[Any]]) -> Any:
    """A saved int, float or bool a backward takes from the forward, for random inputs: the
    value recorded at capture (the forward's output record, version 3, or the input's own)."""
    k = rec.forward_output
    value = rec.value
    if value is None and forward_outputs is not None and k is not None and k < len(forward_outputs):
        value = forward_outputs[k]
    kind = {"int": int, "bool": bool, "float": float}[rec.type]
    if not isinstance(value, (bool, int, float)):
        raise ArtifactError(f"input {rec.name!r} ({rec.type}) is a value the forward graph computes "
                            f"(forward output {k}), "
                            "and no value of it is recorded (artefacts from before format version 3 record none): "
                            "random inputs cannot be used for this graph, as its saved tensors' shapes depend on it; "
                            "replay it with saved inputs (--inputs saved)")
    return kind(value)


@dataclass
class Artifact:
    """A loaded model artefact: manifest and graphs by key ("forward", "forward_1", ...)."""

    path: Path
    manifest: Manifest
    graphs: dict[str, GraphArtifact] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.manifest.model.name

    def subgraph_keys(self) -> dict[int, dict[str, str]]:
        """Per subgraph index (0 only, for export), its captured graphs' keys by kind."""
        out: dict[int, dict[str, str]] = {}
        for key in self.graphs:
            parsed = parse_graph_key(key)
            if parsed is not None and parsed.chain is None:
                out.setdefault(parsed.subgraph, {})[parsed.kind] = key
        return dict(sorted(out.items()))

    def build_all(self, *, recompute: bool = False) -> "Artifact":
        """Every graph rebuilt from graph.json now (a malformed one fails here), running none:
        constants the loader recomputes are left for the first use of a graph's `module`.
        `recompute=True` builds every runnable module now, recomputing them (which runs
        the pass chain on the base graph: only for an artefact one has just made)."""
        for ga in self.graphs.values():
            try:
                ga.module if recompute else ga.structure
            except ArtifactError:
                raise
            except Exception as e:
                raise ArtifactError(f"{ga.folder}: building the graph failed ({exception_line(e)})") from None
        return self


def _import_module_py(path: Path) -> torch.nn.Module:
    """Import module.py and instantiate its GraphModule class (runs the file's code)."""
    spec = importlib.util.spec_from_file_location(f"aotpipe_artifact_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        raise ArtifactError(f"{path}: cannot import")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        return mod.GraphModule()
    except Exception as e:
        raise ArtifactError(f"{path}: importing it failed ({exception_line(e)})") from None


def load_graph(folder: Path, blobs: BlobStore, *, trust_code: bool = False,
               recompute: Optional[Callable[[], dict[str, torch.Tensor]]] = None,
               trusted: frozenset[str] = frozenset(), nodes: Optional[NodeBudget] = None,
               packing: str = PACKING) -> GraphArtifact:
    """Load one graph folder (`<model>_<kind>_<i>/`): every record validated against the
    format (format/records.py) before anything is built from it. Ops of the library
    namespaces in `trusted` (imported by :func:`grant_trust`) resolve too. `nodes`: the
    artefact's node budget, charged before the graph is validated or built. `packing`: how
    the recorded outputs packed a CPU graph's weights (the manifest's environment.packing),
    which the loader packs it as."""
    folder = Path(folder)
    graph_data: records.RawJson = read_graph_json(folder / GRAPH_JSON, folder)  # its size charged before validating
    if nodes is not None and isinstance(graph_data, dict) and isinstance(graph_data.get("nodes"), list):
        nodes.take(len(graph_data["nodes"]), folder / GRAPH_JSON)
    graph = records.parse(records.GraphRecord, graph_data, folder / GRAPH_JSON)
    _, record = records.read(InputsRecord, folder / INPUTS_JSON, folder)
    check_regular_file(folder / f"{folder.name}{records.INPUT_SUFFIX}", folder)
    trace = None
    if (folder / TRACE).exists() or (folder / TRACE).is_symlink():
        _, trace = records.read(TraceRecord, folder / TRACE, folder)

    def constants(recomputed: Optional[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """graph.json's constants by blob: stored ones from their blobs; recomputed ones from
        `recomputed`, or with None, meta tensors of their recorded layout (nothing runs)."""
        out: dict[str, torch.Tensor] = {}
        for node in graph.nodes:
            if node.op != "get_attr":
                continue
            if node.recompute:
                if recompute is None:
                    raise ArtifactError(f"{folder / GRAPH_JSON}: constant {node.target!r} is to be "
                                        "recomputed, but the graph names no pass chain and base graph")
                if recomputed is None:
                    out[node.blob] = _placeholder(node)
                    continue
                if node.blob not in recomputed:
                    raise ArtifactError(
                        f"{folder / GRAPH_JSON}: constant {node.target!r} recomputed by the pass "
                        "chain differs from the one recorded (other arithmetic on this machine?); an "
                        "artefact made with save_values: full stores it instead")
                out[node.blob] = recomputed[node.blob]
            elif node.blob is not None:
                out[node.blob] = blobs.get(node.blob)
        return out

    where = str(folder / GRAPH_JSON)

    def structure() -> torch.fx.GraphModule:
        return graph_from_json(graph, constants(None), where=where, trusted=trusted)

    deferred = any(n.recompute for n in graph.nodes)
    if trust_code and not _packed_at_load(graph):
        # Only a module.py that is the code graph.json makes is imported (verify's check).
        why = code_mismatch(folder / MODULE_PY, structure(), graph_constants(graph))
        if why:
            raise ArtifactError(f"{why}; --trust-code imports only a module.py that matches graph.json")
        module: Any = _import_module_py(folder / MODULE_PY)
    else:
        # With trust_code too, a graph the loader packs (cpu-fast's convolutions and linears):
        # module.py holds it dense, but its recorded outputs come from the packed graph, so
        # module.py would be another graph than the one replayed and compared.
        def build() -> torch.nn.Module:
            recomputed = recompute() if deferred and recompute is not None else None
            gm = graph_from_json(graph, constants(recomputed), where=where, trusted=trusted)
            # aotpipe's run functions propagate it on fake tensors before any kernel runs, and
            # run its value-indexing ops in checked forms (artifact/precheck.py, checked.py).
            precheck.mark(gm, where, own_capture=OWN_CAPTURE in trusted)
            return _packed_for_this_cpu(gm, packing, where)

        # Recomputing constants runs the pass chain on the base graph: only when the graph
        # is run (replaying the inference graph alone need not pay for the optimised one,
        # and checking an artefact never runs it).
        module = build if deferred else build()
    built = module if isinstance(module, torch.fx.GraphModule) else None
    if built is not None and not is_packed(built):
        return GraphArtifact(record.kind, folder, record, module, blobs, trace, structure_builder=lambda: built,
                             graph=graph)
    return GraphArtifact(record.kind, folder, record, module, blobs, trace, structure_builder=structure, graph=graph)


def _placeholder(node: records.NodeRecord) -> torch.Tensor:
    """A meta tensor with the layout graph.json records for a constant (its dtype if the
    node's value records one): what a graph is rebuilt with when it is only read."""
    val: records.RawJson = node.val if isinstance(node.val, dict) else {}  # free JSON in the format
    try:
        dtype = decode_dtype(val.get("dtype", "float32"))
    except ArtifactError:
        dtype = torch.float32
    if node.shape is None or node.stride is None:
        return torch.empty(0, dtype=dtype, device="meta")
    try:
        return torch.empty_strided(node.shape, node.stride, dtype=dtype, device="meta")
    except (RuntimeError, ValueError, TypeError, OverflowError):
        return torch.empty(0, dtype=dtype, device="meta")  # graph_from_json names the bad layout


def _packed_at_load(graph: records.GraphRecord) -> bool:
    """Whether the graph calls an op :func:`_packed_for_this_cpu` may pack (it is then
    always built from graph.json)."""
    return any(n.op == "call_function" and n.target in PACKABLE_TARGETS for n in graph.nodes)


def _packed_for_this_cpu(gm: torch.fx.GraphModule, packing: str, where: str) -> torch.fx.GraphModule:
    """A graph of the cpu-fast chain with its convolution and linear weights packed for
    this CPU as `packing` says, in memory (aotpipe/artifact/prepack.py); any other graph as it is."""
    try:
        prepack(gm, packing)
    except ArtifactError as e:
        raise ArtifactError(f"{where}: {e}") from None
    return gm


def _recompute(art: "Artifact", key: str, rec: records.GraphEntry) -> Callable[[], dict[str, torch.Tensor]]:
    """For a graph made by passes: its constants, recomputed by the recorded chain on its base graph."""
    def run() -> dict[str, torch.Tensor]:
        base = art.graphs.get(rec.base or "")
        if base is None or not isinstance(base.module, torch.fx.GraphModule):
            raise ArtifactError(f"{art.path}: the {key} graph's constants come from its base graph "
                                f"{rec.base!r}, which is not loaded")
        try:
            return recompute.recompute_constants(base.module, base.record, base.saved_inputs(), rec.passes or [])
        except ArtifactError:
            raise
        except Exception as e:
            raise ArtifactError(f"{art.path}: recomputing the {key} graph's constants failed "
                                f"({exception_line(e)})") from None
    return run


TrustOps = Union[Iterable[str], Mapping[str, Optional[str]]]


# Namespaces torch registers only when a module of its own is imported, so they may be
# missing from the dispatcher when --trust-ops is read.
_TORCH_LAZY_NAMESPACES = ("quantized_decomposed", "fbgemm")


def torch_namespaces() -> frozenset[str]:
    """Op namespaces that are torch's own, never a library's to trust: every namespace the
    dispatcher has ops in (aten, prims, quantized, _quantized, mkldnn, onednn, ...) but a
    library's, with the allow-list's checked namespaces and those torch registers lazily.
    A library's: a module of its name is imported (torchvision, transformers), or its ops
    were defined in Python outside torch's package (torch.library, custom_op)."""
    import os
    import re
    import sys

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    outside = {qualname.split("::")[0] for qualname, opdef in OPDEFS.items()
               if not getattr(getattr(opdef, "_init_fn", None), "__module__", "torch").startswith("torch")}
    first: dict[str, str] = {}
    for name in torch._C._dispatch_get_all_op_names():
        first.setdefault(name.split("::")[0], name)
    own = set(records.CHECKED_NAMESPACES) | set(_TORCH_LAZY_NAMESPACES)
    for ns, op in first.items():
        if ns in own or ns in outside or (ns in sys.modules and ns != "torch"):
            continue
        where = re.search(r"debug: registered at (.*):\d+", torch._C._dispatch_dump(op))
        path = where.group(1) if where else ""
        if (path.endswith(".py") or path.startswith("<")) and not os.path.abspath(path).startswith(torch_dir):
            continue  # torch.library.Library used by a library's own Python file
        own.add(ns)
    return frozenset(own)


def trust_problem(ns: Any, module: Optional[str] = None) -> Optional[str]:
    """Why namespace `ns` (its ops defined by `module`, if named) cannot be trusted, or None."""
    why = records.library_namespace_problem(ns)
    if why:
        return why
    if ns in torch_namespaces():
        return (f"{ns!r} is one of torch's own op namespaces; --trust-ops is for a library's ops, and torch's "
                "are admitted one by one by aotpipe's allow-list (aotpipe/artifact/ops.py)")
    if module is not None and (module == "torch" or module.startswith("torch.")):
        return f"{module!r} is part of torch; --trust-ops names a library's module"
    return None


def parse_trust(entries: Iterable[str]) -> dict[str, Optional[str]]:
    """``--trust-ops`` values ("ns" or "ns=module") as {namespace: module to import or None}."""
    out: dict[str, Optional[str]] = {}
    for entry in entries:
        ns, sep, module = entry.partition("=")
        if sep and not all(p.isidentifier() for p in module.split(".")):
            raise ArtifactError(f"--trust-ops {entry}: {module!r} is not a module name (a.b.c)")
        why = trust_problem(ns, module if sep else None)
        if why:
            raise ArtifactError(f"--trust-ops {entry}: {why}")
        out[ns] = module if sep else None
    return out


def _registered(qualname: str) -> bool:
    ns, _, name = qualname.partition("::")
    try:
        return isinstance(getattr(getattr(torch.ops, ns), name), torch._ops.OpOverloadPacket)
    except (AttributeError, RuntimeError):
        return False


def grant_trust(manifest: Manifest, where: Path, trust_ops: TrustOps) -> frozenset[str]:
    """The library namespaces whose ops this artefact's graphs may call: those its manifest
    records (its pipeline trusted them) that the user trusts too; each one's module imported.

    The module imported is the user's (``ns=module``), else the one the manifest records, but
    only if it lies in the package named like the namespace: an artefact never makes aotpipe
    import a module outside the library its user named. A namespace the user does not trust
    is left out, and loading a graph that calls one of its ops fails, saying how to trust it.
    """
    granted = trust_ops if isinstance(trust_ops, Mapping) else parse_trust(trust_ops)
    for ns, module in granted.items():
        why = trust_problem(ns, module)
        if why:
            raise ArtifactError(f"trust_ops {ns}: {why}")
    recorded = manifest.capture.trusted_ops or {}
    out = set()
    for ns, rec in recorded.items():
        if ns not in granted:
            continue
        if granted[ns] is None and all(_registered(op) for op in rec.ops):
            out.add(ns)  # already imported (by the user, or by the capture that wrote it)
            continue
        module = granted[ns] or rec.module
        if module is None:
            raise ArtifactError(f"{where}: the artefact does not record which module defines the {ns} ops "
                                f"({', '.join(rec.ops[:3])}); name it: --trust-ops {ns}=<module>")
        if granted[ns] is None and module != ns and not module.startswith(ns + "."):
            raise ArtifactError(f"{where}: the artefact says module {module!r} defines the {ns} ops; aotpipe "
                                f"imports on an artefact's word only modules of the package {ns!r}; if you "
                                f"trust that module, name it: --trust-ops {ns}={module}")
        try:
            importlib.import_module(module)
        except Exception as e:
            raise ArtifactError(f"{where}: importing {module} (which defines the {ns} ops) failed "
                                f"({exception_line(e)}); install the library the artefact was made with") from None
        out.add(ns)
    return frozenset(out)


def load(path: str | Path, *, trust_code: bool = False, trust_ops: TrustOps = (), own_capture: bool = False) -> Artifact:
    """Load a model artefact folder (the one holding manifest.json), without running its code.

    Any malformed or hostile content is an ArtifactError naming the file. A graph whose
    constants are recomputed (save_values: minimal after folding passes) is built on first
    use of its `module`, which runs the pass chain on its base graph; its `structure` (what
    checking reads) runs nothing. :meth:`Artifact.build_all` rebuilds every graph's
    structure now. With `trust_code`, module.py is imported only if it is the code
    graph.json makes (artifact/codegen.py's check, as verify's).

    `trust_ops` names the library op namespaces (``["transformers"]``, or
    ``{"mylib": "my_project.ops"}`` naming the module to import) whose ops the graphs may
    call, if the artefact's pipeline trusted them too (:func:`grant_trust`). `own_capture`:
    the folder is one this process's capture just wrote (the checks after writing), whose
    graphs are never refused for their ops (ops.OWN_CAPTURE).
    """
    try:
        return _load(path, trust_code=trust_code, trust_ops=trust_ops, own_capture=own_capture)
    except ArtifactError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, RuntimeError, RecursionError) as e:
        raise ArtifactError(f"{path}: malformed artefact ({exception_line(e)})") from None


def _load(path: str | Path, *, trust_code: bool = False, trust_ops: TrustOps = (), own_capture: bool = False
          ) -> Artifact:
    p = Path(path)
    p = model_folder(p)  # a graph folder: load its model
    if not p.is_dir():
        raise ArtifactError(f"{path}: no such artefact folder")
    _, manifest = records.read(Manifest, p / MANIFEST, p)
    trusted = grant_trust(manifest, p, trust_ops) | ({OWN_CAPTURE} if own_capture else set())
    blobs = BlobStore(p)
    art = Artifact(p, manifest)
    graphs = manifest.graphs
    check_graphs(len(graphs), p / MANIFEST)
    budget = NodeBudget()
    keys = {k: parse_graph_key(k) for k in graphs}
    # The packing the recorded outputs were computed with: before it was recorded, MKL's.
    packing = (manifest.environment.packing if manifest.environment is not None else None) or LEGACY_PACKING
    # Captured graphs by subgraph, then kind; then the graphs made from them by passes.
    kinds = sorted((k for k, parsed in keys.items() if parsed is not None and parsed.chain is None),
                   key=lambda k: (keys[k].subgraph, GRAPH_KINDS.index(keys[k].kind)))
    kinds += sorted(k for k, r in graphs.items() if k not in kinds and r.base is not None)  # base: a key
    for kind in kinds:
        rec = graphs[kind]
        if (p / rec.folder).is_symlink():
            raise ArtifactError(f"{p / rec.folder}: a link, not a folder of this artefact")
        art.graphs[kind] = load_graph(p / rec.folder, blobs, trust_code=trust_code,
                                      recompute=_recompute(art, kind, rec) if rec.base else None, trusted=trusted,
                                      nodes=budget, packing=packing)
        art.graphs[kind].name = kind
    for key, ga in art.graphs.items():
        if ga.kind == "backward" and keys[key] is not None:
            ga.upstream = art.graphs.get(graph_key("forward", keys[key].subgraph))
    return art
