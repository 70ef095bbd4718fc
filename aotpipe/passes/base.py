"""What every pass works on and returns, and helpers passes share."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
import torch.fx

from aotpipe.errors import AotpipeError
from aotpipe.format.ir import GraphInput, GraphOutput
from aotpipe.runtime.determinism import op_draws_random
from aotpipe.runtime.execution import layouts_of


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
        """A copy to transform: a new graph and module, sharing the constant tensors (passes
        replace constants, never write into them: a deep copy of a 110M-parameter model
        per pass took longer than the passes)."""
        gm = torch.fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
        gm.meta = dict(self.gm.meta)
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


def _symbolic(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return any(isinstance(x, torch.SymInt) for x in (*v.shape, *v.stride()))
    if isinstance(v, (list, tuple)):
        return any(_symbolic(x) for x in v)
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _fake(v: Any) -> Any:
    """A value as a fake tensor of its layout and device (inside the caller's FakeTensorMode);
    tuples and scalars as they are."""
    if isinstance(v, torch.Tensor):
        extent = 1 + sum((d - 1) * s for d, s in zip(v.shape, v.stride(), strict=True)) if all(v.shape) else 0
        base = torch.empty(v.storage_offset() + extent, dtype=v.dtype, device=v.device)
        return base.as_strided(v.shape, v.stride(), v.storage_offset())
    if isinstance(v, (list, tuple)):
        return type(v)(_fake(x) for x in v)
    return v


def fill_vals(gm: torch.fx.GraphModule) -> int:
    """Record, after a pass, the layout of every call_function node's value (meta["val"], a
    fake tensor) from its inputs' layouts and the constants the graph now holds: a node the pass
    made had none, and one whose inputs it changed (channels_last's weights make a convolution's
    output channels-last) had a stale one. graph.json then describes each value of a pass-made
    graph as it does a captured one's (aotpipe ops --cases keys on them). A node whose op cannot
    run on fake tensors keeps what it had; a graph with symbolic sizes is left as it is. How many
    nodes changed."""
    # torch internals: fake tensors (no memory) of the graph's real layouts
    from torch._subclasses.fake_tensor import FakeTensorMode

    if any(_symbolic(n.meta.get("val")) for n in gm.graph.nodes):
        return 0
    changed = 0
    env: dict[torch.fx.Node, Any] = {}
    with FakeTensorMode():
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = _fake(n.meta.get("val"))
            elif n.op == "get_attr":
                env[n] = _fake(constant_value(gm, n))
            elif n.op == "call_function":
                old = n.meta.get("val")
                try:
                    args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
                    with torch.no_grad():
                        new = n.target(*args, **kwargs)
                except Exception:  # an op with no fake kernel, an input not described: it keeps what it had
                    env[n] = _fake(old)
                    continue
                env[n] = new
                if _layouts(new) != _layouts(old):
                    n.meta["val"] = new
                    changed += 1
    return changed


def _layouts(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype, v.device.type
    if isinstance(v, (list, tuple)):
        return tuple(_layouts(x) for x in v)
    return v if isinstance(v, (int, float, bool)) or v is None else type(v)


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
    """Each tensor-valued node's Facts, from one run of the graph on `values`.

    A run at real size costs what the model's forward does (0.6 s for a ResNet-50 at batch
    8 here), so the result is kept in ``gm.meta`` with the graph and constant layouts it
    was taken on: the next pass of a chain, if the graph has not changed since, reuses it.
    """
    signature = _facts_signature(gm, values)
    cached = gm.meta.get("aotpipe_facts")
    if cached is not None and cached[0] == signature:
        return dict(cached[1])
    out = layouts_of(gm, values, lambda t: Facts(tuple(t.shape), tuple(t.stride()), t.dtype, t.device.type))
    facts = {k: v for k, v in out.items() if isinstance(v, Facts)}
    gm.meta["aotpipe_facts"] = (signature, facts)
    return dict(facts)


class ShapeFacts:
    """Facts from each node's "val", which capture records for every node, running the
    graph (:func:`tensor_facts`) only if a node asked for has none (one a pass made).

    Shapes and dtypes are exact. Strides are capture's: exact until a layout pass changes
    them (it marks ``gm.meta["layouts_changed"]``; :func:`layout_facts` then runs the graph).
    """

    def __init__(self, gm: torch.fx.GraphModule, values: list[Any]):
        self.gm, self.values = gm, values
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.device = next((v.device.type for v in values if isinstance(v, torch.Tensor)), "cpu")
        self.added: dict[str, Facts] = {}
        self.run: Optional[dict[str, Facts]] = None

    def get(self, name: str, default: Any = None) -> Optional[Facts]:
        if name in self.added:
            return self.added[name]
        node = self.nodes.get(name)
        val = node.meta.get("val") if node is not None else None
        if isinstance(val, torch.Tensor):
            return Facts(tuple(val.shape), tuple(val.stride()), val.dtype, self.device)
        if node is None or isinstance(val, (tuple, list)) or node.op == "output" or (
                isinstance(node.target, torch._ops.OpOverload) and len(node.target._schema.returns) != 1):
            return default  # no single tensor: no Facts, as a run gives none either
        if self.run is None:
            self.run = tensor_facts(self.gm, self.values)
        return self.run.get(name, default)

    def __getitem__(self, name: str) -> Facts:
        f = self.get(name)
        if f is None:
            raise KeyError(name)
        return f

    def __setitem__(self, name: str, f: Facts) -> None:
        self.added[name] = f


FactsLike = Union[dict[str, Facts], ShapeFacts]


def layout_facts(gm: torch.fx.GraphModule, values: list[Any]) -> FactsLike:
    """Facts with exact strides: capture's while no layout pass has run (no run of the
    graph: a ViT-B/16's takes 2 s here), else from a run (:func:`tensor_facts`)."""
    return tensor_facts(gm, values) if gm.meta.get("layouts_changed") else ShapeFacts(gm, values)


