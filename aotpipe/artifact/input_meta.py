"""The `.input` file: graph_dumper_aot's pickled input metadata, written and read safely.

Format (kept compatible with torch._functorch.compilers.get_inputs): a list with one entry
per graph input, ``(torch.Tensor, shape, stride, dtype, device)`` for a tensor or
``(int,)`` / ``(float,)`` for a scalar. The joint graph's is nested: ``[[primals...],
[tangents...]]``. Reading checks every pickle opcode first, then unpickles accepting only
those types, REDUCE reaching only torch.Size and torch.device.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path
from typing import Any, Sequence

import torch

from aotpipe.format.limits import breach, current, read_bytes
from aotpipe.format.ir import GraphInput
from aotpipe.errors import ArtifactError, exception_line

PICKLE_PROTOCOL = 4  # what torch's own reader and Python >= 3.8 read; deterministic for these types


def entry_for(gi: GraphInput) -> tuple:
    """The .input entry of one graph input."""
    if gi.meta is None:
        return (gi.scalar_type or int,)
    m = gi.meta
    return (torch.Tensor, torch.Size(m.shape), tuple(m.stride), m.dtype, torch.device(m.device))


def nest(flat: list[Any], groups: Sequence[int] | None) -> list[Any]:
    """`flat` split into consecutive groups of the given sizes (the joint graph's
    [[primals...], [tangents...]]); unchanged when there are no groups."""
    if not groups:
        return flat
    out, start = [], 0
    for size in groups:
        out.append(flat[start:start + size])
        start += size
    return out


def input_meta(inputs: list[GraphInput], groups: tuple[int, ...] | None = None) -> list:
    """The .input list for a graph's inputs, nested by `groups` when given."""
    return nest([entry_for(gi) for gi in inputs], groups)


def dumps(meta: list) -> bytes:
    return pickle.dumps(meta, protocol=PICKLE_PROTOCOL)


# The pickle opcodes the format needs, in every protocol Python writes (0 to 5): lists,
# tuples, small ints, short strings, globals, the memo, and REDUCE for the two constructors
# below. No BUILD (it would run __setstate__: Tensor's allocates a storage of a size the
# file chooses), no INST/OBJ/NEWOBJ, no persistent ids, no dicts, sets, bytes or buffers.
ALLOWED_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK",
    "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "INT", "BININT", "BININT1", "BININT2", "LONG1",
    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "GLOBAL", "STACK_GLOBAL", "REDUCE",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
})


class _TypeMark:
    """Stands for a type named in an entry (torch.Tensor, int, float) while unpickling, so
    that REDUCE can never call it: torch.Tensor(n) would allocate n elements."""

    __slots__ = ("type",)

    def __init__(self, t: type):
        self.type = t


_TYPES = {
    ("torch", "Tensor"): torch.Tensor,
    ("torch._tensor", "Tensor"): torch.Tensor,
    # graph_dumper_aot writes type(arg): a parameter, or a fake tensor at compile time
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("torch._subclasses.fake_tensor", "FakeTensor"): torch.Tensor,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "bool"): bool,
    # protocols 0-2 name them as Python 2 did (the stock find_class maps these back)
    ("__builtin__", "long"): int,
    ("__builtin__", "int"): int,
    ("__builtin__", "float"): float,
    ("__builtin__", "bool"): bool,
}
# The only callables REDUCE may reach: they build a shape and a device from plain data.
_CONSTRUCTORS = {
    ("torch", "Size"): torch.Size,
    ("torch._C", "Size"): torch.Size,
    ("torch", "device"): torch.device,
}
_DTYPES = {("torch", name): getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name, None), torch.dtype)}
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (int, float, bool)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in _TYPES:
            return _TypeMark(_TYPES[key])
        if key in _CONSTRUCTORS:
            return _CONSTRUCTORS[key]
        if key in _DTYPES:
            return _DTYPES[key]
        raise ArtifactError(
            f"refusing to unpickle {module}.{name}: a .input file holds only tensor metadata "
            "(torch.Tensor, torch.Size, torch.device, dtypes, int, float)"
        )


