"""Evidence, each decision pinned: the sample, its statistics, the element-wise bound and a
replay's judgement on both sides of it, on small tensors with the answers worked out by hand.

    bound = TAIL * 2 * (m * e + floor),  floor = rel * rms + 1e-7,  TAIL = 4
    e: eager float32's float64 error where measured, else the floor itself
"""

import math
import sys
from types import SimpleNamespace

import pytest
import torch

from aotpipe.runtime import accuracy, evidence
from aotpipe.runtime.evidence import Judgement, SampleStats

INF, NAN = math.inf, math.nan
ABS = 1e-7


def recorded(t, eager_error=None):
    values, fields = evidence.record(t, eager_error)
    return values, SimpleNamespace(**fields)


# ---- the sample ------------------------------------------------------------------------------

def test_sample_indices_are_j_times_numel_over_count():
    assert evidence.sample_indices(10, 4).tolist() == [0, 2, 5, 7]
    assert evidence.sample_indices(3).tolist() == [0, 1, 2]  # small: every element
    assert evidence.sample_indices(0).tolist() == []
    big = evidence.sample_indices(3 * evidence.SAMPLE + 1)
    assert big.numel() == evidence.SAMPLE and big[:3].tolist() == [0, 3, 6] and big.dtype == torch.int64


def test_a_sample_of_a_given_count_whatever_the_layout():
    t = torch.arange(10.0).reshape(5, 2).t()  # row-major: 0 2 4 6 8 1 3 5 7 9
    assert evidence.sample(t, 4).tolist() == [0.0, 4.0, 1.0, 5.0]
    assert evidence.sample(t).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 1.0, 3.0, 5.0, 7.0, 9.0]


def test_a_sample_of_a_scalar_and_of_a_complex_value():
    assert evidence.sample(torch.tensor(2.5)).tolist() == [2.5]
    assert evidence.sample(torch.tensor(2.5), 0).tolist() == []
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    s = evidence.sample(z.conj())
    assert s.dtype == torch.float32 and s.tolist() == [1.0, -2.0, 3.0, 4.0]


# ---- statistics ------------------------------------------------------------------------------

def test_statistics_are_over_the_finite_elements_and_count_the_others():
    s = torch.tensor([1.5, -4.0, INF, NAN, -INF, 2.0])
    assert evidence.stats(s) == SampleStats(sum=-0.5, abs_sum=7.5, max_abs=4.0, nonfinite=3)
    assert evidence.stats(torch.tensor([INF, NAN])) == SampleStats(0.0, 0.0, 0.0, 2)
    assert evidence.stats(torch.ones(0)) == SampleStats(0.0, 0.0, 0.0, 0)
    assert evidence.stats(torch.tensor([True, False, True])) == SampleStats(2.0, 2.0, 1.0, 0)
    assert evidence.stats(torch.tensor([-3, 2])) == SampleStats(-1.0, 5.0, 3.0, 0)


def test_statistics_that_overflow_float64_are_kept_finite_with_their_sign():
    big = sys.float_info.max
    assert evidence.stats(torch.tensor([-big, -big], dtype=torch.float64)) == SampleStats(
        sum=-big, abs_sum=big, max_abs=big, nonfinite=0)
    assert evidence.stats(torch.tensor([big, big], dtype=torch.float64)).sum == big


# ---- the bound -------------------------------------------------------------------------------

@pytest.mark.parametrize("numel,m", [(10, 10), (11, 8), (500, 8), (501, 2)])
def test_the_bound_takes_the_small_tensor_multiplier(numel, m):
    t = torch.full((numel,), 2.0)
    fl = 1e-5 * 2.0 + ABS
    b, source, rms = evidence.bound(t, None)
    assert (source, rms) == ("floor", 2.0) and b == pytest.approx(4 * 2 * (m * fl + fl), rel=1e-12)
    b, source, _ = evidence.bound(t, 1e-3)
    assert source == "fp64" and b == pytest.approx(4 * 2 * (m * 1e-3 + fl), rel=1e-12)


def test_the_bound_of_a_half_type_uses_its_own_floor_and_multiplier():
    t = torch.full((1000,), 2.0, dtype=torch.float16)
    fl = 1e-3 * 2.0 + ABS
    assert evidence.bound(t, None)[0] == pytest.approx(4 * 2 * (3 * fl + fl), rel=1e-12)


