"""Comparing values: exactly (digests), or against eager the way torch's accuracy runners do.

The tolerant rule follows ``torch._dynamo.utils.same`` with an fp64 reference, as the dynamo
benchmark runners use it. The eager model run in float64 is the reference; a graph's output
passes when its error against that reference is within a small multiple of eager float32's
own error against it, plus a floor:

    rmse(graph, fp64) <= multiplier * rmse(eager32, fp64) + floor
    floor = rel_floor * rms(eager32) + abs_floor

Errors are root-mean-square over the tensor, so they scale with it, not one element-wise
atol. The fp64 run is only made when needed: if ``rmse(graph, eager32) <= floor`` the rule
holds already (triangle inequality: rmse(graph, fp64) <= rmse(graph, eager32) +
rmse(eager32, fp64) <= floor + rmse(eager32, fp64)), so most outputs never need it.
Integer and bool outputs, shapes, dtypes and the places of NaN and inf must match exactly.

A value that is zero in exact arithmetic (its float64 value no larger than eager float32's
error: eager has no correct digit) is held to the same form of bound, with a multiplier of
:data:`NOISE_MULTIPLIER`: the graph's value must lie within eager's own noise of the float64
value, so no value passes whatever it is. The training loss is weighted (eager.model_loss)
so that no gradient is zero merely because of the loss; some still are (a bias before a
batch norm), and those are checked so.

Eager's error is one draw of rounding noise; where a value is small next to it, one draw can
be small by chance. A check that fails the rule takes further samples (eager float32 on inputs
and weights nudged by one ulp, :data:`NOISE_SAMPLES` in all) and uses the largest error
(:func:`eager_error`); :func:`fp64_bound` is the bound for a given eager error.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import torch

from aotpipe.format.records import CheckItem, Summary

# Per dtype: (multiplier, relative floor). torch's runners use 2.0 for float32 and 3.0 for
# half types; the floor is about 100 float32 ulps of the tensor's RMS.
_RULES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (2.0, 1e-10),
    torch.float32: (2.0, 1e-5),
    torch.float16: (3.0, 1e-3),
    torch.bfloat16: (3.0, 1e-2),
}
ABS_FLOOR = 1e-7


def multiplier(dtype: torch.dtype, numel: int) -> float:
    """The allowed multiple of eager's own error; larger for small tensors, whose RMSE is noisy."""
    base = _RULES.get(dtype, (2.0, 1e-5))[0]
    if numel <= 10:
        return max(base, 10.0)
    if numel <= 500:
        return max(base, 8.0)
    return base


