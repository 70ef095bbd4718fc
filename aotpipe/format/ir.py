"""What capture returns: graphs with typed descriptions of their inputs and outputs.

These types know nothing of model sources or of the on-disk format; the artifact writer
turns them into files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx

from aotpipe.format.graph_keys import parse_graph_key
from aotpipe.format.records import (
    CaptureRecord,
    DType,
    GraphBreakRecord,
    Layout,
    OutsideGraphs,
    Partition,
    PassRecord,
    SymbolRecord,
    TrustedNamespace,
    updated,
)
from aotpipe.format.source_files import name_files_in
from aotpipe.format.vocabulary import GraphKind


def size_hint(s: Any) -> int:
    """A size as an int: a symbolic one's value at the example sizes, read without a guard
    (``int()`` of a SymInt would specialise the graph's shape environment to it)."""
    if isinstance(s, torch.SymInt):
        hint = s.node.hint
        return int(hint) if hint is not None else int(s)  # unbacked: capture made it concrete already
    return int(s)


def size_expr(s: Any) -> int | str:
    """A size as the format stores it in a symbolic layout: an int, or its expression in the
    graph's symbols as torch prints it (``4*s0``)."""
    if isinstance(s, torch.SymInt):
        expr = s.node.expr
        return int(expr) if getattr(expr, "is_number", False) else str(expr)
    return int(s)


def _symbolic(sizes: tuple[int | str, ...]) -> tuple[int | str, ...] | None:
    return sizes if any(isinstance(x, str) for x in sizes) else None


@dataclass(frozen=True)
class TensorMeta:
    """Shape, layout and type of one tensor value, as torch types (records.Layout is its record,
    by name: :meth:`layout`)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    storage_offset: int = 0
    requires_grad: bool = False
    # A shape-polymorphic graph's value: shape and stride in its symbols (None: all static).
    sym_shape: tuple[int | str, ...] | None = None
    sym_stride: tuple[int | str, ...] | None = None

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        shape, stride = tuple(t.shape), tuple(t.stride())
        return cls(
            shape=tuple(size_hint(s) for s in shape),
            stride=tuple(size_hint(s) for s in stride),
            dtype=t.dtype,
            device=t.device,
            storage_offset=size_hint(t.storage_offset()),
            requires_grad=bool(t.requires_grad),
            sym_shape=_symbolic(tuple(size_expr(s) for s in shape)),
            sym_stride=_symbolic(tuple(size_expr(s) for s in stride)),
        )

    def layout(self) -> Layout:
        """The record of this layout (inputs.json's and the manifest's)."""
        # torch's name of the dtype; Layout refuses one outside records.DTYPES as it validates
        dtype = cast(DType, str(self.dtype).removeprefix("torch."))
        sym = {} if self.sym_shape is None and self.sym_stride is None else {
            "sym_shape": list(self.sym_shape or self.shape), "sym_stride": list(self.sym_stride or self.stride)}
        return Layout(shape=list(self.shape), stride=list(self.stride), dtype=dtype,
                      device=str(self.device), storage_offset=self.storage_offset, requires_grad=self.requires_grad,
                      **sym)


@dataclass(frozen=True)
class GraphInput:
    """One placeholder of a graph and what it stands for.

    `target` is the parameter or buffer name for param/buffer/constant, the user input's
    name for user, the output a tangent belongs to, and the forward output index a saved
    activation comes from.
    """

    name: str
    role: str  # param | buffer | constant | user | tangent | saved | symint | state (a train_step's optimizer state)
    target: str | None
    meta: TensorMeta | None  # None for int/float scalars
    scalar_type: type | None = None  # int or float, for scalar inputs
    int_range: tuple[int, int] | None = None  # [low, high) for integer tensors; random floats drawn uniform there
    sym_expr: str | None = None  # a size input (role symint) of a shape-polymorphic graph: its expression


@dataclass(frozen=True)
class GraphOutput:
    """One output of a graph and what it stands for (see GraphInput.target)."""

    index: int
    role: str  # user | mutation | saved | grad | none | param, state (a train_step's new values)
    target: str | None
    meta: TensorMeta | None


@dataclass
class CapturedGraph:
    """One graph of one kind, with flat placeholders and described inputs/outputs."""

    kind: GraphKind
    gm: torch.fx.GraphModule
    inputs: list[GraphInput]
    outputs: list[GraphOutput]
    # The joint graph takes [primals, tangents]: the sizes of those groups. None: one flat list.
    input_groups: tuple[int, ...] | None = None
    # A shape-polymorphic graph's symbols (graph.json's) and the guards torch derived on them.
    symbols: dict[str, SymbolRecord] = field(default_factory=dict)
    guards: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.gm.graph.nodes)


@dataclass
class DerivedGraph:
    """A graph made from a captured one by a pass chain (saved beside it)."""

    base: str  # the key of the graph it was made from ("inference", "inference_1", ...)
    chain: str  # its passes joined by '+'
    graph: CapturedGraph
    steps: list[PassRecord]  # what each pass did (no timings: the manifest is deterministic)

    @property
    def key(self) -> str:
        return f"{self.base}.{self.chain}"


@dataclass
class Subgraph:
    """One compiled subgraph of a dynamo capture: the keys of its graphs, its partition, and
    the dynamo FX graphs it was captured from (the reference its graphs are checked against).

    `reference` maps a mode ("inference" or "training") to (module, inputs): dynamo's own
    graph of that compile with the parameters and buffers it reads registered on it under
    the model's names, and its user inputs as they were when the model ran.
    """

    index: int
    keys: dict[str, str]  # kind -> key in CapturedGraphs.graphs
    contract: Partition | None = None
    reference: dict[str, tuple[torch.nn.Module, list[Any]]] = field(default_factory=dict)


@dataclass
class CapturedGraphs:
    """Everything one capture produced for one model.

    `graphs` holds every captured graph by key (see aotpipe.format.graph_keys): "forward" for the
    first (for export, the only) subgraph, "forward_<i>" for subgraph i. `contract` is the
    first subgraph's partition; `subgraphs` (dynamo) says which graphs belong together and
    holds each one's own.
    """

    model: str
    mode: str
    graphs: dict[str, CapturedGraph]
    contract: Partition | None
    seconds: float
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Graphs made from these by passes, by key "<kind>.<chain>".
    derived: dict[str, DerivedGraph] = field(default_factory=dict)
    # Names of the user inputs in flattened (args, kwargs) order: GraphInput.target of role user.
    user_inputs: list[str] = field(default_factory=list)
    # Real values of inputs with role "constant" (lifted tensor constants), by target.
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    # Dynamo: one entry per compiled subgraph, in order; empty for a single-graph capture.
    subgraphs: list[Subgraph] = field(default_factory=list)
    graph_breaks: list[GraphBreakRecord] = field(default_factory=list)
    # Mode auto: why export failed, when it fell back to dynamo.
    fallback: str | None = None
    # Each graph's real inputs by key, where capture saw them (dynamo: a later subgraph's
    # user inputs are values the model computed); backward graphs left out. Empty:
    # bind them from the model's state and its example inputs (capture.binding).
    inputs: dict[str, list[Any]] = field(default_factory=dict)
    # Library op namespaces the graphs call, trusted by the pipeline (custom_ops.trust):
    trusted_ops: dict[str, TrustedNamespace] = field(default_factory=dict)
    # Dynamo: what each compile ran outside its graphs; non-empty: the capture is partial.
    outside_graphs: list[OutsideGraphs] = field(default_factory=list)
    # dims: auto: per input, whether its leading dimension stayed dynamic or what specialised it.
    dims_report: list[str] = field(default_factory=list)
    # Named dims asked for, captured at the example's sizes instead, and why (mode auto: dynamo
    # split the model after export failed); None: every named dimension was asked of torch.
    static_sizes: str | None = None
    # A train_step's warm start (models.train_step.StepStart): what its checks run eager steps from.
    step_start: Any = None
    # A train_step's joint traced under torch.autocast (optimizer autocast:), which the step is
    # built from instead of the joint graph; None without mixed precision. Not saved itself.
    step_joint: Any = None
    # One rank of a parallel world (records.DistributedRecord): the manifest's `distributed`.
    distributed: Any = None
    # A per-op case mined from a corpus (records.CaseRecord): the manifest's `case`.
    case: Any = None

    @property
    def partial(self) -> bool:
        """Whether part of the model's computation is in no graph (capture/dynamo.outside_graphs)."""
        return bool(self.outside_graphs)

    def contract_of(self, key: str) -> Partition | None:
        """The partition contract of the subgraph graph `key` belongs to."""
        parsed = parse_graph_key(key)
        index = parsed.subgraph if parsed is not None else 0
        for sg in self.subgraphs:
            if sg.index == index:
                return sg.contract
        return self.contract if index == 0 else None

    def capture_record(self) -> CaptureRecord:
        """The manifest's "capture" entry: mode, options and notes; for a multi-subgraph
        capture also the subgraph count and the graph breaks; for auto, why export failed."""
        # torch's messages quote the model's file by its absolute path: named by import name
        # instead, so the manifest is the same from any folder or checkout.
        more: dict[str, Any] = {}
        if self.subgraphs:
            more.update(subgraphs=len(self.subgraphs),
                        graph_breaks=[updated(b, reason=name_files_in(b.reason)) for b in self.graph_breaks])
        if self.fallback is not None:
            more.update(fallback=name_files_in(self.fallback))
        if self.trusted_ops:
            more.update(trusted_ops=self.trusted_ops)
        if self.outside_graphs:
            more.update(outside_graphs=self.outside_graphs)
        return CaptureRecord(mode=self.mode, options=self.options, notes=[name_files_in(n) for n in self.notes], **more)
