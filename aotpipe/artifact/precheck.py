"""A loaded graph, propagated on meta or fake tensors before any of its kernels runs.

graph.json is data, but data can still ask a kernel for what it cannot give: a view whose
sizes, strides or offset reach past its storage (``as_strided``, ``_reshape_alias``), a
literal size in any argument (``arange(0, 10**12)``, ``eye``, ``repeat``, ``pad``, an
upsample's output size), one value returned many times, a chain of ``cat``. So before a
graph from an artefact runs, :func:`check_graph` runs it on torch's fake tensors
(``FakeTensorMode``: shapes, strides, dtypes and storages, no data, no kernels) from the
very inputs and constants it is about to get, and refuses, naming the node and op. A first
pass on meta tensors (the same kernels, called directly: about twice as fast) accepts the
graphs it can say all of (no size read from values, one device); any other graph, and any
the meta pass would refuse, the fake-tensor pass checks, and its verdict is the check's:

- a value that reaches outside its storage: each node's tensors are held against the
  storage they live in, at the size it had when it was made (a fake ``as_strided`` grows
  its fake storage instead of failing, as the real kernel may fail or may not). A view
  whose sizes are read from values while the graph runs (an MoE's routed-token counts),
  and so has no bound here or one that overshoots, is checked when it runs instead: made
  first on meta tensors with the run's sizes, it must lie within its storage before its
  kernel runs (checked.ViewCheckedAtRun);
- a tensor over the per-tensor byte limit, and a peak of live bytes (inputs, constants,
  and every intermediate until its last use; outputs live to the end) over ``max_bytes``;
- a size that depends on values and has no bound: ``nonzero``, ``masked_select`` and
  ``unique`` are bounded by their input's size (torch's fake kernels say so); a
  ``bincount`` or ``repeat_interleave`` size is the bound the checked forms enforce when
  they run (aotpipe/artifact/checked.py: at most the per-tensor limit); a size read from
  a tensor's value (``item()``) has no bound here: each node making such a tensor runs
  checked (checked.AllocationCheckedAtRun: made on meta first, from the run's values) and
  may make at most an equal share of the room the checked peak leaves under ``max_bytes``,
  so that all of them at once still fit; a view of such a tensor is checked when it runs;
  a fake kernel that wants a plain int where the graph gives such a size (SAM3's
  ``constant_pad_nd`` of a tensor ``u0*u1`` wide) is probed with stand-in values for it, the
  sizes that do not follow the probes become the run's own, and the node runs checked
  against the outputs assumed (:func:`_assumed_outputs`);
- an op torch has no fake kernel for (it cannot be checked without running it).

A node whose arguments torch's own checks reject (a wrong shape or type) raises
:class:`GraphWillNotRun`: the graph does not run, as the real kernel would have said, and
callers treat it as a failed run rather than a hostile artefact.

Fake propagation runs no kernel and allocates nothing real (fallback kernels are off).
The graph checked is the one graph.json holds (before the loader packs weights), with the
module's constants.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Optional

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    ShapeEnv,
    _constrain_range_for_size,
    free_unbacked_symbols,
)
from torch.multiprocessing.reductions import StorageWeakRef

from aotpipe.artifact.checked import (
    RUN_CHECKED_ALLOCS,
    RUN_CHECKED_OUTPUTS,
    RUN_CHECKED_VIEWS,
    RUNTIME_BOUNDED,
    aliases_inputs,
    checked_twin,
    expected_outputs,
    how_to_raise_tensor_limit,
)
from aotpipe.artifact.ops import PYTHON_CALLABLES, op_name
from aotpipe.artifact.prepack import stored_graph
from aotpipe.errors import ArtifactError, LimitError, exception_line
from aotpipe.format import limits
from aotpipe.format.records import RawJson
from aotpipe.runtime.execution import RUN_GUARD

_MARK = "aotpipe_precheck"  # gm.meta key: the loader built this module from an artefact


# Allowed composites whose C++ reads a tensor argument's values while it decomposes (a packed
# sequence's batch sizes, through its data pointer): on a fake tensor torch raises ("data is
# not allocated yet"), but for an empty one it reads through a null pointer and the process
# dies. Not propagated: they fail as torch's check fails for every other input.
_READS_VALUES = {torch.ops.aten.lstm.data: "batch_sizes", torch.ops.aten.gru.data: "batch_sizes",
                 torch.ops.aten.rnn_tanh.data: "batch_sizes", torch.ops.aten.rnn_relu.data: "batch_sizes"}


class GraphWillNotRun(RuntimeError):
    """A node's arguments fail torch's own checks on fake tensors: the graph does not run."""


_OWN = "aotpipe_precheck_own_capture"  # gm.meta key: built by the check after writing, where it was captured


def mark(gm: torch.fx.GraphModule, where: str, own_capture: bool = False) -> None:
    """Have :func:`runnable` propagate `gm` (built from the artefact at `where`) before it runs.
    `own_capture`: this process's capture wrote it (ops.OWN_CAPTURE), so an op with no
    fake-tensor kernel is given the outputs graph.json records for it rather than refused."""
    gm.meta[_MARK] = where
    if own_capture:
        gm.meta[_OWN] = True
    gm.meta[RUN_GUARD] = runnable  # aotpipe.runtime.execution runs every graph through it


def needs_check(module: Any) -> bool:
    return isinstance(module, torch.fx.GraphModule) and _MARK in module.meta


def _signature(values: list[Any]) -> tuple:
    """What of the inputs the check depends on: layouts, storage sizes and sharing, scalars."""
    seen: dict[Any, int] = {}
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            key = StorageWeakRef(v.untyped_storage()) if v.layout == torch.strided else id(v)
            group = seen.setdefault(key, len(seen))
            out.append((tuple(v.shape), tuple(v.stride()) if v.layout == torch.strided else None,
                        v.storage_offset() if v.layout == torch.strided else None, v.dtype, v.device.type,
                        v.untyped_storage().nbytes() if v.layout == torch.strided else None, group))
        else:
            out.append((type(v).__name__, v if isinstance(v, (bool, int, float, str, type(None))) else id(v)))
    return tuple(out)


_CHECKED: "weakref.WeakKeyDictionary[torch.fx.GraphModule, dict]" = weakref.WeakKeyDictionary()


def runnable(module: Any, inputs: list[Any]) -> Any:
    """What to run for `module` on `inputs`: a graph built from an artefact, propagated on
    fake tensors like `inputs` first (once per input layout), with its value-indexing ops
    in checked forms (artifact/checked.py); any other module (capture's own graphs) as is."""
    if not needs_check(module):
        return module
    done = _CHECKED.setdefault(module, {})  # by module: a copy (a pass's) is checked afresh
    sig = (module.code, _signature(inputs))  # and by code: a pass may rewrite the graph in place
    if sig not in done:
        check_graph(module, inputs, module.meta[_MARK])
        done[sig] = module.meta[RUN_CHECKED_OUTPUTS]
    # The outputs the check assumed are those of these inputs' layout (the views and shares
    # it found are kept over all layouts seen, the stricter always).
    module.meta[RUN_CHECKED_OUTPUTS] = done[sig]
    return checked_twin(module, module.meta[_MARK])


def _op_label(node: torch.fx.Node) -> str:
    target = getattr(node.target, "checked_op", node.target)
    return op_name(target) or getattr(target, "__name__", str(target))


class _Refusal:
    """Builds the one-line errors for one graph."""

    def __init__(self, where: str):
        self.where = where

    def node(self, node: torch.fx.Node, why: str, cls: type[ArtifactError] = ArtifactError) -> ArtifactError:
        return cls(f"{self.where}: node {node.name!r} ({_op_label(node)}) {why}; refused before running the graph")


def _upper(n: Any, shape_env: Any) -> Optional[int]:
    """An int, or the upper bound of a symbolic one (None: unbounded)."""
    if isinstance(n, int):
        return n
    if isinstance(n, torch.SymInt):
        expr = n.node.expr
        try:
            upper = shape_env.bound_sympy(expr).upper
        except Exception:
            return None
        try:
            return int(upper) if upper.is_finite else None
        except (TypeError, ValueError, AttributeError):
            return None
    return None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def check_graph(gm: torch.fx.GraphModule, inputs: list[Any], where: str = "graph.json") -> None:
    """Refuse `gm` if, run on `inputs`, a node would reach outside a storage or the bytes
    it holds would pass the limits (see the module's docstring); ArtifactError or
    LimitError naming the node, GraphWillNotRun if torch's checks reject a node's arguments.

    First on meta tensors: torch's meta kernels called directly, about twice as fast as fake
    tensors, which call the same kernels through a Python dispatch of their own (a cache key
    and a fake tensor per output, per call). Where that pass does not accept the graph
    outright (an op it does not take, a device other than the inputs', any error, any
    refusal), on fake tensors, whose result is the check's: so the meta pass can only accept
    what the fake one would."""
    device = _meta_pass_device(inputs)
    if device is not None and all(_meta_takes(node) for node in stored_graph(gm).nodes):
        try:
            _propagate(gm, inputs, where, on_meta=device)
            return
        except Exception:  # not accepted on meta: the fake-tensor pass decides
            pass
    _propagate(gm, inputs, where, on_meta=None)


# The Python callables a loaded graph calls (getitem; size arithmetic in its checked form,
# which takes ints and symbolic ints, and computes nothing on a list: ``[0] * 10**12``).
_PYTHON_FORMS = frozenset(PYTHON_CALLABLES.values())


def _callee(node: torch.fx.Node) -> Any:
    """What the check calls for `node`: the op itself (not a checked form, which reads values),
    or a Python callable's checked form."""
    if node.target in _PYTHON_FORMS:
        return node.target
    return getattr(node.target, "checked_op", node.target)


class _NotOnMeta(Exception):
    """The meta pass does not take this node: the fake-tensor pass checks the graph."""


def _meta_pass_device(inputs: list[Any]) -> torch.device | None:
    """The one device of the graph's inputs, where the meta pass can stand in for it; None
    where they span several (fake tensors keep torch's device checks). A constant on
    another device stops the meta pass when it reaches it."""
    devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        return None
    return next(iter(devices), torch.device("cpu"))


_META = torch.device("meta")
_DEVICE_ARGS: dict[Any, tuple[str, ...] | None] = {}


def _device_args(op: torch._ops.OpOverload) -> tuple[str, ...] | None:
    """The names of `op`'s Device arguments, all keyword-only; None where one may be given by
    position (rngprims.philox_rand alone among the allowed ops: fake tensors check it)."""
    if op not in _DEVICE_ARGS:
        args = [a for a in op._schema.arguments if "Device" in str(a.type)]
        _DEVICE_ARGS[op] = tuple(a.name for a in args) if all(a.kwarg_only for a in args) else None
    return _DEVICE_ARGS[op]


# Convolutions: their fake-tensor kernel runs torch's own argument checks (through
# _select_conv_backend: channels, groups, dimensions), which their meta kernel skips (a
# transposed weight of the wrong channels passes it); the meta pass runs those checks first.
_CONVOLUTIONS = frozenset({
    torch.ops.aten.convolution.default, torch.ops.aten._convolution.default, torch.ops.aten._convolution.deprecated,
    torch.ops.aten.convolution_backward.default,
})
# Ops fake tensors refuse and meta takes (slice_inverse), and one whose output's size is the
# values of its lengths, untagged (_pack_padded_sequence): the fake pass checks them. Over
# every op's recorded calls, hostile ones included, no other op is accepted on meta and
# refused on fake tensors (tests/artifact/test_precheck_meta_sweep.py, which would name it).
_FAKE_ONLY = frozenset({torch.ops.aten.slice_inverse.default, torch.ops.aten._pack_padded_sequence.default})


def _convolution_checks(target: Any, args: tuple, kwargs: dict) -> None:
    """Raise as fake tensors' convolution does on arguments torch's checks reject."""
    bound = torch.fx.operator_schemas.normalize_function(target, tuple(args), dict(kwargs),
                                                         normalize_to_only_use_kwargs=True)
    if bound is None:
        raise _NotOnMeta(str(target))
    new = bound.kwargs
    x, weight = new["input"], new["weight"]
    if target is not torch.ops.aten.convolution_backward.default and x.dtype != weight.dtype:
        raise RuntimeError(f"Input type ({x.dtype}) and weight type ({weight.dtype}) should be the same")
    select = {k: new[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}
    select["bias"] = new.get("bias")
    if select["bias"] is None:
        select["bias_sizes"] = new.get("bias_sizes")
    torch._C._select_conv_backend(x, weight, **select)


def _meta_takes(node: torch.fx.Node) -> bool:
    """Whether the meta pass can run `node` (it may still stop at it: an index by a mask)."""
    if node.op != "call_function":
        return True
    target = _callee(node)
    if not isinstance(target, torch._ops.OpOverload):
        return target in _PYTHON_FORMS
    return not ((torch.Tag.dynamic_output_shape in target.tags and target is not torch.ops.aten.index.Tensor)
                or torch.Tag.data_dependent_output in target.tags or target in RUNTIME_BOUNDED
                or target in _READS_VALUES or target in _FAKE_ONLY or _device_args(target) is None)


def _index_by_positions(args: tuple) -> bool:
    """aten.index's arguments index by integer tensors: its output's size is the indices' (a
    mask's would be its count, which meta cannot say)."""
    return len(args) == 2 and isinstance(args[1], (list, tuple)) and all(
        i is None or (isinstance(i, torch.Tensor) and not i.dtype.is_floating_point
                      and i.dtype not in (torch.bool, torch.uint8)) for i in args[1])


def _call_on_meta(node: torch.fx.Node, args: tuple, kwargs: dict, device: torch.device) -> Any:
    """`node`'s op on meta tensors, with every Device argument (an explicit one, and a
    factory's default) on meta: nothing real is allocated. _NotOnMeta for what
    :func:`_meta_takes` leaves to fake tensors, an index by a mask, and a device other than
    the graph's (fake tensors check the mix)."""
    target = _callee(node)
    if not _meta_takes(node) or (target is torch.ops.aten.index.Tensor and not _index_by_positions(args)):
        raise _NotOnMeta(node.name)
    if not isinstance(target, torch._ops.OpOverload):
        return target(*args, **kwargs)  # getitem, size arithmetic's checked form
    device_args = _device_args(target)
    if device_args:
        kwargs = dict(kwargs)
        takes_tensors = any(isinstance(a, torch.Tensor) for a in torch.utils._pytree.tree_leaves((args, kwargs)))
        for name in device_args:
            value = kwargs.get(name)
            if value is None and not takes_tensors:
                value = "cpu"  # a factory's default (a *_like op's None is its input's device)
            if value is not None:
                given = torch.device(value)
                if given.type != device.type or None not in (given.index, device.index) and given.index != device.index:
                    raise _NotOnMeta(node.name)
            kwargs[name] = _META
    if target is _CONV_BINARY:  # no meta kernel: as the fake pass computes it, on arguments its schema binds
        bound = torch.fx.operator_schemas.normalize_function(  # (`is` narrowed target to _CONV_BINARY's Optional)
            target, tuple(args), dict(kwargs), normalize_to_only_use_kwargs=True)  # type: ignore[arg-type]
        if bound is None:  # too many, too few or unknown arguments: the fake pass's binding names which
            raise _NotOnMeta(node.name)
        value = _binary_convolution_output((), bound.kwargs)
        if isinstance(value, str):
            raise _NotOnMeta(node.name)  # the fake pass refuses it, naming why
        return value
    if target in _CONVOLUTIONS:
        _convolution_checks(target, args, kwargs)
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
        # A composite decomposes as fake tensors decompose it: through its Python decomposition
        # where torch has one, whose checks come first (the C++ LSTM on meta tensors crashes the
        # process on a hidden state of no layers; the Python one raises).
        value = target.decompose(*args, **kwargs)
    else:
        value = target(*args, **kwargs)
    if any(t.device != _META for t in _tensors(value)):  # (prims whose meta kernel makes a real scalar)
        raise _NotOnMeta(node.name)
    return value


def _propagate(gm: torch.fx.GraphModule, inputs: list[Any], where: str, on_meta: torch.device | None) -> None:
    """check_graph's pass: on fake tensors, or with `on_meta` (the graph's device) on meta ones."""
    graph = stored_graph(gm)
    refuse = _Refusal(where)
    lim = limits.current()
    tensor_limit, total_limit = lim.tensor_bytes, lim.max_bytes
    raise_tensor_limit = how_to_raise_tensor_limit(lim)
    shape_env = ShapeEnv()
    mode: Any = contextlib.nullcontext()  # meta tensors: no mode
    if on_meta is None:
        mode = FakeTensorMode(shape_env=shape_env, allow_fallback_kernels=False, static_shapes=True)

    storage_bytes: dict[Any, int] = {}  # every storage seen, at the size it was made with
    refs: dict[Any, int] = {}  # intermediate storage -> live node values referencing it
    node_storages: dict[torch.fx.Node, list[Any]] = {}
    live = 0

    bases: dict[Any, torch.Tensor] = {}  # (real storage, dtype) -> a fake tensor over all of it
    held_bytes = 0  # inputs and constants (their whole storages): live throughout

    def fake(t: Any) -> Any:
        """A fake view like `t` over a fake storage as large as t's (made directly: torch's
        from_tensor rebuilds each view's history, ten times slower at real size)."""
        nonlocal held_bytes
        if not isinstance(t, torch.Tensor):
            return t
        if t.layout != torch.strided:
            raise ArtifactError(f"{where}: an input or constant is not a dense tensor ({t.layout}); "
                                "it cannot be checked")
        if on_meta is not None and t.device != on_meta:
            raise _NotOnMeta(f"a tensor on {t.device}, the inputs on {on_meta}")
        real = (StorageWeakRef(t.untyped_storage()), t.dtype)
        if real not in bases:
            nbytes = int(t.untyped_storage().nbytes())
            bases[real] = torch.empty(nbytes // t.dtype.itemsize, dtype=t.dtype,
                                      device=t.device if on_meta is None else _META)
            key = StorageWeakRef(bases[real].untyped_storage())
            storage_bytes[key] = nbytes
            held_bytes += nbytes
        return torch.ops.aten.as_strided.default(bases[real], t.shape, t.stride(), t.storage_offset())

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise GraphWillNotRun(f"{where}: the graph takes {len(placeholders)} inputs, given {len(inputs)}")
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in reversed(graph.nodes):
        for used in node.all_input_nodes:
            last_use.setdefault(used, node)
    dying: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for used, user in last_use.items():
        dying.setdefault(user, []).append(used)

    env: dict[torch.fx.Node, Any] = {}
    inputs_iter = iter(inputs)
    run_checked: set[str] = gm.meta.setdefault(RUN_CHECKED_VIEWS, set())
    unbounded: list[torch.fx.Node] = []  # nodes making a tensor whose size only the run decides
    assumed: dict[str, Any] = {}  # RUN_CHECKED_OUTPUTS for these inputs
    peak = 0
    # torch logs a traceback for each fake kernel that raises (one that wants plain ints, say):
    # what it means is this check's to say, in one line.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    with mode, contextlib.ExitStack() as restore:
        restore.callback(fake_log.setLevel, fake_log.level)
        fake_log.setLevel(logging.CRITICAL + 1)
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = fake(next(inputs_iter))
            elif node.op == "get_attr":
                obj: Any = gm
                for part in str(node.target).split("."):
                    obj = getattr(obj, part)
                env[node] = fake(obj)
            elif node.op == "call_function":
                target = _callee(node)
                if target in _READS_VALUES:
                    raise GraphWillNotRun(f"{where}: node {node.name!r} ({_op_label(node)}) does not run on these "
                                          f"inputs: it reads the values of {_READS_VALUES[target]} as it "
                                          "decomposes, which fake tensors do not have")
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                if on_meta is not None:
                    value = _call_on_meta(node, args, kwargs, on_meta)  # any error: the fake pass decides
                else:
                    value = _call_on_fake(gm, node, target, args, kwargs, shape_env, refuse, assumed)
                if target in RUNTIME_BOUNDED:
                    _bound_by_limit(node, value, shape_env, tensor_limit, refuse, raise_tensor_limit)
                if isinstance(value, torch.Tensor) and value.layout == torch.strided \
                        and StorageWeakRef(value.untyped_storage()) not in storage_bytes and node.name not in assumed:
                    value = _as_recorded(node, value)
                env[node] = value
                mine = []
                for t in _tensors(value):
                    if t.layout != torch.strided:
                        raise refuse.node(node, f"makes a {t.layout} tensor")
                    key = StorageWeakRef(t.untyped_storage())
                    item = t.dtype.itemsize
                    span = _span(t, shape_env)
                    if key not in storage_bytes:  # made by this node
                        nbytes = _upper(t.untyped_storage().nbytes(), shape_env)
                        if nbytes is None or (nbytes > tensor_limit and _unbacked_geometry(t)):
                            # A size read from values while the graph runs, with no bound here
                            # (an arange to a count) or only one past the limit (nonzero of such
                            # a tensor): the node runs checked, held to a share of the room the
                            # graph leaves under the limit (see below).
                            storage_bytes[key] = None
                            if node not in unbounded:
                                unbounded.append(node)
                            continue
                        storage_bytes[key] = nbytes
                        if nbytes > tensor_limit:
                            raise refuse.node(node, f"makes {_describe(t)}, which needs {limits.human(nbytes)}, "
                                                    f"over the limit of {limits.human(tensor_limit)} (raise it "
                                                    f"with {raise_tensor_limit})", LimitError)
                        refs[key] = 0
                        live += nbytes
                    if storage_bytes[key] is None:  # a view of a tensor only the run sizes
                        if aliases_inputs(target):
                            run_checked.add(node.name)
                    elif (span is None or span * item > storage_bytes[key]) and aliases_inputs(target) \
                            and _unbacked_geometry(t):
                        # Sizes read from values while the graph runs: their static bound can
                        # overshoot (the sum of four routed-token counts, each bounded by all
                        # tokens) or not exist. The view is checked with the run's values
                        # before its kernel runs (checked.ViewCheckedAtRun).
                        run_checked.add(node.name)
                    elif span is not None and span * item > storage_bytes[key]:
                        raise refuse.node(node, f"gives a view (sizes {list(t.shape)[:8]}, strides "
                                                f"{list(t.stride())[:8]}, storage offset {t.storage_offset()}) "
                                                f"that reaches byte {span * item:,} of a storage of "
                                                f"{storage_bytes[key]:,} bytes")
                    if key in refs:
                        refs[key] += 1
                        mine.append(key)
                node_storages[node] = mine
                total = live + held_bytes
                peak = max(peak, total)
                if total > total_limit:
                    raise refuse.node(node, f"would hold {limits.human(total)} of tensors alive at once (inputs, "
                                            f"constants, values still to be used and outputs), over the limit of "
                                            f"{limits.human(total_limit)} (raise it with AOTPIPE_MAX_BYTES or "
                                            "--max-bytes)", LimitError)
            elif node.op == "output":
                gm.meta[_DATA_DEPENDENT] = _data_dependent(node, env)
                continue
            else:
                raise ArtifactError(f"{where}: node {node.name!r} is a {node.op} node, which cannot be checked")
            for gone in dying.get(node, []):  # (outputs' last use is the output node: alive to the end)
                for key in node_storages.pop(gone, []):
                    refs[key] -= 1
                    if refs[key] == 0:
                        live -= storage_bytes[key]
    gm.meta[RUN_CHECKED_OUTPUTS] = assumed
    if unbounded:
        # Each tensor sized by the run gets an equal share of the room the checked peak leaves
        # under max_bytes (and no more than the per-tensor limit): all of them alive at the
        # checked peak still fit. Kept per node at the smallest share any input layout gave.
        share = min(tensor_limit, (total_limit - peak) // len(unbounded))
        if share <= 0:
            raise refuse.node(unbounded[0], f"makes a tensor whose size depends on values read from tensors while "
                                            f"the graph runs, and the graph leaves it no room under the limit of "
                                            f"{limits.human(total_limit)} (raise it with AOTPIPE_MAX_BYTES or "
                                            "--max-bytes)", LimitError)
        allocs: dict[str, int] = gm.meta.setdefault(RUN_CHECKED_ALLOCS, {})
        for node in unbounded:
            allocs[node.name] = min(allocs.get(node.name, share), share)


def _call_on_fake(gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict,
                  shape_env: Any, refuse: _Refusal, assumed: dict[str, Any]) -> Any:
    """`node`'s op on fake tensors; where its output size is read from values, the outputs
    assumed (recorded in `assumed` by node name); refusals as the module's docstring says."""
    where = refuse.where
    try:
        value = target(*args, **kwargs)
    except ArtifactError:
        raise
    except (DynamicOutputShapeException, DataDependentOutputException, GuardOnDataDependentSymNode) as e:
        value = _assumed_outputs(target, args, kwargs, shape_env) \
            if isinstance(e, GuardOnDataDependentSymNode) else None
        if value is None:
            raise refuse.node(node, f"has a size that depends on the values of tensors "
                                    f"({exception_line(e, 120)}), which cannot be checked before it runs")
        assumed[node.name] = expected_outputs(value)
    except UnsupportedOperatorException:
        if target is _CONV_BINARY:
            try:
                value = _binary_convolution_output(args, kwargs)
            except Exception as e:  # the plain convolution's checks: wrong channels, a one-element weight...
                raise GraphWillNotRun(f"{where}: node {node.name!r} ({_op_label(node)}) does not run on "
                                      f"these inputs: {exception_line(e)}") from None
            if isinstance(value, str):
                raise refuse.node(node, value) from None
            return value
        value = _recorded_outputs(node) if gm.meta.get(_OWN) else None
        if value is None:
            raise refuse.node(node, "has no fake-tensor kernel in this torch, so its arguments "
                                    "cannot be checked without running it")
    except Exception as e:
        # (a fake kernel that wants plain ints: "SymIntArrayRef expected to contain
        # only concrete integers", given a size read from values)
        value = _assumed_outputs(target, args, kwargs, shape_env)
        if value is None:
            raise GraphWillNotRun(f"{where}: node {node.name!r} ({_op_label(node)}) does not run on "
                                  f"these inputs: {exception_line(e)}") from None
        assumed[node.name] = expected_outputs(value)
    return value


_CONV_BINARY = getattr(getattr(torch.ops.mkldnn, "_convolution_pointwise", None), "binary", None)
_GEOMETRY = ("padding", "stride", "dilation", "groups")  # the convolution's, in the plain op's order


def _binary_convolution_output(args: tuple, kwargs: dict) -> torch.Tensor | str:
    """oneDNN's residual convolution on fake or meta tensors (torch has neither kernel for
    it): the plain convolution's output, with `other` held to its shape and dtype (the kernel
    reads `other` as the output's shape without checking it); or why not. Raises as the plain
    convolution's checks do. (The call's arguments are bound to the schema: it has no
    defaults.)"""
    named = dict(zip((a.name for a in _CONV_BINARY._schema.arguments), args, strict=False))  # type: ignore[union-attr]
    named.update(kwargs)
    x, other, w, b, *geometry = (named[k] for k in ("X", "other", "W", "B", *_GEOMETRY))
    out = torch.ops.mkldnn._convolution_pointwise.default(x, w, b, *geometry, "none", [], None)
    if other.shape != out.shape or other.dtype != out.dtype:  # a tensor: the call's binding saw to that
        return (f"adds a residual of shape {list(other.shape)} to a convolution whose output "
                f"has shape {list(out.shape)}: the kernel would read the residual out of bounds")
    return out


def data_dependent_outputs(module: Any) -> dict[int, list[int]]:
    """Per output of a graph the check has propagated, the dimensions whose size depends on
    tensor values (a tensor's; [] for an int, float or bool computed from them): another
    input gives other sizes there. Empty where it was not checked."""
    meta = getattr(module, "meta", None)
    return dict(meta.get(_DATA_DEPENDENT, {})) if isinstance(meta, dict) else {}


_DATA_DEPENDENT = "aotpipe_data_dependent_outputs"


def _data_dependent(node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> dict[int, list[int]]:
    args = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
    out: dict[int, list[int]] = {}
    for i, a in enumerate(args):
        v = env.get(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(v, torch.Tensor):
            dims = [d for d, s in enumerate(v.shape) if isinstance(s, torch.SymInt) and free_unbacked_symbols(s)]
            if dims:
                out[i] = dims
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(v):
            out[i] = []
    return out


# The values the probes give each size read from values (distinct per symbol and between
# probes; small and large, so that a size divided down still differs): a size of an output
# that is the same in every probe that ran is taken to be that size, one that differs to be
# any (a fresh symbol). The run holds the outputs to that (checked.Expected).
_PROBES = ((lambda i: 7 + 2 * i), (lambda i: 1031 + 3 * i), (lambda i: 4099 + 5 * i))


def _assumed_outputs(target: Any, args: tuple, kwargs: dict, shape_env: Any) -> Any:
    """Fake outputs for an op whose fake kernel needs a plain int where its arguments hold a
    size read from values while the graph runs (constant_pad_nd padded by ``u0*u1``), so that
    the precheck can go on past it; None where that cannot be done (the caller refuses).

    The op is run on fake arguments with every such size replaced by each probe's value
    (:data:`_PROBES`; at least two must run); sizes of the outputs that agree are kept, the
    others become sizes of their own read from the run (so the outputs' storages have no bound
    here: the node runs checked, and anything that views them too). The guess is not
    trusted: when the graph runs, the op is first run on meta tensors and its outputs must
    have the dtypes and kept sizes assumed here (checked.AllocationCheckedAtRun), or the
    kernel is not run. Views and in-place ops (whose outputs are their inputs' memory) and
    ops whose output size is the data's own are not assumed."""
    if not isinstance(target, torch._ops.OpOverload) or aliases_inputs(target) or target._schema.is_mutable \
            or torch.Tag.dynamic_output_shape in target.tags:
        return None
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    symbols = sorted(free_unbacked_symbols([x for x in leaves if isinstance(x, (torch.Tensor, torch.SymInt,
                                                                                torch.SymFloat, torch.SymBool))]),
                     key=str)
    if not symbols:
        return None

    def concrete(x: Any, values: dict) -> Any:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            expr = x.node.expr.xreplace(values)
            if expr.free_symbols:
                raise ValueError("a size of symbols other than those read from values")
            if isinstance(x, torch.SymInt):
                return int(expr)
            return float(expr) if isinstance(x, torch.SymFloat) else bool(expr)
        if isinstance(x, torch.Tensor) and _unbacked_geometry(x):
            sizes = [concrete(s, values) for s in x.shape]
            strides = [concrete(s, values) for s in x.stride()]
            return torch.empty_strided(sizes, strides, dtype=x.dtype, device=x.device)
        return x

    outs = []
    for probe in _PROBES:
        # sympy's integers: a size that is one symbol alone (a pad by u0) becomes one, not a Python int
        values = {s: sympy.Integer(probe(i)) for i, s in enumerate(symbols)}
        try:
            a, k = torch.utils._pytree.tree_unflatten([concrete(x, values) for x in leaves], spec)
            outs.append(torch.utils._pytree.tree_flatten(target(*a, **k)))
        except Exception:  # noqa: BLE001 - values the op refuses (a narrow past the end): not this probe
            continue
    if len(outs) < 2:
        return None  # the caller refuses the node, naming the first error
    (first, first_spec), others = outs[0], outs[1:]
    if any(other_spec != first_spec or not all(
            isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
            and x.device == y.device and x.dim() == y.dim() and x.layout == torch.strided == y.layout
            for x, y in zip(first, other)) for other, other_spec in others):
        return None
    made = []
    for i, x in enumerate(first):
        sizes = []
        for d, size in enumerate(x.shape):
            if all(other[i].shape[d] == size for other, _ in others):
                sizes.append(int(size))
            else:
                s = shape_env.create_unbacked_symint()
                _constrain_range_for_size(s, min=0)
                sizes.append(s)
        made.append(torch.empty(sizes, dtype=x.dtype, device=x.device))
    return torch.utils._pytree.tree_unflatten(made, first_spec)


def _bound_by_limit(node: torch.fx.Node, value: Any, shape_env: Any, limit: int, refuse: _Refusal,
                    how_to_raise: str) -> None:
    """An op whose output size comes from values (bincount): its checked form refuses, when
    it runs, a size over the per-tensor limit, so that limit bounds it here; a lower bound
    already over it (a literal minlength) is refused now."""
    for t in _tensors(value):
        for s in t.shape:
            if not (isinstance(s, torch.SymInt) and free_unbacked_symbols(s)):
                continue
            most = limit // t.dtype.itemsize
            low = shape_env.bound_sympy(s.node.expr).lower
            if low.is_finite and int(low) > most:
                raise refuse.node(node, f"makes at least {int(low):,} elements of "
                                        f"{str(t.dtype).removeprefix('torch.')}, over the limit of "
                                        f"{limits.human(limit)} (raise it with {how_to_raise})", LimitError)
            _constrain_range_for_size(s, min=0, max=most)


def _recorded_outputs(node: torch.fx.Node) -> Any:
    """Fresh values laid out as graph.json records the node's outputs (one, or a list), or None
    where the record does not say: for a graph of our own capture only (its record is what the
    capture's own fake tensors found), at an op with no fake-tensor kernel."""
    rec: RawJson = node.meta.get("saved_val")

    def one(r: RawJson) -> Optional[torch.Tensor]:
        if not isinstance(r, dict):
            return None
        shape, stride, dtype = r.get("shape"), r.get("stride"), getattr(torch, str(r.get("dtype")), None)
        if not (isinstance(shape, list) and isinstance(stride, list) and isinstance(dtype, torch.dtype)
                and all(isinstance(v, int) for v in shape + stride)):
            return None
        return torch.empty_strided(shape, stride, dtype=dtype, device=str(r.get("device", "cpu")))

    if isinstance(rec, list):
        values = [one(r) for r in rec]
        return None if any(v is None for v in values) else tuple(values)
    return one(rec)


def _as_recorded(node: torch.fx.Node, value: torch.Tensor) -> torch.Tensor:
    """A fresh value laid out with the strides graph.json records for the node, where they
    are a dense layout of the same shape: a few fake kernels (oneDNN's convolution on NCHW
    activations) guess another memory format than their real kernel gives, and a view
    after them would fail only here. The bytes are the same either way, and a record that
    lies can only make a later view fail, here or when the real graph runs and checks it."""
    rec: RawJson = node.meta.get("saved_val")  # graph.json's free-JSON val, as the loader kept it
    if not isinstance(rec, dict):
        return value
    shape, stride = rec.get("shape"), rec.get("stride")
    if not (isinstance(shape, list) and isinstance(stride, list) and len(stride) == len(shape)
            and all(isinstance(s, int) and s >= 0 for s in shape + stride)):
        return value
    if any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
        return value  # a size read from values (unbacked): comparing it with a literal would guard on it
    if shape != list(value.shape) or stride == list(value.stride()):
        return value
    expected = 1  # dense: dims by stride, each stride the element count of those inside it
    for size, st in sorted(((sz, st) for sz, st in zip(shape, stride) if sz != 1), key=lambda d: d[1]):
        if st != expected:
            return value
        expected *= size
    return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)


def _span(t: torch.Tensor, shape_env: Any) -> Optional[int]:
    """Elements of its storage a tensor reaches, offset included (None if not known statically)."""
    try:
        sizes = [_upper(s, shape_env) if isinstance(s, torch.SymInt) else int(s) for s in t.shape]
        strides = [int(s) for s in t.stride()]
        offset = int(t.storage_offset())
    except Exception:
        return None
    if any(s is None for s in sizes):
        return None
    if any(s == 0 for s in sizes):
        return 0
    return offset + 1 + sum((s - 1) * abs(st) for s, st in zip(sizes, strides))


def _unbacked_geometry(t: torch.Tensor) -> bool:
    """Whether a tensor's sizes, strides or offset are read from values while the graph runs."""
    return any(isinstance(s, torch.SymInt) and free_unbacked_symbols(s)
               for s in (*t.shape, *t.stride(), t.storage_offset()))


def _describe(t: torch.Tensor) -> str:
    shape = [s if isinstance(s, int) else str(s) for s in t.shape]
    return f"a {str(t.dtype).removeprefix('torch.')}{shape[:8]}{'...' if len(shape) > 8 else ''} tensor"
