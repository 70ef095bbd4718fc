"""Data-dependent sizes in captured graphs, made concrete from the example inputs.

A model with data-dependent ops (``nonzero``, ``torch.where(mask)``, boolean indexing:
top-k routing in a mixture of experts) traces to a graph whose values have sizes torch
cannot know before running (unbacked symbols, ``u0``). The graph computes them at run
time and stays general; what aotpipe records about it (each node's shape in graph.json,
the shapes of the inputs and outputs in the records, a backward's saved tensors) is a
size, so it records the sizes the graph's values have on the example inputs, found by
running the graph on them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from aotpipe.errors import CaptureError
from aotpipe.runtime.determinism import op_draws_random


def _symbolic(v: Any) -> bool:
    """Whether a node's value (tensor, scalar, or a list of them) has a size known only at run time."""
    return bool(free_unbacked_symbols(v)) if v is not None else False


def has_data_dependent_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether any node of `gm` has a size (or a scalar value) only known at run time."""
    return any(_symbolic(n.meta.get("val")) for n in gm.graph.nodes)


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def example_values(gm: torch.fx.GraphModule, inputs: list[Any]) -> dict[str, Any]:
    """Every node's value when `gm` runs on `inputs`, by node name (the generator is left as it was)."""
    rec = _Recorder(gm)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        rec.run(*inputs)
    return rec.values


def make_concrete(gm: torch.fx.GraphModule, values: dict[str, Any], what: str) -> None:
    """Replace each data-dependent size in `gm`'s node metadata by the size of the node's
    example value in `values` (by node name), and drop the range assertions torch.export
    adds on such sizes (see drop_size_assertions)."""
    drop_size_assertions(gm)
    fake_mode: Optional[FakeTensorMode] = None
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if not _symbolic(val):
            continue
        if node.name not in values:
            raise CaptureError(f"{what} graph: node {node.name} has a data-dependent size and no example value "
                               "to record it from")
        fake_mode = fake_mode or FakeTensorMode(allow_non_fake_inputs=True)
        node.meta["val"] = pytree.tree_map(lambda x: _concrete(x, fake_mode), values[node.name])


def _concrete(x: Any, fake_mode: FakeTensorMode) -> Any:
    if isinstance(x, torch.Tensor):
        return fake_mode.from_tensor(x)
    return x


_ASSERTIONS = (torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default,
               torch.ops.aten.sym_constrain_range.default)


def drop_size_assertions(gm: torch.fx.GraphModule) -> int:
    """Remove torch.export's run-time checks that a data-dependent size lies in the range it
    inferred (``_assert_scalar(ge(u0, 0))``), and the Python comparisons that feed them; the
    number of checks removed.

    They compute nothing the graph returns, and their comparisons are Python operators
    (``operator.ge``), which graph.json does not store: only torch ops are stored.
    """
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _ASSERTIONS:
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return dropped


def constant_sizes_folded(ep: "torch.export.ExportedProgram", *, guards_decided: bool = False
                          ) -> Optional[torch.fx.GraphModule]:
    """`ep` as a module whose sizes read from the model's own constants are plain numbers, or
    None when it has none.

    A size torch.export leaves data-dependent may not depend on data at all: EnCodec- and
    Mimi-style convolutions compute their padding from integer scalar buffers (kernel size,
    stride) and the input's static length, then pass those 0-dim tensors to ``F.pad``. torch
    reads each with ``.item()`` and, buffers being inputs of the graph, calls the result an
    unbacked symbol; the padded length is then ``u0 + u1 + 7680``, every later size a formula
    of it, and the training graphs compute those formulas with Python operators that graph.json
    cannot store. Here each ``item`` whose value follows from buffers and constants alone (no
    user input, no parameter, no random op, no buffer the graph writes) is evaluated and
    replaced by its value; exporting the result again gives static sizes.

    `guards_decided`: `ep` was traced with torch's real-tensor propagation (see
    capture/export.py's ``_export_deciding_guards``), which decides each data-dependent guard on the example's values
    and leaves a run-time assertion (``_assert_scalar``) for it. Such a graph is folded only if
    every assertion follows from constants too and holds; one that reads a user input or a
    parameter is a branch on data, and the graph is refused (None).
    """
    folded = fold_constant_sizes(ep, guards_decided=guards_decided)
    return folded[0] if folded is not None else None


def fold_constant_sizes(ep: "torch.export.ExportedProgram", *, guards_decided: bool = False
                        ) -> Optional[tuple[torch.fx.GraphModule, list[str]]]:
    """:func:`constant_sizes_folded`'s module, with the names of the buffers and constants
    whose values it read (for the manifest's note), or None."""
    if not has_data_dependent_sizes(ep.graph_module):
        return None
    module = ep.module()
    graph = module.graph
    written = {n.args[0] for n in graph.nodes if n.op == "call_function" and _writes_first_argument(n)}
    params = {name for name, _ in module.named_parameters()}
    env: dict[torch.fx.Node, Any] = {}

    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in params and node not in written:
            env[node] = _attr(module, node.target)
        elif (node.op == "call_function" and node.all_input_nodes and all(i in env for i in node.all_input_nodes)
              and not op_draws_random(node.target) and not _writes_first_argument(node)):
            try:
                env[node] = node.target(*torch.fx.node.map_arg(node.args, env.__getitem__),
                                        **torch.fx.node.map_arg(node.kwargs, env.__getitem__))
            except Exception:  # noqa: BLE001 - not evaluable here: leave it to the graph
                continue
    items = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.item.default
             and n in env and isinstance(env[n], int)]  # sizes (ints, bools), not a float scale
    if not items:
        return None
    if guards_decided:
        for node in graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default:
                cond = node.args[0]
                value = env.get(cond) if isinstance(cond, torch.fx.Node) else cond
                if value is None or not bool(value):
                    return None  # decided on a user input's (or a parameter's) values, or false
    sources = sorted({a.target for n in items for a in _ancestors(n) if a.op == "get_attr"})
    for node in items:
        value = env[node]
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()
    return module, sources


def branches_on_random_draw(ep: "torch.export.ExportedProgram") -> bool:
    """Whether a guard torch's real-tensor propagation decided (an ``_assert_scalar`` left in
    the graph) reads a random draw made only to decide: the model picks a branch by a number
    it draws (LayerDrop skips a layer when ``torch.rand([]) < layerdrop``), which no one graph
    can hold. A draw whose values also reach an output (a dropout mask) does not count: a
    guard on the values it made (``isfinite(hidden).all()`` after dropout) is an ordinary
    data-dependent branch."""
    graph = ep.graph_module.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    reach_output = _ancestors(output)
    # One pass in graph order (each node after its inputs): does a draw that reaches no output
    # flow into the node? (An ancestor walk per assertion was quadratic: SLANeXt's 501.)
    tainted: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "call_function" and op_draws_random(node.target) and node not in reach_output) \
                or any(i in tainted for i in node.all_input_nodes):
            tainted.add(node)
            if node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default:
                return True
    return False


def _ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def _attr(module: torch.nn.Module, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _writes_first_argument(node: torch.fx.Node) -> bool:
    """Whether `node` (an op) writes into its first argument: an in-place or out= overload, copy_."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    return bool(schema.arguments) and schema.arguments[0].alias_info is not None and \
        schema.arguments[0].alias_info.is_write
