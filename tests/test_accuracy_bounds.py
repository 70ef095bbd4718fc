"""The accuracy rule's bounds, each pinned just inside and just outside, on hand-built values.

Every case is made of constants that float32 and float64 hold exactly (sums of powers of two),
so the figures the rule works with (eager's error, the graph's error, the floor, the bound)
are worked out by hand here and the verdict follows from them, not from the code under test.

    bound = multiplier * eager_error + floor,    floor = rel * rms(eager) + 1e-7
    multiplier: 10 up to 10 elements, 8 up to 500, else 2 (float32, float64) or 3 (half types);
    at least 10 where the float64 value is no larger than eager's error (zero in exact arithmetic)
"""

import math

import pytest
import torch

from aotpipe.runtime import accuracy
from aotpipe.runtime.accuracy import Check, compare

F32, F64 = torch.float32, torch.float64
ABS = 1e-7  # the absolute floor
REL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _never():
    raise AssertionError("asked for a value the rule did not need")


def full(n, v, dtype=F64):
    return torch.full((n,), v, dtype=dtype)


# ---- the small-tensor multiplier -------------------------------------------------------------

@pytest.mark.parametrize("dtype,base", [(F32, 2.0), (F64, 2.0), (torch.float16, 3.0), (torch.bfloat16, 3.0),
                                        (torch.float8_e4m3fn, 2.0)])  # a dtype with no rule of its own: float32's
@pytest.mark.parametrize("numel,small", [(0, 10.0), (1, 10.0), (10, 10.0), (11, 8.0), (500, 8.0), (501, None),
                                         (10_000, None)])
def test_the_multiplier_is_10_up_to_10_elements_8_up_to_500_then_the_dtypes_own(dtype, base, numel, small):
    assert accuracy.multiplier(dtype, numel) == (small if small is not None else base)


# float32 values 1 + k/1024: eager is off float64 by e = 1/1024; the graph by k/1024. The floor,
# 1e-5 * rms(eager) + 1e-7, is about e/100, so k = m passes and k = m + 1/64 does not.
@pytest.mark.parametrize("numel,m", [(1, 10), (10, 10), (11, 8), (500, 8), (501, 2), (2048, 2)])
@pytest.mark.parametrize("over", [0.0, 1 / 64])
def test_the_small_tensor_multiplier_decides_a_float32_verdict_at_each_size(numel, m, over):
    e = 2.0 ** -10
    k = m + over
    ref, eager, graph = full(numel, 1.0), full(numel, 1 + e, F32), full(numel, 1 + k * e, F32)
    fl = REL[F32] * (1 + e) + ABS
    bound = m * e + fl
    passes = k * e <= bound
    assert passes is (over == 0.0)  # the hand figures: just inside, or just outside
    c = compare(graph, eager, lambda: ref, what="w")
    assert (c.passed, c.method) == (passes, "fp64")
    assert c.error == pytest.approx(k * e, rel=1e-12) and c.eager_error == pytest.approx(e, rel=1e-12)
    assert c.bound == pytest.approx(bound, rel=1e-12)
    if not passes:
        assert c.detail == (f"RMS error {k * e:.3g} against the float64 eager model, over {bound:.3g} "
                            f"({m}x eager float32's own {e:.3g} plus the floor)")


# float16: 1 + k/64, k = 3 or 3 + 1/8 (the floor is 1e-3 of the rms: e/15); bfloat16: 1 + k/16,
# k = 3 or 3 + 1/4 (its floor, 1e-2 of the rms, is e/6); 7 bits of mantissa suffice.
@pytest.mark.parametrize("dtype,e,step", [(torch.float16, 2.0 ** -6, 1 / 8), (torch.bfloat16, 2.0 ** -4, 1 / 4)])
@pytest.mark.parametrize("outside", [False, True])
def test_half_types_get_three_times_eagers_error_on_a_large_tensor(dtype, e, step, outside):
    n, over = 1000, step if outside else 0.0
    k = 3 + over
    ref, eager, graph = full(n, 1.0), full(n, 1 + e, dtype), full(n, 1 + k * e, dtype)
    bound = 3 * e + REL[dtype] * (1 + e) + ABS
    passes = k * e <= bound
    assert passes is (over == 0.0)
    c = compare(graph, eager, ref)
    assert c.passed is passes and c.bound == pytest.approx(bound, rel=1e-12)


