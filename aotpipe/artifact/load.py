"""Load an artefact folder without executing any code from it.

Graphs are rebuilt from graph.json (ops resolved only through the allow-list of
artifact/ops.py), `.input` pickles go through a restricted unpickler, tensors come from
safetensors blobs checked against their hashes. ``trust_code=True`` imports module.py
instead of rebuilding from graph.json: only for artefacts you made yourself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.fx

from aotpipe.artifact import input_meta
from aotpipe.artifact.blobs import BlobStore
from aotpipe.artifact.graph_json import decode_dtype, graph_from_json, read_graph_json
from aotpipe.artifact.limits import check_record_bytes, check_regular_file, read_json  # noqa: F401 (read_json: replay)
from aotpipe.artifact.manifest import FORMAT_VERSION, MANIFEST, READABLE_VERSIONS
from aotpipe.artifact.writer import GRAPH_JSON, INPUTS_JSON, MODULE_PY, TRACE
from aotpipe.errors import ArtifactError

GRAPH_KINDS = ("inference", "forward", "backward", "joint")


def check_version(data: Any, where: Path) -> None:
    version = data.get("format_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ArtifactError(
            f"{where}: format version {version!r}; this aotpipe reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}" + ("; upgrade aotpipe to read it" if newer else "")
        )


@dataclass
class Expected:
    """One recorded output: its value (version 1, or save_values: full) or only its digest."""

    digest: Optional[str] = None
    summary: Optional[dict[str, Any]] = None
    value: Any = None
    has_value: bool = False  # value is meaningful (None may be a recorded None)
    spread: Optional[float] = None  # run-to-run spread of an op without a deterministic kernel


@dataclass
class GraphArtifact:
    """One saved graph: its module, input/output records, and saved values if any."""

    kind: str
    folder: Path
    record: dict[str, Any]  # inputs.json
    # A GraphModule rebuilt from graph.json, or module.py's with trust_code; or a function
    # that builds it on first use (a graph whose constants the loader recomputes).
    built: Any
    blobs: BlobStore
    trace: Optional[dict[str, Any]] = None
    name: str = ""  # the manifest's key: the kind, or "<kind>.<passes>" for a transformed graph
    # For a backward graph: the forward graph, whose outputs are its saved activations.
    upstream: Optional["GraphArtifact"] = None

    def __post_init__(self) -> None:
        self.name = self.name or self.kind

    @property
    def module(self) -> torch.nn.Module:
        """The graph as a module (built now if the loader deferred it)."""
        if not isinstance(self.built, torch.nn.Module):
            self.built = self.built()
        return self.built

    @property
    def input_file(self) -> Path:
        return self.folder / f"{self.folder.name}.input"

    @property
    def values_mode(self) -> str:
        """What is stored: "full" (every value), "minimal" (what cannot be recomputed), "none"."""
        if "values" in self.record:
            return self.record["values"]
        return "full" if self.record.get("saved_values") else "none"  # format version 1

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
        check_record_bytes(self.record, self.folder / "inputs.json")
        try:
            return self._saved_inputs(forward_outputs)
        except ArtifactError:
            raise
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
            raise ArtifactError(f"{self.folder / 'inputs.json'}: malformed ({e.__class__.__name__}: {e})") from None

    def _saved_inputs(self, forward_outputs: Optional[list[Any]]) -> list[Any]:
        bases: list[Optional[torch.Tensor]] = []
        for s in self.record["storages"]:
            if not s.get("blob"):
                bases.append(None)
                continue
            t = self.blobs.get(s["blob"])
            if t.dtype != decode_dtype(s["dtype"]) or t.numel() != s["numel"]:
                raise ArtifactError(f"{self.folder}: blob {s['blob'][:12]} does not match its storage record")
            bases.append(t)
        if forward_outputs is None and any(r.get("source") == "forward" for r in self.record["inputs"]):
            if self.upstream is None:
                raise ArtifactError(f"{self.folder}: its saved activations come from the forward graph, "
                                    "which this artefact does not have")
            from aotpipe.execution import run_graph

            forward_outputs = run_graph(self.upstream.module, self.upstream.saved_inputs())
        return build_inputs(self.record, bases, forward_outputs)

    def expected_outputs(self) -> list[Expected]:
        """The outputs recorded at capture, one per output (de-duplicated ones re-expanded)."""
        if not self.has_saved_values:
            raise ArtifactError(f"{self.folder}: no reference outputs (save_inputs: false)")
        try:
            return self._expected()
        except ArtifactError:
            raise
        except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
            raise ArtifactError(f"{self.folder / 'inputs.json'}: malformed ({e.__class__.__name__}: {e})") from None

    def _expected(self) -> list[Expected]:
        inputs: Optional[list[Any]] = None
        out: list[Expected] = []
        for rec in self.record["outputs"]:
            if rec["same_as"] is not None:
                out.append(out[rec["same_as"]])
                continue
            e = Expected(rec.get("digest"), rec.get("summary"), spread=rec.get("spread"))
            if rec["blob"] is not None:
                # Values only: the recorded stride is in `rec`, compared separately at replay.
                e.value, e.has_value = self.blobs.get(rec["blob"]).reshape(rec["shape"]), True
            elif rec["same_as_input"] is not None and e.digest is None:
                inputs = inputs if inputs is not None else self.saved_inputs()
                e.value, e.has_value = inputs[rec["same_as_input"]], True
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


def build_inputs(record: dict[str, Any], bases: list[Optional[torch.Tensor]],
                 forward_outputs: Optional[list[Any]] = None) -> list[Any]:
    """Graph inputs as views over storage bases, with recorded shape, stride and offset.

    Inputs whose source is "ones" are ones; "forward" ones are `forward_outputs[k]`.
    """
    from aotpipe.tensors import view_of

    out: list[Any] = []
    for rec in record["inputs"]:
        source = rec.get("source", "blob")
        if source == "forward":
            k = rec["forward_output"]
            if forward_outputs is None or not isinstance(k, int) or not 0 <= k < len(forward_outputs):
                raise ArtifactError(f"input {rec.get('name')!r} names forward output {k!r}, which does not exist")
            out.append(forward_outputs[k])
            continue
        if rec["type"] != "tensor":
            kind = int if rec["type"] == "int" else (bool if rec["type"] == "bool" else float)
            out.append(kind(rec.get("value", 1)))
            continue
        if source == "ones":
            from aotpipe.artifact.limits import check_tensor_bytes
            from aotpipe.tensors import extent, ones

            dt = decode_dtype(rec["dtype"])
            check_tensor_bytes(extent(tuple(rec["shape"]), tuple(rec["stride"])) * dt.itemsize, "inputs.json",
                               f"input {rec.get('name')!r}")
            out.append(ones(rec["shape"], rec["stride"], dt))
            continue
        k = rec["storage"]
        if not isinstance(k, int) or not 0 <= k < len(bases) or bases[k] is None:
            raise ArtifactError(f"input {rec.get('name')!r} names storage {k!r}, which has no stored value")
        out.append(view_of(bases[k], rec["shape"], rec["stride"], rec["storage_offset"]))
    return out


@dataclass
class Artifact:
    """A loaded model artefact: manifest and graphs by kind."""

    path: Path
    manifest: dict[str, Any]
    graphs: dict[str, GraphArtifact] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.manifest.get("model", {}).get("name", self.path.name)

    def build_all(self) -> "Artifact":
        """Every graph's module built now (what verify needs: a deferred one may fail)."""
        for ga in self.graphs.values():
            try:
                ga.module
            except ArtifactError:
                raise
            except Exception as e:
                raise ArtifactError(f"{ga.folder}: building the graph failed ({e.__class__.__name__}: {e})") from None
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
        raise ArtifactError(f"{path}: importing it failed ({e.__class__.__name__}: {e})") from None


