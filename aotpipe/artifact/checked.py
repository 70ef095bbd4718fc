"""Checked forms of the ops whose kernels index memory with values they are given.

Many ATen kernels, backward ones above all, trust their arguments: a max-pool backward
writes ``grad_input[indices[i]]`` without asking whether ``indices[i]`` lies in the input,
an embedding backward does the same with token ids, a norm backward reads as many
statistics as the input has rows. Capture only ever hands them consistent arguments, but
graph.json is data anyone can write: with an index out of range or a statistics tensor
too short, those kernels read or write outside their buffers.

So a graph the loader built from an artefact runs with a checked form in place of each
such op (:func:`checked_twin`, called by aotpipe's run functions in execution.py): the form validates the arguments the kernel trusts (index
values within range, lengths and shapes consistent, sizes a value decides within the
byte limit) and then calls the op itself, returning exactly what it returns; a violation
is one :class:`~aotpipe.errors.ArtifactError` line naming the node and the argument, and
the kernel is never reached. Ops whose kernels check their own indices (``gather``,
``scatter``, ``index_select``, ``index.Tensor``, ``index_put``, ``take``...) keep them.

The loaded module itself keeps graph.json's ops (what passes match, verify compares and
show lists); the checked forms live in a twin module over the same constants.
"""

from __future__ import annotations

import copy
import math
import weakref
from typing import Any, Callable, Optional

import torch
import torch.fx

from aotpipe.format import limits
from aotpipe.artifact.ops import op_name
from aotpipe.errors import ArtifactError
from aotpipe.format.limits import extent

aten = torch.ops.aten


class CheckedOp:
    """A node's op in its checked form: checks, then the op (``checked_op``) itself."""

    def __init__(self, op: torch._ops.OpOverload, check: Callable[[dict[str, Any]], Optional[str]], where: str):
        self.checked_op = op
        self.check = check
        self.where = where
        short = op.__name__.replace(".", "_")
        self.__name__ = self.__qualname__ = f"checked_{short}"
        self.__module__ = __name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        why = self.check(_bind(self.checked_op, args, kwargs))
        if why:
            raise ArtifactError(f"{self.where} ({op_name(self.checked_op)}): {why}; the kernel was not run")
        return call_kernel(self.checked_op, args, kwargs)


