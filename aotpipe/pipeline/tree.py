"""What an output tree holds, read from disk without running anything: run.json, each model's
manifest, and each graph's graph.json and inputs.json (every file within the artefact limits,
every record validated). The HTML report and `aotpipe ops` read a tree through this; a
hostile tree can be read: no graph is built, no code imported.

A leaf above artifact/: torch-free.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from aotpipe.errors import AotpipeError
from aotpipe.format import records
from aotpipe.format.graph_keys import key_order
from aotpipe.format.records import GraphRecord, InputsRecord, Layout, Manifest, NodeRecord

RUN_JSON = "run.json"


# ---------------------------------------------------------------------------------------
# run.json


def read_run(root: Path) -> Optional[records.RunRecord]:
    """run.json of the output folder `root` as its record, or None where there is none; an
    ArtifactError naming the file and field where it is not a run record."""
    path = root / RUN_JSON
    if not path.is_file():
        return None
    return records.load_run(path)


# ---------------------------------------------------------------------------------------
# Graphs


@dataclass
class GraphView:
    """One graph of a model as its files say: kind (the manifest's key), folder, and its
    graph.json nodes (None where graph.json could not be read: `problem` says why)."""

    key: str
    folder: str
    nodes: Optional[list[NodeRecord]] = None
    inputs: Optional[InputsRecord] = None
    problem: Optional[str] = None
    op_counts: Optional[collections.Counter] = None  # ops(), kept where the nodes were not

    def ops(self) -> collections.Counter:
        """call_function targets and how often each is called."""
        if self.op_counts is not None:
            return self.op_counts
        return collections.Counter(n.target or "?" for n in self.nodes or [] if n.op == "call_function")


@dataclass
class ModelView:
    """One model folder: its manifest (None where unreadable: `problem` says why) and graphs."""

    name: str
    folder: Path
    manifest: Optional[Manifest] = None
    graphs: list[GraphView] = field(default_factory=list)
    problem: Optional[str] = None

    def parameters(self) -> Optional[int]:
        """Elements of the parameters a graph takes (the first graph that lists param inputs)."""
        for g in self.graphs:
            if g.inputs is not None and any(i.role == "param" for i in g.inputs.inputs):
                total = 0
                for i in g.inputs.inputs:
                    if i.role == "param" and i.shape is not None:
                        n = 1
                        for d in i.shape:
                            n *= d
                        total += n
                return total
        return None


def _one_line(e: BaseException) -> str:
    if isinstance(e, AotpipeError):
        return e.lines()[0]
    return f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def read_model(folder: Path, root: Path, keep_nodes: bool = True) -> ModelView:
    """A model folder's manifest and every graph's graph.json and inputs.json, read (never run).
    Without `keep_nodes`, each graph keeps its op counts rather than its nodes (the report: a
    zoo's nodes held at once took 7 GB)."""
    view = ModelView(name=folder.name, folder=folder)
    try:
        view.manifest = records.read(Manifest, folder / records.MANIFEST, root)[1]
    except (AotpipeError, OSError) as e:
        view.problem = _one_line(e)
        return view
    view.name = view.manifest.model.name
    for key in sorted(view.manifest.graphs, key=key_order):
        entry = view.manifest.graphs[key]
        g = GraphView(key=key, folder=entry.folder)
        gdir = folder / entry.folder
        try:
            g.nodes = records.read(GraphRecord, gdir / records.GRAPH_JSON, root)[1].nodes
            if not keep_nodes:
                g.op_counts, g.nodes = g.ops(), None
            if (gdir / records.INPUTS_JSON).exists():
                g.inputs = records.read(InputsRecord, gdir / records.INPUTS_JSON, root)[1]
        except (AotpipeError, OSError) as e:
            g.problem = _one_line(e)
        view.graphs.append(g)
    return view


def read_tree(root: Path, keep_nodes: bool = True, folders: Optional[list[Path]] = None) -> list[ModelView]:
    """Every model folder under `root` (or `root` itself if it is one), read as ModelViews
    (without `keep_nodes`: op counts instead of nodes, see read_model; `folders`: as iter_tree)."""
    return list(iter_tree(root, keep_nodes, folders))


def model_folders(root: Path) -> list[Path]:
    """The model folders under `root` (or `root` itself if it is one), in tree order."""
    return all_model_folders(root)[0]


def all_model_folders(root: Path) -> tuple[list[Path], list[Path]]:
    """(the model folders under `root`, in tree order; the folders that hold a model's graph
    folders but no manifest.json: an artefact cut short or damaged, which verify fails)."""
    # cryptography (signatures): kept off the torch-free path of ls, report and diff
    from aotpipe.trust.verify import find_artifacts

    return find_artifacts(Path(root))


def tree_model_folders(root: Path) -> tuple[list[Path], list[Path]]:
    """all_model_folders of the tree `root` that a command was given; an AotpipeError naming it
    where it is not a folder or holds no artefact at all."""
    root = Path(root)
    if not root.is_dir():
        raise AotpipeError(f"{root}: not a folder; pass a pipeline's output folder or a model folder")
    folders, incomplete = all_model_folders(root)
    if not folders and not incomplete:
        raise AotpipeError(f"{root}: no artefacts found (looked for manifest.json in it and every folder below); "
                           "pass a pipeline's output folder, e.g. artifacts/quickstart")
    return folders, incomplete


def missing_manifest(folder: Path) -> str:
    """The problem of a model folder without its manifest.json, in verify's words."""
    return f"{folder / records.MANIFEST}: missing (an incomplete artefact: run the pipeline again)"


def incomplete_model(folder: Path) -> ModelView:
    """The view of a model folder without its manifest.json (all_model_folders' second list)."""
    return ModelView(name=folder.name, folder=folder, problem=missing_manifest(folder))


def iter_tree(root: Path, keep_nodes: bool = True, folders: Optional[list[Path]] = None) -> Iterator[ModelView]:
    """read_tree's views one at a time, each read when asked for: a caller that keeps only
    what it needs of each (`aotpipe ops`) holds one model's nodes at a time, not a zoo's.
    `folders`: model_folders(root), if the caller already has them."""
    root = Path(root)
    for m in model_folders(root) if folders is None else folders:
        yield read_model(m, root, keep_nodes)


def value_layout(node: NodeRecord) -> Optional[Layout]:
    """A node's recorded value as a tensor layout, or None (a tuple, a scalar, nothing)."""
    from pydantic import ValidationError

    if not isinstance(node.val, dict):
        return None
    try:
        return Layout.model_validate(node.val)
    except ValidationError:
        return None


def node_signature(node: NodeRecord, by_name: dict[str, NodeRecord]) -> str:
    """A call's input signature: dtype and rank of each tensor argument, in order, e.g.
    "float32[2], float32[2]"; scalars and lists as their Python type."""
    parts = []
    for a in node.args or []:
        parts.append(_arg_signature(a, by_name))
    return ", ".join(parts)


def _arg_signature(a: Any, by_name: dict[str, NodeRecord]) -> str:
    if isinstance(a, records.NodeRef):
        src = by_name.get(a.node)
        layout = value_layout(src) if src is not None else None
        if layout is not None and layout.shape is not None:
            return f"{layout.dtype or '?'}[{len(layout.shape)}]"
        return "value"
    if isinstance(a, list):
        inner = {_arg_signature(x, by_name) for x in a}
        return f"list({'|'.join(sorted(inner))})" if inner else "list()"
    if isinstance(a, records.Record):  # a tagged argument: its tag (dtype, device, tuple...)
        return next(iter(type(a).model_fields))
    return type(a).__name__
