"""The value helpers the rule and the records rest on: equality, errors, digests, summaries,
samples and the check's record, each on small tensors whose answers are worked out by hand."""

import hashlib
import math
import struct
from typing import ClassVar

import pytest
import torch

from aotpipe.format.records import CheckItem, Summary
from aotpipe.runtime import accuracy
from aotpipe.runtime.accuracy import Check

INF, NAN = math.inf, math.nan


# ---- exact equality --------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,equal", [
    (torch.tensor([1.0, NAN]), torch.tensor([1.0, NAN]), True),       # NaNs equal each other
    (torch.tensor([1.0, NAN]), torch.tensor([1.0, 2.0]), False),      # but nothing else
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, NAN]), False),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), False),
    (torch.tensor([INF, -INF]), torch.tensor([INF, -INF]), True),
    (torch.tensor([INF]), torch.tensor([-INF]), False),
    (torch.ones(1), torch.ones(3), False),                           # no broadcasting
    (torch.ones(2), torch.ones(2, dtype=torch.float64), False),
    (torch.ones(2, 3), torch.ones(3, 2), False),
    (torch.tensor([1, 2]), torch.tensor([1, 2]), True),
    (torch.tensor([1, 2]), torch.tensor([1, 3]), False),
    (torch.tensor([True]), torch.tensor([False]), False),
    (torch.ones(0), torch.ones(0), True),
])
def test_exact_equality_of_tensors(a, b, equal):
    assert accuracy.exact_equal(a, b) is equal


def test_exact_equality_of_other_values():
    one, other = torch.tensor([1.5, 1.5]).tolist()  # two float objects of one value
    assert one is not other and accuracy.exact_equal(one, other)
    assert accuracy.exact_equal([1, 2], list((1, 2))) and not accuracy.exact_equal([1, 2], [2, 1])
    assert accuracy.exact_equal(NAN, float("nan"))
    assert not accuracy.exact_equal(1.0, 2.0) and not accuracy.exact_equal(1.0, NAN)
    assert not accuracy.exact_equal(NAN, 1.0) and not accuracy.exact_equal(1, NAN)
    assert accuracy.exact_equal(None, None)
    assert not accuracy.exact_equal(None, 0) and not accuracy.exact_equal(0, None)
    assert not accuracy.exact_equal(None, torch.zeros(1)) and not accuracy.exact_equal(torch.zeros(1), None)


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,err", [
    (torch.tensor([1.0, 2.0]), torch.tensor([1.5, -2.0]), 4.0),
    (torch.tensor([2.0]), torch.tensor([1.0]), 1.0),                 # one element
    (torch.tensor([NAN, 1.0]), torch.tensor([NAN, 1.25]), 0.25),     # NaN against NaN: no error
    (torch.tensor([NAN, 1.0]), torch.tensor([1.0, 1.0]), INF),       # against a number: unbounded
    (torch.tensor([INF, 1.0]), torch.tensor([INF, 1.0]), 0.0),
    (torch.tensor([INF]), torch.tensor([-INF]), INF),
    (torch.tensor([1, 5]), torch.tensor([1, 2]), 3.0),
    (torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.75]), 0.25),
    (torch.tensor([1 + 1j]), torch.tensor([1 + 3j]), 2.0),           # the parts, not the modulus
    (torch.ones(2), torch.ones(3), INF),
    (torch.ones(0, 2), torch.ones(0, 2), 0.0),
])
def test_max_abs_error(a, b, err):
    assert accuracy.max_abs_error(a, b) == err


def test_max_abs_error_of_other_values_is_zero_or_unbounded():
    assert accuracy.max_abs_error(3, 3) == 0.0 and accuracy.max_abs_error(None, None) == 0.0
    assert accuracy.max_abs_error(3, 4) == INF and accuracy.max_abs_error(torch.ones(2), 1.0) == INF
    assert accuracy.max_abs_error(1.0, torch.ones(1)) == INF