def call_kernel(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """The op itself, after its checks passed (a seam for tests to prove it was not reached)."""
    return op(*args, **kwargs)


def _bind(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


# ---------------------------------------------------------------------------------------
# checks: each returns None, or why the arguments are unsafe


def _range(t: Any, low: int, high: int, what: str) -> Optional[str]:
    """Integer tensor `t` holds values in [low, high) only."""
    if not isinstance(t, torch.Tensor):
        return f"{what} is not a tensor"
    if t.is_floating_point() or t.is_complex():
        return f"{what} is not an integer tensor"
    if t.numel() == 0:
        return None
    lo, hi = int(t.min()), int(t.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        return f"{what} holds {bad}, outside [{low}, {high})"
    return None


def _numel(t: Any, n: int, what: str) -> Optional[str]:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return f"{what} is not a tensor"
    if t.numel() != n:
        return f"{what} has {t.numel()} elements where the input needs {n}"
    return None


def _dense(t: Any, what: str, *formats: torch.memory_format) -> Optional[str]:
    """`t` laid out densely (in one of `formats`; default: contiguous), as kernels that walk
    its data pointer by its sizes alone read it: a stride 0 (an expand of one element) or a
    gap would have them read past its storage."""
    if t is None or not isinstance(t, torch.Tensor):
        return None
    if any(t.is_contiguous(memory_format=f) for f in formats or (torch.contiguous_format,)):
        return None
    return (f"{what} is not dense (sizes {list(t.shape)[:8]}, strides {list(t.stride())[:8]}) where the kernel "
            "reads it so")


def _same_shape(a: Any, b: Any, what_a: str, what_b: str) -> Optional[str]:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return f"{what_a} or {what_b} is not a tensor"
    if a.shape != b.shape:
        return f"{what_a} has shape {list(a.shape)}, {what_b} {list(b.shape)}"
    return None


def _first(*problems: Optional[str]) -> Optional[str]:
    return next((p for p in problems if p), None)


def _pool_backward(spatial: int) -> Callable[[dict[str, Any]], Optional[str]]:
    def check(a: dict[str, Any]) -> Optional[str]:
        g, x, idx = a["grad_output"], a["self"], a["indices"]
        if not all(isinstance(t, torch.Tensor) for t in (g, x, idx)) or x.dim() < spatial:
            return "its tensors do not have the dimensions of a pooling"
        plane = math.prod(x.shape[-spatial:])
        if g.shape[:-spatial] != x.shape[:-spatial]:
            return f"grad_output has shape {list(g.shape)} for an input of shape {list(x.shape)}"
        layout = torch.channels_last if spatial == 2 else torch.channels_last_3d
        return _first(_same_shape(idx, g, "indices", "grad_output"),
                      _dense(idx, "indices", torch.contiguous_format, layout), _range(idx, 0, plane, "indices"))
    return check


def _batch_dims(grad: Any, x: Any, spatial: int, grad_name: str = "grad_output") -> Optional[str]:
    """A pooling's or padding's backward: grad has the input's dimensions but the last
    `spatial` (the kernels take the planes to walk from one and read the other with them)."""
    if not isinstance(grad, torch.Tensor) or not isinstance(x, torch.Tensor) or x.dim() <= spatial:
        return f"{grad_name} or self is not a tensor of more than {spatial} dimensions"
    if grad.dim() != x.dim() or grad.shape[:-spatial] != x.shape[:-spatial]:
        return f"{grad_name} has shape {list(grad.shape)} for an input of shape {list(x.shape)}"
    return None


def _pool_planes(spatial: int) -> Callable[[dict[str, Any]], Optional[str]]:
    def check(a: dict[str, Any]) -> Optional[str]:
        return _batch_dims(a["grad_output"], a["self"], spatial)
    return check


def _pad_backward(spatial: int, reflects: bool) -> Callable[[dict[str, Any]], Optional[str]]:
    """reflection_pad*d_backward, replication_pad*d_backward: grad_output is self padded. A
    reflection's pads are each less than self's size along their dimension, as its forward
    checks: the 2-d and 3-d backward kernels do not, and reflect a pad of the size or more to
    an index outside grad_input, where they write."""
    def check(a: dict[str, Any]) -> Optional[str]:
        g, x, pad = a["grad_output"], a["self"], a["padding"]
        problem = _batch_dims(g, x, spatial)
        if problem:
            return problem
        if not isinstance(pad, (list, tuple)) or len(pad) != 2 * spatial or not all(isinstance(p, int) for p in pad):
            return f"padding {pad!r} is not a list of {2 * spatial} ints"
        want = list(x.shape[:-spatial]) + [x.shape[-1 - d] + pad[2 * d] + pad[2 * d + 1]
                                           for d in reversed(range(spatial))]
        if list(g.shape) != want:
            return (f"grad_output has shape {list(g.shape)} where self {list(x.shape)} padded by {list(pad)} "
                    f"gives {want}")
        for d in range(spatial) if reflects else ():
            if max(pad[2 * d], pad[2 * d + 1]) >= x.shape[-1 - d]:
                return (f"padding {list(pad)} reflects a pad of {max(pad[2 * d], pad[2 * d + 1])} in dimension "
                        f"{x.dim() - 1 - d} of self {list(x.shape)}, where a pad must be less than the size")
        return None
    return check


def _softmax_backward(a: dict[str, Any]) -> Optional[str]:
    return _same_shape(a["grad_output"], a["output"], "grad_output", "output")


def _embedding_dense_backward(a: dict[str, Any]) -> Optional[str]:
    g, idx, n = a["grad_output"], a["indices"], a["num_weights"]
    if not isinstance(g, torch.Tensor) or not isinstance(idx, torch.Tensor) or g.dim() < 1:
        return "grad_output or indices is not a tensor"
    if g.shape[:-1] != idx.shape:
        return f"grad_output has shape {list(g.shape)} for indices of shape {list(idx.shape)}"
    return _range(idx, 0, n, f"indices (num_weights {n})")


def _bags(indices: Any, offset2bag: Any, num_bags: int, num_weights: int) -> Optional[str]:
    # offset2bag names each index's bag, the row of grad the kernels read for it: with no
    # bags (a grad of no rows) there is no row to name
    return _first(_range(indices, 0, num_weights, f"indices (num_weights {num_weights})"),
                  _numel(offset2bag, indices.numel(), "offset2bag") if isinstance(indices, torch.Tensor) else None,
                  _range(offset2bag, 0, num_bags, f"offset2bag ({num_bags} bags)")
                  if offset2bag is not None and offset2bag.numel() else None)


def _embedding_bag_dense_backward(a: dict[str, Any]) -> Optional[str]:
    grad, n = a["grad"], a["num_weights"]
    if not isinstance(grad, torch.Tensor) or grad.dim() != 2:
        return "grad is not a [bags, dim] tensor"
    bags = grad.shape[0]
    problem = _first(_bags(a["indices"], a["offset2bag"], bags, n),
                     _numel(a["bag_size"], bags, "bag_size"),
                     _numel(a.get("per_sample_weights"), a["indices"].numel(), "per_sample_weights"))
    if problem or a["mode"] != 2:  # 2: max
        return problem
    mx, size = a["maximum_indices"], a["bag_size"]
    if not isinstance(mx, torch.Tensor) or mx.shape != grad.shape:
        return "maximum_indices does not have grad's shape"
    return _range(mx[size > 0], 0, n, f"maximum_indices (num_weights {n})")


def _embedding_bag_backward(a: dict[str, Any]) -> Optional[str]:
    if a.get("sparse"):
        return "sparse=True builds a sparse tensor"
    problem = _offsets(a["offsets"], a["indices"])
    if problem:
        return problem
    idx, o2b = a["indices"], a["offset2bag"]
    if idx.numel() and isinstance(o2b, torch.Tensor) and o2b.numel() == 0:
        # The forward leaves offset2bag empty where it does not need it (mode sum); this op
        # then rebuilds it from offsets, and what it rebuilds must name bags grad has.
        a = {**a, "offset2bag": _offset2bag_from(a["offsets"], idx.numel())}
    return _embedding_bag_dense_backward(a)


def _offset2bag_from(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The offset2bag _embedding_bag_backward builds from `offsets` (checked: in [0, n],
    never decreasing) for `n` indices: each index's bag."""
    o2b = torch.zeros(n + 1, dtype=offsets.dtype)
    o2b.index_add_(0, offsets, torch.ones_like(offsets))
    o2b[0] -= 1
    return o2b.cumsum(0)[:n]


def _offsets(offsets: Any, indices: Any) -> Optional[str]:
    if not isinstance(offsets, torch.Tensor) or not isinstance(indices, torch.Tensor):
        return "offsets or indices is not a tensor"
    problem = _range(offsets, 0, indices.numel() + 1, "offsets")
    if problem is None and offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        problem = "offsets decrease"
    return problem


def _embedding_bag(a: dict[str, Any]) -> Optional[str]:
    w, idx, offsets = a["weight"], a["indices"], a["offsets"]
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return "weight is not a [num_weights, dim] tensor"
    if not isinstance(idx, torch.Tensor) or idx.dim() != 1:
        # The kernel takes 2-d indices too, but sizes offset2bag by their rows and reads it
        # for each element (max mode: past its end); embedding_bag flattens them before.
        return "indices is not a 1-d tensor"
    problem = _first(_dense(idx, "indices"), _dense(offsets, "offsets"),
                     _range(idx, 0, w.shape[0], f"indices (num_weights {w.shape[0]})"),
                     _offsets(offsets, idx), _numel(a.get("per_sample_weights"), idx.numel(), "per_sample_weights"))
    last = bool(a["include_last_offset"])
    if problem is None and idx.numel() and offsets.numel() - last < 1:
        # the kernel counts each index's bag from the offsets (the last one left out where it
        # is included): with none, every index lands in bag -1, a row before its output
        return (f"offsets has {offsets.numel()} elements (include_last_offset={last}), no bag for the {idx.numel()} "
                "indices")
    return problem


def _per_sample_weights_backward(a: dict[str, Any]) -> Optional[str]:
    grad, w = a["grad"], a["weight"]
    if not isinstance(grad, torch.Tensor) or not isinstance(w, torch.Tensor) or grad.dim() != 2 or w.dim() != 2:
        return "grad or weight is not a 2-d tensor"
    # An empty offset2bag (the forward's, where its mode made none) is rebuilt by the kernel
    # from offsets, which are checked
    o2b, idx, offsets = a["offset2bag"], a["indices"], a["offsets"]
    if not (isinstance(o2b, torch.Tensor) and o2b.numel() == 0):
        return _first(_bags(idx, o2b, grad.shape[0], w.shape[0]), _offsets(offsets, idx))
    why = _first(_range(idx, 0, w.shape[0], f"indices (num_weights {w.shape[0]})"), _offsets(offsets, idx))
    if why is None and idx.numel():
        # the bag of each index, as the kernel rebuilds it: the offsets at or before it, less
        # one (so the indices before the first offset land in bag -1, a row before grad's)
        if not offsets.numel() or int(offsets.min()) != 0:
            return f"offsets {offsets.tolist()[:8]} do not begin at 0, which puts the indices before them in bag -1"
        bags = int((offsets < idx.numel()).sum())
        if grad.shape[0] < bags:
            why = f"grad has {grad.shape[0]} rows for the {bags} bags offsets make"
    return why


def _layer_norm_rows(x: Any, normalized_shape: Any) -> tuple[Optional[str], int, int]:
    if not isinstance(x, torch.Tensor) or not isinstance(normalized_shape, (list, tuple)):
        return "input or normalized_shape is malformed", 0, 0
    k = len(normalized_shape)
    if k == 0 or k > x.dim() or list(x.shape[x.dim() - k:]) != [int(s) for s in normalized_shape]:
        return f"normalized_shape {list(normalized_shape)} does not end input's shape {list(x.shape)}", 0, 0
    # the kernel's M (rows: the dimensions before normalized_shape's) and N
    return None, math.prod(x.shape[:x.dim() - k]), math.prod(x.shape[x.dim() - k:])


def _layer_norm(a: dict[str, Any]) -> Optional[str]:
    why, _, n = _layer_norm_rows(a["input"], a["normalized_shape"])
    return _first(why, _numel(a["weight"], n, "weight"), _numel(a["bias"], n, "bias"))


def _layer_norm_backward(a: dict[str, Any]) -> Optional[str]:
    # The kernel reads mean and rstd by their data pointer, a row's statistic at a time
    # (one expanded from an element: past its storage); grad_out it makes contiguous.
    why, rows, n = _layer_norm_rows(a["input"], a["normalized_shape"])
    return _first(why, _same_shape(a["grad_out"], a["input"], "grad_out", "input"),
                  _numel(a["mean"], rows, "mean"), _numel(a["rstd"], rows, "rstd"),
                  _numel(a["weight"], n, "weight"), _numel(a["bias"], n, "bias"),
                  _dense(a["mean"], "mean"), _dense(a["rstd"], "rstd"))


def _channels(x: Any) -> tuple[Optional[str], int]:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return "input has fewer than 2 dimensions", 0
    return None, x.shape[1]


def _batch_norm_stats(*names: str) -> Callable[[dict[str, Any]], Optional[str]]:
    def check(a: dict[str, Any]) -> Optional[str]:
        why, c = _channels(a["input"])
        if why:
            return why
        problems = [_numel(a.get(name), c, name) for name in names]
        if "grad_out" in a:
            problems.insert(0, _same_shape(a["grad_out"], a["input"], "grad_out", "input"))
        return _first(*problems)
    return check


def _flash_attention_cpu(a: dict[str, Any]) -> Optional[str]:
    """_scaled_dot_product_flash_attention_for_cpu: its kernel checks only ranks, head sizes
    and the mask, then walks key and value with query's batch and heads (a key head per group
    of query heads) and value's positions, and reads each head's vector as dense, trusting what
    SDPA's CPU dispatch (use_flash_attention_cpp) checked before it chose this kernel: one
    batch size, key and value heads that group query's, key and value positions alike and none
    empty (it divides by them), last dimensions of stride 1. Its fake kernel checks none of it.
    (The mask it views and expands to the attention's shape itself, walking it by strides.)"""
    q, k, v = a["query"], a["key"], a["value"]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "query, key and value are not 4-d tensors [batch, heads, positions, head size]"
    if not q.dtype == k.dtype == v.dtype:
        return f"query, key and value have dtypes {q.dtype}, {k.dtype} and {v.dtype} where the kernel needs one"
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        return (f"query, key and value have batch sizes {q.shape[0]}, {k.shape[0]}, {v.shape[0]} where the kernel "
                "needs one")
    if k.shape[1] != v.shape[1] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return (f"key and value have {k.shape[1]} and {v.shape[1]} heads for query's {q.shape[1]} (the kernel needs "
                "one number, dividing query's)")
    if k.shape[2] != v.shape[2] or 0 in (q.shape[2], k.shape[2]):
        return (f"query, key and value have {q.shape[2]}, {k.shape[2]} and {v.shape[2]} positions (the kernel needs "
                "at least one, and as many in key as in value)")
    if not q.shape[3] == k.shape[3] == v.shape[3]:
        return (f"query, key and value have head sizes {q.shape[3]}, {k.shape[3]} and {v.shape[3]} where the kernel "
                "needs one")
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.shape[3] > 1 and t.stride(3) != 1:
            return (f"{name}'s last dimension ({t.shape[3]} elements) has stride {t.stride(3)} where the kernel "
                    "reads it densely (stride 1)")
    return None


def _flash_attention_cpu_backward(a: dict[str, Any]) -> Optional[str]:
    """_scaled_dot_product_flash_attention_for_cpu_backward: the kernel takes its sizes from
    query and key (as the forward does: :func:`_flash_attention_cpu`) and walks grad_out, out
    and logsumexp by their strides with them, reading each head's vector of grad_out and out
    as dense; autograd hands it the forward's out and logsumexp, and a grad_out of out's shape."""
    problem = _flash_attention_cpu(a)
    if problem:
        return problem
    q, v, out, g, lse = a["query"], a["value"], a["out"], a["grad_out"], a["logsumexp"]
    want = [q.shape[0], q.shape[1], q.shape[2], v.shape[3]]
    for name, t in (("out", out), ("grad_out", g)):
        if not isinstance(t, torch.Tensor) or list(t.shape) != want or t.dtype != q.dtype:
            return (f"{name} is {_described(t)} where query and value give {q.dtype} {want} (the forward's "
                    "output)")
        if t.shape[3] > 1 and t.stride(3) != 1:
            return f"{name}'s last dimension has stride {t.stride(3)} where the kernel reads it densely (stride 1)"
    if not isinstance(lse, torch.Tensor) or list(lse.shape) != want[:3]:
        return f"logsumexp is {_described(lse)} where query gives [batch, heads, positions] {want[:3]}"
    return None


def _described(t: Any) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _rnn(gates: int) -> Callable[[dict[str, Any]], Optional[str]]:
    """lstm.input (4 gates), gru.input (3), rnn_tanh.input and rnn_relu.input (1): the CPU
    path (oneDNN's RNN among its kernels) reads each layer's weights and the hidden state by
    the sizes the input and hidden state give, unchecked; each must have the shape torch.nn's
    RNNs give it (weights per layer and direction: w_ih, w_hh, then b_ih, b_hh, then an
    LSTM's w_hr projection)."""
    def check(a: dict[str, Any]) -> Optional[str]:
        x, params, dirs, layers = a["input"], a["params"], 2 if a["bidirectional"] else 1, a["num_layers"]
        hs = list(a["hx"]) if isinstance(a["hx"], (list, tuple)) else [a["hx"]]
        if not (isinstance(x, torch.Tensor) and x.dim() == 3 and len(hs) == (2 if gates == 4 else 1)
                and all(isinstance(h, torch.Tensor) and h.dim() == 3 for h in hs)
                and isinstance(params, (list, tuple)) and isinstance(layers, int) and layers > 0):
            return "input and hx are not 3-d tensors (hx: two for an LSTM) or params is not a list"
        batch, out = x.shape[0] if a["batch_first"] else x.shape[1], hs[0].shape[2]
        hidden = hs[1].shape[2] if gates == 4 else out
        proj = out != hidden  # an LSTM's projection: its output is out wide, its cell hidden
        for name, h, width in zip(("hx[0]", "hx[1]"), hs, (out, hidden)):
            if list(h.shape) != [layers * dirs, batch, width]:
                return f"{name} has shape {list(h.shape)} where the input and {layers} layers need " \
                       f"{[layers * dirs, batch, width]}"
        per = (4 if a["has_biases"] else 2) + (1 if proj else 0)
        if len(params) != per * layers * dirs:
            return (f"params holds {len(params)} tensors where {layers * dirs} layers and directions need "
                    f"{per * layers * dirs}")
        for i, w in enumerate(params):
            k, layer = i % per, i // per // dirs
            rows = gates * hidden
            shapes = [[rows, x.shape[2] if layer == 0 else out * dirs], [rows, out]] + \
                ([[rows], [rows]] if a["has_biases"] else []) + ([[out, hidden]] if proj else [])
            if not isinstance(w, torch.Tensor) or list(w.shape) != shapes[k]:
                return f"params[{i}] has shape {list(getattr(w, 'shape', []))} where its layer needs {shapes[k]}"
        return None
    return check


def _mkldnn_convolution(a: dict[str, Any]) -> Optional[str]:
    """mkldnn._convolution_pointwise (and .binary): oneDNN reads the bias as W's output
    channels, densely (its other tensors it takes by their strides)."""
    w = a["W"]
    if not isinstance(w, torch.Tensor) or w.dim() < 3:
        return "W is not a convolution's weight"
    return _first(_numel(a["B"], w.shape[0], "B"), _dense(a["B"], "B"),
                  _residual_shape(a) if "other" in a else None)


def _residual_shape(a: dict[str, Any]) -> str | None:
    """The binary kernel reads `other` as its output's shape, unchecked: hold it to that."""
    x, w, other = a["X"], a["W"], a["other"]
    if not (isinstance(x, torch.Tensor) and isinstance(other, torch.Tensor) and x.dim() == w.dim()):
        return "X or other is not a tensor of the convolution's rank"
    spatial = []
    for i, size in enumerate(x.shape[2:]):
        pad, stride, dil = (_at(a[k], i) for k in ("padding", "stride", "dilation"))
        spatial.append((size + 2 * pad - dil * (w.shape[2 + i] - 1) - 1) // stride + 1)
    want = [x.shape[0], w.shape[0], *spatial]
    return None if list(other.shape) == want else f"other has shape {list(other.shape)} where the output has {want}"


def _at(values: Any, i: int) -> int:
    return int(values[i] if len(values) > 1 else values[0])


def _group_norm_geometry(a: dict[str, Any]) -> Optional[str]:
    x, n, c, hxw, group = a["input"], a["N"], a["C"], a["HxW"], a["group"]
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return "input has fewer than 2 dimensions"
    if x.shape[0] != n or x.shape[1] != c or x.numel() != n * c * hxw:
        return f"N={n}, C={c}, HxW={hxw} do not describe an input of shape {list(x.shape)}"
    if not (isinstance(group, int) and group > 0 and c % group == 0):
        return f"group={group} does not divide C={c}"
    return None


def _group_norm(a: dict[str, Any]) -> Optional[str]:
    return _first(_group_norm_geometry(a), _numel(a["weight"], a["C"], "weight"), _numel(a["bias"], a["C"], "bias"),
                  _dense(a["weight"], "weight"), _dense(a["bias"], "bias"))


def _group_norm_backward(a: dict[str, Any]) -> Optional[str]:
    problem = _group_norm_geometry(a)
    if problem:
        return problem
    stats = a["N"] * a["group"]
    x = a["input"]
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim(), torch.contiguous_format)
    if x.is_contiguous() or not x.is_contiguous(memory_format=layout):  # the kernel's suggest_memory_format
        layout = torch.contiguous_format
    return _first(_same_shape(a["grad_out"], a["input"], "grad_out", "input"),
                  _numel(a["mean"], stats, "mean"), _numel(a["rstd"], stats, "rstd"),
                  _numel(a["weight"], a["C"], "weight"),
                  _dense(a["input"], "input", layout), _dense(a["grad_out"], "grad_out", layout),
                  *(_dense(a[name], name) for name in ("mean", "rstd", "weight")))


def _cholesky_solve_helper(a: dict[str, Any]) -> Optional[str]:
    """_cholesky_solve_helper (cholesky_solve's kernel): LAPACK's potrs solves each of A's
    matrices against self's by A's size alone; cholesky_solve hands it self and A with their
    batch dimensions broadcast, A square and self of A's rows."""
    b, m = a["self"], a["A"]
    if not isinstance(b, torch.Tensor) or not isinstance(m, torch.Tensor) or b.dim() < 2 or m.dim() < 2:
        return "self or A is not a batch of matrices"
    if m.shape[-1] != m.shape[-2] or b.shape[-2] != m.shape[-1] or b.shape[:-2] != m.shape[:-2]:
        return (f"self has shape {list(b.shape)} for A of shape {list(m.shape)} (A square, self of its rows, "
                "batch dimensions broadcast)")
    return None


def _ldl_solve(a: dict[str, Any]) -> Optional[str]:
    """linalg_ldl_solve: torch checks that each pivot's magnitude is a row of LD, but LAPACK's
    sytrs reads a negative pivot as the first of a 2x2 block and takes the row after it too,
    past the last row when the block begins there. Pivots as linalg_ldl_factor gives them
    (LAPACK's lower form): a positive one alone, negative ones in equal pairs."""
    pivots = a["pivots"]
    if not isinstance(pivots, torch.Tensor) or pivots.dim() < 1 or pivots.is_floating_point():
        return "pivots is not an integer tensor"
    rows = pivots.reshape(-1, pivots.shape[-1]).tolist() if pivots.numel() else []
    for row in rows:
        k = 0
        while k < len(row):
            if row[k] > 0:
                k += 1
            elif k + 1 < len(row) and row[k] < 0 and row[k + 1] == row[k]:
                k += 2
            else:
                return (f"pivots {row[:8]} has a 2x2 block (negative pivots, in equal pairs) cut at row {k}, as "
                        "linalg_ldl_factor never gives")
    return None


def _lu_unpack(a: dict[str, Any]) -> Optional[str]:
    """lu_unpack: torch checks the pivots' values against LU's rows, not how many there are;
    with none the CPU kernel reads pivots past its storage. linalg_lu_factor gives one per
    row or column, whichever are fewer, for each of LU's matrices."""
    lu, pivots = a["LU_data"], a["LU_pivots"]
    if not isinstance(lu, torch.Tensor) or not isinstance(pivots, torch.Tensor) or lu.dim() < 2:
        return "LU_data is not a batch of matrices or LU_pivots is not a tensor"
    want = [*lu.shape[:-2], min(lu.shape[-2:])]
    if list(pivots.shape) != want:
        return f"LU_pivots has shape {list(pivots.shape)} where LU_data {list(lu.shape)} needs {want}"
    return None


def _pdist_backward(a: dict[str, Any]) -> Optional[str]:
    """_pdist_backward: the CPU kernel steps through grad by its first stride, once per pair
    of self's rows, so grad is one dimension of that many (a [1, pairs] grad has it read
    pairs times pairs elements)."""
    x, g = a["self"], a["grad"]
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return "self is not a 2-d tensor"
    if x.shape[0] == 0:
        return "self has no rows"
    pairs = x.shape[0] * (x.shape[0] - 1) // 2
    return _first(_numel(a["pdist"], pairs, "pdist"), _numel(g, pairs, "grad"),
                  f"grad has shape {list(g.shape)} where the kernel reads [{pairs}]"
                  if isinstance(g, torch.Tensor) and g.dim() != 1 else None)


def _cdist_backward(a: dict[str, Any]) -> Optional[str]:
    x1, x2, d, g = a["x1"], a["x2"], a["cdist"], a["grad"]
    if not all(isinstance(t, torch.Tensor) for t in (x1, x2, d, g)) or min(x1.dim(), x2.dim(), d.dim()) < 2:
        return "its tensors are not batches of matrices"
    # The kernel expands x1's and x2's batch dimensions to their broadcast (as cdist's forward
    # does) but reads cdist and grad as if they had it: theirs must be exactly that.
    try:
        batch = list(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    except RuntimeError:
        batch = None
    if x1.shape[-1] != x2.shape[-1] or batch is None or list(d.shape) != [*batch, x1.shape[-2], x2.shape[-2]]:
        return (f"cdist has shape {list(d.shape)} for x1 {list(x1.shape)} and x2 {list(x2.shape)} "
                "(not their batch dimensions broadcast, then [rows of x1, rows of x2])")
    return _same_shape(g, d, "grad", "cdist")


def _norm_dim(v: Any, dim: Any) -> tuple[Optional[str], int]:
    if not isinstance(v, torch.Tensor) or not isinstance(dim, int) or not -v.dim() <= dim < v.dim():
        return "dim is not a dimension of v", 0
    return None, v.shape[dim]


def _weight_norm(a: dict[str, Any]) -> Optional[str]:
    why, n = _norm_dim(a["v"], a["dim"])
    return _first(why, _numel(a["g"], n, "g"), _dense(a["v"], "v"), _dense(a["g"], "g"))


def _weight_norm_backward(a: dict[str, Any]) -> Optional[str]:
    why, n = _norm_dim(a["saved_v"], a["dim"])
    return _first(why, _same_shape(a["grad_w"], a["saved_v"], "grad_w", "saved_v"),
                  _numel(a["saved_g"], n, "saved_g"), _numel(a["saved_norms"], n, "saved_norms"),
                  *(_dense(a[name], name) for name in ("grad_w", "saved_v", "saved_g", "saved_norms")))


def _lengths(lengths: Any, offsets: Any, axis_size: int) -> Optional[str]:
    if lengths is not None:
        if not isinstance(lengths, torch.Tensor):
            return "lengths is not a tensor"
        if lengths.numel() and int(lengths.min()) < 0:
            return "lengths holds a negative length"
        per_row = lengths.reshape(-1, lengths.shape[-1]) if lengths.dim() else lengths.reshape(1, 1)
        sums = per_row.sum(-1) if per_row.numel() else per_row.new_zeros(0)
        if sums.numel() and bool((sums != axis_size).any()):
            return f"lengths add up to {int(sums.max())}, the data has {axis_size} along the axis"
        return None
    if offsets is not None:
        if not isinstance(offsets, torch.Tensor) or offsets.dim() < 1 or offsets.shape[-1] < 1:
            return "offsets is not a tensor of offsets"
        problem = _range(offsets, 0, axis_size + 1, "offsets")
        if problem:
            return problem
        if offsets.shape[-1] > 1 and bool((offsets[..., 1:] < offsets[..., :-1]).any()):
            return "offsets decrease"
        if bool((offsets[..., 0] != 0).any()) or bool((offsets[..., -1] != axis_size).any()):
            return f"offsets do not run from 0 to {axis_size}"
        return None
    return "neither lengths nor offsets is given"


def _segment_reduce(a: dict[str, Any]) -> Optional[str]:
    if a.get("unsafe"):
        return "unsafe=True skips the kernel's own checks"
    data, axis = a["data"], a["axis"]
    if not isinstance(data, torch.Tensor) or not isinstance(axis, int) or not -data.dim() <= axis < data.dim():
        return "axis is not a dimension of data"
    return _lengths(a["lengths"], a["offsets"], data.shape[axis])


def _segment_reduce_backward(a: dict[str, Any]) -> Optional[str]:
    data, axis, out, grad = a["data"], a["axis"], a["output"], a["grad"]
    if not all(isinstance(t, torch.Tensor) for t in (data, out, grad)) or not isinstance(axis, int) \
            or not -data.dim() <= axis < data.dim():
        return "axis is not a dimension of data"
    problem = _first(_same_shape(grad, out, "grad", "output"), _lengths(a["lengths"], a["offsets"], data.shape[axis]))
    if problem:
        return problem
    segments = a["lengths"].shape[-1] if a["lengths"] is not None else a["offsets"].shape[-1] - 1
    expect = list(data.shape)
    expect[axis] = segments
    if list(out.shape) != expect:
        return f"output has shape {list(out.shape)} where {segments} segments of data give {expect}"
    return None


def how_to_raise_tensor_limit(lim: limits.Limits) -> str:
    """What raises the per-tensor limit: --max-bytes only where no max_tensor_bytes is set apart."""
    if lim.max_tensor_bytes is not None:
        return limits.ENV["max_tensor_bytes"]
    return f"{limits.ENV['max_bytes']} or --max-bytes"


def _bounded_size(n: int, itemsize: int, what: str) -> Optional[str]:
    lim = limits.current()
    limit = lim.tensor_bytes
    if n * itemsize > limit:
        return (f"{what} makes {n:,} elements ({limits.human(n * itemsize)}), over the limit of "
                f"{limits.human(limit)} (raise it with {how_to_raise_tensor_limit(lim)})")
    return None


def _bincount(a: dict[str, Any]) -> Optional[str]:
    x, minlength = a["self"], a["minlength"] or 0
    if not isinstance(x, torch.Tensor) or x.is_floating_point():
        return "self is not an integer tensor"
    size = max(int(minlength), int(x.max()) + 1 if x.numel() else 0)
    return _bounded_size(size, 8, "its values")


def _repeat_interleave(a: dict[str, Any]) -> Optional[str]:
    r, given = a["repeats"], a["output_size"]
    if not isinstance(r, torch.Tensor) or r.is_floating_point():
        return "repeats is not an integer tensor"
    if r.numel() and int(r.min()) < 0:
        return "repeats holds a negative count"
    total = int(r.sum()) if r.numel() else 0
    if given is not None and given != total:
        return f"output_size {given} differs from the repeats' sum {total}"
    return _bounded_size(total, 8, "its repeats")


def _fft(a: dict[str, Any]) -> Optional[str]:
    """_fft_r2c, _fft_c2r, _fft_c2c: the MKL and pocketfft kernels index the input's sizes with
    `dim` and switch on `normalization` without checking either."""
    x, dims, norm = a["self"], a["dim"], a["normalization"]
    if not isinstance(x, torch.Tensor):
        return "self is not a tensor"
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(d, int) for d in dims):
        return "dim is not a list of dimensions"
    if any(not 0 <= d < x.dim() for d in dims):  # the kernels take wrapped dims only
        return f"dim {list(dims)} names a dimension self ({x.dim()}-d) does not have (0 to {x.dim() - 1})"
    if len(set(dims)) != len(dims):
        return f"dim {list(dims)} names a dimension twice"
    if norm not in (0, 1, 2):
        return f"normalization {norm!r} is not 0, 1 or 2"
    last = a.get("last_dim_size")
    if last is not None:
        if not isinstance(last, int) or last < 1:
            return f"last_dim_size {last!r} is not a positive size"
        return _bounded_size(x.numel() // max(1, x.shape[dims[-1]]) * last, x.element_size(), "last_dim_size")
    return None


def _grid_sampler(a: dict[str, Any]) -> Optional[str]:
    """grid_sampler_2d, grid_sampler_3d (and _grid_sampler_2d_cpu_fallback) and their
    backwards: the CPU kernels switch on `interpolation_mode` and `padding_mode` (ints in the
    graph) without checking them (7 runs as if it were a mode); the backwards walk grad_output
    by the sizes input and grid give."""
    if a["interpolation_mode"] not in (0, 1, 2):
        return f"interpolation_mode {a['interpolation_mode']!r} is not 0, 1 or 2 (bilinear, nearest, bicubic)"
    if a["padding_mode"] not in (0, 1, 2):
        return f"padding_mode {a['padding_mode']!r} is not 0, 1 or 2 (zeros, border, reflection)"
    g, x, grid = a.get("grad_output"), a["input"], a["grid"]
    if g is not None and isinstance(x, torch.Tensor) and isinstance(grid, torch.Tensor) and x.dim() == grid.dim() \
            and x.dim() in (4, 5):
        want = [x.shape[0], x.shape[1], *grid.shape[1:-1]]
        if not isinstance(g, torch.Tensor) or list(g.shape) != want:
            return f"grad_output has shape {list(getattr(g, 'shape', []))} where input and grid give {want}"
    return None


def _group(name: Any, size: Any = None) -> str | None:
    """A collective's process group: one this process set up (torch.distributed's registry),
    of `size` ranks where the node gives one (an all-gather allocates `size` times its input)."""
    import torch.distributed as dist  # only a graph with collectives needs it

    if not dist.is_available() or not dist.is_initialized():
        return (f"it calls process group {name!r} and this process has none: a distributed rank's graph runs with its "
                "peer ranks (aotpipe replay ART --ranks)")
    try:
        group = dist.distributed_c10d._resolve_process_group(name)
    except (RuntimeError, ValueError, KeyError):
        return f"process group {name!r} is not one this process set up (the ranks' mesh differs from the capture's)"
    if size is not None and size != group.size():
        return f"group_size {size!r} where process group {name!r} has {group.size()} ranks"
    return None


def _all_gather(a: dict[str, Any]) -> str | None:
    return _group(a.get("group_name"), a.get("group_size"))


def _reduce_scatter(a: dict[str, Any]) -> str | None:
    x, n = a.get("input"), a.get("group_size")
    problem = _group(a.get("group_name"), n)
    if problem is None and isinstance(x, torch.Tensor) and isinstance(n, int) and (x.dim() == 0 or x.shape[0] % n):
        return f"input {_described(x)} does not split into {n} equal parts on its first dimension"
    return problem


def _all_reduce(a: dict[str, Any]) -> str | None:
    return _group(a.get("group_name"))


_collectives = torch.ops._c10d_functional

# The op -> its check. Ops whose output size a value decides are here too: the precheck
# bounds them by the limit these checks enforce (aotpipe/artifact/precheck.py).
CHECKS: dict[Any, Callable[[dict[str, Any]], Optional[str]]] = {
    aten.max_pool2d_with_indices_backward.default: _pool_backward(2),
    aten.max_pool3d_with_indices_backward.default: _pool_backward(3),
    _collectives.all_gather_into_tensor.default: _all_gather,
    _collectives.reduce_scatter_tensor.default: _reduce_scatter,
    _collectives.all_reduce.default: _all_reduce,
    aten.adaptive_max_pool2d_backward.default: _pool_backward(2),
    aten.adaptive_max_pool3d_backward.default: _pool_backward(3),
    aten.embedding_dense_backward.default: _embedding_dense_backward,
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
    aten._embedding_bag_backward.default: _embedding_bag_backward,
    aten._embedding_bag_dense_backward.default: _embedding_bag_dense_backward,
    aten._embedding_bag_per_sample_weights_backward.default: _per_sample_weights_backward,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.native_batch_norm.default: _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._native_batch_norm_legit.default: _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._native_batch_norm_legit.no_stats: _batch_norm_stats("weight", "bias"),
    aten._native_batch_norm_legit_functional.default:
        _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._native_batch_norm_legit_no_training.default:
        _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._batch_norm_with_update_functional.default:
        _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._batch_norm_no_update.default: _batch_norm_stats("weight", "bias", "running_mean", "running_var"),
    aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_attention_cpu,
    aten.native_batch_norm_backward.default:
        _batch_norm_stats("weight", "running_mean", "running_var", "save_mean", "save_invstd"),
    aten.batch_norm_backward.default:
        _batch_norm_stats("weight", "running_mean", "running_var", "save_mean", "save_var"),
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _softmax_backward,
    aten._adaptive_avg_pool2d_backward.default: _pool_planes(2),
    aten.avg_pool2d_backward.default: _pool_planes(2),
    aten._adaptive_avg_pool3d_backward.default: _pool_planes(3),
    aten.avg_pool3d_backward.default: _pool_planes(3),
    aten.fractional_max_pool2d_backward.default: _pool_backward(2),
    aten.fractional_max_pool3d_backward.default: _pool_backward(3),
    aten.reflection_pad1d_backward.default: _pad_backward(1, reflects=True),
    aten.reflection_pad2d_backward.default: _pad_backward(2, reflects=True),
    aten.reflection_pad3d_backward.default: _pad_backward(3, reflects=True),
    aten.replication_pad1d_backward.default: _pad_backward(1, reflects=False),
    aten.replication_pad2d_backward.default: _pad_backward(2, reflects=False),
    aten.replication_pad3d_backward.default: _pad_backward(3, reflects=False),
    aten.lstm.input: _rnn(4),
    aten.gru.input: _rnn(3),
    aten.rnn_tanh.input: _rnn(1),
    aten.rnn_relu.input: _rnn(1),
    aten.native_group_norm.default: _group_norm,
    aten.native_group_norm_backward.default: _group_norm_backward,
    aten._pdist_backward.default: _pdist_backward,
    aten._cdist_backward.default: _cdist_backward,
    aten._weight_norm_interface.default: _weight_norm,
    aten._weight_norm_interface_backward.default: _weight_norm_backward,
    aten.segment_reduce.default: _segment_reduce,
    aten._segment_reduce_backward.default: _segment_reduce_backward,
    aten.bincount.default: _bincount,
    aten.repeat_interleave.Tensor: _repeat_interleave,
    aten._fft_r2c.default: _fft,
    aten._fft_c2r.default: _fft,
    aten._fft_c2c.default: _fft,
    aten.grid_sampler_2d.default: _grid_sampler,
    aten.grid_sampler_2d_backward.default: _grid_sampler,
    aten.grid_sampler_3d.default: _grid_sampler,
    aten.grid_sampler_3d_backward.default: _grid_sampler,
    aten._grid_sampler_2d_cpu_fallback.default: _grid_sampler,
    aten._grid_sampler_2d_cpu_fallback_backward.default: _grid_sampler,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_attention_cpu_backward,
    aten._cholesky_solve_helper.default: _cholesky_solve_helper,
    aten.linalg_ldl_solve.default: _ldl_solve,
    aten.lu_unpack.default: _lu_unpack,
}

# oneDNN's fused convolutions, where this torch has them (ops.MKLDNN allows them by name)
if hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
    CHECKS[torch.ops.mkldnn._convolution_pointwise.default] = _mkldnn_convolution
    CHECKS[torch.ops.mkldnn._convolution_pointwise.binary] = _mkldnn_convolution

# Ops whose output size comes from values, bounded at run time by their check above to
# the per-tensor limit (elements of 8 bytes): the precheck takes that bound.
RUNTIME_BOUNDED = frozenset({aten.bincount.default, aten.repeat_interleave.Tensor})


# ---------------------------------------------------------------------------------------
# views whose reach only the run's values decide

# gm.meta key: names of the view nodes the precheck could not bound (their sizes come from
# values read while the graph runs: an MoE's routed-token counts); each runs checked.
RUN_CHECKED_VIEWS = "aotpipe_run_checked_views"


def aliases_inputs(target: Any) -> bool:
    """An op whose outputs are its inputs' memory (a view, an in-place op): what they reach
    lies in its inputs' storages, and its meta kernel gives their sizes, strides and offset."""
    schema = getattr(target, "_schema", None)
    return schema is not None and bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)


def reach_bytes(t: torch.Tensor) -> int:
    """Bytes of its storage a strided tensor reaches, from the storage's start."""
    if t.numel() == 0:
        return 0
    return (t.storage_offset() + extent(t.shape, t.stride())) * t.element_size()


# gm.meta key: node name -> bytes, for the nodes that make a tensor whose size only the run's
# values decide (an arange to a count read from a tensor): each may make at most that much.
RUN_CHECKED_ALLOCS = "aotpipe_run_checked_allocs"

# gm.meta key: node name -> the outputs the precheck assumed, for the nodes of those above
# whose fake kernel needs a plain int where the graph gives a size read from values (SAM3's
# constant_pad_nd padded by u0*u1): the precheck went on with the outputs it assumed, and the
# run's must be those: per output tensor, its dtype and sizes (None: any size).
RUN_CHECKED_OUTPUTS = "aotpipe_run_checked_outputs"

Expected = tuple[tuple[str, tuple[Optional[int], ...]], ...]


def expected_outputs(value: Any) -> Expected:
    """What :class:`AllocationCheckedAtRun` holds the run's outputs to: per tensor of `value`
    (the precheck's fake outputs), dtype and sizes, None where a size is symbolic."""
    return tuple((str(t.dtype).removeprefix("torch."), tuple(s if isinstance(s, int) else None for s in t.shape))
                 for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


def _shown(expected: Expected) -> str:
    return ", ".join(f"{dtype}[{', '.join('?' if s is None else str(s) for s in sizes)}]" for dtype, sizes in expected)

_META_ELEMENTS = 1 << 56


def _on_meta(op: Any, args: tuple, kwargs: dict) -> tuple[Any, dict[int, int]]:
    """`op` run on meta tensors laid out like the tensor arguments (shapes, strides, offsets;
    no data), and the real storages' bytes by meta storage (its C++ address). Each meta
    storage is far larger than the real one (meta allocates nothing), so that a reach past
    the real one is the caller's refusal, not a meta kernel's own error. Arguments torch's own
    checks reject (an expand to a size that does not match) raise here, as the real kernel
    would, and the real kernel is never reached unchecked."""
    storage_bytes: dict[int, int] = {}

    def meta(v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
            return v
        base = torch.empty(_META_ELEMENTS, dtype=v.dtype, device="meta")
        storage_bytes[base.untyped_storage()._cdata] = v.untyped_storage().nbytes()
        return base.as_strided(v.shape, v.stride(), v.storage_offset())

    meta_args, meta_kwargs = torch.utils._pytree.tree_map(meta, (args, kwargs))
    return op(*meta_args, **meta_kwargs), storage_bytes


class _CheckedAtRun:
    def __init__(self, op: Any, where: str):
        self.checked_op = getattr(op, "checked_op", op)
        self.inner = op
        self.where = where
        short = self.checked_op.__name__.replace(".", "_")
        self.__name__ = self.__qualname__ = f"run_checked_{short}"
        self.__module__ = __name__

    def _refuse(self, why: str) -> ArtifactError:
        return ArtifactError(f"{self.where} ({op_name(self.checked_op)}): {why}; the kernel was not run")


class ViewCheckedAtRun(_CheckedAtRun):
    """A view (or in-place) op whose sizes the precheck could not bound, or over a storage
    whose size only the run decides: the view is first made on meta tensors laid out like the
    arguments, and each output must lie within the storage it views; only then is the op run."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        made, storage_bytes = _on_meta(self.checked_op, args, kwargs)
        for t in torch.utils._pytree.tree_leaves(made):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                have = storage_bytes.get(t.untyped_storage()._cdata)
                need = reach_bytes(t)
                if have is not None and need > have:
                    raise self._refuse(f"gives a view (sizes {list(t.shape)[:8]}, strides {list(t.stride())[:8]}, "
                                       f"storage offset {t.storage_offset()}) that reaches byte {need:,} of a "
                                       f"storage of {have:,} bytes")
        return self.inner(*args, **kwargs)


class AllocationCheckedAtRun(_CheckedAtRun):
    """An op that makes a tensor whose size only the run's values decide: it is first made on
    meta tensors (sizes, no memory), and may need at most `limit` bytes, the share of the room
    the graph leaves under the byte limit that the precheck gave it; where the precheck had to
    assume its outputs (`expected`: its fake kernel could not take the sizes), they must be
    those; only then is the op run."""

    def __init__(self, op: Any, limit: Optional[int], where: str, expected: Optional[Expected] = None):
        super().__init__(op, where)
        self.limit = limit  # None: sizes the precheck knew, counted in its peak (only `expected` to hold)
        self.expected = expected  # RUN_CHECKED_OUTPUTS: the outputs the precheck assumed, if it had to

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.Tag.dynamic_output_shape in getattr(self.checked_op, "tags", ()) and self.checked_op not in CHECKS:
            # Its size depends on the data itself (nonzero, boolean indexing of a tensor the
            # run sized): no meta kernel can say it, and it is at most its input's (torch's fake
            # kernels bound it so), a tensor that already passed its own check. (bincount and
            # repeat_interleave, whose values decide their size, are not: their meta run fails.)
            return self.inner(*args, **kwargs)
        made, inputs = _on_meta(self.checked_op, args, kwargs)
        if self.expected is not None:
            got = expected_outputs(made)
            if len(got) != len(self.expected) or any(
                    g[0] != e[0] or len(g[1]) != len(e[1]) or any(w is not None and w != s for s, w in zip(g[1], e[1]))
                    for g, e in zip(got, self.expected)):
                raise self._refuse(f"gives {_shown(got)} where the check before the run assumed {_shown(self.expected)}")
        fresh = {t.untyped_storage()._cdata: t for t in torch.utils._pytree.tree_leaves(made)
                 if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs}
        need = sum(t.untyped_storage().nbytes() for t in fresh.values())
        if self.limit is not None and need > self.limit:
            shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)[:8]}" for t in fresh.values())
            raise self._refuse(f"makes {shapes} ({limits.human(need)}) from values read while the graph runs, over "
                               f"the {limits.human(self.limit)} the graph leaves it under the byte limit (raise it "
                               "with AOTPIPE_MAX_BYTES or --max-bytes)")
        return self.inner(*args, **kwargs)


_TWINS: "weakref.WeakKeyDictionary[torch.fx.GraphModule, tuple[Any, torch.fx.GraphModule]]" = weakref.WeakKeyDictionary()


def checked_twin(gm: torch.fx.GraphModule, where: str) -> torch.fx.GraphModule:
    """`gm` (a graph built from the artefact at `where`) with the checked form in place of
    every op of :data:`CHECKS`: a module of its own over the same constants, made once per
    module, so `gm` itself keeps graph.json's ops for the passes, verify and show; `gm`
    itself if it has none of them."""
    # A pass may rewrite `gm`'s graph in place after a run (the loader's recompute runs the
    # chain on the loaded base graph): a twin is good only for the code it was made from.
    # The views checked at run time are the precheck's finding for the inputs it has seen.
    run_checked = frozenset(gm.meta.get(RUN_CHECKED_VIEWS, ()))
    run_allocs = dict(gm.meta.get(RUN_CHECKED_ALLOCS, {}))
    run_outputs = dict(gm.meta.get(RUN_CHECKED_OUTPUTS, {}))
    key = (gm.code, run_checked, frozenset(run_allocs.items()), frozenset(run_outputs.items()))
    cached = _TWINS.get(gm)
    if cached is not None and cached[0] == key:
        return cached[1]
    if not any(n.op == "call_function" and (n.target in CHECKS or n.name in run_checked or n.name in run_allocs
                                            or n.name in run_outputs) for n in gm.graph.nodes):
        twin = gm
    else:
        graph = copy.deepcopy(gm.graph)
        for n in graph.nodes:
            if n.op != "call_function":
                continue
            if n.target in CHECKS:
                n.target = CheckedOp(n.target, CHECKS[n.target], f"{where}: node {n.name!r}")
            if n.name in run_checked:
                n.target = ViewCheckedAtRun(n.target, f"{where}: node {n.name!r}")
            elif n.name in run_allocs or n.name in run_outputs:
                n.target = AllocationCheckedAtRun(n.target, run_allocs.get(n.name), f"{where}: node {n.name!r}",
                                                  run_outputs.get(n.name))
        twin = torch.fx.GraphModule(gm, graph)  # gm's constants, not copies
        twin.meta.update({k: v for k, v in gm.meta.items()})
    _TWINS[gm] = (key, twin)
    return twin
