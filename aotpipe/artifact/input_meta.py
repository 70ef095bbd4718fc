"""The `.input` file: graph_dumper_aot's pickled input metadata, written and read safely.

Format (kept compatible with torch._functorch.compilers.get_inputs): a list with one entry
per graph input, ``(torch.Tensor, shape, stride, dtype, device)`` for a tensor or
``(int,)`` / ``(float,)`` for a scalar. The joint graph's is nested: ``[[primals...],
[tangents...]]``. Reading goes through an unpickler that accepts only those types.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Sequence

import torch

from aotpipe.capture.types import GraphInput
from aotpipe.errors import ArtifactError

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


_ALLOWED_GLOBALS = {
    ("torch", "Tensor"): torch.Tensor,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "bool"): bool,
    ("torch._tensor", "Tensor"): torch.Tensor,
    ("torch._C", "Size"): torch.Size,
}
_ALLOWED_GLOBALS.update(
    {("torch", name): getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise ArtifactError(
                f"refusing to unpickle {module}.{name}: a .input file holds only tensor metadata "
                "(torch.Tensor, torch.Size, torch.device, dtypes, int, float)"
            ) from None


def loads(data: bytes, where: str = ".input") -> list:
    """Unpickle .input data, refusing any type the format does not use."""
    try:
        meta = _RestrictedUnpickler(io.BytesIO(data)).load()
    except ArtifactError as e:
        raise ArtifactError(f"{where}: {e}") from None
    except Exception as e:
        raise ArtifactError(f"{where}: not a valid .input pickle ({e.__class__.__name__}: {e})") from None
    if not isinstance(meta, list):
        raise ArtifactError(f"{where}: expected a list of input entries, got {type(meta).__name__}")
    return meta


def read(path: str | Path) -> list:
    """Read a .input file safely."""
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise ArtifactError(f"{p}: not a regular file (a link or device is refused)")
    try:
        if p.stat().st_size > (64 << 20):
            raise ArtifactError(f"{p}: far larger than any .input file")
        data = p.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{p}: cannot read ({e.strerror})") from None
    return loads(data, str(p))
