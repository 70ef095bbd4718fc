"""The ops a loaded graph may call: aotpipe's one reviewed allow-list.

graph.json names its ops; the loader resolves a name only if :func:`resolve_op` allows
it. What is allowed is what aotpipe's own capture and passes emit:

- core ATen ops (``torch.Tag.core``): the op set export decomposes to, reviewed by torch;
- the ATen ops export and AOTAutograd emit that are not core (:data:`EXTRA_ATEN`);
- the in-place variant of an allowed functional op (the reinplace pass turns
  ``aten.add.Tensor`` into ``aten.add_.Tensor``, a ``slice_scatter`` into a ``copy_``);
- the few prims and rngprims decompositions can leave behind (:data:`PRIMS`);
- ``operator.getitem``, which picks one output of a multi-output op;

minus, whatever the rules above admit, every op that builds sparse, nested or mkldnn
tensors, resizes a tensor, touches storages or files, or changes process-wide state
(:data:`DENIED`), and every op with an argument that is a free string (a path, code) or a
Storage, and every out= overload (it writes, and may resize, a tensor it is given).

Changing this file widens what a hostile artefact can make aotpipe run: review it so.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable, Optional

import torch

from aotpipe.errors import ArtifactError

ALLOWED_NAMESPACES = ("aten", "prims", "rngprims")

# Python callables (not torch ops) captured graphs use, by qualified name.
PYTHON_CALLABLES: dict[str, Callable[..., Any]] = {
    "operator.getitem": operator.getitem,
}

# ATen ops outside torch.Tag.core that export, AOTAutograd's joint tracing and partitioning,
# or aotpipe's passes emit ("op.overload").
EXTRA_ATEN = frozenset({
    # export / functionalization bookkeeping
    "_assert_tensor_metadata.default", "lift_fresh_copy.default", "detach.default", "t.default",
    "_unsafe_view.default", "reshape.default",  # view_to_reshape emits reshape
    # training-mode batch norm and dropout
    "_native_batch_norm_legit_functional.default", "_batch_norm_with_update_functional.default",
    "native_batch_norm_backward.default", "native_dropout_backward.default",
    "bernoulli.default", "bernoulli.p",
    # indexing the decompositions emit
    "_unsafe_index.Tensor", "_unsafe_index_put.default", "_unsafe_masked_index.default",
    "_unsafe_masked_index_put_accumulate.default", "masked_fill.Scalar", "masked_fill.Tensor",
    "put.default",  # Tensor.put: bounds-checked writes into a copy (no deterministic CPU kernel)
    # factories and reductions the partitioner and decompositions emit
    "zeros.default", "ones.default", "zeros_like.default", "ones_like.default", "empty_like.default",
    "new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default",
    "rand_like.default", "randn_like.default", "randint.default", "randint.low", "sum.default",
    # backward ops AOTAutograd keeps whole
    "_softmax_backward_data.default", "_log_softmax_backward_data.default", "_safe_softmax.default",
    "threshold_backward.default", "gelu_backward.default", "tanh_backward.default", "sigmoid_backward.default",
    "silu_backward.default", "hardtanh_backward.default", "leaky_relu_backward.default", "elu_backward.default",
    "softplus_backward.default", "log_sigmoid_backward.default", "hardswish_backward.default",
    "hardsigmoid_backward.default", "mish_backward.default", "glu_backward.default",
    "select_backward.default", "slice_backward.default", "embedding_backward.default",
    "nll_loss_forward.default", "nll_loss_backward.default", "mse_loss_backward.default",
    "_fused_rms_norm.default", "_fused_rms_norm_backward.default",
    # attention on the CPU, when left to the flash kernel
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
})

# prims and rngprims that decompositions can leave in a graph (all functional).
PRIMS = frozenset({
    "prims.convert_element_type.default", "prims.broadcast_in_dim.default", "prims.view_of.default",
    "prims.iota.default", "rngprims.philox_rand.default",
})

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
)

# String arguments that name a choice among a few values (not a file, not code).
ENUM_STRING_ARGS = frozenset({"rounding_mode", "approximate", "reduce", "side", "mode", "padding_mode", "norm",
                              "UPLO", "driver", "pad_mode", "interpolation", "indexing", "reduction"})


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
    if ns != "aten":
        return f"{ns}.{op}.{overload}" in PRIMS
    if torch.Tag.core in target.tags or f"{op}.{overload}" in EXTRA_ATEN:
        return True
    if op.endswith("_") and not op.endswith("__") and target._schema.is_mutable:
        functional = _lookup(ns, op[:-1], overload)
        return functional is not None and _admitted(ns, op[:-1], overload, functional)
    return False


def _argument_problem(target: torch._ops.OpOverload) -> Optional[str]:
    for a in target._schema.arguments:
        if a.is_out:  # core ATen tags one (atan2.out)
            return "it writes, and may resize, an out= tensor"
        t = str(a.type)
        if "str" in t and a.name not in ENUM_STRING_ARGS:
            return f"its argument {a.name!r} is a free string"
        if "Storage" in t or t == "Any":
            return f"its argument {a.name!r} is a {t}"
    return None


@functools.lru_cache(maxsize=None)
def _resolve(name: str) -> Callable[..., Any]:
    if name in PYTHON_CALLABLES:
        return PYTHON_CALLABLES[name]
    parts = name.split(".")
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


def resolve_op(name: Any) -> Callable[..., Any]:
    """The op or callable a saved target name stands for; ArtifactError if it is not allowed."""
    if not isinstance(name, str):
        raise ArtifactError(f"graph.json: op target must be a string, got {type(name).__name__}")
    return _resolve(name)


def op_name(target: Any) -> Optional[str]:
    """The qualified name ("aten.add.Tensor", "operator.getitem") of a call target, or None."""
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


def check_kwargs(fn: Any, kwargs: Any, where: str) -> dict:
    """Keyword arguments must be named parameters of the op (they become generated code)."""
    if not isinstance(kwargs, dict):
        raise ArtifactError(f"{where}: kwargs must be an object")
    allowed = {a.name for a in fn._schema.arguments} if isinstance(fn, torch._ops.OpOverload) else set()
    for k in kwargs:
        if k not in allowed:
            raise ArtifactError(f"{where}: {k!r} is not an argument of {getattr(fn, '__name__', fn)}")
    return kwargs
