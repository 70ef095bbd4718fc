"""graph.json: an FX graph as data, rebuilt without executing any code from the artefact.

Every call_function target is written as a qualified op name (``aten.addmm.default``) and
resolved on load only inside :data:`ALLOWED_NAMESPACES` of ``torch.ops``, plus the few
Python callables captured graphs use (``operator.getitem``). Arguments are tagged JSON:
node references, dtypes, devices, layouts and memory formats are objects with one key;
tuples are kept apart from lists; non-finite floats are spelled out.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.fx

from aotpipe.errors import ArtifactError

GRAPH_FORMAT_VERSION = 2  # 2: a get_attr may be "recompute" (its blob is not stored)

# torch.ops namespaces a loaded graph may call. `inductor` and friends are left out on
# purpose: a saved graph must load without importing torch._inductor.
ALLOWED_NAMESPACES = frozenset({"aten", "prims", "rngprims", "quantized_decomposed"})

# Python callables (not torch ops) that captured graphs use, by qualified name.
ALLOWED_CALLABLES: dict[str, Callable[..., Any]] = {
    "operator.getitem": operator.getitem,
}

_LAYOUTS = {str(v).removeprefix("torch."): v for v in (torch.strided, torch.sparse_coo, torch.sparse_csr, torch._mkldnn)}
_MEMORY_FORMATS = {
    str(v).removeprefix("torch."): v
    for v in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)
}


def target_name(target: Any) -> str:
    """The qualified name a call_function target is saved under."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    for name, fn in ALLOWED_CALLABLES.items():
        if fn is target:
            return name
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    raise ArtifactError(
        f"graph calls {mod}.{qual}, which graph.json cannot store; only torch ops in "
        f"{sorted(ALLOWED_NAMESPACES)} and {sorted(ALLOWED_CALLABLES)} are allowed"
    )


def resolve_target(name: str) -> Callable[..., Any]:
    """The op or callable a saved target name stands for; refuses anything outside the allow-list."""
    if not isinstance(name, str):
        raise ArtifactError(f"graph.json: op target must be a string, got {type(name).__name__}")
    if name in ALLOWED_CALLABLES:
        return ALLOWED_CALLABLES[name]
    parts = name.split(".")
    if len(parts) != 3 or parts[0] not in ALLOWED_NAMESPACES:
        raise ArtifactError(
            f"graph.json names {name!r}, which is not an op in an allowed namespace "
            f"({', '.join(sorted(ALLOWED_NAMESPACES))}); refusing to load it"
        )
    ns, op, overload = parts
    if not all(p.isidentifier() for p in parts):
        raise ArtifactError(f"graph.json names {name!r}, which is not a valid op name")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        target = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise ArtifactError(f"graph.json names {name!r}, which this torch ({torch.__version__}) does not have") from None
    if not isinstance(target, torch._ops.OpOverload):
        raise ArtifactError(f"graph.json names {name!r}, which is not an op overload")
    why = _unsafe_reason(target)
    if why:
        raise ArtifactError(f"graph.json names {name!r}, which is not allowed: {why}")
    return target


# Ops that reach outside the tensors a graph is given (files, raw storage, printing) or
# re-point a tensor at other memory. A graph of ours never needs them.
DENIED_OPS = frozenset({"from_file", "set_", "set", "resize_", "resize_as_", "_resize_output_", "_print",
                        "_debug_has_internal_overlap", "save", "load", "_unsafe_set_version_counter",
                        "_set_grad_enabled", "_dirichlet_grad"})
# String arguments that name a choice among a few values (not a file, not code).
ENUM_STRING_ARGS = frozenset({"rounding_mode", "approximate", "reduce", "side", "mode", "padding_mode", "norm",
                              "UPLO", "driver", "pad_mode", "interpolation", "indexing", "reduction"})


def _unsafe_reason(op: torch._ops.OpOverload) -> str | None:
    name = op._schema.name.split("::")[-1]
    if name in DENIED_OPS:
        return "it reaches outside the graph's tensors"
    for a in op._schema.arguments:
        t = str(a.type)
        if "str" in t and a.name not in ENUM_STRING_ARGS:
            return f"its argument {a.name!r} is a free string"
        if "Storage" in t or "Any" == t:
            return f"its argument {a.name!r} is a {t}"
    return None


