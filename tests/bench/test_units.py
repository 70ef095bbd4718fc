"""The bench's small decisions at their bounds: GraphNet's tolerance level per dtype, the median
and its interval, the scores, the second noise sample's sums and the second chance it gives."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.corpus.bench.graph import GraphResult, _median_iqr, graphnet_tolerance, judge, median_interval
from aotpipe.corpus.bench.noise import REORDERED, sequential_run, sequential_sum, sequential_twin
from aotpipe.corpus.bench.scores import geomean, graphnet_scores, score, scores


def full(v: float, dtype=torch.float32) -> torch.Tensor:
    return torch.full((4,), v, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype, level_abs, level_rel", [(torch.float64, -6, -6), (torch.float16, -2, -3),
                                                         (torch.bfloat16, -2, -5)])
def test_graphnet_levels_follow_its_per_dtype_exponents(dtype, level_abs, level_rel):
    # atol 10**(t * a) against zeros; rtol 10**(t * r) against large values (GraphNet's exponents:
    # float64 7/5 both, float16 3/5 and 1, bfloat16 1.796/5 and 1)
    if dtype is torch.float64:
        off, big, rel = 10 ** -9.5, 1e8, 1 + 10 ** -9.5
        assert graphnet_tolerance([full(off, dtype)], [full(0.0, dtype)]) == level_abs
        assert graphnet_tolerance([full(big, dtype) * rel], [full(big, dtype)]) == level_rel
    else:
        assert graphnet_tolerance([full(10 ** -2.5, dtype)], [full(0.0, dtype)]) == level_abs
        assert graphnet_tolerance([full(1000.0, dtype) + 8], [full(1000.0, dtype)]) == level_rel


def test_graphnet_level_of_several_outputs_is_the_worst_and_mismatches_have_none():
    e = torch.ones(100)
    assert graphnet_tolerance([], []) == -10
    assert graphnet_tolerance([e, e + 1e-3], [e, e]) == -3
    assert graphnet_tolerance([e + 1e-3, e], [e, e]) == -3
    assert graphnet_tolerance([e[:50]], [e]) is None
    assert graphnet_tolerance([e.double()], [e]) is None
    assert graphnet_tolerance([3, e], [3, e]) == -10 and graphnet_tolerance([3], [4]) is None
    assert graphnet_tolerance([None], [e]) is None
    nan = torch.tensor([1.0, float("nan")])
    assert graphnet_tolerance([nan.clone()], [nan]) == -10  # NaN where eager has NaN
    assert graphnet_tolerance([torch.tensor([True])], [torch.tensor([True])]) == -10


def test_the_median_and_iqr_of_rounds():
    assert _median_iqr([4.0, 1.0, 3.0, 2.0]) == (2.5, 1.5)  # inclusive quartiles 1.75 .. 3.25
    assert _median_iqr([1.0, 3.0]) == (2.0, 1.0)
    assert _median_iqr([5.0]) == (5.0, 0.0)


def test_the_median_interval_of_100_and_of_6_rounds():
    # the textbook 95% ranks for n = 100: x(40) .. x(61); for 6: P(0) = 1.6% fits, P(<= 1) = 11% not
    assert median_interval([float(x) for x in range(100)]) == (39.0, 60.0)
    assert median_interval([float(x) for x in range(6)]) == (0.0, 5.0)
    assert median_interval([float(x) for x in range(14)]) == (2.0, 11.0)


def res(status: str, speedup=None, t=None, kind="inference", verdict="") -> GraphResult:
    return GraphResult("m", "g", kind, status, "", speedup=speedup, graphnet_t=t, verdict=verdict, compile_s=1.0)


def test_graphnet_scores_count_each_failure_kind_from_its_level_and_a_correct_graph_from_its_own():
    for status in ("compile_error", "runtime_error", "timeout", "crashed"):
        s, es = graphnet_scores([res(status, speedup=2.0, t=-10)])
        assert s[4] == pytest.approx(0.1) and es[2] == pytest.approx(0.1) and es[3] == pytest.approx(1.0), status
    s, es = graphnet_scores([res("fail_accuracy", speedup=2.0, t=None)])  # not allclose at any t: b, 1 from t = 1
    assert s[4] == pytest.approx(0.1) and es[0] == pytest.approx(0.1) and es[1] == pytest.approx(1.0)
    s, es = graphnet_scores([res("pass", speedup=2.0, t=-3)])  # correct from its level on, just at it
    assert s[-4] == pytest.approx(0.1) and s[-3] == pytest.approx(2.0) and es[1] == pytest.approx(2.0)
    s, es = graphnet_scores([res("pass", speedup=0.5, t=2)])  # not correct at t = 1: ES counts it as tolerated
    assert s[1] == pytest.approx(0.1) and es[1] == pytest.approx(1.0) and s[2] == pytest.approx(0.5)
    s, es = graphnet_scores([res("pass", speedup=None, t=-10)])  # not timed: never counted correct
    assert s[0] == pytest.approx(0.1) and es[1] == pytest.approx(1.0)
    s, es = graphnet_scores([res("skipped", speedup=2.0, t=-10)])
    assert s[0] is None and es[0] is None


def test_geomean_leaves_out_what_has_no_logarithm():
    assert geomean([2.0, 8.0, None, 0.0, -1.0, math.inf]) == pytest.approx(4.0)
    assert geomean([0.0]) is None and geomean([]) is None


def test_score_counts_skipped_graphs_nowhere_but_by_status():
    s = score([res("skipped"), res("skipped")])
    assert (s.graphs, s.passed, s.pass_rate, s.geomean_speedup) == (0, 0, None, None)
    assert s.by_status == {"skipped": 2} and s.compile_s == 2.0
    s = score([res("pass", 2.0, -6, verdict="faster"), res("pass", 0.5, -6, verdict="slower")])
    assert s.verdicts == {"faster": 1, "within noise": 0, "slower": 1}
    assert s.s_t == graphnet_scores([res("pass", 2.0, -6), res("pass", 0.5, -6)])[0] and s.s_t[0] == pytest.approx(1)
    assert s.es_t[1] == pytest.approx(1.0)
    assert s.to_json()["s_t"]["-6"] == pytest.approx(1.0) and set(s.to_json()["es_t"]) == {str(t) for t in range(-10, 5)}


def test_scores_are_per_kind_in_pipeline_order_then_all():
    rs = [res("pass", 2.0, -6, kind="joint"), res("fail_accuracy", kind="inference"), res("pass", 1.0, -6,
                                                                                          kind="backward"),
          res("pass", 1.0, -6, kind="other"), res("pass", 1.0, -6, kind="forward")]
    out = scores(rs)
    assert list(out) == ["inference", "forward", "backward", "joint", "other", "all"]
    assert out["all"].graphs == 5 and out["inference"].passed == 0 and out["joint"].geomean_speedup == 2.0


def test_sequential_sum_falls_back_to_aten_where_it_has_no_order_to_change():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    for args, kw in (((torch.arange(6).reshape(2, 3), [1]), {}), ((torch.tensor(2.5), None), {}),
                     ((torch.zeros(0, 3), [0]), {}), ((x, [1]), {"keepdim": True, "dtype": torch.float64}),
                     ((x.to(torch.int32), [0]), {"dtype": torch.int64}),
                     ((torch.tensor(2.5), None), {"dtype": torch.float64}), ((torch.zeros(0, 3), [0]), {"keepdim": True})):
        got = sequential_sum(*args, **kw)
        want = torch.sum(args[0], dim=args[1] if args[1] else list(range(args[0].dim())), **kw)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), (args, kw)
    assert torch.equal(sequential_sum(torch.zeros(0, 3), [0], mean=True).isnan(), torch.ones(3, dtype=torch.bool))
    assert sequential_sum(x, [1], keepdim=True).shape == (3, 1)
    assert sequential_sum(x, [-1]).shape == (3,) and sequential_sum(x, None).shape == ()
    # a half type is accumulated in float32, as ATen accumulates it, and given back in its own type
    h = torch.full((4096,), 0.1, dtype=torch.float16)
    assert sequential_sum(h, None).dtype == torch.float16
    assert float(sequential_sum(h, None)) == pytest.approx(409.5, rel=1e-3)


def test_the_twin_graph_sums_sequentially_and_shares_the_rest():
    def f(x, w):
        return (x * w).sum([0, 1]), x.sum(), x.mean([1], keepdim=True), x.mean(), torch.relu(x)

    x = (1.0 + 0.1 * torch.rand(1 << 12, 4, generator=torch.Generator().manual_seed(0)))
    w = torch.ones(1 << 12, 4)
    gm = make_fx(f)(x, w)
    twin = sequential_twin(gm)
    out = twin(x, w)
    assert torch.equal(out[0], sequential_sum(x * w, [0, 1])) and torch.equal(out[1], sequential_sum(x, None))
    assert torch.equal(out[2], sequential_sum(x, [1], keepdim=True, mean=True))
    assert torch.equal(out[3], sequential_sum(x, None, mean=True)) and torch.equal(out[4], torch.relu(x))
    assert not torch.equal(out[1], x.sum())  # ATen's order is another
    assert torch.equal(gm(x, w)[1], x.sum())  # the loaded graph is left as it was
    run = sequential_run(gm, [x, w])
    assert all(torch.equal(a, b) for a, b in zip(run, out))
    assert sequential_run(torch.nn.Identity(), [x]) is None
    assert sequential_run(make_fx(lambda x: x + 1)(x), [x]) is None


def test_the_second_chance_is_taken_only_by_an_fp64_failure_and_says_which_floor_passed_it():
    exact = torch.full((4096,), 0.5, dtype=torch.float64)
    eager = (exact + 1e-7).float()
    backend = (exact + 1e-5).float()
    c, by_seq = judge(backend, eager, lambda: exact, lambda: backend.clone(), "output 3")
    assert c.passed and by_seq and c.what == "output 3" and c.method == "floor"
    assert c.detail.startswith("within the float-noise floor ") and "of float32 summed sequentially" in c.detail
    c, by_seq = judge(backend, eager, lambda: exact, lambda: None, "output 3")  # no second sample
    assert not c.passed and not by_seq and "summed sequentially" not in c.detail
    c, by_seq = judge(backend, eager, None, lambda: backend.clone(), "output 3")  # no fp64: the floor alone
    assert not c.passed and not by_seq and c.method == "floor"
    c, by_seq = judge(eager.clone(), eager, lambda: exact, lambda: backend, "output 3")
    assert c.passed and not by_seq and c.method == "floor" and c.what == "output 3"
    bad = torch.tensor([1.0, float("nan")])
    c, by_seq = judge(bad, torch.tensor([1.0, 2.0]), lambda: exact[:2], lambda: bad, "o")
    assert not c.passed and not by_seq and c.method == "exact"


def test_the_reordered_ops_take_atens_arguments_and_give_atens_shapes_and_dtypes():
    aten = torch.ops.aten
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1))
    cases = [
        (aten.sum.dim_IntList, (x, [1], True), {"dtype": torch.float64}, sequential_sum(x, [1], True, torch.float64)),
        (aten.sum.dim_IntList, (x, [1]), {}, sequential_sum(x, [1])),
        (aten.sum.default, (x,), {"dtype": torch.float64}, sequential_sum(x, None, False, torch.float64)),
        (aten.sum.default, (x,), {}, sequential_sum(x, None)),
        (aten.mean.dim, (x, [2], True), {"dtype": torch.float64}, sequential_sum(x, [2], True, torch.float64, mean=True)),
        (aten.mean.dim, (x, [2]), {}, sequential_sum(x, [2], mean=True)),
        (aten.mean.default, (x,), {"dtype": torch.float64}, sequential_sum(x, None, False, torch.float64, mean=True)),
        (aten.mean.default, (x,), {}, sequential_sum(x, None, mean=True)),
    ]
    for op, args, kw, want in cases:
        got = REORDERED[op](*args, **kw)
        ref = op(*args, **kw)
        assert torch.equal(got, want), op
        assert got.dtype == ref.dtype and got.shape == ref.shape and torch.allclose(got, ref, rtol=1e-5), op
