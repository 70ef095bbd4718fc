"""Weights packed for the CPU a graph runs on, when the loader builds it: in memory only.

Not a pass: a packed weight is an opaque, CPU-specific layout (oneDNN's blocked formats)
that graph.json cannot store nor the loader check, and a graph built from an artefact
should run as fast as the tools that pack at freezing time (jit.freeze, inductor with
freezing). So artefacts keep dense weights and plain ATen ops, and :func:`prepack` packs
them when a graph is loaded, for this CPU:

- ``mkldnn._convolution_pointwise`` (plain and binary) with a constant channels-last
  weight on a channels-last input (as the cpu-fast chain makes them) gets the weight
  reordered by ``mkldnn._reorder_convolution_weight`` for the input shape the
  ``mkldnn_fuse`` pass recorded ("val" of the input node). The kernel takes dense and
  packed weights alike and checks shapes either way. On NCHW activations oneDNN runs
  another algorithm with a packed weight (results differ in the last bits), so those
  stay dense;
- a binary (residual add) convolution whose residual nothing reads after it (the fresh
  result of an op, or an in-place result on one, not an output, no alias of it read later,
  not the convolution's input) becomes :func:`add_into_residual`, which adds into the
  residual in place (``mkldnn._convolution_pointwise_.binary``: oneDNN's sum post-op, what
  inductor emits) when both are channels-last tensors sharing no memory: the same
  values, one activation less to allocate and write;
- ``aten.linear(x, W, B)`` with constant W on a 2-d input becomes :func:`packed_linear`,
  which calls oneDNN's ``mkldnn._linear_pointwise`` with W packed by
  ``mkldnn._reorder_linear_weight`` for the recorded row count, and with the linear's
  unary epilogue (GELU, ReLU, SiLU as ``v * sigmoid(v)``, ... as the convolutions take
  them; through a view between them too) fused into the GEMM. oneDNN's GEMM, not MKL's:
  measured side by side on this machine kind (an AMD EPYC), oneDNN's is faster on every
  transformer shape of the CPU benchmark, and the fused GELU saves a pass over the widest
  activation (benchmarks/gemm_bench.py, benchmarks/cpu_bench.py). :func:`packed_linear` checks its input before the kernel
  and computes ``linear`` and the epilogue in ATen for any input the packed weight does
  not fit.

Results equal the dense graph's up to float noise: bit for bit for channels-last
convolutions, in place or not; a GEMM and a fused epilogue differ in the last bits. The
reference outputs an artefact records come from the graph as loaded, packed, so a replay
on the same machine matches them exactly; the checks against the eager model judge the
packed graph. A node without a recorded input shape, or with one that does not fit it (a
conv's channels, a linear's width, sizes past 2**31), stays dense.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx

from aotpipe.errors import ArtifactError
from aotpipe.format.records import RawJson
from aotpipe.passes.mkldnn_fuse import unary_epilogue
from aotpipe.runtime.devices import DENSE_GRAPH, LEGACY_PACKING, PACKING, is_packed

_mkldnn = torch.ops.mkldnn
_CONVS = {_mkldnn._convolution_pointwise.default: 1, _mkldnn._convolution_pointwise.binary: 2}  # weight's index
_aten = torch.ops.aten
_LINEAR = _aten.linear.default
_VIEWS = (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default)
# graph.json's names of the ops prepack may pack (the loader builds such graphs from graph.json).
PACKABLE_TARGETS = frozenset({"mkldnn._convolution_pointwise.default", "mkldnn._convolution_pointwise.binary",
                              "aten.linear.default"})


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  rows: int, attr: str = "none", scalars: list[Any] | None = None,
                  algorithm: str | None = None) -> torch.Tensor:
    """``linear(x, weight, bias)``, then the unary `attr` (``"none"``: nothing), through
    oneDNN's GEMM with the weight packed for `rows` rows when x fits it."""
    if (x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != torch.float32 or x.device.type != "cpu"
            or not x.is_contiguous() or x.requires_grad
            or x.shape[0] != rows
            or (bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != torch.float32
                                      or not bias.is_contiguous()))):
        return aten_epilogue(torch.nn.functional.linear(x, weight, bias), attr, scalars or [], algorithm)
    return _mkldnn._linear_pointwise(x, packed, bias, attr, scalars or [], algorithm)