@pytest.mark.parametrize("a,b,err", [
    (torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]), 1.0),
    (torch.tensor([1.0, INF]), torch.tensor([2.0, 5.0]), 1.0),       # over the elements finite in both
    (torch.tensor([1.0, 5.0]), torch.tensor([4.0, NAN]), 3.0),
    (torch.tensor([INF, 1.0]), torch.tensor([INF, 1.0]), 0.0),
    (torch.tensor([INF]), torch.tensor([NAN]), 0.0),                  # none finite in both
    (torch.tensor([1, 4]), torch.tensor([1, 2]), math.sqrt(2)),       # integers: as numbers
    (torch.tensor([0.5]), torch.tensor([0.25], dtype=torch.float64), 0.25),
    (torch.tensor([1 + 1j]), torch.tensor([0j]), 1.0),                # complex: its real view's RMS
    (torch.tensor([65504.0], dtype=torch.float16), torch.tensor([-65504.0], dtype=torch.float16), 131008.0),
    # two dtypes: in float64 (float32 would round 2048 - 2**-20 to 2048)
    (torch.tensor([2048.0], dtype=torch.float16), torch.tensor([2.0 ** -20]), 2048.0 - 2.0 ** -20),
])
def test_rmse(a, b, err):
    assert accuracy.rmse(a, b) == pytest.approx(err, rel=1e-12)


def test_rmse_of_finite_tensors_of_one_float_dtype_makes_no_float64_copy_of_either(monkeypatch):
    def no_copy(t):
        raise AssertionError("a float64 copy of an output")

    monkeypatch.setattr(accuracy, "_f64", no_copy)
    assert accuracy.rmse(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0])) == 1.0
    with pytest.raises(AssertionError, match="a float64 copy"):  # a difference not finite: over the finite ones
        accuracy.rmse(torch.tensor([1.0, INF]), torch.tensor([2.0, 5.0]))


BIG64 = 1e200  # finite in float64; its square is not


@pytest.mark.parametrize("a,b,err", [
    (torch.tensor([3e38, 1.0]), torch.tensor([-3e38, 1.0]), 6e38 / math.sqrt(2)),  # the float32 difference overflows
    (torch.tensor([BIG64, 0.0], dtype=torch.float64), torch.tensor([0.0, 0.0], dtype=torch.float64), math.inf),
    (torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]), 1.0),
    (torch.ones(0), torch.ones(0), 0.0),                                             # nothing to differ
])
def test_rmse_where_a_finite_difference_or_its_square_overflows_is_the_float64_form_s(a, b, err):
    """A difference that is inf though both are finite, or a float64 sum of squares that
    overflows: not the one-pass form's (None), the float64 form's answer."""
    assert accuracy._same_dtype_rmse(a, b) == (err if err in (0.0, 1.0) else None)
    assert accuracy.rmse(a, b) == pytest.approx(err, rel=1e-7)  # (3e38 is not a float32: its nearest is)


@pytest.mark.parametrize("t,rms", [
    (torch.tensor([3.0, -4.0]), math.sqrt(12.5)),
    (torch.tensor([3.0, NAN]), None), (torch.tensor([INF, 1.0]), None), (torch.tensor([-INF]), None),
    (torch.tensor([BIG64, 1.0], dtype=torch.float64), None),         # finite, its square overflows
    (torch.tensor([1e150, 1e150], dtype=torch.float64), 1e150),      # finite, and its square too
])
def test_the_one_pass_rms_is_of_finite_tensors_only(t, rms):
    got = accuracy.finite_rms(t)
    assert got == (None if rms is None else pytest.approx(rms, rel=1e-12))


def test_compare_takes_two_passes_where_every_difference_is_finite_and_the_isfinite_ones_elsewhere(monkeypatch):
    """Finite throughout: no isfinite pass over the values (their difference's norm says
    so); a non-finite value: NaN and inf places compared as before."""
    calls = []
    real = accuracy._nonfinite_differs
    monkeypatch.setattr(accuracy, "_nonfinite_differs", lambda a, b: calls.append(1) or real(a, b))
    c = accuracy.compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 2 ** -22]))
    assert c.passed and c.method == "floor" and c.error == pytest.approx(2 ** -22 / math.sqrt(2)) and not calls
    c = accuracy.compare(torch.tensor([1.0, NAN]), torch.tensor([1.0, 2.0]))
    assert not c.passed and c.detail == "NaN or inf in other places than eager's" and calls == [1]
    c = accuracy.compare(torch.tensor([1.0, INF]), torch.tensor([1.0 + 2 ** -23, INF]))
    assert c.passed and c.error == 2 ** -23 and calls == [1, 1]  # over the elements finite in both: one
    c = accuracy.compare(torch.tensor([3e38, 0.0]), torch.tensor([-3e38, 0.0]))  # finite; the difference is not
    assert not c.passed and c.method == "floor" and c.error == pytest.approx(6e38 / math.sqrt(2), rel=1e-7) and calls == [1, 1, 1]