# ---- zero in exact arithmetic ----------------------------------------------------------------

# 1024 float64 values r0, eager r0 + c (c = 1/1024: eager's error is c exactly), the graph r0 + k c.
# The float64 value is "zero in exact arithmetic" when rms(r0) <= c: then the multiplier is at
# least 10 (NOISE_MULTIPLIER), else 2 (1024 float32 elements). r0 = c is on the bound, inside it.
C = 2.0 ** -10
ON_THE_BOUND, JUST_OVER = C, C * (1 + 2.0 ** -20)


def _noise_case(r0, k, n=1024):
    ref = full(n, r0)
    return ref, (ref + C).float(), (ref + k * C).float()


@pytest.mark.parametrize("r0,noise", [(ON_THE_BOUND, True), (JUST_OVER, False), (C / 2, True), (4 * C, False)])
def test_zero_in_exact_arithmetic_means_a_float64_value_no_larger_than_eagers_error(r0, noise):
    ref, eager, graph = _noise_case(r0, 5)
    assert accuracy.fp64_bound(eager, ref, C)[1:] == ((10.0, True) if noise else (2.0, False))
    m = 10 if noise else 2
    bound = m * C + REL[F32] * (r0 + C) + ABS
    c = compare(graph, eager, lambda: ref, what="gradient of b")
    assert c.passed is (5 * C <= bound) is noise
    assert c.bound == pytest.approx(bound, rel=1e-12)
    if noise:
        assert c.detail == accuracy.WITHIN_NOISE and accuracy.within_noise(c)
        assert c.line() == f"gradient of b: error {5 * C:.3g} vs eager float32's {C:.3g} against float64 (bound {bound:.3g})"
    else:
        assert c.detail.endswith(f"(2x eager float32's own {C:.3g} plus the floor)") and not accuracy.within_noise(c)


@pytest.mark.parametrize("k,passes", [(10, True), (10 + 1 / 64, False)])
def test_a_value_zero_in_exact_arithmetic_may_be_ten_times_eagers_error_and_no_more(k, passes):
    ref, eager, graph = _noise_case(ON_THE_BOUND, k)
    bound = accuracy.NOISE_MULTIPLIER * C + REL[F32] * 2 * C + ABS
    assert accuracy.NOISE_MULTIPLIER == 10.0 and (k * C <= bound) is passes
    c = compare(graph, eager, ref)
    assert c.passed is passes and c.bound == pytest.approx(bound, rel=1e-12)


def test_the_noise_multiplier_does_not_lower_a_small_tensors_own():
    # four elements: the small-tensor multiplier is 10 already; zero in exact arithmetic keeps it
    ref, eager, graph = _noise_case(ON_THE_BOUND, 10, n=4)
    assert accuracy.fp64_bound(eager, ref, C)[1:] == (10.0, True)
    assert compare(graph, eager, ref).passed


# ---- the comparisons themselves: <= on each bound --------------------------------------------

def test_an_error_equal_to_the_floor_passes_and_one_ulp_more_fails():
    # float64 [0] against [1e-7]: the floor is 1e-10 * 0 + 1e-7, the error sqrt(1e-7 ** 2) = 1e-7
    eager = torch.zeros(1, dtype=F64)
    on = torch.tensor([ABS], dtype=F64)
    assert compare(on, eager, _never, what="x") == Check("x", True, "floor", error=ABS, bound=ABS)
    over = torch.tensor([math.nextafter(ABS, 1.0)], dtype=F64)
    c = compare(over, eager, None, what="x")
    assert c == Check("x", False, "floor", error=over.item(), bound=ABS, detail=(
        f"RMS error {over.item():.3g} against eager float32, over the float-noise floor {ABS:.3g} "
        f"(max abs error {over.item():.3g})"))


