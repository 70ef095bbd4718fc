"""graph.json: an FX graph as data, rebuilt without executing any code from the artefact.

Every call_function target is written as a qualified op name (``aten.addmm.default``) and
resolved on load only through the reviewed allow-list of :mod:`aotpipe.artifact.ops`.
Arguments are tagged JSON: node references, dtypes, devices, layouts and memory formats
are objects with one key; tuples are kept apart from lists; non-finite floats are spelled
out. Names that become generated code (nodes, placeholders, constants) must be plain
identifiers, never Python keywords.
"""

from __future__ import annotations

import keyword
import math
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.fx._lazy_graph_module import _make_graph_module

from pydantic import TypeAdapter, ValidationError

from aotpipe.format import limits, records
from aotpipe.artifact.provenance import ORIGIN_KEY, node_origin
from aotpipe.artifact.ops import check_kwargs, check_string_args, check_unsafe_flags, op_name, resolve_op
from aotpipe.format.records import GRAPH_FORMAT_VERSION, READABLE_GRAPH_VERSIONS
from aotpipe.errors import ArtifactError
from aotpipe.format.ir import size_expr
from aotpipe.format.limits import extent


# Only dense tensors: a sparse or mkldnn layout argument would build what the op allow-list
# keeps out.
_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {
    str(v).removeprefix("torch."): v
    for v in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)
}


def target_name(target: Any) -> str:
    """The qualified name a call_function target is saved under."""
    name = op_name(target)
    if name is not None:
        return name
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    raise ArtifactError(f"graph calls {mod}.{qual}, which graph.json cannot store; only torch ops, "
                        "operator.getitem and arithmetic and comparisons on sizes (aotpipe.artifact.ops.SIZE_ARITHMETIC) "
                        "can be stored")


def resolve_target(name: Any, trusted: frozenset[str] = frozenset()) -> Callable[..., Any]:
    """The op or callable a saved target name stands for; refuses anything off the allow-list
    (but ops of the library namespaces in `trusted`)."""
    return resolve_op(name, trusted)


def is_code_name(name: Any) -> bool:
    """Whether `name` may become a Python name in generated code: an identifier, not a
    keyword (``None``, ``import``), not ``self``, not a dunder."""
    return (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and name != "self" and not name.startswith("__"))


def read_graph_json(path: Path, root: Optional[Path] = None) -> Any:
    """graph.json's data, refused before parsing when it plainly holds more nodes than the
    limit (each node has an "op" key), and after parsing when it does."""
    lim = limits.current()
    data = limits.read_bytes(path, limit=lim.max_record_bytes, limit_name="max_record_bytes", root=root)
    estimate = data.count(b'"op"')
    if estimate > lim.max_nodes:
        limits.check_nodes(estimate, path)
    return limits.parse_json(data, path)


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


# Node arguments given as parsed JSON (not yet a record) are read through the record's union.
_NODE_ARG = TypeAdapter(records.NodeArg)


def decode_arg(a: Any, env: dict[str, torch.fx.Node]) -> Any:
    """Inverse of encode_arg: a node argument (records.NodeArg, or the JSON it is parsed
    from) as the value it stands for; node names resolve in `env` (nodes defined so far)."""
    if isinstance(a, dict):
        try:
            a = _NODE_ARG.validate_python(a)
        except ValidationError:
            raise ArtifactError(f"graph.json: cannot decode argument {str(a)[:80]}") from None
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, list):
        return [decode_arg(x, env) for x in a]
    if isinstance(a, records.NodeRef):
        if a.node not in env:
            raise ArtifactError(f"graph.json refers to node {a.node!r} before it is defined")
        return env[a.node]
    if isinstance(a, records.TupleArg):
        return tuple(decode_arg(x, env) for x in a.tuple)
    if isinstance(a, records.FloatArg):
        return float(a.float)
    if isinstance(a, records.DTypeArg):
        return decode_dtype(a.dtype)
    if isinstance(a, records.DeviceArg):
        try:
            return torch.device(a.device)
        except (RuntimeError, TypeError):
            raise ArtifactError(f"graph.json: bad device {a.device[:40]!r}") from None
    if isinstance(a, records.LayoutArg):
        if a.layout not in _LAYOUTS:
            raise ArtifactError(f"graph.json: layout {a.layout[:40]!r} is not allowed (only strided tensors)")
        return _LAYOUTS[a.layout]
    if isinstance(a, records.MemoryFormatArg) and a.memory_format in _MEMORY_FORMATS:
        return _MEMORY_FORMATS[a.memory_format]
    if isinstance(a, records.SliceArg):
        return slice(*(decode_arg(x, env) for x in a.slice))
    if isinstance(a, records.ComplexArg):
        return complex(decode_arg(a.complex[0], env), decode_arg(a.complex[1], env))
    raise ArtifactError(f"graph.json: cannot decode argument {str(a)[:80]}")


