"""The comparison rule: float noise passes, real errors fail, the fp64 run only when needed."""

import math

import pytest
import torch

from aotpipe.runtime import accuracy
from aotpipe.runtime.accuracy import compare


def _never():
    raise AssertionError("the float64 reference was asked for")


def test_within_the_floor_passes_without_asking_for_float64():
    x = torch.randn(1000)
    c = compare(x + 1e-7 * torch.randn(1000), x, _never)
    assert c.passed and c.method == "floor"


def test_float32_reordering_passes_against_float64():
    torch.manual_seed(0)
    a, b = torch.randn(256, 512), torch.randn(512, 256)
    ref = a.double() @ b.double()
    eager = a @ b
    # Another summation order: split the inner dimension where this CPU's GEMM does not
    # (one whose blocking splits at 256 gives the same bits for that split).
    for k in (256, 255, 129, 37):
        graph = a[:, :k] @ b[:k] + a[:, k:] @ b[k:]
        if not accuracy.exact_equal(graph, eager):
            break
    assert not accuracy.exact_equal(graph, eager), "no split gives another summation order here"
    c = compare(graph, eager, lambda: ref)
    assert c.passed, c.line()


def test_a_real_error_fails_with_the_figures():
    torch.manual_seed(0)
    a = torch.randn(64, 64)
    ref = a.double() * 2
    eager = a * 2
    c = compare(eager * 1.01, eager, lambda: ref, what="gradient of w")
    assert not c.passed and c.method == "fp64"
    assert c.error > 10 * c.bound / 2 or c.error > c.bound
    assert "gradient of w" in c.line() and "float64" in c.line()


def test_error_is_judged_against_eager_float32s_own_error():
    # eager itself is off float64 by e; a graph off by 1.5 e passes, by 3 e fails (multiplier 2)
    ref = torch.randn(10_000, dtype=torch.float64)
    noise = torch.randn(10_000, dtype=torch.float64)
    eager = (ref + noise * 1e-3).float()
    assert compare((ref + noise * 1.5e-3).float(), eager, ref).passed
    assert not compare((ref + noise * 3.5e-3).float(), eager, ref).passed


def test_small_tensors_get_a_larger_multiplier():
    assert accuracy.multiplier(torch.float32, 1) == 10.0
    assert accuracy.multiplier(torch.float32, 100) == 8.0
    assert accuracy.multiplier(torch.float32, 10_000) == 2.0
    assert accuracy.multiplier(torch.bfloat16, 10_000) == 3.0


def test_none_against_a_gradient_fails():
    assert not compare(None, torch.ones(2)).passed
    assert not compare(torch.ones(2), None).passed
    assert compare(None, None).passed


def test_shape_dtype_integers_and_nan_places_must_match():
    assert not compare(torch.ones(2), torch.ones(3)).passed
    assert not compare(torch.ones(2), torch.ones(2, dtype=torch.float64)).passed
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3])).passed
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2])).passed
    nan = torch.tensor([1.0, math.nan])
    assert compare(nan, nan.clone()).passed
    assert not compare(torch.tensor([math.nan, 1.0]), nan).passed


def test_without_a_reference_only_the_floor_decides():
    x = torch.randn(100)
    c = compare(x * 1.01, x, None)
    assert not c.passed and "noise floor" in c.detail


def test_digest_is_bit_exact_and_layout_free():
    x = torch.randn(4, 5)
    assert accuracy.digest(x) == accuracy.digest(x.t().contiguous().t())
    assert accuracy.digest(x) != accuracy.digest(x.clone().view(5, 4))
    y = x.clone()
    y[0, 0] = torch.nextafter(y[0, 0], torch.tensor(10.0))
    assert accuracy.digest(x) != accuracy.digest(y)


@pytest.mark.parametrize("t", [torch.randn(8, 128, 1024), torch.randn(8, 1024, 128).transpose(1, 2),
                               torch.randn(1024).expand(8, 128, 1024), torch.tensor(2.0)])
