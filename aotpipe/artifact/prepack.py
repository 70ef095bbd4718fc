"""Weights packed for the CPU a graph runs on, when the loader builds it: in memory only.

Not a pass: a packed weight is an opaque, CPU-specific layout (oneDNN's blocked format, MKL's
packed GEMM operand) that graph.json cannot store nor the loader check, and a graph built
from an artefact should run as fast as the tools that pack at freezing time (jit.freeze,
inductor with freezing). So artefacts keep dense weights, and :func:`prepack` packs them
when a graph is loaded, for this CPU:

- ``mkldnn._convolution_pointwise`` (plain and binary) with a constant channels-last
  weight on a channels-last input (as the cpu-fast chain makes them) gets the weight
  reordered by ``mkldnn._reorder_convolution_weight`` for the input shape the
  ``mkldnn_fuse`` pass recorded ("val" of the input node). The kernel takes dense and
  packed weights alike and checks shapes either way. On NCHW activations oneDNN runs
  another algorithm with a packed weight (results differ in the last bits), so those
  stay dense;
- ``aten.linear(x, W, B)`` with constant W on a 2-d input becomes :func:`packed_linear`,
  which calls ``mkl._mkl_linear`` with W packed for the recorded row count. That kernel
  does not check its input's width against the packed weight (it would read out of
  bounds), so :func:`packed_linear` checks it first and falls back to ``linear``.

Results equal the dense graph's up to float noise: bit for bit for channels-last
convolutions and for BERT-size GEMMs here, not for small GEMMs (MKL computes those another
way). The reference outputs an artefact records come from the graph as loaded, packed, so
a replay on the same machine matches them exactly; the checks against the eager model
judge the packed graph. A node without a recorded input shape, or with one that does not
fit it (a conv's channels, a linear's width, sizes past 2**31), stays dense.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.format.records import RawJson
from aotpipe.runtime.devices import DENSE_GRAPH, is_packed

_mkldnn = torch.ops.mkldnn
_CONVS = {_mkldnn._convolution_pointwise.default: 1, _mkldnn._convolution_pointwise.binary: 2}  # weight's index
_LINEAR = torch.ops.aten.linear.default
# graph.json's names of the ops prepack may pack (the loader builds such graphs from graph.json).
PACKABLE_TARGETS = frozenset({"mkldnn._convolution_pointwise.default", "mkldnn._convolution_pointwise.binary",
                              "aten.linear.default"})


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  rows: int) -> torch.Tensor:
    """``linear(x, weight, bias)`` through MKL's packed GEMM when x fits the packed weight."""
    # _mkl_linear trusts its operands' sizes: x's width, and a bias of one value per output
    # (it copies that many per row). Anything else takes linear, which checks.
    if (x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != torch.float32 or x.device.type != "cpu"
            or not x.is_contiguous() or x.requires_grad
            or x.shape[0] != rows
            or (bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != torch.float32
                                      or not bias.is_contiguous()))):
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _recorded(node: Any) -> Optional[tuple[list[int], list[int]]]:
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


def _dense_constant(gm: torch.fx.GraphModule, node: Any, dim: int) -> Optional[torch.Tensor]:
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
    what to hand torch.compile, whose inductor cannot lower MKL's packed linear
    (``mkl._mkl_linear``). `gm` itself when prepack packed nothing."""
    if not is_packed(gm):
        return gm
    return torch.fx.GraphModule(gm, copy.deepcopy(stored_graph(gm)))


def prepack(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Pack `gm`'s convolution and linear weights for this CPU, in place; what it packed.
    The graph before packing stays in gm.meta (:func:`stored_graph`)."""
    done = {"conv": 0, "linear": 0}
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
        elif node.target is _LINEAR and torch._C.has_mkl and len(node.args) == 3 and not node.kwargs:
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
                value = torch.ops.mkl._mkl_reorder_linear_weight(weight, shape[0])
                packed[key] = _attribute(gm, w.target + "_packed", value)
            node.target = packed_linear
            node.args = (x, packed[key], w, b, shape[0])
            done["linear"] += 1
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
