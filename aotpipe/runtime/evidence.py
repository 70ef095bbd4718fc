"""Evidence: what a replay is judged by where bits cannot match.

A replay in the environment that recorded an artefact (manifest.environment: same CPU
capability, torch, intra-op threads, device) must reproduce each output's digest. Elsewhere
the bits of float results legitimately differ (another instruction set or thread count sums
in another order), so each output also keeps a little evidence (records.Evidence):

- a deterministic sample of its values: :data:`SAMPLE` elements at most, element j at
  row-major flat index ``j * numel // count`` (all of them for small outputs);
- statistics of those same elements (sum, absolute sum, largest magnitude, non-finite count),
  so that any figure printed beside a replay's is computed over the same elements;
- an element-wise bound on how far a correct replay's value may be from the recorded one.

The bound comes from the capture's own check of the output (aotpipe.runtime.accuracy): a graph
passes when ``rmse(graph, fp64) <= m * e + floor``, where `e` is eager float32's RMS error
against the float64 eager model and ``floor = rel * rms + 1e-7`` (rel 1e-5 for float32). Two
runs that each satisfy it differ by at most twice that, in RMS (triangle inequality); an
element may stand out from the RMS, and :data:`TAIL` allows for it:

    bound = TAIL * 2 * (m * e + floor)

Where the check measured `e` (the float64 rule ran), that `e`. Where it did not (the output
was within the floor of eager float32, so no float64 run was needed, or the output has no
check of its own: a forward's saved activations), `e` is taken to be the floor itself, the
float-noise level of a tensor of that RMS. Integer and bool outputs have no bound: they
must be equal.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

from aotpipe.runtime import accuracy

# Sampled elements per output: 4 KiB of float32 each. A BERT-base artefact's ~900 outputs
# add about 2 MB to its 440 MB (benchmarks/evidence_bytes.py measures it).
SAMPLE = 1024
# How far beyond the RMS bound one element may go: about the largest of a thousand draws
# of a normal distribution is 3.3 standard deviations.
TAIL = 4.0


def _real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def sample_indices(numel: int, count: Optional[int] = None) -> torch.Tensor:
    """Row-major flat indices of the sampled elements of a tensor of `numel` elements."""
    count = min(numel, SAMPLE) if count is None else count
    return torch.arange(count, dtype=torch.int64) * numel // max(count, 1)


def sample(t: torch.Tensor, count: Optional[int] = None) -> torch.Tensor:
    """The sampled elements of `t` as a 1-D CPU tensor of its dtype (a complex one's real
    view), without copying the rest of it."""
    r = _real(t)
    idx = sample_indices(r.numel(), count)
    if r.dim() == 0:
        return r.reshape(1)[: idx.numel()].cpu().clone()
    where = torch.unravel_index(idx.to(r.device), r.shape)
    return r[where].cpu().clone()


@dataclass(frozen=True)
class SampleStats:
    """Statistics of a sample, as records.Evidence holds them: float64 sums and largest
    magnitude over its finite elements, and how many are not finite."""

    sum: float
    abs_sum: float
    max_abs: float
    nonfinite: int


def stats(s: torch.Tensor) -> SampleStats:
    """sum, abs_sum, max_abs (float64, over the finite elements) and how many are not finite."""
    v = s.double()  # bool too: True is 1.0
    finite = torch.isfinite(v)
    nonfinite = int(v.numel() - int(finite.sum()))
    v = v[finite]
    out = {"sum": float(v.sum()) if v.numel() else 0.0, "abs_sum": float(v.abs().sum()) if v.numel() else 0.0,
           "max_abs": float(v.abs().max()) if v.numel() else 0.0}
    # float64 sums of values near its largest may overflow; JSON has no inf
    return SampleStats(**{k: x if math.isfinite(x) else math.copysign(sys.float_info.max, x) for k, x in out.items()},
                       nonfinite=nonfinite)


def exact_dtype(dtype: torch.dtype) -> bool:
    """Whether values of this dtype must be equal everywhere (integers, bool)."""
    return not (dtype.is_floating_point or dtype.is_complex)


def bound(t: torch.Tensor, eager_error: Optional[float]) -> tuple[Optional[float], Optional[str], Optional[float]]:
    """(element-wise bound, "fp64" or "floor", RMS of t) for output `t`; see the module's docstring."""
    r = _real(t)
    if exact_dtype(r.dtype):
        return None, None, None
    if r.numel() == 0:
        return 0.0, "floor", 0.0
    # One norm pass over the output (it may be a large gradient): a finite sum of squares means
    # every element is finite, so the isfinite pass (a bool tensor as large as the output,
    # slower than the norm) is made only where the norm is not finite (a NaN or inf, or a
    # float64 output whose squares overflow). For a finite output its RMS is the one
    # accuracy.floor would compute again.
    rms = accuracy.finite_rms(r)
    whole = rms is not None
    if rms is None:
        finite = r[torch.isfinite(r)]
        rms = float(torch.linalg.vector_norm(finite, dtype=torch.float64)) / math.sqrt(finite.numel()) \
            if finite.numel() else 0.0
    fl = accuracy.floor(r, rms=rms if whole else None)
    noise, source = (eager_error, "fp64") if eager_error is not None and math.isfinite(eager_error) else (fl, "floor")
    m = accuracy.multiplier(r.dtype, r.numel())
    return TAIL * 2 * (m * noise + fl), source, rms