def floor(expected: torch.Tensor, rel_floor: float | None = None, rms: float | None = None) -> float:
    """Errors below this are float noise whatever the reference says. `rms`: the RMS of
    `expected` (:func:`_norm`) where the caller has it already: a pass over it saved."""
    rel = _RULES.get(expected.dtype, (2.0, 1e-5))[1] if rel_floor is None else rel_floor
    return rel * (_rms(expected) if rms is None else rms) + ABS_FLOOR


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and row-major element bytes: equal iff bit-identical."""
    d = t.detach().to("cpu")
    h = hashlib.sha256(f"{str(d.dtype).removeprefix('torch.')}{list(d.shape)}".encode())
    if d.numel():
        h.update(_dense_flat(d).view(torch.uint8).numpy().data)
    return h.hexdigest()


def digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """:func:`digest` of each tensor, in order, hashed on as many threads as torch's intra-op
    count: hashlib releases the GIL while it hashes a large buffer, so n cores hash n outputs
    at once (1.9x on 2 cores, 40 outputs of 12.6 MB)."""
    workers = min(len(tensors), torch.get_num_threads())
    if workers <= 1:
        return [digest(t) for t in tensors]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(digest, tensors))


def _dense_flat(d: torch.Tensor) -> torch.Tensor:
    """The elements of CPU tensor `d` in row-major order as a 1-D tensor of stride 1: a view
    where `d` is laid out so (most outputs: hashing them is then a pass over their memory, not
    a copy and a pass), else a fresh dense copy. Not .contiguous() alone: torch calls a tensor
    contiguous when only its size-1 dimensions have odd strides (x[:, -1:] of a batch of 1, a
    one-element slice with a step) and returns it as it is, so the flattened view's stride is
    checked too; a conjugate or negative bit is resolved by the copy."""
    if d.is_contiguous() and not (d.is_conj() or d.is_neg()):
        flat = d.reshape(-1)
        if flat.stride() == (1,):
            return flat
    return torch.empty(d.numel(), dtype=d.dtype).copy_(d.reshape(-1))


def _f64(t: torch.Tensor) -> torch.Tensor:
    d = t.detach().to("cpu")
    return torch.view_as_real(d.resolve_conj()).double() if d.is_complex() else d.double()


def _norm(t: torch.Tensor) -> float:
    """RMS of `t`, accumulated in float64 without a float64 copy of a finite tensor."""
    d = t.detach().to("cpu")
    if d.is_complex():
        d = torch.view_as_real(d.resolve_conj())
    if not d.numel():
        return 0.0
    rms = finite_rms(d)
    if rms is not None:
        return rms
    v = d.double()
    v = v[torch.isfinite(v)]
    return float(v.pow(2).mean().sqrt()) if v.numel() else 0.0


def finite_rms(d: torch.Tensor) -> float | None:
    """RMS of real CPU tensor `d` (not empty) in one pass (accumulated in float64), where every element is finite;
    None where one is not, or the sum of squares overflows float64 (then an element is NaN
    or inf, or the values are float64 near its largest). A NaN or inf element makes the norm
    NaN or inf, so a finite norm is the norm of finite elements: no isfinite pass needed."""
    norm = float(torch.linalg.vector_norm(d, dtype=torch.float64))
    return norm / math.sqrt(d.numel()) if math.isfinite(norm) else None


def _rms(t: torch.Tensor) -> float:
    return _norm(t)


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root-mean-square difference over the elements finite in both."""
    same = _same_dtype_rmse(a, b)
    return same if same is not None else _f64_rmse(a, b)


def _f64_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """rmse's float64 form: over the elements finite in both."""
    x, y = _f64(a), _f64(b)
    ok = torch.isfinite(x) & torch.isfinite(y)
    if not bool(ok.any()):
        return 0.0
    return float((x[ok] - y[ok]).pow(2).mean().sqrt())


