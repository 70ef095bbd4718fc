"""remove_copies: copies a frozen, functional inference graph does not need.

Accepts: inference graphs with no in-place ops (run it before `reinplace`; on a graph
that writes in place it changes nothing, since there a copy may protect a value).

- A ``clone`` or a same-dtype, same-device ``_to_copy`` whose result has the layout
  (shape and strides; capture's, until a layout pass has run, else a run's) its input
  already has is bypassed: in a graph that writes nothing
  in place, a copy with the same layout is indistinguishable from its input. Kept: a copy
  of a graph input or a constant (or of a view of one), which protects them from a caller
  writing into a result, a copy that is a graph output (or a view of it is), and one that
  feeds ``as_strided`` (which reads memory, not values).
- ``max_pool2d_with_indices`` whose indices nobody reads becomes ``max_pool2d``, which
  does not compute them.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from aotpipe.passes.base import FactsLike, GraphUnderPass, PassResult, layout_facts, remember_facts
from aotpipe.passes.options import RemoveCopiesOptions

_aten = torch.ops.aten
_POOL_WITH_INDICES = _aten.max_pool2d_with_indices.default


def _writes_in_place(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable for n in gm.graph.nodes)


def _aliases_input_or_constant(node: torch.fx.Node) -> bool:
    """Whether `node` is a graph input or constant, or a view of one."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
        node = node.args[0]
    if node.op == "call_function" and node.target is operator.getitem:
        return False
    return node.op in ("placeholder", "get_attr")


def _output_or_view_of_output(node: torch.fx.Node) -> bool:
    """Whether `node`, or a view of it, is a graph output (a caller may write into it)."""
    for u in node.users:
        if u.op == "output":
            return True
        if u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload) and u.target.is_view \
                and _output_or_view_of_output(u):
            return True
    return False


def _read_as_raw_memory(node: torch.fx.Node) -> bool:
    """Whether `node`, or a view of it, feeds as_strided (which reads memory, not values)."""
    for u in node.users:
        if u.op == "call_function" and u.target is _aten.as_strided.default:
            return True
        if u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload) and u.target.is_view \
                and _read_as_raw_memory(u):
            return True
    return False


def _same_copy(node: torch.fx.Node, facts: FactsLike) -> bool:
    """Whether `node` copies its input into the same layout, dtype and device."""
    if node.target is _aten.clone.default:
        pass
    elif node.target is _aten._to_copy.default:
        allowed = {"dtype", "device", "layout", "memory_format", "pin_memory", "non_blocking"}
        if len(node.args) != 1 or set(node.kwargs) - allowed or node.kwargs.get("non_blocking"):
            return False
    else:
        return False
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        return False
    a, b = facts.get(src.name), facts.get(node.name)
    return a is not None and b is not None and a == b


def remove_copies(g: GraphUnderPass, options: RemoveCopiesOptions) -> PassResult:
    gm = g.gm
    stats = {"copies_removed": 0, "pool_indices_dropped": 0}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _POOL_WITH_INDICES:
            users = list(node.users)
            if users and all(u.target is operator.getitem and u.args[1] == 0 for u in users):
                with gm.graph.inserting_before(node):
                    pool = gm.graph.call_function(_aten.max_pool2d.default, node.args, dict(node.kwargs))
                for u in users:
                    u.replace_all_uses_with(pool)
                    gm.graph.erase_node(u)
                gm.graph.erase_node(node)
                stats["pool_indices_dropped"] += 1
    if _writes_in_place(gm) or not any(n.op == "call_function" and n.target in (_aten.clone.default,
                                                                                  _aten._to_copy.default)
                                       for n in gm.graph.nodes):
        gm.recompile()
        return PassResult(g, modified=bool(stats["pool_indices_dropped"]), stats=stats)
    facts = layout_facts(gm, g.values)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _same_copy(node, facts) or _output_or_view_of_output(node) \
                or _read_as_raw_memory(node):
            continue
        src = node.args[0]
        if _aliases_input_or_constant(src):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        stats["copies_removed"] += 1
    if isinstance(facts, dict):
        # What it removed had its source's layout: every other node's is as it was, and
        # the next pass can have these facts without running the graph again.
        remember_facts(gm, g.values, {k: v for k, v in facts.items() if k in {n.name for n in gm.graph.nodes}}, [])
    gm.recompile()
    return PassResult(g, modified=any(stats.values()), stats=stats)