def test_an_error_equal_to_the_float64_bound_passes_without_further_samples_and_one_ulp_more_fails():
    # float64, one element: eager e = 1/1024 off a float64 value of 0 (zero in exact
    # arithmetic: multiplier 10); rel_floor 0 leaves the floor at 1e-7; bound = 10 e + 1e-7.
    e = 2.0 ** -10
    bound = 10.0 * e + (0.0 * e + ABS)
    ref, eager = torch.zeros(1, dtype=F64), torch.tensor([e], dtype=F64)
    on = compare(torch.tensor([-bound], dtype=F64), eager, ref, rel_floor=0.0, samples=[_never])
    assert on == Check("value", True, "fp64", error=bound, eager_error=e, bound=bound, detail=accuracy.WITHIN_NOISE)
    over = torch.tensor([-math.nextafter(bound, 1.0)], dtype=F64)
    c = compare(over, eager, ref, rel_floor=0.0)
    assert (c.passed, c.error, c.bound) == (False, math.nextafter(bound, 1.0), bound)


def test_rel_floor_sets_the_floor_of_the_float64_bound_too():
    # 1000 float32 elements: eager 1 + 1/4096 (e = 1/4096), graph 1 + 3/2048 (r = 6/4096).
    # rel_floor 1e-3: floor ~ 1.0e-3 > what the floor check needs? no: d = 5/4096 = 1.22e-3 > it,
    # and r <= 2 e + floor = 1.49e-3 passes; float32's own 1e-5 gives 2 e + 1.0e-5 = 4.98e-4: fails.
    e, r = 2.0 ** -12, 6 * 2.0 ** -12
    ref, eager, graph = full(1000, 1.0), full(1000, 1 + e, F32), full(1000, 1 + r, F32)
    loose = 2 * e + 1e-3 * (1 + e) + ABS
    tight = 2 * e + REL[F32] * (1 + e) + ABS
    assert (r - e) > 1e-3 * (1 + e) + ABS and r <= loose and r > tight
    c = compare(graph, eager, ref, rel_floor=1e-3)
    assert (c.passed, c.method) == (True, "fp64") and c.bound == pytest.approx(loose, rel=1e-12)
    d = compare(graph, eager, ref)
    assert (d.passed, d.method) == (False, "fp64") and d.bound == pytest.approx(tight, rel=1e-12)
    assert accuracy.fp64_bound(eager, ref, e, rel_floor=1e-3)[0] == pytest.approx(loose, rel=1e-12)


def test_rel_floor_sets_the_floor_where_there_is_no_reference():
    # 100 float32 elements 1 + 1/4096 against 1: RMS error 2.44e-4, under 1e-3 * 1 + 1e-7, over 1e-5 + 1e-7
    eager, graph = full(100, 1.0, F32), full(100, 1 + 2.0 ** -12, F32)
    assert compare(graph, eager, None, rel_floor=1e-3) == Check("value", True, "floor", error=2.0 ** -12,
                                                                bound=1e-3 + ABS)
    c = compare(graph, eager, None)
    assert (c.passed, c.method, c.bound) == (False, "floor", REL[F32] + ABS)


def test_rel_floor_sets_the_bound_after_a_further_sample_too():
    # eager 1 + 1/4096, the graph 1 + 7/4096, a sample 1 + 2/4096, rel_floor 1e-3: with eager's
    # first error the bound is 2/4096 + 1.0e-3 (under 7/4096), with the sample's 4/4096 + 1.0e-3
    # (over it); float32's own floor would give 4/4096 + 1.0e-5: under it still.
    u = 2.0 ** -12
    ref, eager, graph, sample = full(1000, 1.0), full(1000, 1 + u, F32), full(1000, 1 + 7 * u, F32), \
        full(1000, 1 + 2 * u, F32)
    fl = 1e-3 * (1 + u) + ABS
    assert 7 * u - u > fl and 7 * u > 2 * u + fl and 7 * u <= 4 * u + fl and 7 * u > 4 * u + REL[F32] * (1 + u) + ABS
    c = compare(graph, eager, ref, rel_floor=1e-3, samples=[sample])
    assert (c.passed, c.eager_error) == (True, 2 * u) and c.bound == pytest.approx(4 * u + fl, rel=1e-12)