def _same_dtype_rmse(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """rmse of two floating tensors of one dtype from their difference in that dtype (exact
    where they are close: Sterbenz), in two passes; None where a difference is not finite (a
    NaN or inf in either, or one that overflows) or they are not such a pair: rmse's float64
    form decides."""
    if not (a.dtype == b.dtype and a.is_floating_point()):
        return None
    d = a.detach().cpu() - b.detach().cpu()
    return finite_rms(d) if d.numel() else 0.0


def max_abs_error(a: Any, b: Any) -> float:
    """Largest absolute difference between two tensors (inf on a shape mismatch)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return 0.0 if exact_equal(a, b) else math.inf
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    x, y = _f64(a), _f64(b)
    same = (x == y) | (x.isnan() & y.isnan())
    diff = torch.where(same, torch.zeros_like(x), (x - y).abs())
    m = diff.max()
    return math.inf if m.isnan() else float(m)


def exact_equal(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of values (NaNs equal each other), dtype and shape included."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        # a complex NaN is NaN in either part: compare the parts, or (nan+1j) equals (nan+2j)
        a, b = _real_view(a.detach().cpu()), _real_view(b.detach().cpu())
        if a.dtype.is_floating_point:
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False  # a tensor against a number or None (`a == b` would give a tensor, or raise)
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _nonfinite_differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    if bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
        return False
    x, y = _f64(a), _f64(b)
    return not (torch.equal(x.isnan(), y.isnan()) and torch.equal(x.isinf(), y.isinf())
                and torch.equal(x[x.isinf()], y[y.isinf()]))


@dataclass
class Check:
    """One value compared with its expected value: how, and how far off."""

    what: str
    passed: bool
    method: str  # exact | floor | fp64 | none (None against None)
    error: float | None = None  # the graph's RMSE against the reference used
    eager_error: float | None = None  # eager float32's RMSE against the fp64 reference
    bound: float | None = None  # the largest error that passes
    detail: str | None = None  # why it failed or was skipped

    @property
    def ratio(self) -> float | None:
        """The graph's error as a multiple of eager's own (fp64 checks only)."""
        if self.error is None or not self.eager_error:
            return None
        return self.error / self.eager_error

    def item(self) -> CheckItem:
        """The manifest's record of this check, its figures to 4 significant digits."""
        def num(x: float | None) -> float | None:
            return None if x is None else float(f"{x:.4g}")  # inf and nan print and read back as themselves

        return CheckItem(what=self.what, passed=self.passed, method=self.method, error=num(self.error),
                         eager_error=num(self.eager_error), ratio=num(self.ratio), bound=num(self.bound),
                         detail=self.detail)

    def line(self) -> str:
        """One line for people: what, verdict and the figures behind it."""
        if self.detail and not self.passed:
            return f"{self.what}: {self.detail}"
        if self.method == "fp64":
            return (f"{self.what}: error {self.error:.3g} vs eager float32's {self.eager_error:.3g} "
                    f"against float64 (bound {self.bound:.3g})")
        return f"{self.what}: {self.method}"


Reference = Union[None, torch.Tensor, Callable[[], torch.Tensor | None]]

# The allowed multiple of eager's error where that error is all there is (the float64 value
# is no larger): rounding noise of another operation order is another draw, measured here up
# to about 6x eager's on a LayerNorm-cancelled gradient; garbage is orders of magnitude more.
NOISE_MULTIPLIER = 10.0

# Why a passing fp64 check's reference has no correct digit in eager float32 (Check.detail).
WITHIN_NOISE = ("zero in exact arithmetic: its float64 value is no larger than eager float32's error; the graph's "
                "value lies within eager's own noise of it")


def within_noise(check: "Check") -> bool:
    """Whether a passing fp64 check's reference had no correct digit in eager float32."""
    return check.method == "fp64" and check.passed and (check.detail or "").startswith(WITHIN_NOISE)


# How many samples of eager float32's rounding noise a check may take (the first, then further
# ones only while the float64 rule fails): a value small next to float noise is a ratio of two
# noise draws, heavy-tailed: one draw of eager's is below a tenth of another's about 1 time in 20.
# Measured on 1000 seeds of tests/test_accuracy.py's depthwise-convolution scale gradient (eager's
# batch norm against its decomposition): 52 fail with one sample, 8 with two, 1 with three, 0
# with four.
NOISE_SAMPLES = 4

# Why eager float32's error was taken from more than one sample (appended to a passing check's detail).
MORE_SAMPLES = ("eager float32's error is the largest of {n} samples: the others ran on inputs, parameters and "
                "buffers nudged by one ulp")


def eager_error(expected: torch.Tensor, reference: torch.Tensor, *samples: torch.Tensor | None) -> float:
    """Eager float32's own error against the float64 `reference`: the largest RMSE of `expected`
    and of the other float32 `samples` of the same value (None and mismatched ones left out).

    One sample of rounding noise can be small by chance (a value zero in exact arithmetic is
    a ratio of two noise draws, heavy-tailed); the largest of two is a steadier scale."""
    errors = [rmse(expected, reference)]
    errors += [rmse(s, reference) for s in samples if isinstance(s, torch.Tensor) and s.shape == expected.shape
               and s.dtype == expected.dtype and not _nonfinite_differs(s, expected)]
    return max(errors)


def fp64_bound(expected: torch.Tensor, reference: torch.Tensor, error: float,
               rel_floor: float | None = None, computed_in: torch.dtype | None = None
               ) -> tuple[float, float, bool]:
    """(bound, multiplier, within_noise): the largest RMSE against the float64 `reference` a value
    of `expected`'s dtype and size may have, given eager float32's own `error` (eager_error).
    within_noise: the reference is no larger than eager's error (zero in exact arithmetic), so
    the multiplier is at least NOISE_MULTIPLIER. `computed_in`: the dtype the value was computed
    in where lower than its own (mixed precision: a float32 value from bfloat16 math), whose
    multiplier applies (torch's runners: 3.0 for half types); the floor stays its own dtype's."""
    noise = _rms(reference) <= error  # eager has no correct digit: the value must lie within its noise
    m = multiplier(computed_in or expected.dtype, expected.numel())
    if noise:
        m = max(NOISE_MULTIPLIER, m)
    return m * error + floor(expected, rel_floor), m, noise


def compare(actual: Any, expected: Any, reference: Reference = None, *, what: str = "value",
            rel_floor: float | None = None, samples: Sequence[Reference] = (),
            computed_in: torch.dtype | None = None) -> Check:
    """Compare a graph's value with eager float32's (`expected`) under the rule above.

    `reference` is the fp64 value, or a callable giving it (called only when the floor does
    not settle the question), or None when there is none: then the floor alone decides.
    `samples`: other eager float32 values of the same quantity (or callables giving them), taken
    in order only while the float64 rule fails, at most NOISE_SAMPLES in all with `expected`;
    eager's error is then the largest of those taken (eager_error). `computed_in`: fp64_bound's.
    """
    if actual is None or expected is None:
        if actual is None and expected is None:
            return Check(what, True, "none")
        have = "None" if actual is None else "a value"
        want = "None" if expected is None else "a value"
        return Check(what, False, "none", detail=f"the graph gives {have}, eager gives {want}")
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        ok = exact_equal(actual, expected)
        return Check(what, ok, "exact", detail=None if ok else f"{actual!r} != eager's {expected!r}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Check(what, False, "exact", detail=f"{str(actual.dtype).removeprefix('torch.')}{list(actual.shape)} "
                                                  f"!= eager's {str(expected.dtype).removeprefix('torch.')}"
                                                  f"{list(expected.shape)}")
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        ok = exact_equal(actual, expected)
        return Check(what, ok, "exact", detail=None if ok else
                     f"{int((actual.cpu() != expected.cpu()).sum())} of {expected.numel()} elements differ")
    if expected.numel() == 0:
        return Check(what, True, "exact")
    if expected.dtype.is_complex:
        # judged as its real view: the pairs (real, imaginary) under the rule of their real
        # dtype (complex64: float32's), against the complex128 reference's pairs
        return compare(_real_view(actual), _real_view(expected), _lazy(_real_view, reference), what=what,
                       rel_floor=rel_floor, samples=[_lazy(_real_view, s) for s in samples], computed_in=computed_in)
    # Every difference finite: both are finite throughout, so nothing non-finite differs
    # (two passes instead of the isfinite passes over both and the difference).
    d = _same_dtype_rmse(actual, expected)
    if d is None:
        if _nonfinite_differs(actual, expected):
            return Check(what, False, "exact", detail="NaN or inf in other places than eager's")
        d = _f64_rmse(actual, expected)
    fl = floor(expected, rel_floor)
    if d <= fl:
        return Check(what, True, "floor", error=d, bound=fl)
    ref = reference() if callable(reference) else reference
    if ref is None:
        return Check(what, False, "floor", error=d, bound=fl,
                     detail=f"RMS error {d:.3g} against eager float32, over the float-noise floor {fl:.3g} "
                            f"(max abs error {max_abs_error(actual, expected):.3g})")
    e = eager_error(expected, ref)
    r = rmse(actual, ref)
    bound, m, noise = fp64_bound(expected, ref, e, rel_floor, computed_in)
    taken = 1
    for sample in list(samples)[:NOISE_SAMPLES - 1]:
        if r <= bound:
            break
        taken += 1
        e = max(e, eager_error(expected, ref, sample() if callable(sample) else sample))
        bound, m, noise = fp64_bound(expected, ref, e, rel_floor, computed_in)
    ok = r <= bound
    more = MORE_SAMPLES.format(n=taken) if taken > 1 else None
    why = "; ".join(x for x in (WITHIN_NOISE if noise else None, more) if x)
    return Check(what, ok, "fp64", error=r, eager_error=e, bound=bound, detail=(why or None) if ok else (
        f"RMS error {r:.3g} against the float64 eager model, over {bound:.3g} "
        f"({m:g}x eager float32's own {e:.3g} plus the floor"
        + (f", the largest of {taken} samples" if taken > 1 else "") + ")"))


def _real_view(t: Any) -> Any:
    """``torch.view_as_real`` of a complex tensor (its conjugate bit resolved); anything else as it is."""
    return torch.view_as_real(t.detach().resolve_conj()) if isinstance(t, torch.Tensor) and t.is_complex() else t


def _lazy(f: Callable[[Any], Any], value: Reference) -> Reference:
    """`value` (or what the callable `value` gives, when asked) passed through `f`."""
    return (lambda: f(value())) if callable(value) else f(value)


def summary(t: Any) -> Summary | None:
    """A small fingerprint of a value: layout, float64 sum and absolute sum of finite elements."""
    if not isinstance(t, torch.Tensor):
        return None
    return _summary(t, _f64(t))


def _summary(t: torch.Tensor, v: torch.Tensor) -> Summary:
    """`t`'s layout and the sums of `v` (t in float64, or a sample of it)."""
    finite = torch.isfinite(v)
    nonfinite = v.numel() - int(finite.sum())
    if nonfinite:
        v = v.where(finite, 0.0)
    # Not validated here: a trace is, as a whole, when it is written (records.check_written);
    # a replay or a pass check of a graph with a dtype the format cannot name still compares.
    return Summary.model_construct(shape=list(t.shape), stride=list(t.stride()),
                                   dtype=str(t.dtype).removeprefix("torch."), sum=float(v.sum()),
                                   abs_sum=float(v.abs().sum()), nonfinite=nonfinite)


SAMPLE = 4096


def sampled_summary(t: Any) -> Summary | None:
    """Like :func:`summary`, over at most about :data:`SAMPLE` elements: a strided view that
    keeps every k-th index of the largest dimensions, so nothing is copied but the sample;
    cheap enough to take at every node of a real-size graph."""
    sample = sampled(t)
    return None if sample is None else _summary(t, _f64(sample))


def sampled(t: Any) -> torch.Tensor | None:
    """The elements :func:`sampled_summary` sums: a strided view of `t` (None: not a tensor
    with values)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    sample = t.detach()
    steps = [1] * sample.dim()
    sizes = list(sample.shape)
    while sample.dim() and _prod(sizes) > SAMPLE:
        k = max(range(len(sizes)), key=lambda d: sizes[d])
        steps[k] *= 2
        sizes[k] = -(-sample.shape[k] // steps[k])
    if any(st > 1 for st in steps):
        sample = sample[tuple(slice(None, None, st) for st in steps)]
    return sample


def _prod(xs: list[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def summary_departs(actual: Summary, recorded: Summary, rtol: float,
                    layout: tuple[str, ...] = ("dtype", "shape", "stride")) -> str | None:
    """How `actual` summary departs from a `recorded` one, or None if they agree within `rtol`
    (of the recorded absolute sum). The reason's first word is the field that departs.
    `layout`: the layout fields compared (a diff of two graphs leaves strides out)."""
    for key in layout:
        if getattr(actual, key) != getattr(recorded, key):
            return f"{key} {getattr(actual, key)} != recorded {getattr(recorded, key)}"
    if actual.nonfinite != recorded.nonfinite:
        return f"{actual.nonfinite} non-finite values != recorded {recorded.nonfinite}"
    scale = max(1.0, abs(recorded.abs_sum))
    for key in ("sum", "abs_sum"):
        if abs(getattr(actual, key) - getattr(recorded, key)) > rtol * scale:
            return f"{key} {getattr(actual, key)!r} != recorded {getattr(recorded, key)!r}"
    return None
