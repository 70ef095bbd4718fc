"""freeze: parameters and buffers become constants, then constant folding, CSE and DCE.

Accepts: inference graphs (functional, inputs described by role).

A parameter, buffer or lifted constant becomes a constant unless the graph mutates it
(a "mutation" output targets it) or an output aliases it (returns it, or a view of it):
those stay inputs, as do user inputs. Then every call whose inputs are all constants is
computed once and replaced by its value (unless it draws random numbers, or its value
would be much larger than its inputs, as a broadcast is); identical pure calls are merged;
dead code is removed. The frozen graph's inputs are the preserved ones plus user inputs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from aotpipe.passes.base import (
    GraphUnderPass,
    PassResult,
    add_constant,
    constant_value,
    first_get_attr_anchor,
    is_constant,
    is_pure,
)
from aotpipe.passes.options import FreezeOptions

# Calls whose output is a view of their first input: an output that is one of these of
# a parameter aliases that parameter.
_VIEW_OPS = {
    "alias", "view", "reshape", "_unsafe_view", "permute", "expand", "slice", "select", "t", "transpose",
    "unsqueeze", "squeeze", "as_strided", "detach", "unfold", "diagonal", "narrow", "view_as", "split", "unbind",
    "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk", "movedim", "unflatten", "flatten",
    "view_as_real", "view_as_complex", "swapaxes", "transpose_copy", "real", "imag", "tensor_split", "hsplit",
    "vsplit", "expand_as", "lift_fresh",
}
# Folding is skipped when a value would be this many times larger than its constant inputs.
_GROWTH_LIMIT = 4
_SMALL = 4096


def _aliased_inputs(gm: torch.fx.GraphModule) -> set[str]:
    """Placeholders that some output is, or is a view of."""
    out = set()
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for arg in pytree.tree_leaves(output.args[0]):
        node = arg
        while isinstance(node, torch.fx.Node) and node.op == "call_function":
            name = getattr(node.target, "__name__", "").split(".")[0]
            if name in _VIEW_OPS or node.target.__module__ == "_operator":
                node = node.args[0]
            else:
                break
        if isinstance(node, torch.fx.Node) and node.op == "placeholder":
            out.add(node.name)
    return out


def freeze(g: GraphUnderPass, options: FreezeOptions) -> PassResult:
    gm = g.gm
    mutated = {o.target for o in g.outputs if o.role == "mutation"}
    aliased = _aliased_inputs(gm)
    anchor = first_get_attr_anchor(gm)
    new_inputs, new_values, frozen = [], [], []
    for node, gi, value in zip(g.placeholders(), g.inputs, g.values):
        if gi.role in ("param", "buffer", "constant") and gi.target not in mutated and node.name not in aliased:
            const = add_constant(gm, value.detach().contiguous(), gi.target or node.name, anchor)
            node.replace_all_uses_with(const)
            gm.graph.erase_node(node)
            frozen.append(gi.target)
        else:
            new_inputs.append(gi)
            new_values.append(value)
    # CSE before folding too: two equal calls on constants would fold into two constants.
    merged = cse(gm) if options.cse else 0
    folded = fold_constants(gm) if options.fold else 0
    merged += cse(gm) if options.cse else 0
    _outputs_never_constants(gm)
    gm.graph.eliminate_dead_code()
    drop_unused_constants(gm)
    gm.recompile()
    return PassResult(
        GraphUnderPass(gm, g.kind, new_inputs, g.outputs, new_values),
        modified=bool(frozen or folded or merged),
        stats={"frozen": len(frozen), "preserved": len([i for i in new_inputs if i.role != "user"]),
               "constants_folded": folded, "cse_merged": merged},
    )


def fold_constants(gm: torch.fx.GraphModule) -> int:
    """Replace every pure call whose inputs are all constants by its value; returns how many.

    A view of a constant (a linear's transposed weight) is left a view unless a call that
    folds uses it: folding it would store a second copy of the weight and save nothing.
    """
    folded = 0
    const_only = _constant_only(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_pure(node):
            continue
        inputs = node.all_input_nodes
        if not inputs or not all(is_constant(i) for i in inputs):
            continue
        if _is_view(node) and not any(u.op == "call_function" and const_only.get(u, False) and not _is_view(u)
                                      for u in _non_view_users(node)):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: constant_value(gm, n))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            continue  # tuples are folded through their getitem users
        biggest = max(constant_value(gm, i).numel() for i in inputs)
        if value.numel() > _SMALL and value.numel() > _GROWTH_LIMIT * biggest:
            continue
        const = add_constant(gm, value.contiguous(), node.name, node)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
        folded += 1
    # tuple-valued calls on constants: fold their getitem users
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target.__module__ == "_operator" and node.args:
            src = node.args[0]
            if (isinstance(src, torch.fx.Node) and src.op == "call_function" and is_pure(src)
                    and src.all_input_nodes and all(is_constant(i) for i in src.all_input_nodes)):
                args, kwargs = torch.fx.node.map_arg((src.args, src.kwargs), lambda n: constant_value(gm, n))
                with torch.no_grad():
                    value = src.target(*args, **kwargs)[node.args[1]]
                if isinstance(value, torch.Tensor):
                    const = add_constant(gm, value.contiguous(), node.name, node)
                    node.replace_all_uses_with(const)
                    gm.graph.erase_node(node)
                    folded += 1
    return folded


def _is_view(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _non_view_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The users of `node`, looking through chains of views."""
    out = []
    for u in node.users:
        out += _non_view_users(u) if u.op == "call_function" and _is_view(u) else [u]
    return out


def _constant_only(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, bool]:
    """Per node: whether it is a pure function of constants only (folding would reach it)."""
    out: dict[torch.fx.Node, bool] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            out[n] = True
        elif n.op == "call_function" and is_pure(n):
            out[n] = bool(n.all_input_nodes) and all(out.get(i, False) for i in n.all_input_nodes)
        else:
            out[n] = False
    return out


def _key(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return ("node", a.name)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return tuple(sorted((k, _key(v)) for k, v in a.items()))
    if isinstance(a, float) and a != a:
        return ("nan",)
    return (type(a).__name__, repr(a))


def cse(gm: torch.fx.GraphModule) -> int:
    """Merge pure calls with the same target and arguments; returns how many were merged."""
    seen: dict[Any, torch.fx.Node] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_pure(node):
            continue
        key = (node.target, _key(node.args), _key(node.kwargs))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
            merged += 1
        else:
            seen[key] = node
    return merged


def _outputs_never_constants(gm: torch.fx.GraphModule) -> None:
    """An output that folded to a constant is returned as a copy: a caller writing into
    the result must not change the graph's constant for the next call."""
    output = next(n for n in gm.graph.nodes if n.op == "output")

    def fix(a: Any) -> Any:
        if is_constant(a):
            with gm.graph.inserting_before(output):
                return gm.graph.call_function(torch.ops.aten.clone.default, (a,))
        return a

    output.args = torch.fx.node.map_arg(output.args, fix)


def drop_unused_constants(gm: torch.fx.GraphModule) -> None:
    """Erase get_attr nodes nothing uses, and the constants no get_attr names."""
    used = set()
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            if not node.users:
                gm.graph.erase_node(node)
            else:
                used.add(node.target)
    for name, _ in list(gm.named_buffers()):
        if name not in used and "." not in name:
            delattr(gm, name)
