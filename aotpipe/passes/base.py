"""What every pass works on and returns, and helpers passes share."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.capture.types import GraphInput, GraphOutput
from aotpipe.determinism import op_draws_random
from aotpipe.errors import AotpipeError


@dataclass
class GraphUnderPass:
    """A graph with its inputs described and example values for them.

    `values` are real example inputs bound by position (saved at capture): passes that
    turn inputs into constants (freeze) take their values from here.
    """

    gm: torch.fx.GraphModule
    kind: str
    inputs: list[GraphInput]
    outputs: list[GraphOutput]
    values: list[Any]

    def copy(self) -> "GraphUnderPass":
        gm = copy.deepcopy(self.gm)
        return dataclasses.replace(self, gm=gm, inputs=list(self.inputs), outputs=list(self.outputs),
                                   values=list(self.values))

    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]


@dataclass
class PassResult:
    """What a pass returns: the (possibly) new graph, whether it changed, and what it did."""

    graph: GraphUnderPass
    modified: bool
    stats: dict[str, Any] = field(default_factory=dict)


class PassError(AotpipeError):
    """A pass failed or changed the graph's results; names the pass and those before it."""

    exit_code = 1


def constant_name(gm: torch.fx.GraphModule, hint: str) -> str:
    """A fresh attribute name for a constant, derived from `hint`."""
    base = "_const_" + "".join(c if c.isalnum() else "_" for c in hint).strip("_")
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


def add_constant(gm: torch.fx.GraphModule, value: torch.Tensor, hint: str, before: torch.fx.Node) -> torch.fx.Node:
    """Register `value` on `gm` and return a get_attr node for it, placed before `before`."""
    name = constant_name(gm, hint)
    gm.register_buffer(name, value.detach())
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta["val"] = value
    return node


def is_constant(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "get_attr"


def constant_value(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    return gm.get_buffer(node.target) if "." in node.target else getattr(gm, node.target)


def view_of_constant(gm: torch.fx.GraphModule, node: Any) -> Optional[torch.Tensor]:
    """The value of a constant, or of a chain of views of one (freeze leaves those as views);
    None for anything else."""
    if is_constant(node):
        return constant_value(gm, node)
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
            and len(node.all_input_nodes) == 1):
        return None
    base = view_of_constant(gm, node.all_input_nodes[0])
    if base is None:
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: base)
    return node.target(*args, **kwargs)


def first_get_attr_anchor(gm: torch.fx.GraphModule) -> torch.fx.Node:
    """The node before which new constants go: the first non-placeholder node."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            return n
    raise ValueError("empty graph")


def is_pure(node: torch.fx.Node) -> bool:
    """Whether a call can be evaluated ahead of time or deduplicated: no RNG, no mutation."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return t.__module__ == "_operator"  # operator.getitem
    if op_draws_random(t):
        return False
    schema = t._schema
    return not schema.is_mutable and not any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)


def real_strides(gm: torch.fx.GraphModule, values: list[Any]) -> dict[str, Any]:
    """Each tensor-valued node's (shape, stride) when run on `values`."""
    from aotpipe.execution import run_with_summaries

    _, layouts = run_with_summaries(gm, values, lambda t: (tuple(t.shape), tuple(t.stride())))
    return {k: v for k, v in layouts.items() if not isinstance(v, dict)}  # tuple-valued nodes aside


@dataclass(frozen=True)
class Facts:
    """What a pass may need to know of a node's value when run on the example inputs."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @property
    def channels_last(self) -> bool:
        return len(self.shape) == 4 and self.stride == _channels_last_strides(self.shape)


def _channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def tensor_facts(gm: torch.fx.GraphModule, values: list[Any]) -> dict[str, Facts]:
    """Each tensor-valued node's Facts, from one run of the graph on `values`."""
    from aotpipe.execution import run_with_summaries

    _, out = run_with_summaries(gm, values, lambda t: Facts(tuple(t.shape), tuple(t.stride()), t.dtype,
                                                             t.device.type))
    return {k: v for k, v in out.items() if isinstance(v, Facts)}


def single_user(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The one node that uses `node`, or None if there are none or several."""
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def restride(graph: torch.fx.Graph, x: torch.fx.Node, stride: tuple[int, ...], before: torch.fx.Node) -> torch.fx.Node:
    """Nodes that copy `x` into a dense tensor with the same stride order as `stride`.

    Functional: permute so the wanted order is row-major, make contiguous, permute back.
    """
    ndim = len(stride)
    order = sorted(range(ndim), key=lambda d: -stride[d])  # outermost dim first
    inverse = [order.index(d) for d in range(ndim)]
    with graph.inserting_before(before):
        if order == list(range(ndim)):
            return graph.call_function(torch.ops.aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
        p = graph.call_function(torch.ops.aten.permute.default, (x, order))
        c = graph.call_function(torch.ops.aten.clone.default, (p,), {"memory_format": torch.contiguous_format})
        return graph.call_function(torch.ops.aten.permute.default, (c, inverse))