def _check_kwargs(fn: Any, kwargs: Any, where: str) -> dict:
    """Keyword arguments must be named parameters of the op (they become generated code)."""
    if not isinstance(kwargs, dict):
        raise ArtifactError(f"{where}: kwargs must be an object")
    allowed = {a.name for a in fn._schema.arguments} if isinstance(fn, torch._ops.OpOverload) else set()
    for k in kwargs:
        if k not in allowed:
            raise ArtifactError(f"{where}: {k!r} is not an argument of {getattr(fn, '__name__', fn)}")
    return kwargs


def encode_arg(a: Any) -> Any:
    """A node argument as tagged JSON data."""
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        if math.isfinite(a):
            return a
        return {"float": "nan" if math.isnan(a) else ("inf" if a > 0 else "-inf")}
    if isinstance(a, list):
        return [encode_arg(x) for x in a]
    if isinstance(a, tuple):
        return {"tuple": [encode_arg(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if isinstance(a, slice):
        return {"slice": [encode_arg(a.start), encode_arg(a.stop), encode_arg(a.step)]}
    if isinstance(a, complex):
        return {"complex": [encode_arg(a.real), encode_arg(a.imag)]}
    raise ArtifactError(f"graph.json cannot store an argument of type {type(a).__name__}: {a!r}")


def decode_arg(a: Any, env: dict[str, torch.fx.Node]) -> Any:
    """Inverse of encode_arg; node names resolve in `env` (nodes defined so far)."""
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, list):
        return [decode_arg(x, env) for x in a]
    if isinstance(a, dict) and len(a) == 1:
        (tag, v), = a.items()
        if tag == "node":
            if v not in env:
                raise ArtifactError(f"graph.json refers to node {v!r} before it is defined")
            return env[v]
        if tag == "tuple":
            return tuple(decode_arg(x, env) for x in v)
        if tag == "float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "dtype":
            return decode_dtype(v)
        if tag == "device":
            try:
                return torch.device(v)
            except (RuntimeError, TypeError):
                raise ArtifactError(f"graph.json: bad device {v!r}") from None
        if tag == "layout" and v in _LAYOUTS:
            return _LAYOUTS[v]
        if tag == "memory_format" and v in _MEMORY_FORMATS:
            return _MEMORY_FORMATS[v]
        if tag == "slice":
            return slice(*(decode_arg(x, env) for x in v))
        if tag == "complex":
            return complex(decode_arg(v[0], env), decode_arg(v[1], env))
    raise ArtifactError(f"graph.json: cannot decode argument {str(a)[:80]}")


def decode_dtype(name: Any) -> torch.dtype:
    """A torch dtype from its short name ('float32'), refusing anything else."""
    dt = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise ArtifactError(f"unknown dtype {name!r}")
    return dt


def _encode_val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {
            "shape": [int(s) for s in v.shape],
            "stride": [int(s) for s in v.stride()],
            "dtype": str(v.dtype).removeprefix("torch."),
            "device": str(v.device),
            "storage_offset": int(v.storage_offset()),
        }
    if isinstance(v, (list, tuple)):
        return [_encode_val(x) for x in v]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"symbolic": str(v)}
    if isinstance(v, (bool, int, float)) or v is None:
        return encode_arg(v)
    return None


def graph_to_json(gm: torch.fx.GraphModule, constants: dict[str, str] | None = None) -> dict[str, Any]:
    """The graph as JSON data. `constants` maps get_attr targets to their blob hashes.

    A constant's shape and stride are recorded beside its blob (blobs hold contiguous
    data), so a channels-last constant loads channels-last.
    """
    constants = constants or {}
    nodes = []
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "call_function":
            entry["target"] = target_name(node.target)
        elif node.op in ("placeholder", "get_attr"):
            entry["target"] = str(node.target)
            if node.op == "get_attr":
                if node.target not in constants:
                    raise ArtifactError(f"get_attr {node.target!r} has no stored tensor")
                entry["blob"] = constants[node.target]
                value = gm.get_buffer(node.target) if "." in node.target else getattr(gm, node.target)
                entry["shape"] = [int(x) for x in value.shape]
                entry["stride"] = [int(x) for x in value.stride()]
        elif node.op != "output":
            raise ArtifactError(f"graph.json cannot store a {node.op} node ({node.name})")
        if node.op in ("call_function", "output"):
            entry["args"] = encode_arg(list(node.args))
            entry["kwargs"] = {k: encode_arg(v) for k, v in node.kwargs.items()}
        val = node.meta.get("val")
        if val is not None:
            entry["val"] = _encode_val(val)
        nodes.append(entry)
    return {"format_version": GRAPH_FORMAT_VERSION, "nodes": nodes}


def graph_from_json(
    data: Any, constants: dict[str, torch.Tensor] | None = None, *, where: str = "graph.json"
) -> torch.fx.GraphModule:
    """Rebuild a GraphModule from graph_to_json data; `constants` maps blob hashes to tensors.

    Malformed data of any shape is an ArtifactError, never another exception.
    """
    try:
        return _graph_from_json(data, constants, where)
    except ArtifactError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, RuntimeError, RecursionError) as e:
        raise ArtifactError(f"{where}: malformed graph ({e.__class__.__name__}: {e})") from None