@pytest.mark.parametrize("dtype", [F64, F32, torch.float16, torch.bfloat16])
def test_the_floor_is_the_dtypes_relative_floor_of_the_rms_plus_1e_7(dtype):
    t = torch.tensor([3.0, -4.0], dtype=dtype)  # rms sqrt(12.5)
    assert accuracy.floor(t) == pytest.approx(REL[dtype] * math.sqrt(12.5) + ABS, rel=1e-12)
    assert accuracy.floor(torch.zeros(3, dtype=dtype)) == ABS
    assert accuracy.floor(t, rel_floor=0.5) == pytest.approx(0.5 * math.sqrt(12.5) + ABS, rel=1e-12)
    assert accuracy.floor(t, rms=2.0) == REL[dtype] * 2.0 + ABS  # the caller's RMS, not the tensor's


def test_a_dtype_without_a_rule_of_its_own_has_float32s_floor():
    # complex64 (compare judges its real view as float32; a direct call gets the same floor)
    t = torch.tensor([3 + 4j, 3 - 4j], dtype=torch.complex64)  # real view's rms: sqrt(12.5)
    assert accuracy.floor(t) == pytest.approx(1e-5 * math.sqrt(12.5) + ABS, rel=1e-12)


# ---- further samples of eager's noise --------------------------------------------------------

def _sampled_case():
    # 1000 float32 values on a float64 value of 1: eager off by e0 = 1/1024, the graph by 4/1024:
    # over 2 e0 + floor. A sample of eager off by 2/1024 makes the bound 4/1024 + floor: passes.
    e0 = 2.0 ** -10
    ref = full(1000, 1.0)
    return ref, full(1000, 1 + e0, F32), full(1000, 1 + 4 * e0, F32), e0


def test_samples_are_taken_in_order_until_the_rule_holds_and_no_further():
    ref, eager, graph, e0 = _sampled_case()
    small, large = full(1000, 1 - e0, F32), full(1000, 1 + 2 * e0, F32)
    c = compare(graph, eager, ref, what="w", samples=[small, lambda: large, _never])
    assert (c.passed, c.eager_error) == (True, 2 * e0)
    assert c.detail == accuracy.MORE_SAMPLES.format(n=3)
    assert c.bound == pytest.approx(2 * 2 * e0 + REL[F32] * (1 + e0) + ABS, rel=1e-12)


def test_at_most_four_samples_in_all_are_taken():
    ref, eager, graph, e0 = _sampled_case()
    small, large = full(1000, 1 - e0, F32), full(1000, 1 + 2 * e0, F32)
    c = compare(graph, eager, ref, what="w", samples=[small, small, small, large, large])
    assert not c.passed and c.eager_error == e0
    bound = 2 * e0 + REL[F32] * (1 + e0) + ABS
    assert c.detail == (f"RMS error {4 * e0:.3g} against the float64 eager model, over {bound:.3g} "
                        f"(2x eager float32's own {e0:.3g} plus the floor, the largest of 4 samples)")


def test_a_failing_check_with_one_more_sample_says_two():
    ref, eager, graph, e0 = _sampled_case()
    c = compare(graph, eager, ref, what="w", samples=[full(1000, 1 - e0, F32)])
    assert not c.passed and c.detail.endswith("plus the floor, the largest of 2 samples)")
    one = compare(graph, eager, ref, what="w")
    assert not one.passed and one.detail.endswith("plus the floor)")