def test_rmse_of_complex_values_is_that_of_their_real_views():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, dtype=torch.complex64, generator=g), torch.randn(50, dtype=torch.complex64, generator=g)
    assert accuracy.rmse(a, b) == pytest.approx(accuracy.rmse(torch.view_as_real(a), torch.view_as_real(b)), rel=1e-6)


@pytest.mark.parametrize("t,rms", [
    (torch.tensor([3.0, -4.0]), math.sqrt(12.5)),
    (torch.tensor([3.0, INF, -4.0, NAN]), math.sqrt(12.5)),           # over the finite elements
    (torch.tensor([INF, NAN]), 0.0),
    (torch.ones(0), 0.0),
    (torch.tensor([3 + 4j]), math.sqrt(12.5)),                        # a complex one's real view
    (torch.tensor([3 + 4j]).conj(), math.sqrt(12.5)),
])
def test_rms(t, rms):
    assert accuracy._rms(t) == pytest.approx(rms, rel=1e-12)


# ---- digests ---------------------------------------------------------------------------------

def _sha(head, payload=b""):
    return hashlib.sha256(head.encode() + payload).hexdigest()


def test_the_digest_is_sha256_of_dtype_shape_and_row_major_bytes():
    # the artefact format: digests recorded by one version must match those of the next
    assert accuracy.digest(torch.tensor([1.0, 2.0])) == _sha("float32[2]", struct.pack("<2f", 1.0, 2.0))
    assert accuracy.digest(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32).t()) == _sha(
        "int32[2, 2]", struct.pack("<4i", 1, 3, 2, 4))
    assert accuracy.digest(torch.tensor(2.5, dtype=torch.float64)) == _sha("float64[]", struct.pack("<d", 2.5))
    assert accuracy.digest(torch.tensor([True, False])) == _sha("bool[2]", b"\x01\x00")
    assert accuracy.digest(torch.ones(0, 3)) == _sha("float32[0, 3]")


def test_the_digest_hashes_a_view_where_the_layout_allows_and_a_copy_elsewhere():
    """The bytes hashed are the row-major elements whatever the layout: a view of a dense tensor
    (no copy), a copy of a one-element tensor torch calls contiguous with an odd stride, of a
    tensor with a conjugate or negative bit, of a transposed or stepped one."""
    base = torch.arange(12, dtype=torch.float32)
    want = accuracy.digest(base.clone())
    odd = torch.arange(3, dtype=torch.float32).reshape(3, 1, 1).as_strided((1, 1, 1), (7, 9, 11), 2)
    assert odd.is_contiguous() and odd.reshape(-1).stride() == (11,)  # the case a plain view misses
    assert accuracy.digest(odd) == _sha("float32[1, 1, 1]", struct.pack("<f", 2.0))
    assert accuracy.digest(torch.arange(24, dtype=torch.float32)[::2]) == _sha(
        "float32[12]", struct.pack("<12f", *range(0, 24, 2)))
    assert accuracy.digest(base.reshape(3, 4).t().contiguous().t().contiguous().reshape(-1)) == want
    assert accuracy.digest(torch.arange(13, dtype=torch.float32)[1:] - 1) == want  # a view at an offset
    c = torch.tensor([1 + 2j, 3 - 4j])
    assert c.conj().is_conj() and accuracy.digest(c.conj()) == accuracy.digest(c.conj().resolve_conj())
    neg = torch._neg_view(base)
    assert neg.is_neg() and accuracy.digest(neg) == accuracy.digest(-base)


def test_a_dense_tensor_is_hashed_in_place_and_only_the_others_are_copied():
    dense = torch.arange(12, dtype=torch.float32).reshape(3, 4)[1:]
    assert accuracy._dense_flat(dense).data_ptr() == dense.data_ptr()  # a view: no copy of a large output
    odd = torch.arange(3, dtype=torch.float32).reshape(3, 1, 1).as_strided((1, 1, 1), (7, 9, 11), 2)
    for t in (odd, dense.t(), torch._neg_view(dense), torch.tensor([1 + 2j]).conj()):
        flat = accuracy._dense_flat(t)
        assert flat.data_ptr() != t.data_ptr() and flat.stride() == (1,) and not (flat.is_conj() or flat.is_neg())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_digests_are_each_tensor_s_digest_in_order_on_as_many_threads_as_torch_has(monkeypatch, threads):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(64, 33, generator=g), torch.randn(5, 7, generator=g).t(), torch.zeros(0),
               torch.arange(10)[::3], torch.randn(3, generator=g).double()]
    pools = []
    real = accuracy.concurrent.futures.ThreadPoolExecutor
    monkeypatch.setattr(accuracy.concurrent.futures, "ThreadPoolExecutor", lambda n: pools.append(n) or real(n))
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert accuracy.digests(tensors) == [accuracy.digest(t) for t in tensors]
        assert accuracy.digests(tensors[:1]) == [accuracy.digest(tensors[0])] and accuracy.digests([]) == []
    finally:
        torch.set_num_threads(was)
    assert pools == ([] if threads == 1 else [threads])  # one output, or one thread: no pool