_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def check_opcodes(data: bytes, where: str) -> None:
    """Refuse a pickle using any opcode the .input format does not, before unpickling it; and
    one that would make the unpickler allocate more than the file's size suggests: more
    opcodes than the limit (each can push an object), or a memo index out of order (the
    unpickler grows its memo to twice the largest index: ten bytes can ask for gigabytes)."""
    limit = current().max_pickle_ops
    memo = 0  # entries the memo holds so far: a pickler numbers them 0, 1, 2, ...
    try:
        for count, (op, arg, pos) in enumerate(pickletools.genops(data), 1):
            if count > limit:
                raise breach(where, f"more than {limit:,} pickle opcodes", "max_pickle_ops", limit)
            if op.name not in ALLOWED_OPCODES:
                raise ArtifactError(f"{where}: refusing pickle opcode {op.name} at byte {pos}: "
                                    "a .input file never uses it")
            if op.name in _MEMO_PUTS:
                if not isinstance(arg, int) or arg < 0 or arg > memo:
                    raise ArtifactError(f"{where}: pickle memo index {arg} at byte {pos} is out of order (the "
                                        f"memo holds {memo} entries): a .input file numbers them in order")
                memo += arg == memo
            elif op.name == "MEMOIZE":
                memo += 1
    except ArtifactError:
        raise
    except Exception as e:  # truncated or not a pickle at all
        raise ArtifactError(f"{where}: not a valid .input pickle ({exception_line(e)})") from None


def _entry(e: Any, where: str, index: str) -> tuple:
    """One entry with its type mark replaced by the type, checked against the format."""
    if not isinstance(e, tuple) or len(e) not in (1, 5) or not isinstance(e[0], _TypeMark):
        raise ArtifactError(f"{where}: entry {index} is not (type, shape, stride, dtype, device) or (type,)")
    t = e[0].type
    if len(e) == 1:
        if t not in _SCALAR_TYPES:
            raise ArtifactError(f"{where}: entry {index}: a scalar entry's type must be int, float or bool")
        return (t,)
    _, shape, stride, dtype, device = e
    ints = lambda v: isinstance(v, tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)  # noqa: E731
    if t not in _TENSOR_TYPES or not ints(shape) or not ints(stride) or len(shape) != len(stride) \
            or not isinstance(dtype, torch.dtype) or not isinstance(device, torch.device):
        raise ArtifactError(f"{where}: entry {index} is not (torch.Tensor, shape, stride, dtype, device)")
    if any(i < 0 for i in shape) or any(i < 0 for i in stride):
        raise ArtifactError(f"{where}: entry {index} has a negative size or stride")
    return (t, torch.Size(shape), tuple(stride), dtype, device)


def loads(data: bytes, where: str = ".input") -> list:
    """Unpickle .input data: opcodes checked first, then only the format's types, then the
    structure ([entry, ...] or, for a joint graph, [[entry, ...], [entry, ...]])."""
    check_opcodes(data, where)
    try:
        meta = _RestrictedUnpickler(io.BytesIO(data)).load()
    except ArtifactError as e:
        raise ArtifactError(f"{where}: {e}") from None
    except Exception as e:
        raise ArtifactError(f"{where}: not a valid .input pickle ({exception_line(e)})") from None
    if not isinstance(meta, list):
        raise ArtifactError(f"{where}: expected a list of input entries, got {type(meta).__name__}")
    if meta and all(isinstance(g, list) for g in meta):
        return [[_entry(e, where, f"{i}.{j}") for j, e in enumerate(g)] for i, g in enumerate(meta)]
    return [_entry(e, where, str(i)) for i, e in enumerate(meta)]


def read(path: str | Path) -> list:
    """Read a .input file safely (a regular file within the record size limit)."""
    p = Path(path)
    data = read_bytes(p, limit=current().max_record_bytes, limit_name="max_record_bytes")
    return loads(data, str(p))