@pytest.mark.parametrize("eager_error", [INF, NAN, None])
def test_without_a_finite_measured_error_the_bound_is_the_floors(eager_error):
    t = torch.full((1000,), 2.0)
    fl = 1e-5 * 2.0 + ABS
    values, f = recorded(t, eager_error)
    assert (f.bound_from, f.eager_error, f.rms) == ("floor", None, 2.0)
    assert f.bound == pytest.approx(4 * 2 * (2 * fl + fl), rel=1e-12)


def test_a_measured_error_is_recorded_with_the_bound_it_gave():
    t = torch.tensor([3.0, -4.0, 0.0, 0.0])
    values, f = recorded(t, 1e-3)
    rms = 2.5
    fl = 1e-5 * rms + ABS
    assert values.tolist() == [3.0, -4.0, 0.0, 0.0]
    assert vars(f) == {"count": 4, "sum": -1.0, "abs_sum": 7.0, "max_abs": 4.0, "nonfinite": 0,
                       "bound": pytest.approx(4 * 2 * (10 * 1e-3 + fl), rel=1e-12), "bound_from": "fp64",
                       "eager_error": 1e-3, "rms": rms}


def test_the_rms_and_floor_of_an_output_with_infinities_are_of_its_finite_elements():
    t = torch.tensor([3.0, INF, -4.0, NAN] + [0.0] * 1000)
    b, source, rms = evidence.bound(t, None)
    assert rms == pytest.approx(5 / math.sqrt(1002), rel=1e-12)
    fl = 1e-5 * rms + ABS
    assert b == pytest.approx(4 * 2 * (2 * fl + fl), rel=1e-12)
    b, source, rms = evidence.bound(torch.tensor([INF, NAN]), None)
    assert rms == 0.0 and b == pytest.approx(4 * 2 * (10 * ABS + ABS), rel=1e-12)


def test_a_large_strided_outputs_rms_and_bound_are_those_the_accuracy_rule_computes_of_it():
    # 262144 elements in a transposed layout, where the order of a float64 sum of squares
    # (memory order, or row-major in a copy) shows in the last bits: the record's RMS is the
    # rule's own (accuracy._rms of the output as it is) and the bound is made from it
    t = torch.randn(64, 64, 64, generator=torch.Generator().manual_seed(0)).transpose(0, 2) * 3.7
    fl, m = accuracy.floor(t), accuracy.multiplier(t.dtype, t.numel())
    assert evidence.bound(t, None) == (evidence.TAIL * 2 * (m * fl + fl), "floor", accuracy._rms(t))


def test_an_empty_output_has_a_zero_bound_and_integers_none():
    assert evidence.bound(torch.ones(0, 3), None) == (0.0, "floor", 0.0)
    assert evidence.bound(torch.ones(0, dtype=torch.complex64), 1.0) == (0.0, "floor", 0.0)
    for t in (torch.arange(4), torch.tensor([True]), torch.ones(0, dtype=torch.int32)):
        assert evidence.bound(t, 1.0) == (None, None, None)
        values, f = recorded(t, 1.0)
        assert (f.bound, f.bound_from, f.eager_error, f.rms) == (None, None, None, None)


def test_a_complex_outputs_bound_is_its_real_views():
    z = torch.full((3,), 3 + 4j, dtype=torch.complex64)  # real view: six elements, rms sqrt(12.5)
    rms = math.sqrt(12.5)
    fl = 1e-5 * rms + ABS
    b, source, got = evidence.bound(z, None)
    assert got == pytest.approx(rms, rel=1e-12) and b == pytest.approx(4 * 2 * (10 * fl + fl), rel=1e-12)


# ---- judging a replay ------------------------------------------------------------------------

def test_a_replay_that_is_not_a_tensor_or_has_another_size_fails():
    t = torch.arange(4.0)
    values, f = recorded(t)
    assert evidence.judge(3, f, values, 4) == Judgement(False, 0, detail="int, recorded a tensor")
    assert evidence.judge(None, f, values, 4) == Judgement(False, 0, detail="NoneType, recorded a tensor")
    assert evidence.judge(torch.arange(5.0), f, values, 4) == Judgement(False, 0, detail="5 elements, recorded 4")
    assert evidence.judge(t.double(), f, values, 4) == Judgement(
        False, 0, detail="sampled float64[4], recorded float32[4]")
    assert evidence.judge(t.reshape(2, 2), f, values, 4).passed  # the sample is row-major, shape aside


def test_a_complex_replay_is_judged_on_its_real_view():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    values, f = recorded(z)
    assert values.numel() == 4 and evidence.judge(z.clone(), f, values, 2) == Judgement(True, 4, 0.0, f.bound)
    assert evidence.judge(torch.tensor([1 + 2j], dtype=torch.complex64), f, values, 2) == Judgement(
        False, 0, detail="1 elements, recorded 2")
    assert not evidence.judge(z + 1j, f, values, 2).passed