def test_samples_of_another_shape_dtype_or_nonfinite_places_are_left_out_of_eagers_error():
    ref, eager, graph, e0 = _sampled_case()
    far = 1 + 2 * e0
    odd = full(1000, far, F32)
    odd[3] = math.inf
    for sample in (full(999, far, F32), full(1000, far, F64), odd, None):
        assert accuracy.eager_error(eager, ref, sample) == e0, sample
    assert accuracy.eager_error(eager, ref, full(1000, 1 - e0, F32), full(1000, far, F32)) == 2 * e0
    c = compare(graph, eager, ref, samples=[full(999, far, F32), full(1000, far, F64), odd])
    assert not c.passed and c.eager_error == e0


def test_a_value_within_noise_that_needed_more_samples_says_both():
    # a float64 value of 0: eager +1/1024 off it; a sample 2/1024; the graph 15/1024: over 10 e0
    e0 = 2.0 ** -10
    ref, eager, graph = full(1000, 0.0), full(1000, e0, F32), full(1000, -15 * e0, F32)
    c = compare(graph, eager, ref, samples=[full(1000, 2 * e0, F32)])
    assert c.passed and c.detail == accuracy.WITHIN_NOISE + "; " + accuracy.MORE_SAMPLES.format(n=2)
    assert accuracy.within_noise(c)


def test_a_plain_fp64_pass_has_no_detail():
    ref, eager, _, e0 = _sampled_case()
    c = compare(full(1000, 1 + 2 * e0, F32), eager, ref, what="w")
    assert c.passed and c.method == "fp64" and c.detail is None and not accuracy.within_noise(c)
    assert c.line().startswith("w: error ") and c.ratio == pytest.approx(2.0, rel=1e-12)


# ---- NaN and inf: places and signs -----------------------------------------------------------

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("graph,eager", [
    ([INF, 1.0], [-INF, 1.0]),    # the sign of an infinity
    ([-INF, 1.0], [INF, 1.0]),
    ([INF, 1.0], [1.0, 1.0]),     # an infinity where eager is finite
    ([1.0, 1.0], [INF, 1.0]),     # and the other way
    ([NAN, 1.0], [1.0, 1.0]),
    ([1.0, 1.0], [NAN, 1.0]),
    ([NAN, 1.0], [INF, 1.0]),     # NaN is not inf
    ([1.0, INF], [INF, 1.0]),     # as many infinities, in other places
])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_nan_and_inf_must_be_where_eager_has_them_with_its_sign(graph, eager, dtype):
    c = compare(torch.tensor(graph, dtype=dtype), torch.tensor(eager, dtype=dtype), _never, what="y")
    assert c == Check("y", False, "exact", detail="NaN or inf in other places than eager's")
    assert c.line() == "y: NaN or inf in other places than eager's"


@pytest.mark.parametrize("special", [[INF, 1.0], [-INF, 1.0], [NAN, 1.0], [INF, -INF], [NAN, -INF]])
def test_nan_and_inf_in_eagers_places_pass_and_the_rest_is_judged_by_the_rule(special):
    eager = torch.tensor(special + [2.0, 3.0])
    assert compare(eager.clone(), eager, _never).passed
    off = eager.clone()
    off[2:] += 1.0  # the finite elements are judged as ever: here far over the floor
    c = compare(off, eager, None)
    finite = 2 + sum(math.isfinite(x) for x in special)  # the RMS is over the elements finite in both
    assert not c.passed and c.method == "floor" and c.error == pytest.approx(math.sqrt(2 / finite))


def test_inf_of_the_other_sign_in_a_sample_leaves_it_out():
    ref, eager = full(4, 1.0), torch.tensor([INF, 1 + 2.0 ** -10, 1.0, 1.0])
    sample = torch.tensor([-INF, 1 + 2.0 ** -5, 1.0, 1.0])
    assert accuracy.eager_error(eager, ref, sample) == accuracy.eager_error(eager, ref)


# ---- dtypes, shapes, empty tensors -----------------------------------------------------------

