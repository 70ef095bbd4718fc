"""The ops a loaded graph may call: aotpipe's one reviewed allow-list.

graph.json names its ops; the loader resolves a name only if :func:`resolve_op` allows
it. What is allowed is the class of ops aotpipe's own capture and passes emit:

- functional ATen ops: every ATen op whose schema mutates none of its arguments. Export
  decomposes to core ATen (``torch.Tag.core``); AOTAutograd's functionalised training
  graphs add non-core functional ops (``_softmax_backward_data``, ``native_dropout_backward``,
  a mixture-of-experts router's ``histc``), whichever a model uses. Listing them one by
  one failed real models for ops the list had not met yet;
- the in-place variant of an allowed functional op (the reinplace pass turns
  ``aten.add.Tensor`` into ``aten.add_.Tensor``, a ``slice_scatter`` into a ``copy_``);
- the few prims and rngprims decompositions can leave behind (:data:`PRIMS`);
- ``operator.getitem``, which picks one output of a multi-output op;
- the oneDNN convolutions the ``mkldnn_fuse`` pass emits (:data:`MKLDNN`): named one by
  one, on dense tensors only (no op that builds or reorders into an mkldnn-layout tensor),
  each string argument held to the values listed in :data:`STRING_ARG_VALUES`;

minus, whatever the rules above admit, every op that builds sparse, nested or mkldnn
tensors, resizes a tensor, touches storages or files, or changes process-wide state
(:data:`DENIED`), and every op with an argument that is a free string (a path, code) or a
Storage, and every out= overload (it writes, and may resize, a tensor it is given).

Ops of a library namespace (``transformers::...``, ``mylib::...``) are outside the list.
An artefact holds them only if its pipeline trusted that namespace (``trusted_ops``, recorded
in the manifest), and a loader resolves them only when its user grants the same trust
(``--trust-ops``, ``load(..., trust_ops=...)``): :func:`resolve_op`'s `trusted`. A trusted
namespace's ops skip the rules above: the user vouches for that library.

Changing this file widens what a hostile artefact can make aotpipe run: review it so.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable, Optional

import torch

from aotpipe.artifact.records import library_namespace_problem
from aotpipe.errors import ArtifactError

ALLOWED_NAMESPACES = ("aten", "prims", "rngprims", "mkldnn")

# Python callables (not torch ops) captured graphs use, by qualified name.
PYTHON_CALLABLES: dict[str, Callable[..., Any]] = {
    "operator.getitem": operator.getitem,
}

# prims and rngprims that decompositions can leave in a graph (all functional).
PRIMS = frozenset({
    "prims.convert_element_type.default", "prims.broadcast_in_dim.default", "prims.view_of.default",
    "prims.iota.default", "rngprims.philox_rand.default",
})

# oneDNN ops the mkldnn_fuse pass emits. Functional (they allocate their result), on dense
# tensors: the kernels check shapes as aten.convolution does. Nothing that reorders a weight
# into a blocked mkldnn tensor: that layout cannot be stored, nor checked.
MKLDNN = frozenset({"mkldnn._convolution_pointwise.default", "mkldnn._convolution_pointwise.binary"})

# Ops whose string arguments are checked value by value: {argument: allowed values}. The
# oneDNN post-ops of torch's own mkldnn fusion; "sum" (which accumulates into the residual
# in place) is left out.
_UNARY = frozenset({"none", "relu", "sigmoid", "tanh", "hardswish", "swish", "gelu", "hardtanh", "leaky_relu",
                    "hardsigmoid", "mish"})
STRING_ARG_VALUES: dict[str, dict[str, frozenset]] = {
    "mkldnn._convolution_pointwise.default": {"attr": _UNARY, "algorithm": frozenset({"none", "tanh", ""})},
    "mkldnn._convolution_pointwise.binary": {
        "binary_attr": frozenset({"add", "sub", "mul", "div"}),
        "unary_attr": _UNARY, "unary_algorithm": frozenset({"none", "tanh", ""}),
    },
}

# Categories refused whatever the rules above admit (core ATen includes resize_, for one),
# matched against the op's name without its namespace and overload.
DENIED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"sparse|nested|mkldnn|padded_tensor|_coo|csr|csc|bsr|bsc"),
     "it builds sparse, nested or mkldnn tensors"),
    (re.compile(r"resize"), "it resizes a tensor in place"),
    (re.compile(r"^(from_file|set_?|set_data|is_set_to|_print|save|load)$|storage|version_counter|^_version$"),
     "it touches storages, files or the console"),
    (re.compile(r"seed|grad_enabled|_set_|^_cudnn_init|^_cufft|^_sobol|^requires_grad_$|^retain_grad$"
                r"|record_stream|_token|^_propagate"),
     "it changes process-wide state"),
    # Capture never emits these families, and their kernels take packed or backend-specific
    # layouts that the argument checks cannot vouch for.
    (re.compile(r"quantiz|fbgemm|cudnn|miopen|mps|vulkan|nnpack|^_test_|^_cslt|^_dyn_quant|^_amp_|^_fused_ada"
                r"|^_foreach_|pin_memory|is_pinned|jagged|^_indices|^_values|^_nnz$|^_dim[IV]$"
                r"|^(c?col|crow|row)_indices|^_lazy_clone$"),
     "it is specific to a backend, to quantized or sparse tensors, to optimisers or to tests"),
)

# String arguments that name a choice among a few values (not a file, not code).
ENUM_STRING_ARGS = frozenset({"rounding_mode", "approximate", "reduce", "side", "mode", "padding_mode", "norm",
                              "UPLO", "driver", "pad_mode", "interpolation", "indexing", "reduction",
                              # the message of a runtime assert export leaves in a graph (_assert_async.msg,
                              # _assert_scalar): only ever the text of the error raised
                              "assert_msg"})


def _denied(op_name: str) -> Optional[str]:
    for pattern, why in DENIED:
        if pattern.search(op_name):
            return why
    return None


def _lookup(ns: str, op: str, overload: str) -> Optional[torch._ops.OpOverload]:
    try:
        target = getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError):
        return None
    return target if isinstance(target, torch._ops.OpOverload) else None


def _admitted(ns: str, op: str, overload: str, target: torch._ops.OpOverload) -> bool:
    """Whether the allow rules (before DENIED and the argument checks) admit the op."""
    if ns == "mkldnn":
        return f"{ns}.{op}.{overload}" in MKLDNN
    if ns != "aten":
        return f"{ns}.{op}.{overload}" in PRIMS
    if not target._schema.is_mutable:
        return True  # functional: writes only the tensors it returns
    if op.endswith("_") and not op.endswith("__") and target._schema.is_mutable:
        functional = _lookup(ns, op[:-1], overload)
        return functional is not None and _admitted(ns, op[:-1], overload, functional)
    return False


def _argument_problem(target: torch._ops.OpOverload) -> Optional[str]:
    checked = STRING_ARG_VALUES.get(op_name(target) or "", {})
    for a in target._schema.arguments:
        if a.name in checked:
            continue  # a string held to listed values, node by node (check_string_args)
        if a.is_out:  # core ATen tags one (atan2.out)
            return "it writes, and may resize, an out= tensor"
        t = str(a.type)
        if "str" in t and a.name not in ENUM_STRING_ARGS:
            return f"its argument {a.name!r} is a free string"
        if "Storage" in t or t == "Any":
            return f"its argument {a.name!r} is a {t}"
    return None


@functools.lru_cache(maxsize=None)
def _resolve_trusted(name: str) -> Callable[..., Any]:
    parts = name.split(".")
    if len(parts) != 3 or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise ArtifactError(f"graph.json names {name!r}, which is not a valid op name")
    target = _lookup(*parts)
    if target is None:
        raise ArtifactError(f"graph.json names {name!r}, a {parts[0]} op that is not registered: the library "
                            f"that defines {parts[0]}::{parts[1]} was not imported, or its version lacks it")
    return target


@functools.lru_cache(maxsize=None)
def _resolve(name: str) -> Callable[..., Any]:
    if name in PYTHON_CALLABLES:
        return PYTHON_CALLABLES[name]
    parts = name.split(".")
    if len(parts) == 3 and parts[0] not in ALLOWED_NAMESPACES and library_namespace_problem(parts[0]) is None:
        raise ArtifactError(
            f"graph.json names {name!r}, an op of the library namespace {parts[0]!r}, which aotpipe runs only "
            f"if you trust that library: load with --trust-ops {parts[0]} (Python: trust_ops=[{parts[0]!r}]); "
            "the artefact's pipeline must have trusted it too (trusted_ops in the manifest)"
        )
    if len(parts) != 3 or parts[0] not in ALLOWED_NAMESPACES:
        raise ArtifactError(
            f"graph.json names {name!r}, which is not an op in an allowed namespace "
            f"({', '.join(ALLOWED_NAMESPACES)}) nor one of {', '.join(PYTHON_CALLABLES)}; refusing to load it"
        )
    ns, op, overload = parts
    if not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise ArtifactError(f"graph.json names {name!r}, which is not a valid op name")
    why = _denied(op)
    if why:
        raise ArtifactError(f"graph.json names {name!r}, which is not allowed: {why}")
    target = _lookup(ns, op, overload)
    if target is None:
        raise ArtifactError(f"graph.json names {name!r}, which this torch ({torch.__version__}) does not have")
    if not _admitted(ns, op, overload, target):
        raise ArtifactError(f"graph.json names {name!r}, which is not allowed: aotpipe's capture and passes "
                            "never emit it (see aotpipe/artifact/ops.py)")
    why = _argument_problem(target)
    if why:
        raise ArtifactError(f"graph.json names {name!r}, which is not allowed: {why}")
    return target


def resolve_op(name: Any, trusted: frozenset[str] = frozenset()) -> Callable[..., Any]:
    """The op or callable a saved target name stands for; ArtifactError if it is not allowed.
    Ops of the library namespaces in `trusted` resolve to whatever that library registered."""
    if not isinstance(name, str):
        raise ArtifactError(f"graph.json: op target must be a string, got {type(name).__name__}")
    ns = name.partition(".")[0]
    if ns in trusted and library_namespace_problem(ns) is None:
        return _resolve_trusted(name)
    return _resolve(name)


def op_name(target: Any) -> Optional[str]:
    """The qualified name ("aten.add.Tensor", "operator.getitem") of a call target, or None;
    for an op the loader put in its checked form (artifact/checked.py), the op's."""
    target = getattr(target, "checked_op", target)
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    for name, fn in PYTHON_CALLABLES.items():
        if fn is target:
            return name
    return None