def _check_record(record: Any, where: Path) -> None:
    """The shape of inputs.json: lists of objects where lists of objects belong."""
    for key in ("inputs", "outputs", "storages"):
        items = record.get(key)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ArtifactError(f"{where}: {key!r} must be a list of objects")
    for i, rec in enumerate(record["inputs"]):
        if not isinstance(rec.get("type"), str) or not isinstance(rec.get("role"), str):
            raise ArtifactError(f"{where}: input {i} has no type or role")
    for i, rec in enumerate(record["outputs"]):
        for key in ("role", "same_as", "same_as_input", "blob"):
            if key not in rec:
                raise ArtifactError(f"{where}: output {i} has no {key!r}")


def load_graph(folder: Path, blobs: BlobStore, *, trust_code: bool = False,
               recompute: Optional[Callable[[], dict[str, torch.Tensor]]] = None) -> GraphArtifact:
    """Load one graph folder (`<model>_<kind>_<i>/`)."""
    folder = Path(folder)
    graph_data = read_graph_json(folder / GRAPH_JSON, folder)
    record = read_json(folder / INPUTS_JSON, folder)
    check_regular_file(folder / f"{folder.name}.input", folder)
    check_version(graph_data, folder / GRAPH_JSON)
    check_version(record, folder / INPUTS_JSON)
    _check_record(record, folder / INPUTS_JSON)
    if trust_code:
        module: torch.nn.Module = _import_module_py(folder / MODULE_PY)
    else:
        def build() -> torch.nn.Module:
            constants = {}
            recomputed: Optional[dict[str, torch.Tensor]] = None
            for node in graph_data.get("nodes", []):
                if isinstance(node, dict) and node.get("op") == "get_attr":
                    if node.get("recompute") is True:
                        if recompute is None:
                            raise ArtifactError(f"{folder / GRAPH_JSON}: constant {node.get('target')!r} is to be "
                                                "recomputed, but the graph names no pass chain and base graph")
                        recomputed = recompute() if recomputed is None else recomputed
                        if node.get("blob") not in recomputed:
                            raise ArtifactError(
                                f"{folder / GRAPH_JSON}: constant {node.get('target')!r} recomputed by the pass "
                                "chain differs from the one recorded (other arithmetic on this machine?); an "
                                "artefact made with save_values: full stores it instead")
                        constants[node.get("blob")] = recomputed[node.get("blob")]
                    else:
                        constants[node.get("blob")] = blobs.get(node.get("blob"))
            return graph_from_json(graph_data, constants, where=str(folder / GRAPH_JSON))

        # Recomputing constants runs the pass chain: only when the graph is used (replaying
        # the inference graph alone need not pay for the optimised one).
        deferred = any(isinstance(n, dict) and n.get("recompute") is True for n in graph_data.get("nodes", []))
        module = build if deferred else build()
    trace = read_json(folder / TRACE, folder) if (folder / TRACE).exists() or (folder / TRACE).is_symlink() else None
    if trace is not None:
        check_version(trace, folder / TRACE)
    kind = record.get("kind")
    if kind not in GRAPH_KINDS:
        raise ArtifactError(f"{folder / INPUTS_JSON}: unknown graph kind {kind!r}")
    return GraphArtifact(kind, folder, record, module, blobs, trace)


