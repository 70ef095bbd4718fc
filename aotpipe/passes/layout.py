"""Layout passes: view_to_reshape, remove_noops, channels_last.

view_to_reshape: every ``aten.view`` becomes ``aten.reshape`` (the same where a view is
  possible, a copy where a layout change made it impossible). Accepts any graph kind.
remove_noops: calls that return their input unchanged are bypassed: ``alias``, ``detach``,
  and ``view``/``reshape``/``expand`` to the same shape, ``permute`` by the identity,
  ``slice`` of a whole dimension. Accepts any graph kind.
channels_last: 4-d convolution weights that are constants (run `freeze` first) are
  converted to channels-last, so CPU convolutions run in that layout; views are made
  reshapes so downstream code copes with the new strides; graph outputs and the inputs
  of ``as_strided`` keep the strides they had before the pass. With ``activations: true``
  (layout propagation) a graph input that a convolution reads and that is not
  channels-last (the image) is converted once, so activations stay channels-last from the first convolution to the
  last instead of the first convolution converting on every call. Accepts inference graphs.
"""

from __future__ import annotations


import torch
import torch.fx

from aotpipe.passes.base import GraphUnderPass, PassResult, constant_value, is_constant, layout_facts, \
    remember_facts, restride, tensor_facts
from aotpipe.passes.options import ViewToReshapeOptions, RemoveNoopsOptions, ChannelsLastOptions

_aten = torch.ops.aten


def view_to_reshape(g: GraphUnderPass, options: ViewToReshapeOptions) -> PassResult:
    n = 0
    for node in g.gm.graph.nodes:
        if node.op == "call_function" and node.target is _aten.view.default:
            node.target = _aten.reshape.default
            n += 1
    g.gm.recompile()
    return PassResult(g, modified=bool(n), stats={"views_replaced": n})


def _shape(node: object) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _is_noop(node: torch.fx.Node) -> bool:
    t, args = node.target, node.args
    if t in (_aten.alias.default, _aten.detach.default):
        return True
    src = args[0] if args else None
    if t in (_aten.view.default, _aten.reshape.default, _aten.expand.default, _aten._unsafe_view.default):
        shape = _shape(src)
        return shape is not None and list(shape) == list(args[1])
    if t is _aten.permute.default:
        return list(args[1]) == list(range(len(args[1])))
    if t is _aten.slice.Tensor:
        shape = _shape(src)
        dim = args[1] if len(args) > 1 else 0
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = args[4] if len(args) > 4 else 1
        return (shape is not None and start in (None, 0) and step == 1
                and (end is None or end >= shape[dim]))
    return False


def remove_noops(g: GraphUnderPass, options: RemoveNoopsOptions) -> PassResult:
    removed = 0
    for node in list(g.gm.graph.nodes):
        if node.op == "call_function" and _is_noop(node):
            node.replace_all_uses_with(node.args[0])
            g.gm.graph.erase_node(node)
            removed += 1
    g.gm.recompile()
    return PassResult(g, modified=bool(removed), stats={"noops_removed": removed})


