"""Evidence: the sampled values, statistics and element-wise bound replays elsewhere are judged by."""

import math
from types import SimpleNamespace

import torch

from aotpipe.runtime import accuracy, evidence


def fields(t, eager_error=None):
    values, f = evidence.record(t, eager_error)
    return values, SimpleNamespace(**f)


def test_sample_is_every_kth_element_in_row_major_order_whatever_the_layout():
    t = torch.randn(64, 48)
    idx = evidence.sample_indices(t.numel())
    assert idx.numel() == evidence.SAMPLE and idx[1] == t.numel() // evidence.SAMPLE
    assert torch.equal(evidence.sample(t), t.reshape(-1)[idx])
    assert torch.equal(evidence.sample(t.t().contiguous().t()), evidence.sample(t))  # strides do not matter
    small = torch.randn(5, 7)
    assert torch.equal(evidence.sample(small), small.reshape(-1))  # small outputs: every element


def test_statistics_are_of_the_sampled_elements():
    t = torch.randn(300, 300)
    values, f = fields(t)
    assert f.count == evidence.SAMPLE
    assert f.sum == float(values.double().sum()) and f.abs_sum == float(values.double().abs().sum())
    assert f.sum != float(t.double().sum())


def test_bound_uses_eagers_float64_error_where_measured_else_the_floor():
    t = torch.randn(1000)
    fl, m = accuracy.floor(t), accuracy.multiplier(t.dtype, t.numel())
    _, measured = fields(t, eager_error=1e-4)
    assert measured.bound_from == "fp64" and math.isclose(measured.bound, evidence.TAIL * 2 * (m * 1e-4 + fl))
    _, floor = fields(t)
    assert floor.bound_from == "floor" and math.isclose(floor.bound, evidence.TAIL * 2 * (m * fl + fl))
    _, ints = fields(torch.arange(10))
    assert ints.bound is None


def test_bound_and_rms_are_bit_for_bit_those_of_the_floor_and_norm_computed_apart():
    # bound() takes one norm pass (and an isfinite pass only where the norm is not finite) and hands its RMS to accuracy.floor; the artefact's bytes must be those of
    # computing each apart (finite or not, real or complex, float64 whose squares overflow).
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(257, 31, generator=g) * 3.7, torch.randn(5, generator=g, dtype=torch.float64),
             torch.randn(40, 40, generator=g).t(), torch.randn(64, generator=g, dtype=torch.complex64),
             torch.randn(1000, generator=g).to(torch.bfloat16)]
    odd = torch.randn(999, generator=torch.Generator().manual_seed(0)) * 3.7  # the two RMS formulas differ here
    odd[[3, 500]] = float("inf")
    odd[7] = float("nan")
    cases.append(odd)
    cases.append(torch.tensor([1e200, -3.0, 1e200], dtype=torch.float64))  # finite, its squares' sum is not
    cases.append(torch.tensor([1.0, float("inf"), 2.0], dtype=torch.float64))
    for t in cases:
        r = torch.view_as_real(t) if t.is_complex() else t
        finite = r[torch.isfinite(r)]
        rms = float(torch.linalg.vector_norm(finite, dtype=torch.float64)) / math.sqrt(finite.numel())
        fl = accuracy.floor(r)  # its own pass: float64 mean of squares where some are not finite
        m = accuracy.multiplier(r.dtype, r.numel())
        b, source, got_rms = evidence.bound(t, None)
        assert (b, source, got_rms) == (evidence.TAIL * 2 * (m * fl + fl), "floor", rms), t.dtype


def test_an_output_with_no_finite_element_has_rms_zero():
    b, source, rms = evidence.bound(torch.tensor([float("nan"), float("inf"), -float("inf")]), None)
    fl = accuracy.ABS_FLOOR  # no finite element: the floor is the absolute one
    assert (rms, source) == (0.0, "floor") and b == evidence.TAIL * 2 * (accuracy.multiplier(torch.float32, 3) * fl + fl)


def test_the_isfinite_pass_is_made_only_where_the_norm_is_not_finite(monkeypatch):
    calls = []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t.shape) or isfinite(t))
    evidence.bound(torch.randn(100, 10), None)
    assert calls == []  # a finite norm: every element is finite, no bool tensor as large as the output
    odd = torch.randn(100, 10)
    odd[3, 4] = float("nan")
    _, _, rms = evidence.bound(odd, None)
    assert calls[:1] == [torch.Size([100, 10])] and math.isfinite(rms)  # (then floor's own pass over it)


def test_a_finite_output_s_bound_takes_one_norm_pass_and_the_floor_none(monkeypatch):
    """bound() hands its RMS to accuracy.floor where every element is finite: one pass over a
    (maybe large) output; with a NaN, the floor computes its own over the finite elements."""
    calls = []
    norm = torch.linalg.vector_norm
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda t, *a, **k: calls.append(t.shape) or norm(t, *a, **k))
    evidence.bound(torch.randn(100, 10), None)
    assert calls == [torch.Size([100, 10])]
    odd = torch.randn(100, 10)
    odd[3, 4] = float("nan")
    calls.clear()
    evidence.bound(odd, None)
    assert calls == [torch.Size([100, 10]), torch.Size([999]), torch.Size([100, 10])]  # whole, finite, the floor's


def test_an_element_beyond_the_bound_fails_with_its_elementwise_error():
    t = torch.randn(200, 100)
    values, f = fields(t)
    near = t.clone()
    near.view(-1)[evidence.sample_indices(t.numel())[7]] += f.bound / 2
    ok = evidence.judge(near, f, values, t.numel())
    assert ok.passed and math.isclose(ok.max_abs_error, f.bound / 2, rel_tol=1e-3)
    far = t.clone()
    far.view(-1)[evidence.sample_indices(t.numel())[7]] += 0.25
    bad = evidence.judge(far, f, values, t.numel())
    assert not bad.passed and math.isclose(bad.max_abs_error, 0.25, rel_tol=1e-5)
    assert f"max abs error {bad.max_abs_error:.3g} over {evidence.SAMPLE} sampled elements" in bad.detail
    assert f"recorded {f.sum:.8g}" in bad.detail  # the sum of the same elements


def test_integers_must_be_equal_and_nans_stay_in_place():
    t = torch.arange(50)
    values, f = fields(t)
    other = t.clone()
    other[3] += 1
    j = evidence.judge(other, f, values, t.numel())
    assert not j.passed and "1 of 50 sampled elements differ" in j.detail
    x = torch.randn(20)
    x[4] = float("nan")
    values, f = fields(x)
    assert evidence.judge(x.clone(), f, values, 20).passed
    moved = x.clone()
    moved[4], moved[5] = 0.0, float("nan")
    assert "NaN or inf in other places" in evidence.judge(moved, f, values, 20).detail
