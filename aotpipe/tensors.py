"""Tensor helpers shared by capture and replay: storage layout, value statistics, comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# Tolerances for "close to the eager model" per dtype: (rtol, atol). Decompositions change
# the order of floating-point operations, so a graph is not bit-equal to eager; it must
# be this close. Gradients compound rounding, hence the float32 values.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing values of `dtype` against eager; 0 for exact dtypes."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def extent(shape: tuple[int, ...] | torch.Size, stride: tuple[int, ...]) -> int:
    """Number of storage elements a (shape, stride) view spans from its offset; 0 if empty."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


@dataclass(frozen=True)
class StorageGroup:
    """One storage shared by one or more inputs: elements [0, numel) of one dtype."""

    dtype: torch.dtype
    device: str
    numel: int


def storage_groups(values: list[Any]) -> tuple[list[StorageGroup], list[Optional[int]]]:
    """Group tensors that share a storage (and dtype); returns groups and each value's group.

    Works for real and fake tensors alike. Tensors of different dtypes over one storage are
    put in separate groups: their aliasing is not reproduced.
    """
    groups: list[StorageGroup] = []
    index: dict[tuple, int] = {}
    member: list[Optional[int]] = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            member.append(None)
            continue
        key = (StorageWeakRef(v.untyped_storage()), v.dtype)
        need = int(v.storage_offset()) + extent(tuple(v.shape), tuple(v.stride()))
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


def storage_base(values: list[Any], member: list[Optional[int]], groups: list[StorageGroup]) -> list[torch.Tensor]:
    """Per group, a 1-D tensor of the group's storage elements [0, numel), from its members."""
    bases: list[Optional[torch.Tensor]] = [None] * len(groups)
    for v, k in zip(values, member):
        if k is not None and bases[k] is None:
            bases[k] = v.detach().as_strided((groups[k].numel,), (1,), 0)
    return bases  # type: ignore[return-value]


def view_of(base: torch.Tensor, shape: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """A view with the recorded layout over a group's base storage."""
    return base.as_strided(tuple(shape), tuple(stride), offset)


def random_storage(
    group: StorageGroup, generator: torch.Generator, int_range: Optional[tuple[int, int]] = None
) -> torch.Tensor:
    """Random contents for a storage: N(0,1) floats, integers in `int_range`, random bools."""
    n = group.numel
    dt = group.dtype
    if dt == torch.bool:
        return torch.randint(0, 2, (n,), generator=generator).bool()
    if dt.is_floating_point:
        return torch.randn((n,), generator=generator, dtype=torch.float32).to(dt)
    if dt.is_complex:
        return torch.randn((n,), generator=generator, dtype=dt)
    low, high = int_range if int_range else (0, 2)
    if high <= low:
        high = low + 1
    return torch.randint(low, high, (n,), generator=generator, dtype=torch.int64).to(dt)


def stats(t: Any) -> Optional[dict[str, Any]]:
    """A small fingerprint of a value: layout plus float64 sum and absolute sum of finite elements."""
    if not isinstance(t, torch.Tensor):
        return None
    d = t.detach()
    if d.is_complex():
        d = torch.view_as_real(d)
    v = d.to("cpu", torch.float64)
    finite = torch.isfinite(v)
    vf = v[finite]
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "dtype": str(t.dtype).removeprefix("torch."),
        "sum": float(vf.sum()) if vf.numel() else 0.0,
        "abs_sum": float(vf.abs().sum()) if vf.numel() else 0.0,
        "nonfinite": int((~finite).sum()),
    }


def stats_depart(actual: dict[str, Any], recorded: dict[str, Any], rtol: float) -> Optional[str]:
    """How `actual` stats depart from `recorded` ones, or None if they agree within `rtol`."""
    for key in ("dtype", "shape", "stride"):
        if actual[key] != recorded[key]:
            return f"{key} {actual[key]} != recorded {recorded[key]}"
    if actual["nonfinite"] != recorded["nonfinite"]:
        return f"{actual['nonfinite']} non-finite values != recorded {recorded['nonfinite']}"
    scale = max(1.0, abs(recorded["abs_sum"]))
    for key in ("sum", "abs_sum"):
        if abs(actual[key] - recorded[key]) > rtol * scale:
            return f"{key} {actual[key]!r} != recorded {recorded[key]!r}"
    return None


def equal_exact(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of values (NaNs equal each other), dtype and shape included."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def max_abs_error(a: Any, b: Any) -> float:
    """Largest absolute difference between two tensors (inf on shape/dtype mismatch)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return 0.0 if equal_exact(a, b) else math.inf
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    a64 = a.detach().cpu().to(torch.float64) if not a.dtype.is_complex else a.detach().cpu().abs().double()
    b64 = b.detach().cpu().to(torch.float64) if not b.dtype.is_complex else b.detach().cpu().abs().double()
    both_nan = a64.isnan() & b64.isnan()
    diff = (a64 - b64).abs()
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    same_inf = (a64 == b64) & a64.isinf()
    diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    m = diff.max()
    return math.inf if m.isnan() else float(m)


def close(actual: Any, expected: Any) -> bool:
    """Within the per-dtype eager tolerance (exact for integer and bool tensors)."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return equal_exact(actual, expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    rtol, atol = tolerance(expected.dtype)
    if rtol == 0 and atol == 0:
        return equal_exact(actual, expected)
    return bool(torch.allclose(actual.detach().cpu(), expected.detach().cpu(), rtol=rtol, atol=atol, equal_nan=True))