def decode_dtype(name: Any) -> torch.dtype:
    """A torch dtype from its short name ('float32'), refusing anything else."""
    dt = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise ArtifactError(f"unknown dtype {name!r}")
    return dt


def _encode_val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        # a symbolic size as its expression (size_expr: no guard on the graph's shape environment)
        return {
            "shape": [size_expr(s) for s in v.shape],
            "stride": [size_expr(s) for s in v.stride()],
            "dtype": str(v.dtype).removeprefix("torch."),
            "device": str(v.device),
            "storage_offset": size_expr(v.storage_offset()),
        } if v.device.type != "meta" else {  # a layout a pass recorded: no device to tell
            "shape": [size_expr(s) for s in v.shape],
            "stride": [size_expr(s) for s in v.stride()],
            "dtype": str(v.dtype).removeprefix("torch."),
            "storage_offset": size_expr(v.storage_offset()),
        }
    if isinstance(v, (list, tuple)):
        return [_encode_val(x) for x in v]
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"symbolic": str(v.node.expr)}
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
        origin = node_origin(node)
        if origin is not None:
            entry["origin"] = origin.model_dump(exclude_none=True)
        nodes.append(entry)
    return {"format_version": GRAPH_FORMAT_VERSION, "nodes": nodes}


def graph_from_json(
    data: Any, constants: dict[str, torch.Tensor] | None = None, *, where: str = "graph.json",
    trusted: frozenset[str] = frozenset(),
) -> torch.fx.GraphModule:
    """Rebuild a GraphModule from a graph record (records.GraphRecord, or the JSON data of
    one: graph_to_json's); `constants` maps blob hashes to tensors; ops of the library
    namespaces in `trusted` (granted by the user) resolve too.

    Malformed data of any shape is an ArtifactError, never another exception.
    """
    try:
        graph = data if isinstance(data, records.GraphRecord) else _graph_record(data, where)
        return _graph_from_json(graph, constants, where, trusted)
    except ArtifactError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, RuntimeError, RecursionError,
            SyntaxError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ArtifactError(f"{where}: malformed graph ({e.__class__.__name__}: {first})") from None