def channels_last(g: GraphUnderPass, options: ChannelsLastOptions) -> PassResult:
    gm = g.gm
    if not any(n.op == "call_function" and n.target is _aten.convolution.default for n in gm.graph.nodes):
        return PassResult(g, modified=False, stats={"weights_converted": 0})
    if options.activations and not _conv_feeds_conv(gm):
        # Nothing to propagate (a lone patch embedding on the image, as in a ViT): its layout
        # makes no measurable difference, and finding the layouts costs two runs of the graph.
        lone = sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is _aten.convolution.default)
        return PassResult(g, modified=False, stats={"weights_converted": 0, "convolutions_left_alone": lone})
    before = _layouts_before(gm, g.values)
    converted = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _aten.convolution.default:
            w = node.args[1]
            if is_constant(w) and w.target not in converted:
                value = constant_value(gm, w)
                if value.dim() == 4:
                    gm.register_buffer(w.target, value.contiguous(memory_format=torch.channels_last))
                    converted.add(w.target)
    if not converted:
        return PassResult(g, modified=False, stats={"weights_converted": 0})
    view_to_reshape(g, ViewToReshapeOptions())
    activations = _inputs_channels_last(gm, before, converted) if options.activations else []
    facts = tensor_facts(gm, g.values)
    after = {k: (f.shape, f.stride) for k, f in facts.items()}
    created: list[torch.fx.Node] = []
    fixed = 0
    # as_strided reads raw memory: its input must keep the layout it had.
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _aten.as_strided.default:
            src = node.args[0]
            if isinstance(src, torch.fx.Node) and src.name in before and before[src.name] != after.get(src.name):
                new = restride(gm.graph, src, before[src.name][1], node, created)
                node.replace_input_with(src, new)
                fixed += 1
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    new_outs = []
    for o in outs:
        if isinstance(o, torch.fx.Node) and o.name in before and before[o.name] != after.get(o.name) \
                and len(before[o.name][1]) > 1:
            o = restride(gm.graph, o, before[o.name][1], output, created)
            fixed += 1
        new_outs.append(o)
    output.args = (tuple(new_outs) if isinstance(output.args[0], tuple) else new_outs,)
    gm.meta["layouts_changed"] = True  # capture's strides ("val") no longer hold
    remember_facts(gm, g.values, facts, created)  # the next pass (mkldnn_fuse) need not run the graph again
    gm.recompile()
    return PassResult(g, modified=True, stats={"weights_converted": len(converted),
                                               "activations_converted": len(activations), "layouts_restored": fixed})


def _layouts_before(gm: torch.fx.GraphModule, values: list) -> dict[str, tuple]:
    """(shape, stride) of the nodes whose layout the pass keeps or reads (outputs, inputs
    of as_strided, graph inputs), taken now, before it changes any: capture's if no layout
    pass ran before it (no run of the graph), else a run's."""
    facts = layout_facts(gm, values)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    needed = [n for n in gm.graph.nodes if n.op == "placeholder"] + output.all_input_nodes + [
        n.args[0] for n in gm.graph.nodes
        if n.op == "call_function" and n.target is _aten.as_strided.default and isinstance(n.args[0], torch.fx.Node)]
    out = {}
    for n in needed:
        f = facts.get(n.name)
        if f is not None:
            out[n.name] = (f.shape, f.stride)
    return out


def _conv_feeds_conv(gm: torch.fx.GraphModule) -> bool:
    """Whether some convolution's result reaches another convolution."""
    after_conv: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        fed = any(i in after_conv or (i.op == "call_function" and i.target is _aten.convolution.default)
                  for i in n.all_input_nodes)
        if fed and n.op == "call_function" and n.target is _aten.convolution.default:
            return True
        if fed:
            after_conv.add(n)
    return False


def _inputs_channels_last(gm: torch.fx.GraphModule, before: dict, weights: set[str]) -> list[torch.fx.Node]:
    """Make each graph input that a converted convolution reads channels-last, once, where
    it is not (the image); returns the conversions inserted. Convolutions with channels-last
    weights return channels-last results, and pointwise ops keep the layout, so after this
    activations stay channels-last from the first convolution to the last."""
    done: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and node.target is _aten.convolution.default
                and is_constant(node.args[1]) and node.args[1].target in weights):
            continue
        x = node.args[0]
        if not isinstance(x, torch.fx.Node) or x.op != "placeholder" or x.name not in before:
            continue
        shape, stride = before[x.name]
        if len(shape) != 4 or _is_channels_last(shape, stride):
            continue
        if x not in done:
            with gm.graph.inserting_before(node):  # the first convolution to read x
                done[x] = gm.graph.call_function(_aten.clone.default, (x,), {"memory_format": torch.channels_last})
        node.replace_input_with(x, done[x])
    return list(done.values())


def _is_channels_last(shape: tuple, stride: tuple) -> bool:
    return torch.empty_strided(shape, stride, device="meta").is_contiguous(memory_format=torch.channels_last)