def test_a_shape_or_dtype_mismatch_fails_naming_both_layouts():
    c = compare(torch.ones(2, 3), torch.ones(3, 2), _never, what="out")
    assert c == Check("out", False, "exact", detail="float32[2, 3] != eager's float32[3, 2]")
    d = compare(torch.ones(2, dtype=F64), torch.ones(2), _never, what="out")
    assert d == Check("out", False, "exact", detail="float64[2] != eager's float32[2]")
    assert compare(torch.ones(0, 2), torch.ones(0), what="out").detail == "float32[0, 2] != eager's float32[0]"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_values_must_be_equal_everywhere(dtype):
    eager = torch.tensor([1, 0, 1, 1]).to(dtype)
    assert compare(eager.clone(), eager, _never, what="mask") == Check("mask", True, "exact")
    other = eager.clone()
    other[1] = 1
    assert compare(other, eager, _never, what="mask") == Check("mask", False, "exact",
                                                               detail="1 of 4 elements differ")
    other[3] = 0
    assert compare(other, eager, _never, what="mask").detail == "2 of 4 elements differ"


@pytest.mark.parametrize("dtype", [F32, F64, torch.complex64, torch.int64])
def test_empty_tensors_of_the_same_layout_are_equal(dtype):
    assert compare(torch.ones(0, 3, dtype=dtype), torch.ones(0, 3, dtype=dtype), _never) == Check("value", True, "exact")


def test_none_is_only_none():
    assert compare(None, None, _never, what="g") == Check("g", True, "none")
    assert compare(None, torch.ones(2), _never, what="g") == Check(
        "g", False, "none", detail="the graph gives None, eager gives a value")
    assert compare(torch.ones(2), None, _never, what="g") == Check(
        "g", False, "none", detail="the graph gives a value, eager gives None")


@pytest.mark.parametrize("actual,expected,passed", [(3, 3, True), (3, 4, False), (1.5, 1.5, True), (NAN, NAN, True),
                                                     (True, True, True), ((1, 2), (1, 2), True), ("a", "b", False)])
def test_values_that_are_not_tensors_must_be_equal(actual, expected, passed):
    c = compare(actual, expected, _never, what="n")
    assert c == Check("n", passed, "exact", detail=None if passed else f"{actual!r} != eager's {expected!r}")


@pytest.mark.parametrize("actual,expected", [(torch.tensor(3.0), 3.0), (3.0, torch.tensor(3.0)),
                                             (torch.ones(3), 1.0), (torch.zeros(2, dtype=torch.int64), 0)])
def test_a_tensor_against_a_number_fails_instead_of_comparing_elementwise(actual, expected):
    c = compare(actual, expected, _never, what="n")
    assert c.passed is False and c.method == "exact" and c.detail == f"{actual!r} != eager's {expected!r}"


# ---- complex values: judged as their (real, imaginary) pairs ---------------------------------

def _as_complex(t):
    return torch.view_as_complex(t.reshape(-1, 2).contiguous())


def test_complex_values_are_judged_as_their_real_pairs_reference_rel_floor_and_samples_included():
    e = 2.0 ** -12
    ref, eager, graph = full(1000, 1.0), full(1000, 1 + e, F32), full(1000, 1 + 6 * e, F32)
    cref, ceager, cgraph = _as_complex(ref), _as_complex(eager), _as_complex(graph)
    assert ceager.dtype == torch.complex64 and cref.dtype == torch.complex128
    loose = compare(cgraph, ceager, lambda: cref, what="z", rel_floor=1e-3)
    assert loose == compare(graph.reshape(-1, 2), eager.reshape(-1, 2), ref.reshape(-1, 2), what="z", rel_floor=1e-3)
    assert loose.passed and loose.method == "fp64"
    assert not compare(cgraph, ceager, cref, what="z").passed  # float32's own floor: over it (see above)
    sample = _as_complex(full(1000, 1 + 3 * e, F32))
    more = compare(cgraph, ceager, cref, what="z", samples=[lambda: sample])
    assert more.passed and more.eager_error == 3 * e and more.detail == accuracy.MORE_SAMPLES.format(n=2)