def record(t: torch.Tensor, eager_error: Optional[float] = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """(the sampled values, the other fields of records.Evidence) of output `t`."""
    s = sample(t)
    b, source, rms = bound(t, eager_error)
    fields = {"count": s.numel(), **asdict(stats(s)), "bound": b, "bound_from": source,
              "eager_error": eager_error if source == "fp64" else None, "rms": rms}
    return s, fields


@dataclass
class Judgement:
    """One output replayed elsewhere, against its evidence."""

    passed: bool
    count: int  # elements compared
    max_abs_error: Optional[float] = None  # element-wise, over the sampled elements
    bound: Optional[float] = None
    detail: Optional[str] = None  # why it failed

    @property
    def share(self) -> Optional[float]:
        """The error as a fraction of the bound."""
        if self.max_abs_error is None or not self.bound:
            return None if self.max_abs_error is None else (0.0 if self.max_abs_error == 0 else math.inf)
        return self.max_abs_error / self.bound


def judge(actual: Any, evidence: Any, values: torch.Tensor, numel: int) -> Judgement:
    """`actual` (a replay's output) against its recorded `evidence` (records.Evidence) and
    sampled `values`; `numel` is the recorded output's element count."""
    if not isinstance(actual, torch.Tensor):
        return Judgement(False, 0, detail=f"{type(actual).__name__}, recorded a tensor")
    r = _real(actual)
    if r.numel() != numel * (2 if actual.is_complex() else 1):
        return Judgement(False, 0, detail=f"{actual.numel()} elements, recorded {numel}")
    now = sample(actual, evidence.count)
    if now.dtype != values.dtype or now.shape != values.shape:
        return Judgement(False, 0, detail=f"sampled {str(now.dtype).removeprefix('torch.')}[{now.numel()}], "
                                          f"recorded {str(values.dtype).removeprefix('torch.')}[{values.numel()}]")
    n = now.numel()
    if exact_dtype(now.dtype):
        differ = int((now != values).sum())
        err = float((now.double() - values.double()).abs().max()) if n else 0.0
        return Judgement(differ == 0, n, err, 0.0, None if differ == 0 else
                         f"{differ} of {n} sampled elements differ (max abs error {err:.3g}); integers must be equal")
    x, y = now.double(), values.double()
    if not (torch.equal(x.isnan(), y.isnan()) and torch.equal(x.isinf(), y.isinf())
            and torch.equal(x[x.isinf()], y[y.isinf()])):
        return Judgement(False, n, math.inf, evidence.bound,
                         "NaN or inf in other places than recorded, among the sampled elements")
    finite = torch.isfinite(y)
    err = float((x[finite] - y[finite]).abs().max()) if bool(finite.any()) else 0.0
    b = evidence.bound if evidence.bound is not None else 0.0
    if err <= b:
        return Judgement(True, n, err, b)
    got = stats(now)
    return Judgement(False, n, err, b, (
        f"max abs error {err:.3g} over {n} sampled elements, over the bound {b:.3g} "
        f"(from {'eager float32' + chr(39) + 's float64 error' if evidence.bound_from == 'fp64' else 'the float-noise floor'}); "
        f"sum of those elements {got.sum:.8g}, recorded {evidence.sum:.8g}"))