def test_equal_bytes_of_another_dtype_have_another_digest():
    assert accuracy.digest(torch.zeros(2)) != accuracy.digest(torch.zeros(2, dtype=torch.int32))


# ---- summaries and samples -------------------------------------------------------------------

def _fields(s):
    return (s.shape, s.stride, s.dtype, s.sum, s.abs_sum, s.nonfinite)


def test_a_summary_is_the_layout_and_sums_of_the_finite_elements():
    t = torch.tensor([[1.0, INF], [-2.0, NAN]]).t()  # [[1, -2], [inf, nan]], strides (1, 2)
    assert _fields(accuracy.summary(t)) == ([2, 2], [1, 2], "float32", -1.0, 3.0, 2)
    assert _fields(accuracy.summary(torch.tensor([1, -3], dtype=torch.int64))) == ([2], [1], "int64", -2.0, 4.0, 0)
    assert _fields(accuracy.summary(torch.tensor([1 - 2j]))) == ([1], [1], "complex64", -1.0, 3.0, 0)
    assert accuracy.summary(3) is None and accuracy.summary(None) is None


def test_a_tensor_of_4096_elements_is_summed_whole_and_one_more_is_sampled():
    whole = torch.arange(4096, dtype=torch.float64)
    assert torch.equal(accuracy.sampled(whole), whole)
    assert accuracy.sampled_summary(whole).sum == float(whole.sum())
    more = torch.arange(4097, dtype=torch.float64)
    assert torch.equal(accuracy.sampled(more), more[::2])  # every 2nd: 2049 elements
    s = accuracy.sampled_summary(more)
    assert _fields(s) == ([4097], [1], "float64", float(more[::2].sum()), float(more[::2].sum()), 0)


@pytest.mark.parametrize("shape,steps", [
    ((8192, 2), (4, 1)),      # the largest dimension halved until the sample fits
    ((2, 8192), (1, 4)),
    ((129, 127), (4, 2)),     # 65 x 64 = 4160 rows and columns (rounded up) is still over 4096
    ((64, 64), (1, 1)),
    ((3, 5000), (1, 4)),      # 3 x 2500 is still over
])
def test_the_sample_keeps_every_kth_index_of_the_largest_dimensions(shape, steps):
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    want = t[tuple(slice(None, None, k) for k in steps)]
    got = accuracy.sampled(t)
    assert got.shape == want.shape and torch.equal(got, want)


def test_a_scalar_a_number_and_a_meta_tensor():
    assert torch.equal(accuracy.sampled(torch.tensor(2.0)), torch.tensor(2.0))
    for t in (3, None, torch.empty(8, device="meta")):
        assert accuracy.sampled(t) is None and accuracy.sampled_summary(t) is None


def _summary(**kw):
    fields = {"shape": [4], "stride": [1], "dtype": "float32", "sum": 2.0, "abs_sum": 4.0, "nonfinite": 0}
    return Summary.model_construct(**{**fields, **kw})


def test_a_summary_agrees_with_itself_and_departs_in_its_first_differing_field():
    rec = _summary()
    assert accuracy.summary_departs(_summary(), rec, 0.0) is None
    assert accuracy.summary_departs(_summary(dtype="float64"), rec, 1.0) == "dtype float64 != recorded float32"
    assert accuracy.summary_departs(_summary(shape=[2, 2], stride=[2, 1]), rec, 1.0) == "shape [2, 2] != recorded [4]"
    assert accuracy.summary_departs(_summary(stride=[2]), rec, 1.0) == "stride [2] != recorded [1]"
    assert accuracy.summary_departs(_summary(stride=[2]), rec, 1.0, layout=("dtype", "shape")) is None
    assert accuracy.summary_departs(_summary(nonfinite=2), rec, 1.0) == "2 non-finite values != recorded 0"
    assert accuracy.summary_departs(_summary(sum=-2.0, abs_sum=5.0), rec, 0.1) == "sum -2.0 != recorded 2.0"
    assert accuracy.summary_departs(_summary(abs_sum=5.0), rec, 0.1) == "abs_sum 5.0 != recorded 4.0"