def mkl_packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      rows: int) -> torch.Tensor:
    """``linear(x, weight, bias)`` through MKL's packed GEMM when x fits the packed weight:
    how the loader packed linears before it recorded its packing (``"mkl"``)."""
    # _mkl_linear trusts its operands' sizes: x's width, and a bias of one value per output
    # (it copies that many per row). Anything else takes linear, which checks.
    if (x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != torch.float32 or x.device.type != "cpu"
            or not x.is_contiguous() or x.requires_grad
            or x.shape[0] != rows
            or (bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != torch.float32
                                      or not bias.is_contiguous()))):
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def aten_epilogue(y: torch.Tensor, attr: str, scalars: list[Any], algorithm: str | None) -> torch.Tensor:
    """The unary oneDNN names `attr` (with its scalars and algorithm) applied to y by
    ATen: what :func:`packed_linear` computes where the packed kernel does not apply."""
    f = torch.nn.functional
    ops = {"none": lambda: y, "relu": lambda: torch.relu(y), "sigmoid": lambda: torch.sigmoid(y),
           "tanh": lambda: torch.tanh(y), "hardswish": lambda: f.hardswish(y), "swish": lambda: f.silu(y),
           "gelu": lambda: f.gelu(y, approximate=algorithm or "none"),
           "hardtanh": lambda: f.hardtanh(y, *scalars), "leaky_relu": lambda: f.leaky_relu(y, *scalars)}
    if attr not in ops:
        raise ValueError(f"no epilogue {attr!r}; one of {', '.join(ops)}")
    return ops[attr]()


def _recorded(node: Any) -> tuple[list[int], list[int]] | None:
    """(shape, stride) a pass recorded for `node` (its "val"), if any and plausible: an
    artefact from someone else may record anything there, and a shape only steers packing."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return list(val.shape), list(val.stride())
    saved: RawJson = node.meta.get("saved_val")  # graph.json's free-JSON val, as the loader kept it
    shape, stride = (saved.get("shape"), saved.get("stride")) if isinstance(saved, dict) else (None, None)
    if all(isinstance(v, list) and len(v) == len(shape) and all(isinstance(s, int) and 0 <= s < 2**31 for s in v)
           for v in (shape, stride)):
        return shape, stride
    return None


def _channels_last(shape: list[int], stride: list[int]) -> bool:
    if len(shape) != 4:
        return False
    n, c, h, w = shape
    return stride == [h * w * c, 1, w * c, c]


def _dense_constant(gm: torch.fx.GraphModule, node: Any, dim: int) -> torch.Tensor | None:
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return None
    value = getattr(gm, node.target, None) if "." not in node.target else None
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dim() != dim \
            or value.dtype != torch.float32 or value.device.type != "cpu" or value.requires_grad:
        return None
    return value


def needs_prepack(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and (n.target in _CONVS or n.target is _LINEAR) for n in gm.graph.nodes)


def stored_graph(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    """The graph as graph.json holds it: for a module :func:`prepack` packed, the graph
    before packing (what verify, the checks and show compare and list)."""
    return gm.meta.get(DENSE_GRAPH, gm.graph)


def unpacked(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with its dense weights, as graph.json holds it (a new module sharing gm's tensors):
    what to hand torch.compile, whose inductor cannot lower oneDNN's packed weights (opaque
    tensors). `gm` itself when prepack packed nothing."""
    if not is_packed(gm):
        return gm
    return torch.fx.GraphModule(gm, copy.deepcopy(stored_graph(gm)))