def test_sampled_summary_is_small_and_deterministic(t):
    a, b = accuracy.sampled_summary(t), accuracy.sampled_summary(t.clone().as_strided(t.shape, t.stride()))
    assert a == b and a.shape == list(t.shape)
    if t.numel() <= accuracy.SAMPLE:
        assert a.sum == pytest.approx(float(t.double().sum()))


def _noise_gradient(dtype, split=False):
    # The gradient of sum(layer_norm(x @ w)) is zero in exact arithmetic: float32 gives noise,
    # and another summation order (split) other noise.
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    wd = w.to(dtype).requires_grad_(True)
    h = x[:, :32] @ wd[:32] + x[:, 32:] @ wd[32:] if split else x @ wd
    (1000 * torch.nn.functional.layer_norm(h, (64,))).sum().backward()  # noise over the absolute floor
    return wd.grad


@pytest.fixture(scope="module")
def noise():
    ref, eager, graph = (_noise_gradient(torch.float64), _noise_gradient(torch.float32),
                         _noise_gradient(torch.float32, split=True))
    assert accuracy._rms(ref) <= accuracy.rmse(eager, ref)  # eager has no correct digit
    assert not accuracy.exact_equal(graph, eager)  # and the graph's noise is another
    return ref, eager, graph


def test_a_value_zero_in_exact_arithmetic_passes_within_eagers_own_noise(noise):
    ref, eager, graph = noise
    c = compare(graph, eager, lambda: ref, what="gradient of w")
    assert c.passed and c.method == "fp64" and c.detail == accuracy.WITHIN_NOISE
    assert c.error <= c.bound == pytest.approx(accuracy.NOISE_MULTIPLIER * c.eager_error
                                               + accuracy.floor(eager))


@pytest.mark.parametrize("garbage", ["1e6 everywhere", "N(0,1) noise", "-1000x eager", "100x eager"])
def test_garbage_where_eager_has_no_correct_digit_fails(noise, garbage):
    ref, eager, _ = noise
    actual = {"1e6 everywhere": torch.full_like(eager, 1e6),
              "N(0,1) noise": torch.randn(eager.shape, generator=torch.Generator().manual_seed(2)),
              "-1000x eager": -1000 * eager, "100x eager": 100 * eager}[garbage]
    c = compare(actual, eager, lambda: ref, what="gradient of w")
    assert not c.passed and c.method == "fp64", c
    assert c.line().startswith("gradient of w: RMS error ") and "against the float64 eager model, over" in c.line()


def test_a_small_but_real_value_is_still_checked():
    ref = torch.full((100,), 1e-3, dtype=torch.float64)
    eager = ref.float() + 1e-9
    c = compare(eager * 1.5, eager, lambda: ref)
    assert not c.passed and c.method == "fp64"


# A depthwise convolution's activation scale before a batch norm (PP-LCNet's learnable affine
# block): its gradient is near zero in exact arithmetic, every float32 value of it rounding
# noise, and a graph's noise (the batch norm decomposed) lands within eager's about 19 times in 20.
# The 20th is where eager's one draw happened to be small: more samples of eager's noise (on
# inputs nudged by one ulp) give a steadier scale, and a fault of the same size is still caught.


def _scale_gradient(seed, dtype, decomposed=False, nudge=0):
    from aotpipe.models.eager import nudge as nudge_one_ulp

    g = torch.Generator().manual_seed(seed)
    x, w, t = torch.randn(4, 8, 12, 12, generator=g), torch.randn(8, 1, 3, 3, generator=g), \
        torch.randn(4, 8, 12, 12, generator=g)
    if nudge:
        n = torch.Generator().manual_seed(nudge)
        x, w, t = (nudge_one_ulp(v, n) for v in (x, w, t))
    x, w, t = (v.to(dtype) for v in (x, w, t))
    s = torch.tensor(1.0, dtype=dtype, requires_grad=True)
    y = s * torch.nn.functional.conv2d(x, w, padding=1, groups=8)
    if decomposed:
        mean = y.mean((0, 2, 3), keepdim=True)
        z = (y - mean) * torch.rsqrt((y - mean).pow(2).mean((0, 2, 3), keepdim=True) + 1e-5)
    else:
        z = torch.nn.functional.batch_norm(y, None, None, training=True)
    (z * t).sum().backward()
    return s.grad.detach()


