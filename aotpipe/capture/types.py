"""What capture returns: graphs with typed descriptions of their inputs and outputs.

These types know nothing of model sources or of the on-disk format; the artifact writer
turns them into files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx



@dataclass(frozen=True)
class TensorMeta:
    """Shape, layout and type of one tensor value."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    storage_offset: int = 0
    requires_grad: bool = False

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(
            shape=tuple(int(s) for s in t.shape),
            stride=tuple(int(s) for s in t.stride()),
            dtype=t.dtype,
            device=t.device,
            storage_offset=int(t.storage_offset()),
            requires_grad=bool(t.requires_grad),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "stride": list(self.stride),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "storage_offset": self.storage_offset,
            "requires_grad": self.requires_grad,
        }


@dataclass(frozen=True)
class GraphInput:
    """One placeholder of a graph and what it stands for.

    `target` is the parameter or buffer name for param/buffer/constant, the user input's
    name for user, the output a tangent belongs to, and the forward output index a saved
    activation comes from.
    """

    name: str
    role: str  # param | buffer | constant | user | tangent | saved | symint
    target: Optional[str]
    meta: Optional[TensorMeta]  # None for int/float scalars
    scalar_type: Optional[type] = None  # int or float, for scalar inputs
    int_range: Optional[tuple[int, int]] = None  # [low, high) for integer tensors


@dataclass(frozen=True)
class GraphOutput:
    """One output of a graph and what it stands for (see GraphInput.target)."""

    index: int
    role: str  # user | mutation | saved | grad | none
    target: Optional[str]
    meta: Optional[TensorMeta]


@dataclass(frozen=True)
class PartitionContract:
    """How a forward graph and its backward graph fit together.

    forward(*primals) returns ``mutated inputs' new values + user outputs + saved``;
    backward(*saved, *tangents) returns one gradient (or None) per primal.
    """

    num_mutated_inputs: int
    num_user_outputs: int
    num_saved_tensors: int
    num_saved_symints: int
    num_tangents: int
    mutated_inputs: tuple[str, ...]  # forward input names, in output order
    grad_of: tuple[Optional[str], ...]  # per backward output: the forward input it is the grad of

    @property
    def num_forward_outputs(self) -> int:
        """Forward outputs that are not saved activations (mutations + user outputs)."""
        return self.num_mutated_inputs + self.num_user_outputs

    def to_json(self) -> dict[str, Any]:
        return {
            "num_mutated_inputs": self.num_mutated_inputs,
            "num_user_outputs": self.num_user_outputs,
            "num_saved_tensors": self.num_saved_tensors,
            "num_saved_symints": self.num_saved_symints,
            "num_tangents": self.num_tangents,
            "mutated_inputs": list(self.mutated_inputs),
            "grad_of": list(self.grad_of),
        }


@dataclass
class CapturedGraph:
    """One graph of one kind, with flat placeholders and described inputs/outputs."""

    kind: str  # inference | forward | backward | joint
    gm: torch.fx.GraphModule
    inputs: list[GraphInput]
    outputs: list[GraphOutput]
    # The joint graph takes [primals, tangents]: the sizes of those groups. None: one flat list.
    input_groups: Optional[tuple[int, ...]] = None

    @property
    def num_nodes(self) -> int:
        return len(self.gm.graph.nodes)


@dataclass
class DerivedGraph:
    """A graph made from a captured one by a pass chain (saved beside it)."""

    base: str  # the kind it was made from
    chain: str  # its passes joined by '+'
    graph: CapturedGraph
    steps: list[dict[str, Any]]  # what each pass did (no timings: the manifest is deterministic)

    @property
    def key(self) -> str:
        return f"{self.base}.{self.chain}"


@dataclass
class CapturedGraphs:
    """Everything one capture produced for one model."""

    model: str
    mode: str
    graphs: dict[str, CapturedGraph]
    contract: Optional[PartitionContract]
    seconds: float
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Graphs made from these by passes, by key "<kind>.<chain>".
    derived: dict[str, DerivedGraph] = field(default_factory=dict)
    # Names of the user inputs in flattened (args, kwargs) order: GraphInput.target of role user.
    user_inputs: list[str] = field(default_factory=list)
    # Real values of inputs with role "constant" (lifted tensor constants), by target.
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