def prepack(gm: torch.fx.GraphModule, scheme: str = PACKING) -> dict[str, int]:
    """Pack `gm`'s convolution and linear weights for this CPU, in place, as `scheme` says
    (the artefact's recorded ``environment.packing``: its outputs were computed so); what it
    packed. ``"onednn"``: the module's docstring. ``"mkl"``, an artefact's written before its
    packing was recorded: convolutions as ``"onednn"``'s, linears through MKL's packed GEMM
    (:func:`mkl_packed_linear`), no epilogue fused, no residual in place. The graph before
    packing stays in gm.meta (:func:`stored_graph`)."""
    if scheme not in (PACKING, LEGACY_PACKING):
        raise ArtifactError(f"its outputs were recorded with the loader packing weights as {scheme!r}, which this "
                            f"aotpipe does not know (it packs as {PACKING!r} or {LEGACY_PACKING!r}): replay it with "
                            "the aotpipe that wrote it")
    done = {"conv": 0, "linear": 0, "epilogue": 0, "in_place": 0}
    if not torch.backends.mkldnn.is_available() or not needs_prepack(gm):
        return done
    dense = copy.deepcopy(gm.graph)
    packed: dict[tuple, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _CONVS:
            i = _CONVS[node.target]
            weight = _dense_constant(gm, node.args[i], 4)
            recorded = _recorded(node.args[0])
            # Only channels-last: there the packed and dense kernels are the same (bit-identical
            # results); on NCHW activations oneDNN picks another algorithm for a packed weight.
            if weight is None or recorded is None or not _channels_last(*recorded) \
                    or not weight.is_contiguous(memory_format=torch.channels_last):
                continue
            shape = recorded[0]
            padding, stride, dilation, groups = node.args[i + 2:i + 6]
            if not (isinstance(groups, int) and groups > 0 and min(shape) > 0 and shape[1] == weight.shape[1] * groups
                    and all(isinstance(g, list) and all(isinstance(v, int) for v in g)
                            for g in (padding, stride, dilation))):
                continue  # not what this convolution reads: left dense (its kernel checks at run time)
            key = ("conv", node.args[i].target, tuple(padding), tuple(stride), tuple(dilation), groups, tuple(shape))
            if key not in packed:
                try:
                    value = _mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups, shape)
                except RuntimeError:
                    continue  # oneDNN refused the geometry: left dense
                packed[key] = _attribute(gm, node.args[i].target + "_packed", value)
            args = list(node.args)
            args[i] = packed[key]
            node.args = tuple(args)
            done["conv"] += 1
        elif node.target is _LINEAR and len(node.args) == 3 and not node.kwargs \
                and (scheme == PACKING or torch._C.has_mkl):
            x, w, b = node.args
            weight = _dense_constant(gm, w, 2)
            shape = (_recorded(x) or (None,))[0]
            bias = _dense_constant(gm, b, 1) if b is not None else None
            if weight is None or not weight.is_contiguous() or shape is None or len(shape) != 2 \
                    or not (0 < shape[0] and shape[1] == weight.shape[1]) \
                    or (b is not None and (bias is None or bias.shape != (weight.shape[0],))):
                continue
            key = ("linear", w.target, shape[0])
            if key not in packed:
                value = _mkldnn._reorder_linear_weight(weight, shape[0]) if scheme == PACKING \
                    else torch.ops.mkl._mkl_reorder_linear_weight(weight, shape[0])
                packed[key] = _attribute(gm, w.target + "_packed", value)
            if scheme == PACKING:
                node.target = packed_linear
                node.args = (x, packed[key], w, b, shape[0], *_fuse_epilogue(gm, node, done))
            else:
                node.target = mkl_packed_linear
                node.args = (x, packed[key], w, b, shape[0])
            done["linear"] += 1
    if scheme == PACKING:
        done["in_place"] = _residuals_in_place(gm)
    if any(done.values()):
        gm.meta[DENSE_GRAPH] = dense
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def _attribute(gm: torch.fx.GraphModule, hint: str, value: torch.Tensor) -> torch.fx.Node:
    name, i = hint, 0
    while hasattr(gm, name):
        i += 1
        name = f"{hint}_{i}"
    gm.register_buffer(name, value, persistent=False)  # never in a state_dict: it cannot be saved
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        return gm.graph.get_attr(name)


def _fuse_epilogue(gm: torch.fx.GraphModule, node: torch.fx.Node, done: dict[str, int]) -> tuple:
    """(attr, scalars, algorithm) of the unary that alone uses `node`'s result, directly or
    through one view used by nothing else, which is then taken out of the graph: the GEMM
    computes it. SiLU counts in its decomposed form, ``v * sigmoid(v)``. ("none", [], None)
    when there is none."""
    users = list(node.users)
    view = users[0] if len(users) == 1 and users[0].op == "call_function" and users[0].target in _VIEWS \
        and users[0].args[0] is node else None
    value = view or node
    gone: list[torch.fx.Node] = []
    fused, last = None, None
    if len(value.users) == 1:
        unary = next(iter(value.users))
        if unary.op == "call_function" and unary.args and unary.args[0] is value \
                and not unary.kwargs.keys() - {"approximate"}:
            fused, last, gone = unary_epilogue(unary), unary, [unary]
    elif len(value.users) == 2:  # silu decomposed: mul(v, sigmoid(v))
        sig = next((u for u in value.users if u.target is _aten.sigmoid.default), None)
        mul = next((u for u in value.users if u.target is _aten.mul.Tensor), None)
        if sig is not None and mul is not None and list(sig.users) == [mul] and not mul.kwargs \
                and set(mul.args) == {value, sig} and len(mul.args) == 2 and sig.args == (value,):
            fused, last, gone = ("swish", [], None), mul, [mul, sig]
    if fused is None or last is None:
        return "none", [], None
    last.replace_all_uses_with(value)
    for n in gone:
        gm.graph.erase_node(n)
    done["epilogue"] += 1
    return fused