def _recompute(art: "Artifact", key: str, rec: dict[str, Any]) -> Callable[[], dict[str, torch.Tensor]]:
    """For a graph made by passes: its constants, recomputed by the recorded chain on its base graph."""
    def run() -> dict[str, torch.Tensor]:
        from aotpipe.passes.manager import recompute_constants

        base = art.graphs.get(rec["base"])
        if base is None or not isinstance(base.module, torch.fx.GraphModule):
            raise ArtifactError(f"{art.path}: the {key} graph's constants come from its base graph "
                                f"{rec['base']!r}, which is not loaded")
        try:
            return recompute_constants(base.module, base.record, base.saved_inputs(), rec["passes"])
        except ArtifactError:
            raise
        except Exception as e:
            raise ArtifactError(f"{art.path}: recomputing the {key} graph's constants failed "
                                f"({e.__class__.__name__}: {e})") from None
    return run


def load(path: str | Path, *, trust_code: bool = False) -> Artifact:
    """Load a model artefact folder (the one holding manifest.json), without running its code.

    Any malformed or hostile content is an ArtifactError naming the file. A graph whose
    constants are recomputed (save_values: minimal after folding passes) is built on first
    use of its `module`; :meth:`Artifact.build_all` builds every graph now.
    """
    try:
        return _load(path, trust_code=trust_code)
    except ArtifactError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, RuntimeError, RecursionError) as e:
        raise ArtifactError(f"{path}: malformed artefact ({e.__class__.__name__}: {e})") from None


def _load(path: str | Path, *, trust_code: bool = False) -> Artifact:
    p = Path(path)
    if (p / GRAPH_JSON).exists() and not (p / MANIFEST).exists():
        p = p.parent  # a graph folder: load its model
    if not p.is_dir():
        raise ArtifactError(f"{path}: no such artefact folder")
    manifest = read_json(p / MANIFEST, p)
    check_version(manifest, p / MANIFEST)
    blobs = BlobStore(p)
    art = Artifact(p, manifest)
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict):
        raise ArtifactError(f"{p / MANIFEST}: no graphs record")
    kinds = [k for k in GRAPH_KINDS if k in graphs]
    kinds += sorted(k for k, r in graphs.items() if k not in GRAPH_KINDS and isinstance(r, dict)
                    and r.get("base") in GRAPH_KINDS)
    for kind in kinds:
        rec = graphs[kind]
        folder = rec.get("folder") if isinstance(rec, dict) else None
        if not isinstance(folder, str) or "/" in folder or "\\" in folder or folder.startswith("."):
            raise ArtifactError(f"{p / MANIFEST}: bad folder name for the {kind} graph: {folder!r}")
        if (p / folder).is_symlink():
            raise ArtifactError(f"{p / folder}: a link, not a folder of this artefact")
        art.graphs[kind] = load_graph(p / folder, blobs, trust_code=trust_code,
                                      recompute=_recompute(art, kind, rec) if rec.get("base") else None)
        art.graphs[kind].name = kind
    if "backward" in art.graphs:
        art.graphs["backward"].upstream = art.graphs.get("forward")
    return art