def test_a_complex_value_off_in_its_imaginary_part_alone_fails():
    eager = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    c = compare(eager + 0.5j, eager, None, what="z")
    assert not c.passed and c.method == "floor" and c.error == pytest.approx(0.5 / math.sqrt(2))
    assert compare(eager.conj(), eager.conj().resolve_conj(), _never).passed  # a conjugate view is its value


def test_complex_nan_and_inf_places_are_those_of_each_part():
    eager = torch.tensor([complex(INF, 1.0), complex(1.0, 2.0)], dtype=torch.complex64)
    assert compare(eager.clone(), eager, _never).passed
    flipped = torch.tensor([complex(1.0, INF), complex(1.0, 2.0)], dtype=torch.complex64)
    assert compare(flipped, eager, _never).detail == "NaN or inf in other places than eager's"
    negative = torch.tensor([complex(-INF, 1.0), complex(1.0, 2.0)], dtype=torch.complex64)
    assert not compare(negative, eager, _never).passed


def test_the_default_label_is_value():
    assert compare(torch.ones(2), torch.ones(3)).what == "value"
    assert compare(torch.ones(2), torch.ones(2)).line() == "value: floor"


def test_exact_equality_of_complex_values_takes_both_parts_nan_included():
    a = torch.tensor([complex(NAN, 1.0), 2 + 0j], dtype=torch.complex64)
    assert accuracy.exact_equal(a, a.clone())
    assert not accuracy.exact_equal(a, torch.tensor([complex(NAN, 2.0), 2 + 0j], dtype=torch.complex64))
    assert not accuracy.exact_equal(a, torch.tensor([complex(1.0, 1.0), 2 + 0j], dtype=torch.complex64))
    assert accuracy.exact_equal(a.conj(), a.conj().resolve_conj())


def test_the_mixed_rule_takes_the_half_type_multiplier_and_keeps_float32_floor():
    torch.manual_seed(0)
    ref = torch.randn(10_000, dtype=torch.float64)
    noise = torch.randn(10_000, dtype=torch.float64)
    eager = (ref + 1e-3 * noise).float()  # eager's own error: 1e-3 RMS
    graph = (ref + 2.5e-3 * torch.randn(10_000, dtype=torch.float64)).float()  # 2.5x eager's
    plain = accuracy.compare(graph, eager, ref, what="v")
    mixed = accuracy.compare(graph, eager, ref, what="v", computed_in=torch.bfloat16)
    assert not plain.passed and mixed.passed  # 2x for float32 math; 3x for bfloat16 math
    worse = (ref + 3.5e-3 * torch.randn(10_000, dtype=torch.float64)).float()
    assert not accuracy.compare(worse, eager, ref, what="v", computed_in=torch.bfloat16).passed
    assert mixed.bound == pytest.approx(3 * mixed.eager_error + accuracy.floor(eager), rel=1e-6)


def _noisy(ref: torch.Tensor, rms: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (ref + rms * torch.randn(ref.shape, dtype=ref.dtype, generator=g)).to(
        torch.complex64 if ref.is_complex() else torch.float32)


def test_the_mixed_multiplier_holds_for_complex_values_and_after_noise_samples():
    ref = torch.randn(10_000, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    eager, graph = _noisy(ref, 1e-3, 2), _noisy(ref, 2.5e-3, 3)  # complex: judged as the real view's pairs
    assert accuracy.compare(graph, eager, ref, what="c", computed_in=torch.bfloat16).passed
    assert not accuracy.compare(graph, eager, ref, what="c").passed
    real = ref.real.contiguous()
    eager, graph, sample = _noisy(real, 1e-3, 4), _noisy(real, 4e-3, 5), _noisy(real, 1.5e-3, 6)
    # 4x eager's first error fails 3x; the sample's 1.5x raises eager's error, and 3x of it holds
    mixed = accuracy.compare(graph, eager, real, what="v", samples=[sample], computed_in=torch.bfloat16)
    assert mixed.passed and mixed.bound == pytest.approx(3 * mixed.eager_error + accuracy.floor(eager), rel=1e-6)
    assert not accuracy.compare(graph, eager, real, what="v", samples=[sample]).passed