def allowed_ops() -> list[str]:
    """Every op name this torch has that :func:`resolve_op` allows (for review and tests)."""
    out = set(PYTHON_CALLABLES)
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, rest = full.partition("::")
        if ns not in ALLOWED_NAMESPACES:
            continue
        op, _, overload = rest.partition(".")
        name = f"{ns}.{op}.{overload or 'default'}"
        try:
            _resolve(name)
        except ArtifactError:
            continue
        out.add(name)
    return sorted(out)


def check_string_args(fn: Any, args: list, kwargs: dict, where: str) -> None:
    """An op whose string arguments are held to listed values (STRING_ARG_VALUES): each
    such argument, positional or keyword, must be one of them (or None where optional)."""
    allowed = STRING_ARG_VALUES.get(op_name(fn) or "") if isinstance(fn, torch._ops.OpOverload) else None
    if not allowed:
        return
    for i, a in enumerate(fn._schema.arguments):
        if a.name not in allowed:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        if value is not None and value not in allowed[a.name]:
            raise ArtifactError(f"{where}: {a.name}={str(value)[:40]!r} is not allowed for {op_name(fn)}; "
                                f"allowed: {', '.join(sorted(allowed[a.name]))}")


def check_kwargs(fn: Any, kwargs: Any, where: str) -> dict:
    """Keyword arguments must be named parameters of the op (they become generated code)."""
    if not isinstance(kwargs, dict):
        raise ArtifactError(f"{where}: kwargs must be an object")
    allowed = {a.name for a in fn._schema.arguments} if isinstance(fn, torch._ops.OpOverload) else set()
    for k in kwargs:
        if k not in allowed:
            raise ArtifactError(f"{where}: {k!r} is not an argument of {getattr(fn, '__name__', fn)}")
    return kwargs