@pytest.mark.parametrize("abs_sum,allowed", [(4.0, 1.0), (0.5, 0.25)])
def test_sums_agree_within_rtol_of_the_recorded_absolute_sum_and_at_least_of_one(abs_sum, allowed):
    # rtol 0.25 of max(1, |recorded abs_sum|): just inside and just outside, either sum
    recorded = {"sum": -3.0, "abs_sum": abs_sum}
    rec = _summary(**recorded)
    for key, at in recorded.items():
        inside = _summary(**{**recorded, key: at + allowed})
        assert accuracy.summary_departs(inside, rec, 0.25) is None
        outside = _summary(**{**recorded, key: math.nextafter(at + allowed, INF)})
        assert accuracy.summary_departs(outside, rec, 0.25).startswith(f"{key} ")


# ---- the check's record and line -------------------------------------------------------------

def test_a_checks_record_keeps_four_significant_digits_and_infinity():
    c = Check("gradient of w", False, "fp64", error=0.123456, eager_error=0.0123456, bound=INF, detail="why")
    assert c.item() == CheckItem(what="gradient of w", passed=False, method="fp64", error=0.1235,
                                 eager_error=0.01235, ratio=10.0, bound=INF, detail="why")
    assert Check("x", True, "exact").item() == CheckItem(what="x", passed=True, method="exact")


def test_the_ratio_is_only_where_eager_had_an_error():
    assert Check("x", True, "fp64", error=3.0, eager_error=2.0).ratio == 1.5
    assert Check("x", True, "fp64", error=3.0, eager_error=0.0).ratio is None
    assert Check("x", True, "floor", error=3.0).ratio is None
    assert Check("x", True, "fp64", error=None, eager_error=2.0).ratio is None


def test_a_checks_line():
    assert Check("x", False, "exact", detail="float32[2] != eager's float32[3]").line() == \
        "x: float32[2] != eager's float32[3]"
    assert Check("x", True, "floor", error=1e-9, bound=1e-7).line() == "x: floor"
    assert Check("x", True, "exact").line() == "x: exact"
    passing = Check("x", True, "fp64", error=0.5, eager_error=0.25, bound=0.75, detail=accuracy.WITHIN_NOISE)
    assert passing.line() == "x: error 0.5 vs eager float32's 0.25 against float64 (bound 0.75)"
    assert Check("x", False, "fp64", error=0.5, eager_error=0.25, bound=0.45).line() == \
        "x: error 0.5 vs eager float32's 0.25 against float64 (bound 0.45)"


@pytest.mark.parametrize("check,noise", [
    (Check("x", True, "fp64", detail=accuracy.WITHIN_NOISE), True),
    (Check("x", True, "fp64", detail=accuracy.WITHIN_NOISE + "; " + accuracy.MORE_SAMPLES.format(n=2)), True),
    (Check("x", True, "fp64", detail=accuracy.MORE_SAMPLES.format(n=2)), False),
    (Check("x", True, "fp64"), False),
    (Check("x", False, "fp64", detail=accuracy.WITHIN_NOISE), False),
    (Check("x", True, "floor", detail=accuracy.WITHIN_NOISE), False),
])
def test_within_noise_is_a_passing_fp64_check_whose_detail_says_so(check, noise):
    assert accuracy.within_noise(check) is noise


class _DeviceSpy(torch.Tensor):
    """A CPU tensor that records where each `.to` sends it: a stand-in for a GPU tensor, on a
    machine that has none."""

    moves: ClassVar[list[tuple]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            cls.moves.append(tuple(args[1:]) + tuple((kwargs or {}).values()))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("helper", [accuracy._f64, accuracy._norm], ids=["f64", "norm"])
def test_the_float64_copy_and_the_rms_are_taken_on_the_cpu_whatever_the_tensors_device(helper):
    # a GPU's float64 is slow or absent: the reference arithmetic moves the values to the CPU first
    _DeviceSpy.moves.clear()
    helper(torch.arange(4.0).as_subclass(_DeviceSpy))
    assert _DeviceSpy.moves == [("cpu",)]