def add_into_residual(other: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      padding: list[int], stride: list[int], dilation: list[int], groups: int,
                      unary: str | None, scalars: list[Any], algorithm: str | None) -> torch.Tensor:
    """``mkldnn._convolution_pointwise.binary(x, other, ..., "add", ...)``, computed into
    `other` (oneDNN's sum post-op) when both are channels-last float32 CPU tensors that share
    no memory; otherwise out of place. The graph guarantees nothing reads `other` after."""
    cl = torch.channels_last
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, p, s, d, k in zip(x.shape[2:], padding, stride, dilation, weight.shape[2:], strict=False)]
    if list(other.shape) != [x.shape[0], weight.shape[0], *spatial]:  # the kernel would not check it
        raise RuntimeError(f"a residual of shape {list(other.shape)} for a convolution output of shape "
                           f"{[x.shape[0], weight.shape[0], *spatial]}")
    if (other.layout == torch.strided and x.layout == torch.strided and other.dtype == x.dtype == torch.float32
            and other.device.type == x.device.type == "cpu" and other.dim() == x.dim() == 4
            and other.is_contiguous(memory_format=cl) and x.is_contiguous(memory_format=cl)
            and not other.requires_grad and other.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
        return _mkldnn._convolution_pointwise_.binary(other, x, weight, bias, padding, stride, dilation, groups,
                                                      "add", 1.0, unary, scalars, algorithm)
    return _mkldnn._convolution_pointwise.binary(x, other, weight, bias, padding, stride, dilation, groups,
                                                 "add", None, unary, scalars, algorithm)


def _residuals_in_place(gm: torch.fx.GraphModule) -> int:
    """Binary convolutions whose residual nothing reads after them, as :func:`add_into_residual`; how many."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _mkldnn._convolution_pointwise.binary \
                or len(node.args) != 13 or node.kwargs or node.args[8] != "add" or node.args[9] not in (None, 1, 1.0):
            continue
        x, other, w, b, padding, stride, dilation, groups, _, _, *unary = node.args
        if not _dead_fresh(other, node, order, reads=x):
            continue
        node.target = add_into_residual
        node.args = (other, x, w, b, padding, stride, dilation, groups, *unary)
        count += 1
    return count


def _dead_fresh(value: Any, at: torch.fx.Node, order: dict[torch.fx.Node, int], reads: Any) -> bool:
    """Whether writing into `value` at `at` changes nothing anyone reads: `value` is, or is
    the in-place result of an op on, the fresh result of an ATen or oneDNN op (its schema
    returns no alias of an input: not a graph input, a constant or a view of one), and
    neither it nor any alias of it is read at or after `at`, but by `at` itself (not as
    `reads`, its input), nor is an output."""
    root = value
    while _returns_first_argument(root):
        root = root.args[0]
    if not (isinstance(root, torch.fx.Node) and root.op == "call_function"
            and isinstance(root.target, torch._ops.OpOverload)):
        return False
    schema = root.target._schema
    if len(schema.returns) != 1 or schema.returns[0].alias_info is not None or schema.is_mutable:
        return False
    aliases, todo = {root}, [root]
    while todo:  # everything that may share root's memory
        for user in todo.pop().users:
            if user is at or user in aliases:
                continue
            user_schema = getattr(user.target, "_schema", None)
            if user_schema is None or any(r.alias_info is not None for r in user_schema.returns):
                aliases.add(user)  # an alias (or what we cannot tell is not one): its readers count too
                todo.append(user)
    return reads not in aliases and all(u is at or (u.op != "output" and order.get(u, len(order)) < order[at])
                                        for a in aliases for u in a.users)


def _returns_first_argument(node: Any) -> bool:
    """Whether `node`'s result is, or may be, its first argument (an in-place op's, a view's)."""
    if isinstance(node, torch.fx.Node) and node.target is add_into_residual:
        return True
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and schema is not None
            and len(schema.returns) == 1 and schema.returns[0].alias_info is not None and bool(schema.arguments)
            and schema.arguments[0].alias_info is not None and bool(node.args)
            and schema.returns[0].alias_info.before_set == schema.arguments[0].alias_info.before_set)