def test_integers_must_be_equal_with_the_count_and_largest_difference():
    t = torch.tensor([5, -2, 7, 0])
    values, f = recorded(t)
    assert evidence.judge(t.clone(), f, values, 4) == Judgement(True, 4, 0.0, 0.0)
    other = torch.tensor([5, 1, 7, -1])
    assert evidence.judge(other, f, values, 4) == Judgement(
        False, 4, 3.0, 0.0, "2 of 4 sampled elements differ (max abs error 3); integers must be equal")
    empty = torch.ones(0, dtype=torch.int64)
    values, f = recorded(empty)
    assert evidence.judge(empty.clone(), f, values, 0) == Judgement(True, 0, 0.0, 0.0)


def test_bools_must_be_equal():
    t = torch.tensor([True, False])
    values, f = recorded(t)
    assert evidence.judge(torch.tensor([True, True]), f, values, 2) == Judgement(
        False, 2, 1.0, 0.0, "1 of 2 sampled elements differ (max abs error 1); integers must be equal")


@pytest.mark.parametrize("now", [[-INF, 1.0, 2.0], [INF, 1.0, INF], [NAN, 1.0, 2.0], [1.0, 1.0, 2.0], [INF, NAN, 2.0]])
def test_nan_and_inf_must_stay_in_place_with_their_sign(now):
    t = torch.tensor([INF, 1.0, 2.0])
    values, f = recorded(t)
    assert evidence.judge(torch.tensor(now), f, values, 3) == Judgement(
        False, 3, INF, f.bound, "NaN or inf in other places than recorded, among the sampled elements")


def test_nan_and_inf_in_place_pass_and_the_finite_rest_is_judged():
    t = torch.tensor([INF, -INF, NAN, 2.0])
    values, f = recorded(t)
    assert evidence.judge(t.clone(), f, values, 4) == Judgement(True, 4, 0.0, f.bound)
    nothing_finite = torch.tensor([-INF, NAN])
    values, g = recorded(nothing_finite)
    assert evidence.judge(nothing_finite.clone(), g, values, 2) == Judgement(True, 2, 0.0, g.bound)


def _ev(values, bound, bound_from="floor"):
    s = evidence.stats(values)
    return SimpleNamespace(count=values.numel(), sum=s.sum, abs_sum=s.abs_sum, bound=bound, bound_from=bound_from)


@pytest.mark.parametrize("bound_from,source", [("fp64", "eager float32's float64 error"),
                                               ("floor", "the float-noise floor")])
def test_an_error_on_the_bound_passes_and_just_over_it_fails_saying_where_the_bound_came_from(bound_from, source):
    values = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    ev = _ev(values, 0.5, bound_from)
    on = values.clone()
    on[2] += 0.5
    assert evidence.judge(on, ev, values, 4) == Judgement(True, 4, 0.5, 0.5)
    over = values.clone()
    over[2] = math.nextafter(4.5, INF)
    err = over[2].item() - 4.0
    assert evidence.judge(over, ev, values, 4) == Judgement(False, 4, err, 0.5, (
        f"max abs error {err:.3g} over 4 sampled elements, over the bound 0.5 (from {source}); "
        f"sum of those elements {15.5 + err - 0.5:.8g}, recorded 15"))


def test_a_float_output_with_no_bound_recorded_must_match_exactly():
    values = torch.tensor([1.0, 2.0])
    ev = _ev(values, None)
    assert evidence.judge(values.clone(), ev, values, 2) == Judgement(True, 2, 0.0, 0.0)
    off = torch.nextafter(values, torch.full_like(values, 3.0))  # one float32 ulp up
    assert not evidence.judge(off, ev, values, 2).passed


def test_only_the_recorded_count_of_elements_is_sampled():
    t = torch.arange(10.0)
    values = t[evidence.sample_indices(10, 4)]
    ev = _ev(values, 0.0)
    later = t.clone()
    later[1] = 100.0  # not among the four sampled elements (0, 2, 5, 7)
    assert evidence.judge(later, ev, values, 10) == Judgement(True, 4, 0.0, 0.0)


def test_the_share_of_the_bound():
    assert Judgement(True, 4, 0.25, 0.5).share == 0.5
    assert Judgement(True, 4, 0.0, 0.0).share == 0.0
    assert Judgement(False, 4, 0.25, 0.0).share == INF
    assert Judgement(False, 0).share is None