def _graph_record(data: records.RawJson, where: str) -> records.GraphRecord:
    """JSON data as a graph record: its version and size first, then every field."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ArtifactError(f"{where}: not a graph (no 'nodes' list)")
    version = data.get("format_version")
    if version not in READABLE_GRAPH_VERSIONS:
        raise ArtifactError(f"{where}: graph format version {repr(version)[:40]}; this aotpipe reads versions "
                            f"{', '.join(map(str, READABLE_GRAPH_VERSIONS))}")
    limits.check_nodes(len(data["nodes"]), where)
    return records.parse(records.GraphRecord, data, where)


def _graph_from_json(graph_record: records.GraphRecord, constants: dict[str, torch.Tensor] | None, where: str,
                     trusted: frozenset[str]) -> torch.fx.GraphModule:
    limits.check_nodes(len(graph_record.nodes), where)
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, torch.fx.Node] = {}
    for i, entry in enumerate(graph_record.nodes):
        op, name = entry.op, entry.name
        if not is_code_name(name):
            raise ArtifactError(f"{where}: node {i} has a bad name {str(name)[:80]!r} "
                                "(names must be identifiers, not Python keywords)")
        if op == "placeholder":
            node = graph.create_node("placeholder", name, name=name)
        elif op == "get_attr":
            blob = entry.blob
            if constants is None or blob not in constants:
                raise ArtifactError(f"{where}: constant {name!r} needs blob {blob!r}, which is missing")
            target = entry.target
            if not isinstance(target, str) or not all(is_code_name(p) for p in target.split(".")) \
                    or hasattr(torch.fx.GraphModule, target.split(".")[0]):
                raise ArtifactError(f"{where}: bad get_attr target {str(target)[:80]!r} "
                                    "(dotted identifiers, not Python keywords)")
            value = _constant_layout(constants[blob], entry.shape, entry.stride, f"{where}: constant {name!r}")
            _set_attr(root, target, value)
            node = graph.create_node("get_attr", target, name=name)
        elif op == "call_function":
            fn = resolve_op(entry.target, trusted)
            args = decode_arg(entry.args or [], env)
            raw_kwargs = check_kwargs(fn, entry.kwargs or {}, f"{where}: node {name!r}")
            kwargs = {k: decode_arg(v, env) for k, v in raw_kwargs.items()}
            check_string_args(fn, args, kwargs, f"{where}: node {name!r}")
            check_unsafe_flags(fn, args, kwargs, f"{where}: node {name!r}")
            limits.check_op_sizes(fn, args, kwargs, f"{where}: node {name!r}")
            node = graph.create_node("call_function", fn, tuple(args), kwargs, name=name)
        else:  # output (the record allows no other op)
            args = decode_arg(entry.args or [], env)
            node = graph.create_node("output", "output", (args[0] if len(args) == 1 else tuple(args),), name=name)
        if node.name != name:
            raise ArtifactError(f"{where}: node name {name!r} is used twice")
        if "val" in entry.model_fields_set:
            node.meta["saved_val"] = entry.val
        if entry.origin is not None:  # written again as read (a graph saved from a loaded one)
            node.meta[ORIGIN_KEY] = entry.origin
        env[name] = node
    try:
        graph.lint()
    except Exception as e:
        raise ArtifactError(f"{where}: the rebuilt graph is invalid: {e}") from None
    with warnings.catch_warnings():
        # Literal arguments of an odd graph (None[0]) make Python warn while compiling the
        # generated code; the graph fails when run, and that is reported as an error.
        warnings.simplefilter("ignore", SyntaxWarning)
        # Under torch's _use_lazy_graph_module(True) (the meta check) a module whose code is
        # made when first called, if ever; else a plain one, its code made now.
        return _make_graph_module(root, graph)


def _constant_layout(value: torch.Tensor, shape: Any, stride: Any, where: str) -> torch.Tensor:
    """A constant's blob (contiguous data) laid out with its recorded shape and stride; the
    layout must hold exactly the blob's elements, so it cannot ask for more memory."""
    if shape is None and stride is None:
        return value
    if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride)
            and all(isinstance(s, int) and s >= 0 for s in shape + stride)):
        raise ArtifactError(f"{where}: bad shape {str(shape)[:40]} or stride {str(stride)[:40]}")
    if limits.numel(shape) != value.numel():
        raise ArtifactError(f"{where}: shape {shape} does not hold its blob's {value.numel()} elements")
    if value.numel() and extent(tuple(shape), tuple(stride)) != value.numel():
        raise ArtifactError(f"{where}: stride {stride} is not a dense layout of shape {shape}")
    if list(value.shape) != shape:
        value = value.reshape(shape)
    if list(value.stride()) != stride:
        value = torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value)
    return value


def _set_attr(root: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, attr = target.split(".")
    mod = root
    for p in path:
        if not hasattr(mod, p):
            mod.add_module(p, torch.nn.Module())
        mod = getattr(mod, p)
    mod.register_buffer(attr, value)