def _graph_from_json(data: Any, constants: dict[str, torch.Tensor] | None, where: str) -> torch.fx.GraphModule:
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ArtifactError(f"{where}: not a graph (no 'nodes' list)")
    version = data.get("format_version")
    if version not in (1, GRAPH_FORMAT_VERSION):
        raise ArtifactError(
            f"{where}: graph format version {version!r}; this aotpipe reads versions 1, {GRAPH_FORMAT_VERSION}"
        )
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, torch.fx.Node] = {}
    for i, entry in enumerate(data["nodes"]):
        if not isinstance(entry, dict):
            raise ArtifactError(f"{where}: node {i} is not an object")
        op, name = entry.get("op"), entry.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ArtifactError(f"{where}: node {i} has a bad name {name!r}")
        if op == "placeholder":
            node = graph.create_node("placeholder", name, name=name)
        elif op == "get_attr":
            blob = entry.get("blob")
            if constants is None or blob not in constants:
                raise ArtifactError(f"{where}: constant {name!r} needs blob {blob!r}, which is missing")
            target = entry.get("target")
            if not isinstance(target, str) or not all(p.isidentifier() and not p.startswith("__")
                                                      for p in target.split(".")) \
                    or hasattr(torch.fx.GraphModule, target.split(".")[0]):
                raise ArtifactError(f"{where}: bad get_attr target {target!r}")
            value = constants[blob]
            shape, stride = entry.get("shape"), entry.get("stride")
            if isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride):
                if list(value.shape) != shape and value.numel() == _numel(shape):
                    value = value.reshape(shape)
                if list(value.stride()) != stride:
                    value = torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value.reshape(shape))
            _set_attr(root, target, value)
            node = graph.create_node("get_attr", target, name=name)
        elif op == "call_function":
            fn = resolve_target(entry.get("target"))
            args = decode_arg(entry.get("args", []), env)
            if not isinstance(args, list):
                raise ArtifactError(f"{where}: node {name!r}: args must be a list")
            raw_kwargs = _check_kwargs(fn, entry.get("kwargs") or {}, f"{where}: node {name!r}")
            kwargs = {k: decode_arg(v, env) for k, v in raw_kwargs.items()}
            node = graph.create_node("call_function", fn, tuple(args), kwargs, name=name)
        elif op == "output":
            args = decode_arg(entry.get("args", []), env)
            node = graph.create_node("output", "output", (args[0] if len(args) == 1 else tuple(args),), name=name)
        else:
            raise ArtifactError(f"{where}: node {name!r} has unsupported op {op!r}")
        if node.name != name:
            raise ArtifactError(f"{where}: node name {name!r} is used twice")
        if "val" in entry:
            node.meta["saved_val"] = entry["val"]
        env[name] = node
    try:
        graph.lint()
    except Exception as e:
        raise ArtifactError(f"{where}: the rebuilt graph is invalid: {e}") from None
    return torch.fx.GraphModule(root, graph)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _set_attr(root: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, attr = target.split(".")
    mod = root
    for p in path:
        if not hasattr(mod, p):
            mod.add_module(p, torch.nn.Module())
        mod = getattr(mod, p)
    mod.register_buffer(attr, value)
