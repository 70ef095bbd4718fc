"""Graph views: an artefact's graphs as model-explorer's graph JSON (any graph kind).

model-explorer's own PyTorch adapter reads only inference programs from .pt2 files; this
writes the JSON its web app loads for every graph kind an artefact holds, forward, backward
and joint included: one ``GraphCollection`` (``{"label": <model>, "graphs": [Graph, ...]}``,
built with its ``model_explorer.graph_builder`` classes). Its JSON loader (0.1.34) takes an
object only when it has both ``label`` and ``graphs``; anything else is "Unsupported JSON
format". Built from the records alone: nothing is run.

- nodes are grouped by the module path each came from (graph.json's origin: ``layers.0.attn``
  becomes the namespace ``layers/0/attn``; a ``/`` inside a module's name is written ``\\/``,
  model-explorer's escape, so it stays one layer); inputs in ``inputs``;
- every edge carries its value's dtype[shape] (the source node's ``tensor_shape``, which
  model-explorer draws on the edge);
- a node whose value was checked against eager carries the check as node attributes, and
  its error against the float64 bound (error / bound: at most 1 passes) as node data
  (:func:`node_data`, model-explorer's node-data JSON).

Views of a whole output tree go to ``<tree>/views/<model>/<graph key>.model-explorer.json``
(:func:`view_path`), outside the model folders: a model folder holds only the files its
manifest lists (verify refuses any other). report.html links them there, and also finds a
view a user wrote inside the model folder, ``<model>/views/<graph key>.model-explorer.json``,
where older docs said to put one (:func:`view_candidates`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from aotpipe.errors import AotpipeError
from aotpipe.format import records
from aotpipe.format.folders import is_model_folder, model_folder
from aotpipe.format.records import CheckItem, GraphRecord, InputsRecord, Manifest, NodeRecord

VIEWS_DIR = "views"
SUFFIX = ".model-explorer.json"


def _builder() -> Any:
    try:
        from model_explorer import graph_builder
    except ImportError:
        raise AotpipeError("graph views need model-explorer: pip install ai-edge-model-explorer") from None
    return graph_builder


def _layout(val: records.RawJson) -> Optional[str]:
    """A node's recorded value (graph.json's free-JSON val) in brief: dtype[shape], a symint, a scalar type."""
    if isinstance(val, dict) and "dtype" in val and "shape" in val:
        return f"{val['dtype']}[{', '.join(str(s) for s in val['shape'])}]"
    if isinstance(val, dict) and "symbolic" in val:
        return f"symint {val['symbolic']}"
    if isinstance(val, (bool, int, float)):
        return type(val).__name__
    return None


def _refs(arg: Any, out: list[str]) -> list[str]:
    """Every node an argument refers to, in order."""
    if isinstance(arg, records.NodeRef):
        out.append(arg.node)
    elif isinstance(arg, records.Record):  # a tagged argument (a tuple, a slice...): what it holds
        for k in type(arg).model_fields:
            _refs(getattr(arg, k), out)
    elif isinstance(arg, dict):  # keyword arguments
        for v in arg.values():
            _refs(v, out)
    elif isinstance(arg, list):
        for v in arg:
            _refs(v, out)
    return out


def _label(n: NodeRecord) -> str:
    if n.op == "call_function" and n.target:
        parts = n.target.split(".")
        return parts[1] if len(parts) >= 3 and parts[0] in ("aten", "prims") else parts[-1] if parts[-1] != "default" \
            else parts[-2]
    return {"placeholder": "input", "get_attr": "constant", "output": "output"}.get(n.op, n.op)


def _layer(name: str) -> str:
    """One module name as one model-explorer layer name: its namespace splits on ``/`` except
    where escaped as ``\\/``. A trailing backslash would escape the separator after it, so it
    is shown as U+2216, set minus (the ``module`` attribute keeps the exact path)."""
    name = name.replace("/", "\\/")
    return name[:-1] + "\u2216" if name.endswith("\\") else name


def _namespace(n: NodeRecord) -> str:
    if n.op == "placeholder":
        return "inputs"
    if n.origin is None or not n.origin.module:
        return ""
    return "/".join(_layer(part) for part in n.origin.module.split("."))


def checked_nodes(graph: GraphRecord, inputs: Optional[InputsRecord], checks: list[CheckItem]) -> dict[str, CheckItem]:
    """Per node name, the check of the output it gives (aotpipe's check labels: "output j"
    is the j-th user tensor output, "loss" the first user output, "gradient of T" and "new
    value of T" the output of that role and target)."""
    out_node = next((n for n in graph.nodes if n.op == "output"), None)
    if out_node is None or inputs is None:
        return {}
    args: Any = out_node.args[0] if out_node.args else []
    if isinstance(args, records.TupleArg):
        args = args.tuple
    if not isinstance(args, list):
        args = [args]
    produced = [(_refs(a, []) or [None])[0] if isinstance(a, (records.Record, list)) else None for a in args]
    recs = inputs.outputs
    users = [i for i, r in enumerate(recs) if r.role == "user" and r.dtype is not None]
    placeholders = {i.name: i.target for i in inputs.inputs}
    by_label: dict[str, int] = {}
    for j, i in enumerate(users):
        by_label[f"output {j}"] = i
    if users:
        by_label["loss"] = users[0]
    for i, r in enumerate(recs):
        if r.role == "mutation" and r.target:
            by_label[f"new value of {placeholders.get(r.target) or r.target}"] = i
            by_label.setdefault(f"new value of {r.target}", i)
        elif r.role in ("grad", "none") and r.target:
            by_label[f"gradient of {r.target}"] = i
    found = {}
    for c in checks:
        i = by_label.get(c.what)
        if i is not None and i < len(produced) and produced[i] is not None:
            found[produced[i]] = c
    return found


def ratio(c: CheckItem) -> Optional[float]:
    """A check's error against its bound (at most 1 passes), where both are known."""
    if c.ratio is not None:
        return c.ratio
    if c.error is not None and c.bound:
        return c.error / c.bound
    return None


def explorer_graph(graph: GraphRecord, inputs: Optional[InputsRecord], checks: list[CheckItem], graph_id: str) -> Any:
    """One graph as model-explorer's graph_builder.Graph."""
    gb = _builder()
    layouts = {n.name: n.val for n in graph.nodes}
    roles = {i.name: i for i in inputs.inputs} if inputs is not None else {}
    checked = checked_nodes(graph, inputs, checks)
    g = gb.Graph(id=graph_id, nodes=[])
    for n in graph.nodes:
        node = gb.GraphNode(id=n.name, label=_label(n), namespace=_namespace(n))
        refs = _refs([n.args or [], n.kwargs or {}], [])
        for k, src in enumerate(refs):
            out_id = "0"
            if n.target in ("_operator.getitem", "operator.getitem") and n.args and len(n.args) > 1 \
                    and isinstance(n.args[1], int):
                out_id = str(n.args[1])
            node.incomingEdges.append(gb.IncomingEdge(sourceNodeId=src, sourceNodeOutputId=out_id,
                                                      targetNodeInputId=str(k)))
        attrs = [("op", n.target if n.op == "call_function" else n.op)]
        if n.op == "placeholder" and n.name in roles:
            r = roles[n.name]
            attrs += [("role", r.role)] + ([("target", r.target)] if r.target else [])
        if n.op == "get_attr":
            attrs += [("target", str(n.target)), ("blob", n.blob or "")]
        if n.origin is not None:
            attrs += [(k, str(v)) for k, v in (("module", n.origin.module), ("module_class", n.origin.module_class),
                                               ("source", n.origin.source)) if v is not None]
            if n.origin.of_forward:
                attrs.append(("module_of", "the forward node whose gradient this computes"))
        c = checked.get(n.name)
        if c is not None:
            attrs += [("check", f"{c.what}: {'passed' if c.passed else 'FAILED'} ({c.method})")]
            if ratio(c) is not None:
                attrs.append(("error / float64 bound", f"{ratio(c):.3g}"))
        node.attrs = [gb.KeyValue(key=k, value=v) for k, v in attrs]
        val = layouts.get(n.name)
        items = val if isinstance(val, list) else [val]
        for i, v in enumerate(items):
            text = _layout(v)
            if text is not None:
                node.outputsMetadata.append(gb.MetadataItem(id=str(i), attrs=[
                    gb.KeyValue(key="tensor_shape", value=text),
                    gb.KeyValue(key="__tensor_tag", value=n.name if len(items) == 1 else f"{n.name}[{i}]")]))
        g.nodes.append(node)
    return g


def _read(model: Path) -> Manifest:
    return records.read(Manifest, model / records.MANIFEST, model)[1]


def _model_folder(path: Path) -> Path:
    path = model_folder(path)
    if not is_model_folder(path):
        raise AotpipeError(f"{path}: not an artefact (no manifest.json); pass a model folder")
    return path


def graph_keys(manifest: Manifest, graph: Optional[str]) -> list[str]:
    """The graph keys to view: `graph` (a user's --graph), or all."""
    if graph is None:
        return list(manifest.graphs)
    if graph not in manifest.graphs:
        raise AotpipeError(f"--graph {graph}: this artefact has no such graph; it has {', '.join(manifest.graphs)}")
    return [graph]


def explorer_json(model: Path, graph: Optional[str] = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model-explorer's graphs JSON, its node-data JSON) of an artefact's graphs (one with
    `graph`): the graphs' ids are their keys."""
    model = _model_folder(model)
    manifest = _read(model)
    graphs, data = [], {}
    for key in graph_keys(manifest, graph):
        entry = manifest.graphs[key]
        folder = model / entry.folder
        g = records.read(GraphRecord, folder / records.GRAPH_JSON, model)[1]
        path = folder / records.INPUTS_JSON
        ins = records.read(InputsRecord, path, model)[1] if path.exists() else None
        checks = list(entry.checks.items) if entry.checks is not None else []
        graphs.append(explorer_graph(g, ins, checks, key))
        found = node_data(g, ins, checks)
        if found is not None:
            data[key] = found
    collection = dataclasses.asdict(_builder().GraphCollection(label=manifest.model.name, graphs=graphs))
    if not data:
        return collection, {}
    from model_explorer.node_data_builder import ModelNodeData

    return collection, json.loads(ModelNodeData(graphsData=data).to_json_string())


def node_data(graph: GraphRecord, inputs: Optional[InputsRecord], checks: list[CheckItem]) -> Any:
    """model-explorer's node data of one graph (node_data_builder.GraphNodeData): per checked
    node, its error against the float64 bound (None when no node has one)."""
    from model_explorer import node_data_builder as nd

    results = {name: nd.NodeDataResult(value=ratio(c)) for name, c in checked_nodes(graph, inputs, checks).items()
               if ratio(c) is not None}
    if not results:
        return None
    gnd = nd.GraphNodeData(results=results, name="error / float64 bound",
                           thresholds=[nd.ThresholdItem(value=0.5, bgColor="#c8e6c9"),
                                       nd.ThresholdItem(value=1.0, bgColor="#fff59d"),
                                       nd.ThresholdItem(value=float(1e300), bgColor="#ef9a9a")])
    return gnd


def write_explorer(model: Path, file: Path, graph: Optional[str] = None) -> list[Path]:
    """Write an artefact's graph view(s) to `file`, and where checks give per-node errors,
    their node data beside it (``<file stem>.node-data.json``). Returns the files written."""
    graphs, data = explorer_json(Path(model), graph)
    file = Path(file)
    written = [file]
    _write(file, graphs)
    if data:
        side = file.with_name(file.name.removesuffix(".json") + ".node-data.json")
        _write(side, data)
        written.append(side)
    return written


def _write(path: Path, data: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, allow_nan=False))
        tmp.replace(path)
    except OSError as e:
        raise AotpipeError(f"{path}: cannot write ({e.strerror or e})") from None


def view_path(tree: Path, model: str, key: str) -> Path:
    """Where a tree's view of one graph goes (and where the report links to); `model` is the
    model folder's path under the tree."""
    return Path(tree) / VIEWS_DIR / model / f"{key}{SUFFIX}"


def view_candidates(tree: Path, model_folder: Path, key: str) -> list[Path]:
    """Where a view of one graph of the model in `model_folder` may be, in the order the
    report looks: <tree>/views/<model>/ (what `show --model-explorer-all` writes), then
    <model>/views/ (where docs before it said to write one with `show --model-explorer`)."""
    legacy = Path(model_folder) / VIEWS_DIR / f"{key}{SUFFIX}"
    try:
        model = Path(model_folder).relative_to(tree).as_posix()
    except ValueError:
        return [legacy]
    return [view_path(tree, model, key), legacy] if model != "." else [legacy]


def views_tree(root: Path) -> Path:
    """The tree whose views/ folder gets the views of `root` (a tree, or one artefact: its parent)."""
    root = Path(root)
    return root.parent if is_model_folder(root) else root


def write_tree_views(root: Path) -> dict[str, dict[str, Path]]:
    """A view of every graph of every artefact under `root` (a tree, or one artefact: its
    views go beside it, in its parent's views/). Returns {model: {graph key: path}}."""
    # cryptography (signatures): kept off the torch-free path of ls and report
    from aotpipe.trust.verify import find_artifacts

    root = Path(root)
    models, _ = find_artifacts(root)
    if not models:
        raise AotpipeError(f"{root}: no artefacts found (looked for manifest.json in it and every folder below)")
    tree = views_tree(root)
    views = tree / VIEWS_DIR
    inside = next((m for m in models if views == m or views.is_relative_to(m)), None)
    if inside is not None:
        raise AotpipeError(f"{views}: the views folder would be inside the model folder {inside} (a model named "
                           f"{VIEWS_DIR!r}), whose files its manifest lists; write each view with "
                           "--model-explorer FILE instead")
    out: dict[str, dict[str, Path]] = {}
    for model in models:
        manifest = _read(model)
        for key in manifest.graphs:
            path = view_path(tree, model.relative_to(tree).as_posix(), key)
            write_explorer(model, path, key)
            out.setdefault(manifest.model.name, {})[key] = path
    return out