@pytest.mark.parametrize("seed,taken", [(21, 2), (985, 3)])
def test_a_scale_gradient_at_the_edge_of_one_noise_sample_passes_on_more_samples(seed, taken):
    ref, eager, graph = (_scale_gradient(seed, torch.float64), _scale_gradient(seed, torch.float32),
                         _scale_gradient(seed, torch.float32, decomposed=True))
    samples = [lambda k=k: _scale_gradient(seed, torch.float32, nudge=k) for k in (1, 2, 3)]
    one = compare(graph, eager, lambda: ref, what="gradient of scale")
    assert not one.passed and one.ratio > 13  # one sample: eager's error happened to be tiny
    c = compare(graph, eager, lambda: ref, what="gradient of scale", samples=samples)
    assert c.passed and c.method == "fp64" and c.eager_error > one.eager_error
    assert c.detail.endswith(accuracy.MORE_SAMPLES.format(n=taken)), c.detail


def test_a_fault_of_the_same_size_is_still_caught_with_every_sample():
    seed = 21
    ref, eager = _scale_gradient(seed, torch.float64), _scale_gradient(seed, torch.float32)
    samples = [_scale_gradient(seed, torch.float32, nudge=k) for k in (1, 2, 3)]
    noise = max(accuracy.rmse(s, ref) for s in [eager, *samples])
    wrong = ref.float() + 25 * noise  # as far off as the honest graph was from eager's lucky draw
    c = compare(wrong, eager, lambda: ref, what="gradient of scale", samples=samples)
    assert not c.passed and c.eager_error == pytest.approx(noise)
    assert c.line().startswith("gradient of scale: RMS error ") and "the largest of 4 samples" in c.line(), c.line()


def test_further_noise_samples_are_only_taken_while_the_rule_fails():
    ref, eager, graph = (_scale_gradient(0, torch.float64), _scale_gradient(0, torch.float32),
                         _scale_gradient(0, torch.float32, decomposed=True))
    c = compare(graph, eager, lambda: ref, samples=[_never, _never])
    assert c.passed and "samples" not in (c.detail or "")


def test_a_nudged_eager_run_moves_every_float_input_parameter_and_buffer_by_one_ulp():
    from aotpipe.models.eager import EagerReference

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    x, ids = torch.randn(5, 4), torch.arange(5)
    seen = {}

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x, ids):
            seen["x"], seen["ids"] = x.detach().clone(), ids.clone()
            seen["w"] = self.m[0].weight.detach().clone()
            return self.m(x)

    x0, w0 = x.clone(), model[0].weight.detach().clone()
    ref = EagerReference(Spy(), (x, ids), {})
    plain = ref.run("training")
    first = dict(seen)
    nudged = ref.run("training", nudged=1)
    ulp = torch.nextafter(x, torch.full_like(x, math.inf)) - x
    assert torch.equal(first["x"], x) and torch.equal(seen["ids"], ids)  # integers as they are
    moved = (seen["x"] - x).abs()
    assert bool((moved > 0).all()) and bool((moved <= ulp.abs() * 1.0001 + 1e-45).all())
    assert bool(((seen["w"] - model[0].weight).abs() > 0).all())
    assert not torch.equal(plain.loss, nudged.loss)
    again = EagerReference(Spy(), (x, ids), {}).run("training", nudged=1)
    assert torch.equal(again.loss, nudged.loss)  # seeded: the same sample each time
    assert torch.equal(model[0].weight, w0) and torch.equal(x, x0)  # the originals untouched
