"""Tensor helpers shared by capture and replay: storage layout and aliasing, random storages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from aotpipe.format.ir import size_hint
from aotpipe.format.limits import extent


@dataclass(frozen=True)
class StorageGroup:
    """One storage shared by one or more inputs: elements [0, numel) of one dtype."""

    dtype: torch.dtype
    device: str
    numel: int


def storage_groups(values: list[Any]) -> tuple[list[StorageGroup], list[int | None]]:
    """Group tensors that share a storage (and dtype); returns groups and each value's group.

    Works for real and fake tensors alike. Tensors of different dtypes over one storage are
    put in separate groups: their aliasing is not reproduced.
    """
    groups: list[StorageGroup] = []
    index: dict[tuple, int] = {}
    member: list[int | None] = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            member.append(None)
            continue
        key = (StorageWeakRef(v.untyped_storage()), v.dtype)
        # a symbolic size by its example value (size_hint: int() would make it a constant)
        need = size_hint(v.storage_offset()) + extent(tuple(size_hint(s) for s in v.shape),
                                                     tuple(size_hint(s) for s in v.stride()))
        if key in index:
            k = index[key]
            g = groups[k]
            if need > g.numel:
                groups[k] = StorageGroup(g.dtype, g.device, need)
        else:
            index[key] = len(groups)
            groups.append(StorageGroup(v.dtype, str(v.device), need))
        member.append(index[key])
    return groups, member


def storage_base(values: list[Any], member: list[int | None], groups: list[StorageGroup]) -> list[torch.Tensor]:
    """Per group, a 1-D tensor of the group's storage elements [0, numel), from its members."""
    bases: list[torch.Tensor | None] = [None] * len(groups)
    for v, k in zip(values, member):
        if k is not None and bases[k] is None:
            bases[k] = v.detach().as_strided((groups[k].numel,), (1,), 0)
    return bases  # type: ignore[return-value]


def view_of(base: torch.Tensor, shape: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """A view with the recorded layout over a group's base storage."""
    return base.as_strided(tuple(shape), tuple(stride), offset)


def random_storage(
    group: StorageGroup, generator: torch.Generator, int_range: tuple[int, int] | None = None
) -> torch.Tensor:
    """Random contents for a storage: N(0,1) floats, integers in `int_range`, random bools.
    Floats with a range (a train_step's optimizer state: step counts from 1, second moments
    never negative) are drawn uniform in [low, high)."""
    n = group.numel
    dt = group.dtype
    if dt == torch.bool:
        return torch.randint(0, 2, (n,), generator=generator).bool()
    if dt.is_floating_point and int_range is not None:
        low, high = int_range
        return (torch.rand((n,), generator=generator, dtype=torch.float32) * (high - low) + low).to(dt)
    if dt.is_floating_point:
        return torch.randn((n,), generator=generator, dtype=torch.float32).to(dt)
    if dt.is_complex:
        return torch.randn((n,), generator=generator, dtype=dt)
    low, high = int_range if int_range else (0, 2)
    if high <= low:
        high = low + 1
    return torch.randint(low, high, (n,), generator=generator, dtype=torch.int64).to(dt)


def ones(shape: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    """Ones with the given layout: a scalar loss's tangent, or an older artefact's tangent."""
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype).fill_(1)


def loss_weights(shape: Any, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    """The fixed, non-uniform weight of each element of a `shape` tensor in the weighted loss.

    Element (i_0, ..., i_{n-1}) weighs 1 + sum over d of ((3 i_d + d) mod 7) / 8: it varies
    along every dimension, so no normalisation (rows summing to zero, a batch norm's mean)
    makes the weighted sum constant. One arange per dimension, broadcast: traced, these are
    a few nodes of the graph, not a stored constant. Every value is a multiple of 1/8 below
    8, exact in every floating dtype, so every machine and the float64 reference get the
    same weights. A scalar weighs 1.
    """
    w = torch.ones((), dtype=dtype, device=device)
    for d, size in enumerate(shape):
        v = (torch.arange(size, device=device) * 3 + d) % 7
        view = [1] * len(shape)
        view[d] = size
        w = w + v.to(dtype).reshape(view) * 0.125
    return w


def tangent(shape: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    """A tangent as capture binds it and replay remakes it (records' source "weights", or
    "ones" for a scalar): the loss weights of its output, in the given layout. A joint
    graph fed these gives the gradients of the weighted loss of the outputs it differentiates
    (a dynamo subgraph's, one tangent each; export's scalar loss, 1)."""
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype).copy_(loss_weights(tuple(shape), dtype))


def value_range(t: torch.Tensor) -> tuple[int, int] | None:
    """[min, max + 1) of an integer tensor's values; None for floats, complex, bools, empty
    tensors and tensors without values (meta, fake). The wide unsigned dtypes (uint16, uint32,
    uint64: ``aten.hash_tensor``'s output), which torch's min and max do not take, are read
    through numpy."""
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or t.numel() == 0:
        return None
    if t.is_meta or isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
        return None
    if t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        a = t.detach().cpu().numpy()
        return int(a.min()), int(a.max()) + 1
    return int(t.min()), int(t.max()) + 1