def remember_facts(gm: torch.fx.GraphModule, values: list[Any], facts: dict[str, Facts],
                   new_nodes: list[torch.fx.Node]) -> None:
    """Keep `facts` for the next pass, after a pass inserted `new_nodes` (layout-only ops:
    permutes, copies) into the graph they were taken on: theirs come from meta kernels on
    their inputs' layouts, with no run of the graph."""
    facts = dict(facts)

    def as_meta(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            f = facts[a.name]
            return torch.empty_strided(f.shape, f.stride, dtype=f.dtype, device="meta")
        return a

    for node in new_nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), as_meta)
        value = node.target(*args, **kwargs)
        device = facts[node.all_input_nodes[0].name].device
        facts[node.name] = Facts(tuple(value.shape), tuple(value.stride()), value.dtype, device)
    gm.meta["aotpipe_facts"] = (_facts_signature(gm, values), facts)


def _facts_signature(gm: torch.fx.GraphModule, values: list[Any]) -> tuple:
    """What a graph run's facts depend on: the graph as it is now (not gm.code, which is
    stale until recompile), each constant's layout, and the input values' layouts."""
    constants = tuple((n.target, tuple(v.shape), tuple(v.stride()), v.dtype)
                      for n in gm.graph.nodes if n.op == "get_attr"
                      for v in [constant_value(gm, n)] if isinstance(v, torch.Tensor))
    inputs = tuple((tuple(v.shape), tuple(v.stride()), v.dtype) if isinstance(v, torch.Tensor) else repr(v)
                   for v in values)
    return str(gm.graph), constants, inputs


def single_user(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The one node that uses `node`, or None if there are none or several."""
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def restride(graph: torch.fx.Graph, x: torch.fx.Node, stride: tuple[int, ...], before: torch.fx.Node,
             created: Optional[list[torch.fx.Node]] = None) -> torch.fx.Node:
    """Nodes that copy `x` into a dense tensor with the same stride order as `stride` (the
    last returned; all of them appended to `created`, if given).

    Functional: permute so the wanted order is row-major, make contiguous, permute back.
    """
    ndim = len(stride)
    order = sorted(range(ndim), key=lambda d: -stride[d])  # outermost dim first
    inverse = [order.index(d) for d in range(ndim)]
    created = [] if created is None else created
    with graph.inserting_before(before):
        if order == list(range(ndim)):
            created.append(graph.call_function(torch.ops.aten.clone.default, (x,),
                                               {"memory_format": torch.contiguous_format}))
            return created[-1]
        p = graph.call_function(torch.ops.aten.permute.default, (x, order))
        c = graph.call_function(torch.ops.aten.clone.default, (p,), {"memory_format": torch.contiguous_format})
        created += [p, c, graph.call_function(torch.ops.aten.permute.default, (c, inverse))]
        return created[-1]

