"""reinplace: functional ops become their in-place variants where that is safe.

Accepts: any functional graph (inference, forward, backward, joint).

Uses torch.fx.passes.reinplace: an op ``b = add(a, c)`` becomes ``a.add_(c)`` when ``a``
(and every alias of it) is not used after it and is not a graph input (nor a view of
one); ``{view}_scatter`` ops whose base can be written in place become in-place copies
into the view. The graph's results are unchanged; it allocates less.

An op whose first argument is a Tensor in its schema but a Python number, or a SymInt's
node, in the graph (``aten.sub.Tensor(1, x)``, which capture makes of ``1 - x``; ATen wraps
the number) has nothing to write into: it stays functional, as does a call that gives no
tensor (``sym_size.int``). torch's reinplace reads the first argument and the result of every
call as tensors and fails on these, so they are hidden from it while it runs.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.passes.reinplace import reinplace as fx_reinplace
from torch.multiprocessing.reductions import StorageWeakRef

from aotpipe.passes.base import GraphUnderPass, PassResult, constant_value
from aotpipe.passes.options import ReinplaceOptions


_ASSERT_METADATA = torch.ops.aten._assert_tensor_metadata.default


def _is_inplace(node: torch.fx.Node) -> bool:
    t = node.target
    return (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable)


def reinplace(g: GraphUnderPass, options: ReinplaceOptions) -> PassResult:
    gm = g.gm
    before = sum(1 for n in gm.graph.nodes if n.op == "call_function" and _is_inplace(n))
    # torch's reinplace propagates fake tensors and cannot meet a real constant; it also
    # never writes into a graph input. So constants go in as inputs for the duration:
    # they get fake values, and are safe from being overwritten.
    # torch's reinplace also trips on ops that return None (it compares their "output"
    # with their first argument): drop the metadata assertions export inserts. They
    # check dtypes and shapes the graph already fixes, and compute nothing.
    asserts = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _ASSERT_METADATA]
    for n in asserts:
        gm.graph.erase_node(n)
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"]
    anchor = next(n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr"))
    as_inputs = []
    for c in consts:
        with gm.graph.inserting_before(anchor):
            ph = gm.graph.placeholder(f"{c.name}_as_input")
        ph.meta = dict(c.meta)
        c.replace_all_uses_with(ph)
        as_inputs.append((ph, c.target, constant_value(gm, c)))
        gm.graph.erase_node(c)
    hidden = _hide_untensored_self(gm)
    gm.recompile()
    already = {n.name for n in gm.graph.nodes if n.op == "call_function" and _is_inplace(n)}
    gm = fx_reinplace(gm, *g.values, *[v for _, _, v in as_inputs])
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _call_hidden:
            node.target, node.args = node.args[0], tuple(node.args[1:])
    reverted = _revert_overlapping(gm, already)
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for ph, target, _ in as_inputs:
        with gm.graph.inserting_before(first):
            c = gm.graph.get_attr(target)
        c.meta = dict(ph.meta)
        ph.replace_all_uses_with(c)
        gm.graph.erase_node(ph)
    gm.recompile()
    after = sum(1 for n in gm.graph.nodes if n.op == "call_function" and _is_inplace(n))
    g.gm = gm
    return PassResult(g, modified=after != before or bool(asserts),
                      stats={"ops_reinplaced": after - before, "metadata_asserts_dropped": len(asserts),
                             "unsafe_reverted": reverted, "scalar_self_kept": hidden})


def _call_hidden(op: torch._ops.OpOverload, *args: object, **kwargs: object) -> object:
    """`op` called: the stand-in target of a call torch's reinplace must not look into."""
    return op(*args, **kwargs)


def _gives_tensors(node: torch.fx.Node) -> bool:
    """Whether `node` gives a tensor or tensors only: its recorded value says, else its
    op's schema does."""
    val = node.meta.get("val")
    if val is not None:
        leaves = pytree.tree_leaves(val)
        return bool(leaves) and all(isinstance(v, torch.Tensor) for v in leaves)
    if node.op in ("placeholder", "get_attr"):
        return True  # inputs and constants without a recorded value: tensors in a captured graph
    t = node.target
    if t is operator.getitem:
        src = node.args[0]
        return isinstance(src, torch.fx.Node) and src.op == "call_function" and _gives_tensors(src)
    return isinstance(t, torch._ops.OpOverload) and bool(t._schema.returns) and all(
        isinstance(r.type, torch.TensorType) for r in t._schema.returns)


def _hide_untensored_self(gm: torch.fx.GraphModule) -> int:
    """Calls whose schema's first argument is a Tensor but whose graph argument is a number,
    None or a non-tensor node, and calls that give something other than tensors (a SymInt:
    ``sym_size.int``), re-targeted at :func:`_call_hidden` (reinplace passes over calls of
    anything but an OpOverload); how many."""
    hidden = 0
    for node in gm.graph.nodes:
        t = node.target
        if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or not t._schema.arguments \
                or type(t._schema.arguments[0].type) is not torch.TensorType or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, torch.fx.Node) and _gives_tensors(first) and _gives_tensors(node):
            continue
        node.target, node.args = _call_hidden, (t, *node.args)
        hidden += 1
    return hidden


def _storage(node: object) -> object:
    val = node.meta.get("fake_result") if isinstance(node, torch.fx.Node) else None
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def _shape(node: object) -> object:
    val = node.meta.get("fake_result") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _revert_overlapping(gm: torch.fx.GraphModule, already: set[str]) -> int:
    """Undo in-place rewrites that change the results: whose other arguments read the memory
    being written, or whose result does not have the shape of what it is written into.

    torch's reinplace turns ``sub(slice(x, 1:), slice(x, :-1))`` into an in-place
    ``sub_`` on the first slice while the second, an overlapping view of the same
    storage, is still being read: the result changes. It also compares only element
    counts, so ``add(a, b)`` with a 0-d ``a`` and a ``[1, 1, 1]`` ``b`` becomes ``a.add_(b)``,
    which cannot hold the broadcast result and raises. Such ops go back to their
    functional form, and later uses of the argument go back to the op's result.
    """
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    reverted = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.name in already or not _is_inplace(node):
            continue
        name = node.target._schema.name.split("::")[-1]
        if not name.endswith("_") or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        self_arg = node.args[0]
        mine = _storage(self_arg)
        others = [a for a in node.all_input_nodes if a is not self_arg]
        overlaps = mine is not None and any(_storage(o) == mine for o in others)
        # the node's fake_result is the functional op's (taken before the rewrite)
        reshaped = _shape(self_arg) is not None and _shape(node) is not None and _shape(self_arg) != _shape(node)
        if not (overlaps or reshaped):
            continue
        packet = getattr(torch.ops.aten, name[:-1], None)
        functional = getattr(packet, node.target._overloadname, None) if packet is not None else None
        if functional is None:
            continue
        node.target = functional
        for user in list(self_arg.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(self_arg, node)
        reverted += 1
    return reverted
