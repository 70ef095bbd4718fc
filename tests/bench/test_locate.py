"""bench --locate's bisection to the first faulty node, on small inline graphs compiled with
the planted backends (tests/bench/backends.py); each of locate.py's decisions at its bounds, and
locate_graph on the small committed mlp artefact. All in-process: no worker."""

from __future__ import annotations

import json
import math
import re
import types
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.corpus.bench import locate as locate_mod
from aotpipe.corpus.bench.backends import Backend
from aotpipe.corpus.bench.graph import judge
from aotpipe.corpus.bench.locate import (
    Located,
    References,
    _check_prefix,
    _describe,
    _fresh,
    _kept_values,
    _safe,
    _values,
    first_faulty_node,
    module_path,
    node_check,
    op_name,
    own_scale,
    prefix,
)
from aotpipe.corpus.bench.minimize import Minimized

PLANTED = "tests.bench.backends"


def locate(f, *inputs, backend: str) -> Located:
    gm = make_fx(f)(*inputs)
    b = Backend(f"{PLANTED}:{backend}")
    res = Located("m", "inference", False, "")
    found = first_faulty_node(res, gm, list(inputs), ["user"] * len(inputs), b, b.resolve())
    assert (found is not None) == res.found
    if found is not None:
        assert found[0].name == res.node
    return res


def tiny_gradient(x):
    g = x * 1e-8  # node mul: a gradient of about 1e-8
    y = g * 1e8  # node mul_1: back to about 1
    return torch.relu(y) + 1


X = torch.randn(64, generator=torch.Generator().manual_seed(0))


def test_locate_names_a_tiny_value_off_by_100_percent_not_the_later_node_where_its_error_grew():
    res = locate(tiny_gradient, X, backend="first_mul_doubled")
    assert res.found and res.node == "mul" and res.op == "aten.mul.Tensor", res.lines()
    assert res.position == "1 of 4" and res.output_shape == "float32[64]" and res.input_shapes == ["float32[64]", "1e-08"]
    # the figures at the value's own scale (about 1e-8), the rule at its scale named
    assert res.reason.startswith("node mul: RMS error 1.05e-08 against the float64 eager model, over 1.08e-13"), res.reason
    assert "the whole graph's rule at the value's own scale (times 2**27" in res.reason, res.reason
    # The whole graph's rule alone passes that node: its absolute floor (1e-7) is ten times the value.
    e = X * 1e-8
    c, _ = judge(e * 2, e, X.double() * 1e-8, None, "node mul")
    assert c.passed and c.method == "floor"


def tiny_output(x):
    g = x * 1e-8  # node mul, an output of the graph
    return g, g.neg()


@pytest.mark.parametrize("backend, fails", [("first_mul_off_2e_5", True), ("first_mul_off_5e_6", False)])
def test_a_tiny_value_is_held_to_the_float32_floor_relative_to_itself(backend, fails):
    # just outside (2e-5 relative) and just inside (5e-6) the float32 floor of 1e-5 of the value's RMS
    res = locate(tiny_output, X, backend=backend)
    if fails:
        assert res.found and res.node == "mul", res.lines()
    else:
        assert not res.found and res.prefixes_tried == 1
        assert res.reason == "the graph's prefixes all pass: the fault needs the whole graph (its outputs as one)"


def test_node_check_scales_by_a_power_of_two_and_gives_the_figures_back_at_the_values_scale():
    e = X * 1e-8
    ref = X.double() * 1e-8
    assert own_scale(e) == 27 and 1 <= float((e * 2 ** 27).pow(2).mean().sqrt()) < 2
    assert own_scale(X) == 0 and own_scale(X.half() * 1e-3) == 0 and own_scale(torch.zeros(3)) == 0
    assert own_scale(torch.arange(3)) == 0 and own_scale(1e-8) == 0
    assert own_scale(torch.full((4,), 1e-35)) == 100  # capped: 2**116 would overflow float32's scalar
    c = node_check(e * 2, e, lambda: ref, None, "node g")
    assert not c.passed and c.method == "fp64"
    assert c.error == pytest.approx(float(e.double().pow(2).mean().sqrt()), rel=1e-6)
    assert c.bound < 1e-12 and c.eager_error < 1e-14
    same = node_check(e.clone(), e, lambda: ref, None, "node g")
    assert same.passed and same.error == 0.0 and same.bound == pytest.approx(1e-5 * float(e.pow(2).mean().sqrt()),
                                                                            rel=0.2)
    # a value of RMS 1 or more: exactly the whole graph's rule
    big = X * 4
    c, _ = judge(big * (1 + 3e-5), big, X.double() * 4, None, "n")
    n = node_check(big * (1 + 3e-5), big, lambda: X.double() * 4, None, "n")
    assert (n.passed, n.error, n.bound, n.detail) == (c.passed, c.error, c.bound, c.detail)


def chain(before: int, after: int):
    """`before` negations, the one multiplication (node mul), `after` negations."""
    def f(x):
        y = x
        for _ in range(before):
            y = torch.neg(y)
        y = y * 3.0
        for _ in range(after):
            y = torch.neg(y)
        return y
    return f


@pytest.mark.parametrize("before, after", [(0, 0), (0, 4), (4, 0), (2, 3), (3, 2)])
def test_bisection_names_the_faulty_node_wherever_it_is(before, after):
    n = before + after + 1
    res = locate(chain(before, after), X, backend="first_mul_doubled")
    assert res.found and res.node == "mul" and res.position == f"{before + 1} of {n}", res.lines()
    assert 1 <= res.prefixes_tried <= 1 + math.ceil(math.log2(n))  # the last prefix, then halving


def test_a_graph_whose_prefixes_pass_is_not_found_saying_so():
    res = locate(chain(1, 1), X, backend="first_add_off")  # no add to break
    assert not res.found and res.node is None and res.prefixes_tried == 1
    [line] = res.lines()
    assert line == ("located m inference: no faulty node found (the graph's prefixes all pass: the fault needs "
                    "the whole graph (its outputs as one))")


def test_a_prefix_returns_its_last_node_and_every_value_a_later_node_uses():
    def f(x, unused):
        a = x + 1
        b = a * 2
        c = b - a  # uses a again after b
        return c.neg()
    gm = make_fx(f)(X, X.clone())
    names = {n.name: n for n in gm.graph.nodes}
    tensors = set(names)
    pm = prefix(gm, names["mul"], tensors)
    assert [a.name for a in pm.graph.output_node().args[0]] == ["add", "mul"]
    assert [n.name for n in pm.graph.nodes if n.op == "placeholder"] == ["x_1", "unused_1"]
    pm = prefix(gm, names["mul"], tensors, drop_unused=True)
    assert [n.name for n in pm.graph.nodes if n.op == "placeholder"] == ["x_1"]
    pm = prefix(gm, names["sub"], tensors)
    assert [a.name for a in pm.graph.output_node().args[0]] == ["sub"]
    pm = prefix(gm, names["sub"], tensors - {"sub"})  # not a tensor: not returned
    assert [a.name for a in pm.graph.output_node().args[0]] == []


def test_the_lines_of_a_found_node_name_it_its_shapes_module_and_repro():
    res = Located("m", "forward", True, "node mul: RMS error 1 against ...", node="mul", op="aten.mul.Tensor",
                  input_shapes=["float32[4]", "3.0"], output_shape="float32[4]", position="2 of 5",
                  prefixes_tried=3)
    assert res.lines() == [
        "located m forward: first faulty node mul (aten.mul.Tensor), 2 of 5 tensor nodes, 3 prefixes compiled",
        "    inputs float32[4], 3.0 -> float32[4]; module unknown (the artefact records no module path)",
        "    node mul: RMS error 1 against ...",
        "    repro: not written"]
    res.repro, res.module_path, res.input_shapes = "out/r", "layers.0 (Linear)", []
    assert res.lines()[1] == "    inputs none -> float32[4]; module layers.0 (Linear)"
    assert res.lines()[3] == "    repro: out/r"


# ---- what the bisection names: each value's description, the op, the module -------------------------------------

def test_a_value_is_described_by_its_dtype_and_shape_a_number_by_itself_anything_else_by_its_type():
    assert _describe(torch.zeros(2, 3, dtype=torch.float64)) == "float64[2, 3]"
    assert _describe(torch.zeros((), dtype=torch.int64)) == "int64[]"
    assert [_describe(v) for v in (3, 1e-08, True)] == ["3", "1e-08", "True"]
    assert [_describe(v) for v in (None, torch.float32, [1])] == ["NoneType", "dtype", "list"]


class _Named:
    """A call target torch names by a method (as an OpOverloadPacket-like object does)."""
    def __init__(self, name: str):
        self._name = name

    def name(self) -> str:
        return self._name

    def __call__(self, *args):
        return None

    def __repr__(self) -> str:
        return f"<target {self._name}>"


class _Unnamed:
    name = "an attribute, not a method"

    def __call__(self, *args):
        return None

    def __repr__(self) -> str:
        return "<unnamed target>"


def _node(target, meta=None) -> torch.fx.Node:
    g = torch.fx.Graph()
    n = g.create_node("call_function", target, (), name="n")
    n.meta.update(meta or {})
    return n


def test_an_op_is_named_by_its_qualified_name_else_its_own_name_under_aten_else_its_python_name():
    assert op_name(_node(torch.ops.aten.mul.Tensor)) == "aten.mul.Tensor"
    assert op_name(_node(_Named("my_op"))) == "aten.my_op"
    assert op_name(_node(_Named("aten::add"))) == "aten::add"  # already qualified: kept
    assert op_name(_node(_Named("prims.sum"))) == "prims.sum"
    assert op_name(_node(math.sqrt)) == "sqrt"
    assert op_name(_node(_Unnamed())) == "<unnamed target>"


def test_a_nodes_module_is_its_recorded_origin_else_the_innermost_of_its_module_stack():
    from aotpipe.artifact.provenance import ORIGIN_KEY
    from aotpipe.format.records import NodeOrigin
    mul = torch.ops.aten.mul.Tensor

    def origin(**kw):
        return _node(mul, {ORIGIN_KEY: NodeOrigin(**kw)})

    assert module_path(origin(module="layers.0", module_class="torch.nn.Linear", source="m.py:3")) == \
        "layers.0 (torch.nn.Linear), m.py:3"
    assert module_path(origin(module="", module_class="M")) == "the model itself (M)"
    assert module_path(origin(module="head")) == "head"
    # no module in the origin: the graph's own stack, its innermost (last) module's path
    stack = {"a": ("outer", "A"), "b": ("middle", "B"), "c": ("inner", "C")}
    n = _node(mul, {ORIGIN_KEY: NodeOrigin(source="m.py:3"), "nn_module_stack": stack})
    assert module_path(n) == "inner"
    assert module_path(_node(mul, {ORIGIN_KEY: NodeOrigin(), "nn_module_stack": {"a": ["inner", "C"]}})) is None
    assert module_path(_node(mul, {ORIGIN_KEY: NodeOrigin(), "nn_module_stack": {}})) is None
    assert module_path(_node(mul)) is None  # nothing recorded
    assert module_path(_node(mul, {"nn_module_stack": {"a": ("blocks.1", "torch.nn.ReLU")}})) == \
        "blocks.1 (torch.nn.ReLU)"  # torch's own stack, through node_origin


def test_one_eager_run_tells_each_node_a_tensor_or_not_with_its_description():
    def f(x):
        m = torch.ops.aten.max.dim(x, 0)  # a tuple, then its two tensors
        return m[0] * 2, m[1]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    gm = make_fx(f)(x)
    assert _values(gm, [x]) == {"x_1": (True, "float32[3, 4]"), "max_1": (False, "tuple"),
                                "getitem": (True, "float32[4]"), "getitem_1": (True, "int64[4]"),
                                "mul": (True, "float32[4]"), "output": (False, "tuple")}


# ---- prefixes ------------------------------------------------------------------------------------------------------

def test_a_prefix_returns_no_input_or_constant_and_up_to_the_output_node_is_the_whole_graph():
    root = torch.nn.Module()
    root.register_buffer("c", torch.ones(4))
    g = torch.fx.Graph()
    x, c = g.placeholder("x"), g.get_attr("c")
    b = g.call_function(torch.mul, (g.call_function(torch.add, (x, c)), 2))
    g.output(g.call_function(torch.sub, (g.call_function(torch.sub, (b, x)), c)))  # x and c used again after b
    gm = torch.fx.GraphModule(root, g)
    names = {n.name: n for n in gm.graph.nodes}
    assert names["c"].op == "get_attr"
    tensors = set(names) - {"output"}
    pm = prefix(gm, names["mul"], tensors)
    assert [a.name for a in pm.graph.output_node().args[0]] == ["mul"]  # x and c leave it, but are no values of it
    assert [n.name for n in pm.graph.nodes] == ["x", "c", "add", "mul", "output"]
    pm = prefix(gm, names["add"], tensors)
    assert [n.name for n in pm.graph.nodes] == ["x", "c", "add", "output"]
    whole = prefix(gm, names["output"], tensors)
    assert [n.name for n in whole.graph.nodes] == [n.name for n in gm.graph.nodes]
    assert [a.name for a in whole.graph.output_node().args[0]] == ["sub_1"]
    x = torch.randn(4)
    assert torch.equal(whole(x)[0], gm(x))
    with_output = prefix(gm, names["output"], tensors | {"output"})  # the output node's value is sub_1's
    assert [a.name for a in with_output.graph.output_node().args[0]] == ["sub_1"]


# ---- the values kept from one run of the whole graph ---------------------------------------------------------------

def chain_sum(x):
    a = x + 1  # node add: 16 bytes for float32[4], 32 in float64
    s = a.sum()  # node sum_1: 4 bytes, 8 in float64
    return a * s  # node mul: 16 bytes, 32 in float64


X4 = torch.tensor([0.5, -1.0, 2.0, 0.25])


def test_kept_values_are_copies_of_the_named_tensors_up_to_the_budget_in_graph_order():
    gm = make_fx(chain_sum)(X4)
    every = {"x_1", "add", "sum_1", "mul"}
    got = _kept_values(gm, [X4.clone()], every - {"x_1"}, 1 << 20)
    assert set(got) == {"add", "sum_1", "mul"}
    assert torch.equal(got["add"], X4 + 1) and torch.equal(got["mul"], (X4 + 1) * (X4 + 1).sum())
    # the budget: each value kept while the bytes so far (with it) are at most the budget
    assert set(_kept_values(gm, [X4.clone()], every, 16)) == {"x_1"}
    assert set(_kept_values(gm, [X4.clone()], every, 32)) == {"x_1", "add"}
    assert set(_kept_values(gm, [X4.clone()], every, 31)) == {"x_1", "sum_1"}  # add past it, sum_1 within
    assert set(_kept_values(gm, [X4.clone()], every, 36)) == {"x_1", "add", "sum_1"}
    assert set(_kept_values(gm, [X4.clone()], {"add", "sum_1", "mul"}, 35)) == {"add", "sum_1"}
    assert set(_kept_values(gm, [X4.clone()], {"add", "sum_1", "mul"}, 36)) == {"add", "sum_1", "mul"}
    assert _kept_values(gm, [X4.clone()], set(), 1 << 20) == {}


def test_a_kept_value_is_a_copy_a_later_in_place_op_does_not_change():
    def f(x):
        y = x + 1
        y.mul_(2)
        return y
    gm = torch.fx.symbolic_trace(f)
    got = _kept_values(gm, [X4.clone()], {"add"}, 1 << 20)
    assert torch.equal(got["add"], X4 + 1)


def test_kept_values_run_the_graph_its_run_guard_makes_and_none_from_a_guard_that_makes_no_fx_graph():
    from aotpipe.runtime.execution import RUN_GUARD
    gm = make_fx(chain_sum)(X4)
    doubled = make_fx(lambda x: chain_sum(x * 2))(X4)
    seen = []

    def guard(module, inputs):
        seen.append(inputs)
        return doubled if module is gm else module

    gm.meta[RUN_GUARD] = guard
    got = _kept_values(gm, [X4.clone()], {"add"}, 1 << 20)
    assert len(seen) == 1 and torch.equal(seen[0][0], X4) and torch.equal(got["add"], X4 * 2 + 1)
    gm.meta[RUN_GUARD] = lambda module, inputs: module.forward
    assert _kept_values(gm, [X4.clone()], {"add"}, 1 << 20) == {}


def _only_float32(x):
    if x.dtype != torch.float32:
        raise TypeError("float32 only")
    return x


torch.fx.wrap("_only_float32")


def test_references_are_each_one_run_of_the_whole_graph_made_when_first_needed(monkeypatch):
    monkeypatch.setattr(locate_mod, "KEEP_BYTES", 24)  # float32: add and sum_1 (20 bytes), float64 up to 48: the same
    gm = make_fx(chain_sum)(X4)
    every = {"x_1", "add", "sum_1", "mul"}
    refs = References(gm, [X4.clone()], every - {"x_1"})
    assert refs.runs == {"f32": 0, "f64": 0, "seq": 0}
    assert set(refs.f32()) == {"add", "sum_1"} and refs.f32()["add"].dtype == torch.float32
    assert set(refs.f64()) == {"add", "sum_1"} and refs.f64()["add"].dtype == torch.float64
    assert set(refs.seq()) == {"add", "sum_1"}
    assert refs.runs == {"f32": 1, "f64": 1, "seq": 1}
    names = {n.name: n for n in gm.graph.nodes}
    kept = prefix(gm, names["sum_1"], every)
    assert [a.name for a in kept.graph.output_node().args[0]] == ["add", "sum_1"]
    # a prefix whose values were kept is checked against them ...
    assert all(a is b for a, b in zip(refs.expected(kept, ["add", "sum_1"]), [refs.f32()["add"], refs.f32()["sum_1"]], strict=True))
    assert all(a is b for a, b in zip(refs.reference(kept, ["add", "sum_1"]), [refs.f64()["add"], refs.f64()["sum_1"]], strict=True))
    assert all(a is b for a, b in zip(refs.sequential(kept, ["add", "sum_1"]), [refs.seq()["add"], refs.seq()["sum_1"]], strict=True))
    # ... one with a value not kept runs by itself, on the graph's inputs
    whole = prefix(gm, names["mul"], every)
    expected = (X4 + 1) * (X4 + 1).sum()
    [e] = refs.expected(whole, ["mul"])
    [r] = refs.reference(whole, ["mul"])
    [s] = refs.sequential(whole, ["mul"])
    assert torch.equal(e, expected) and r.dtype == torch.float64 and torch.allclose(r, expected.double())
    assert torch.allclose(s, expected)
    assert refs.runs == {"f32": 1, "f64": 1, "seq": 1}  # the whole graph ran once for each


def test_float64_references_keep_twice_the_bytes_of_float32(monkeypatch):
    monkeypatch.setattr(locate_mod, "KEEP_BYTES", 36)  # float32: all three (36 bytes); float64: 72 of 72
    refs = References(make_fx(chain_sum)(X4), [X4.clone()], {"add", "sum_1", "mul"})
    assert set(refs.f32()) == set(refs.f64()) == {"add", "sum_1", "mul"}
    monkeypatch.setattr(locate_mod, "KEEP_BYTES", 35)  # float32 and float64 both leave mul out
    refs = References(make_fx(chain_sum)(X4), [X4.clone()], {"add", "sum_1", "mul"})
    assert set(refs.f32()) == set(refs.f64()) == {"add", "sum_1"}


def test_references_of_a_graph_that_does_not_run_in_float64_or_has_no_sum_are_none():
    def f(x):
        return _only_float32(x) * 2
    gm = torch.fx.symbolic_trace(f)
    refs = References(gm, [X4.clone()], {"x", "_only_float32", "mul"})
    pm = prefix(gm, next(n for n in gm.graph.nodes if n.name == "mul"), {"_only_float32", "mul"})
    assert refs.reference(pm, ["mul"]) is None and refs.f64() is None  # the floor alone decides
    assert refs.sequential(pm, ["mul"]) is None and refs.seq() is None  # no sum: no second sample
    assert torch.equal(refs.expected(pm, ["mul"])[0], X4 * 2)
    assert refs.runs == {"f32": 1, "f64": 1, "seq": 1}


def test_the_second_sample_runs_the_graph_its_run_guard_makes_on_its_inputs():
    from aotpipe.runtime.execution import RUN_GUARD
    gm = make_fx(chain_sum)(X4)
    seen = []

    def guard(module, inputs):
        seen.append(inputs)
        return module

    gm.meta[RUN_GUARD] = guard
    refs = References(gm, [X4.clone()], {"add", "sum_1", "mul"})
    assert set(refs.seq()) == {"add", "sum_1", "mul"}
    assert seen and all(isinstance(i, list) and torch.equal(i[0], X4) for i in seen)


# ---- one value judged at its own scale -----------------------------------------------------------------------------

def test_own_scale_brings_the_rms_of_the_finite_elements_into_1_to_2_of_float_and_complex_values():
    for rms, k in ((0.75, 1), (0.5, 1), (0.49, 2), (1e-3, 10), (2.0 ** -10, 10), (0.999, 1)):
        t = torch.full((8,), rms, dtype=torch.float64)
        assert own_scale(t) == k and 1 <= rms * 2 ** k < 2, (rms, own_scale(t))
    assert own_scale(torch.full((8,), 1.0)) == 0 and own_scale(torch.full((8,), 3.0)) == 0
    assert own_scale(torch.tensor([1e-3, float("inf"), float("nan"), -1e-3])) == 10  # the finite ones
    assert own_scale(torch.tensor([float("inf"), float("nan")])) == 0
    # over real and imaginary parts: RMS sqrt((1e-6 + 9e-6) / 2) = 2.2e-3, where the real parts' alone is 1e-3
    assert own_scale(torch.full((4,), 1e-3 + 3e-3j, dtype=torch.complex64)) == 9
    assert own_scale(torch.full((4,), 1e-3 + 3e-3j, dtype=torch.complex128).conj()) == 9
    assert own_scale(torch.full((4,), 1e-3, dtype=torch.bfloat16)) == 0


def _rule_at(a, e, r, s, k):
    """The whole graph's rule on the values times 2**k, its figures divided by 2**k."""
    up = 2.0 ** k
    c, _ = judge(a * up, e * up, r * up, None if s is None else (lambda: s * up), "node v")
    return c, [None if x is None else x / up for x in (c.error, c.eager_error, c.bound)]


def test_node_check_is_the_rule_on_the_values_times_exactly_2_to_the_k_and_says_so_when_it_fails():
    r = X.double() * 1e-8
    e = r.float()
    a = e * (1 + 3e-5)  # just outside the float32 floor of 1e-5 of the value
    k = own_scale(e)
    c, figures = _rule_at(a, e, r, None, k)
    n = node_check(a, e, lambda: r, None, "node v")
    assert not n.passed and n.method == c.method == "fp64" and n.what == "node v"
    assert [n.error, n.eager_error, n.bound] == figures
    assert n.detail == (f"RMS error {n.error:.3g} against the float64 eager model, over {n.bound:.3g}: the whole "
                        f"graph's rule at the value's own scale (times 2**{k}, its RMS then 1 to 2); eager float32's "
                        f"own error {n.eager_error:.3g}")
    assert n.line() == f"node v: {n.detail}"
    # without a float64 reference: the floor, against eager float32, with no eager error to name
    n = node_check(a, e, lambda: None, None, "node v")
    c, figures = _rule_at(a, e, r, None, k)
    assert not n.passed and n.method == "floor" and n.eager_error is None
    assert n.detail == (f"RMS error {n.error:.3g} against eager float32, over {n.bound:.3g}: the whole graph's rule "
                        f"at the value's own scale (times 2**{k}, its RMS then 1 to 2)")
    # a passing value keeps the rule's own (no) detail, its figures at its scale
    ok = node_check(e * (1 + 5e-6), e, lambda: r, None, "node v")
    c, figures = _rule_at(e * (1 + 5e-6), e, r, None, k)
    assert ok.passed and ok.detail is c.detail is None and [ok.error, ok.eager_error, ok.bound] == figures


@pytest.mark.parametrize("scale", [4.0, 1e-8])
def test_node_check_passes_a_value_at_the_second_samples_noise_at_any_scale(scale):
    r = X.double() * scale
    e = r.float()
    seq = (r * (1 + 1e-4)).float()  # float32 summed sequentially: 1e-4 off
    a = (r * (1 + 5e-4)).float()
    on = node_check(a, e, lambda: r, lambda: seq, "node v")
    off = node_check(a, e, lambda: r, None, "node v")
    assert on.passed and not off.passed and off.what == "node v", (on, off)
    assert "float32 summed sequentially as the scale" in on.detail


def test_node_check_at_rms_1_or_more_is_the_rule_itself_with_every_argument():
    r = X.double() * 4
    e = r.float()
    for a in (e * (1 + 3e-5), e.clone(), None, e[:3]):
        c, _ = judge(a, e, lambda: r, None, "node v")
        n = node_check(a, e, lambda: r, None, "node v")
        assert (n.passed, n.method, n.error, n.eager_error, n.bound, n.detail, n.what) == \
            (c.passed, c.method, c.error, c.eager_error, c.bound, c.detail, c.what)
    assert node_check(e * (1 + 3e-5), e, lambda: r, None, "node v").method == "fp64"


def test_a_small_value_compared_with_none_or_another_shape_fails_with_the_rules_own_line():
    e = X * 1e-8
    for a in (None, e[:3], torch.ones(64, dtype=torch.int64)):
        c, _ = judge(a, e, lambda: e.double(), None, "node v")
        n = node_check(a, e, lambda: e.double(), None, "node v")
        assert not n.passed and n.detail == c.detail and n.error is None, n


# ---- one prefix compiled and checked -------------------------------------------------------------------------------

def _backend_of(fn):
    """A planted backend given as the callable itself (first_faulty_node's `user`)."""
    return Backend("tests.bench.test_locate:inline"), fn


def _doubling_first_mul(gm, example_inputs):
    from tests.bench.backends import first_mul_doubled
    return first_mul_doubled(gm, example_inputs)


def three_wrong(x):
    m = x * 3.0  # node mul, doubled by the backend
    a = m.neg()  # node neg
    b = a.neg()  # node neg_1
    return m + a + b  # m and a used again here


@pytest.mark.parametrize("keep_bytes", [locate_mod.KEEP_BYTES, 0])  # its values kept from the whole graph's runs, or not
def test_a_prefix_fails_on_its_last_failing_value_compiled_with_the_graphs_roles(monkeypatch, keep_bytes):
    monkeypatch.setattr(locate_mod, "KEEP_BYTES", keep_bytes)
    gm = make_fx(three_wrong)(X)
    names = {n.name: n for n in gm.graph.nodes}
    tensors = set(names) - {"output"}
    refs = References(gm, [X.clone()], tensors)
    calls = []
    real = locate_mod.compile_graph

    def spy(backend, pm, args, roles, user):
        calls.append((backend, pm, args, roles, user))
        return real(backend, pm, args, roles, user)

    monkeypatch.setattr(locate_mod, "compile_graph", spy)
    backend, user = _backend_of(_doubling_first_mul)
    pm = prefix(gm, names["neg_1"], tensors)
    assert [a.name for a in pm.graph.output_node().args[0]] == ["mul", "neg", "neg_1"]  # all three wrong
    ok, line = _check_prefix(pm, refs, backend, user, ["param"])
    assert not ok and line.startswith("node neg_1: RMS error ") and "against the float64 eager model" in line, line
    [(b, p, args, roles, u)] = calls
    assert b is backend and p is pm and roles == ["param"] and u is user
    assert len(args) == 1 and torch.equal(args[0], X) and args[0] is not refs.inputs[0]
    ok, line = _check_prefix(pm, refs, Backend("eager"), None, ["user"])
    assert ok and line == ""


@pytest.mark.parametrize("keep_bytes", [locate_mod.KEEP_BYTES, 0])
def test_a_prefix_passes_by_the_second_sample_where_the_backend_sums_as_float32_sequentially(monkeypatch, keep_bytes):
    monkeypatch.setattr(locate_mod, "KEEP_BYTES", keep_bytes)
    from tests.bench.backends import sums_sequential
    g = torch.Generator().manual_seed(0)
    x = (1.0 + 0.1 * torch.rand(1, 1 << 16, 1, 1, generator=g)).transpose(0, 1).contiguous()
    gm = make_fx(lambda x: x.sum([0, 2, 3]) * 2)(x)
    names = {n.name: n for n in gm.graph.nodes}
    tensors = set(names) - {"output"}
    backend, user = _backend_of(sums_sequential)
    pm = prefix(gm, names["sum_1"], tensors)
    ok, line = _check_prefix(pm, References(gm, [x], tensors), backend, user, ["user"])
    assert ok and line == ""
    refs = References(gm, [x], tensors)
    refs.seq = lambda: None  # no second sample: eager's own error is the scale, and the sum is over it
    ok, line = _check_prefix(pm, refs, backend, user, ["user"])
    assert not ok and line.startswith("node sum_1: RMS error ")


def _returns_none(gm, example_inputs):
    n = len(gm.graph.output_node().args[0])
    return lambda *args: (None,) * n


def test_a_backend_that_returns_no_tensor_fails_the_prefix():
    gm = make_fx(tiny_output)(X)
    names = {n.name: n for n in gm.graph.nodes}
    tensors = set(names) - {"output"}
    backend, user = _backend_of(_returns_none)
    ok, line = _check_prefix(prefix(gm, names["mul"], tensors), References(gm, [X.clone()], tensors), backend, user,
                             ["user"])
    assert not ok and line == "node mul: the graph gives None, eager gives a value"


# ---- the bisection -------------------------------------------------------------------------------------------------

def locate_with(f, fn, *inputs, roles=None):
    gm = make_fx(f)(*inputs)
    backend, user = _backend_of(fn)
    res = Located("m", "inference", False, "")
    found = first_faulty_node(res, gm, list(inputs), roles or ["user"] * len(inputs), backend, user)
    return res, found, gm


def test_a_graph_that_computes_no_tensor_has_no_faulty_node():
    res, found, _ = locate_with(lambda x: x, _doubling_first_mul, X)
    assert found is None and res.found is False and res.reason == "the graph computes no tensor"
    assert res.prefixes_tried == 0 and res.node is None


def _fails_to_compile(gm, example_inputs):
    raise NotImplementedError("no lowering")


def test_prefixes_that_do_not_compile_pass_the_bisection_by():
    res, found, _ = locate_with(chain(1, 1), _fails_to_compile, X)
    assert found is None and res.found is False and res.prefixes_tried == 1
    assert res.reason == "the graph's prefixes all pass: the fault needs the whole graph (its outputs as one)"


def _compiles_only_with_a_sub(gm, example_inputs):
    if torch.ops.aten.sub.Tensor not in {n.target for n in gm.graph.nodes}:
        raise NotImplementedError("no lowering without a sub")
    return _doubling_first_mul(gm, example_inputs)


def test_the_culprit_is_the_first_prefix_that_fails_not_one_that_does_not_compile():
    def f(x):
        y = x * 3.0  # doubled, but its prefixes do not compile
        for _ in range(3):
            y = torch.neg(y)
        return y - 1
    res, found, gm = locate_with(f, _compiles_only_with_a_sub, X)
    assert res.found is True and res.node == "sub" and res.position == "5 of 5", res.lines()
    assert res.reason.startswith("node sub: RMS error ") and res.op == "aten.sub.Tensor"
    assert found[0] is next(n for n in gm.graph.nodes if n.name == "sub")
    assert found[1] == {"x_1", "mul", "neg", "neg_1", "neg_2", "sub", "output"}  # the output node's value is sub's


@pytest.mark.parametrize("before, after", [(0, 1), (1, 0), (0, 6), (6, 0), (5, 2), (1, 7)])
def test_bisection_tries_each_prefix_once_the_last_first(before, after, monkeypatch):
    tried = []
    real = locate_mod._check_prefix

    def spy(pm, *args):
        tried.append(list(pm.graph.nodes)[-2].name)
        return real(pm, *args)

    monkeypatch.setattr(locate_mod, "_check_prefix", spy)
    res, _, gm = locate_with(chain(before, after), _doubling_first_mul, X)
    n = before + after + 1
    cands = [x.name for x in gm.graph.nodes if x.op == "call_function"]
    assert res.node == "mul" and res.position == f"{before + 1} of {n}" and res.prefixes_tried == len(tried)
    assert len(set(tried)) == len(tried) and tried[0] == cands[-1]
    # what a plain bisection over [0, n - 1] probes
    lo, hi, probes = 0, n - 1, [n - 1]
    while lo < hi:
        mid = (lo + hi) // 2
        probes.append(mid)
        lo, hi = (lo, mid) if mid >= before else (mid + 1, hi)
    assert tried == [cands[i] for i in dict.fromkeys(probes)]


def test_the_culprit_is_named_with_its_inputs_shapes_and_module():
    from aotpipe.artifact.provenance import ORIGIN_KEY
    from aotpipe.format.records import NodeOrigin

    def f(x, w):
        return torch.relu(x * w)
    w = torch.randn(64, generator=torch.Generator().manual_seed(3)).double()
    gm = make_fx(f)(X, w)
    mul = next(n for n in gm.graph.nodes if n.name == "mul")
    mul.meta[ORIGIN_KEY] = NodeOrigin(module="layers.0", module_class="torch.nn.Linear")
    backend, user = _backend_of(_doubling_first_mul)
    res = Located("m", "inference", False, "")
    found = first_faulty_node(res, gm, [X, w], ["user", "param"], backend, user)
    assert found is not None and res.found is True and res.node == "mul" and res.position == "1 of 2"
    assert res.input_shapes == ["float32[64]", "float64[64]"] and res.output_shape == "float64[64]"
    assert res.module_path == "layers.0 (torch.nn.Linear)" and res.prefixes_tried == 2


# ---- the repro written for the culprit -----------------------------------------------------------------------------

def test_names_are_made_safe_for_a_folder():
    assert _safe("Xmodel/Graph v1.") == "Xmodel_Graph_v1"
    assert _safe("._a  b_.") == "a_b"
    assert _safe(" a ") == "a"
    assert _safe("//") == "graph" and _safe("") == "graph"


def test_fresh_copies_a_tensor_and_passes_anything_else():
    t = torch.ones(3)
    c = _fresh(t)
    assert c is not t and torch.equal(c, t) and c.data_ptr() != t.data_ptr()
    assert _fresh(2.5) == 2.5 and _fresh(None) is None


def _record(role, target):
    return types.SimpleNamespace(role=role, target=target)


def test_the_repro_is_the_culprits_prefix_with_its_inputs_roles_and_reference_outputs(tmp_path):
    from aotpipe.corpus.bench.graph import loaded

    aten = torch.ops.aten
    g = torch.fx.Graph()
    w, b, c, x, t, _, s = (g.placeholder(n) for n in ("w", "b", "c", "x", "t", "unused", "s"))
    y = g.call_function(aten.mul.Tensor, (x, w))
    y = g.call_function(aten.add.Tensor, (y, b))
    y = g.call_function(aten.mul.Tensor, (y, c))
    y = g.call_function(aten.add.Tensor, (y, t))
    g.output(g.call_function(aten.mul.Scalar, (y, s)))  # ((x * w + b) * c + t) * s
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(4, generator=g) for _ in range(6)] + [0.5]
    records = [_record("param", "l.w"), _record("buffer", "l.b"), _record("constant", "c0"), _record("user", "x"),
               _record("tangent", "out0"), _record("user", "unused"), _record("user", "s")]
    ga = types.SimpleNamespace(record=types.SimpleNamespace(inputs=records))
    names = {n.name: n for n in gm.graph.nodes}
    tensors = set(names) - {"s", "output"}
    task = locate_mod.LocateTask("a", "m/1", "forward", "tests.bench.backends:x", "saved", 0, str(tmp_path))
    [last] = [n for n in gm.graph.nodes if n.target is aten.mul.Scalar]
    path = locate_mod.write_repro(gm, last, tensors, ga, inputs, task)
    assert path == tmp_path / "m_1-forward-mul_scalar"
    art = loaded(str(path), ())
    [key] = art.graphs
    rg = art.graphs[key]
    got = [(i.name, i.role, i.target) for i in rg.record.inputs]
    assert got == [("w", "param", "l.w"), ("b", "buffer", "l.b"), ("c", "constant", "c0"), ("x", "user", "x"),
                   ("t", "user", "t"), ("s", "user", "s")]  # the unused input left out; a tangent is a user input
    assert [i.type for i in rg.record.inputs] == ["tensor"] * 5 + ["float"]
    assert [i.dtype for i in rg.record.inputs[:5]] == ["float32"] * 5 and [i.shape for i in rg.record.inputs[:5]] == [[4]] * 5
    assert rg.record.inputs[5].type == "float"
    saved = rg.saved_inputs()
    for a, b in zip(saved, inputs[:5] + [inputs[6]], strict=True):
        assert torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b
    [out] = rg.record.outputs
    expected = ((inputs[3] * inputs[0] + inputs[1]) * inputs[2] + inputs[4]) * 0.5
    assert (out.role, out.dtype, out.shape) == ("user", "float32", [4])
    assert torch.equal(rg.module(*saved)[0], expected)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["capture"]["mode"] == "export" and manifest["save_values"] == "full"
    assert manifest["capture"]["notes"] == [
        ("aotpipe bench --locate: the prefix of m/1 forward up to node mul_scalar (aten.mul.Scalar), which "
         "tests.bench.backends:x computes outside the bound")]
    assert manifest["model"] == {"name": "m_1-forward-mul_scalar", "source": "bench-repro:m/1:forward"}
    # its reference outputs recorded by running it (not verified: there is no eager model to verify against)
    assert manifest["verification"][key]["status"] == "recorded"
    assert manifest["graphs"][key]["checks"]["skipped_reasons"] == ["verify: false"]


# ---- one failing graph of an artefact located (as a worker does) ---------------------------------------------------

MLP = str(Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp")


def test_locate_graph_bisects_the_artefacts_graph_on_its_inputs_with_its_roles_and_seed(monkeypatch, tmp_path):
    from aotpipe.corpus.bench.graph import loaded
    seen = {}
    real_inputs, real_compile = locate_mod.graph_inputs, locate_mod.compile_graph

    def inputs_spy(ga, inputs, seed):
        seen["inputs"] = (inputs, seed)
        return real_inputs(ga, inputs, seed)

    def compile_spy(backend, pm, args, roles, user):
        seen["roles"] = roles
        return real_compile(backend, pm, args, roles, user)

    monkeypatch.setattr(locate_mod, "graph_inputs", inputs_spy)
    monkeypatch.setattr(locate_mod, "compile_graph", compile_spy)
    task = locate_mod.LocateTask(MLP, "mlp", "inference", f"{PLANTED}:first_relu_doubled", "random", 7,
                                 str(tmp_path))
    loc = locate_mod.locate_graph(task)
    assert (loc.artifact, loc.graph, loc.found, loc.node) == ("mlp", "inference", True, "relu"), loc.lines()
    assert seen["inputs"] == ("random", 7)
    ga = loaded(MLP, ()).graphs["inference"]
    assert seen["roles"] == [r.role for r in ga.record.inputs] and "param" in seen["roles"]


def test_locate_graph_of_a_passing_graph_is_not_found_and_writes_nothing(tmp_path):
    loc = locate_mod.locate_graph(locate_mod.LocateTask(MLP, "mlp", "inference", "eager", "saved", 0, str(tmp_path)))
    assert (loc.artifact, loc.graph, loc.found, loc.repro) == ("mlp", "inference", False, None)
    assert loc.reason == "the graph's prefixes all pass: the fault needs the whole graph (its outputs as one)"
    assert list(tmp_path.iterdir()) == []


def test_locate_graph_says_why_a_repro_was_not_written(monkeypatch, tmp_path):
    def refuse(*args):
        raise OSError("disk full")

    monkeypatch.setattr(locate_mod, "write_repro", refuse)
    loc = locate_mod.locate_graph(locate_mod.LocateTask(MLP, "mlp", "inference", f"{PLANTED}:first_relu_doubled",
                                                        "saved", 0, str(tmp_path)))
    assert loc.found is True and loc.repro is None and loc.lines()[3] == "    repro: not written"
    check, _, why = loc.reason.partition(" (the repro could not be written: ")
    assert re.fullmatch(r"node relu: RMS error .* its RMS then 1 to 2\); eager float32's own error [0-9.e+-]+", check), \
        loc.reason
    assert why == "OSError: disk full)"


def test_locate_graph_of_a_graph_that_is_no_fx_graph_says_so(monkeypatch, tmp_path):
    ga = types.SimpleNamespace(module=torch.nn.ReLU())
    monkeypatch.setattr(locate_mod, "loaded", lambda folder, trust: types.SimpleNamespace(graphs={"inference": ga}))
    loc = locate_mod.locate_graph(locate_mod.LocateTask("x", "x", "inference", "eager", "saved", 0, str(tmp_path)))
    assert (loc.artifact, loc.graph, loc.found, loc.reason) == ("x", "inference", False, "the graph is not an FX graph")


def test_a_locate_task_runs_locate_graph_on_itself(monkeypatch):
    task = locate_mod.LocateTask("p", "a", "g", "eager", "saved", 0, "out")
    monkeypatch.setattr(locate_mod, "locate_graph", lambda t: ("located", t))
    assert task() == ("located", task)


def test_a_locate_result_is_its_fields_as_json():
    res = Located("m", "forward", True, "why", node="mul", op="aten.mul.Tensor", input_shapes=["float32[4]"],
                  output_shape="float32[4]", module_path="l", position="1 of 2", prefixes_tried=2, repro="r")
    assert res.to_json() == {"artifact": "m", "graph": "forward", "found": True, "reason": "why", "node": "mul",
                             "op": "aten.mul.Tensor", "input_shapes": ["float32[4]"], "output_shape": "float32[4]",
                             "module_path": "l", "position": "1 of 2", "prefixes_tried": 2, "repro": "r",
                             "minimized": None}
    res.minimized = Minimized(True, "off", op="aten.mul.Tensor", nodes=1, depth=0, tries=1, repro="m", script="m.py",
                              shrunk=["8 -> 1"], shrink_tries=3)
    assert res.to_json()["minimized"] == {"found": True, "reason": "off", "op": "aten.mul.Tensor", "nodes": 1,
                                          "depth": 0, "tries": 1, "repro": "m", "script": "m.py",
                                          "shrunk": ["8 -> 1"], "shrink_tries": 3}


class _Executor:
    """The process executor's interface, its tasks run here (a task named in `fail` gives the
    worker's Failure instead): what the parent side decides."""
    made: ClassVar[list] = []
    ran: ClassVar[list] = []
    fail: ClassVar[set] = set()

    def __init__(self, **kwargs):
        _Executor.made.append(kwargs)

    def run(self, tasks, *, on_start, on_done):
        from aotpipe.pipeline.executors.base import Failure
        for i, t in enumerate(tasks):
            on_start(i)
            _Executor.ran.append(t)
            on_done(i, Failure("timed out after 5 s") if t.name in _Executor.fail else t.fn.label + " located")


def test_locate_failures_makes_one_task_per_graph_that_failed_accuracy_each_in_a_worker(monkeypatch, tmp_path):
    from aotpipe.corpus.bench.graph import GraphResult
    from aotpipe.corpus.bench.run import Bench
    monkeypatch.setattr(locate_mod, "ProcessExecutor", _Executor)
    _Executor.made, _Executor.ran, _Executor.fail = [], [], {"locate b forward"}
    rs = [GraphResult("a", "inference", "inference", "fail_accuracy", path="/p/a", inputs="random", seed=3),
          GraphResult("a", "forward", "forward", "pass", path="/p/a"),
          GraphResult("b", "forward", "forward", "fail_accuracy", path="/p/b"),
          GraphResult("c", "joint", "joint", "compile_error", path="/p/c")]
    monkeypatch.chdir(tmp_path)
    out = locate_mod.locate_failures(Bench("mod:fn", rs, {}, 1.0), Path("r"), timeout_s=5, trust_ops=["mylib"],
                                     threads=2)
    assert _Executor.made == [{"workers": 1, "timeout_s": 5, "threads": 2, "cwd": tmp_path}]
    assert [t.name for t in _Executor.ran] == ["locate a inference", "locate b forward"]
    assert [t.resources.timeout_s for t in _Executor.ran] == [5, 5]
    LT = locate_mod.LocateTask
    assert [t.fn for t in _Executor.ran] == [LT("/p/a", "a", "inference", "mod:fn", "random", 3, str(tmp_path / "r"),
                                                ("mylib",)),
                                             LT("/p/b", "b", "forward", "mod:fn", "saved", 0, str(tmp_path / "r"),
                                                ("mylib",))]
    assert out == ["a located", Located("b", "forward", False, "timed out after 5 s")]
    assert out[1].found is False
    _Executor.ran = []
    assert locate_mod.locate_failures(Bench("eager", rs[1:2], {}, 1.0), Path("r"), timeout_s=5) == []
    assert _Executor.ran == []


def test_with_a_task_for_errors_the_graphs_that_crashed_or_did_not_compile_or_run_are_taken_too(monkeypatch, tmp_path):
    from aotpipe.corpus.bench.graph import GraphResult
    from aotpipe.corpus.bench.run import Bench

    class Cut(locate_mod.LocateTask):
        pass

    class Crash(locate_mod.LocateTask):
        pass

    monkeypatch.setattr(locate_mod, "ProcessExecutor", _Executor)
    _Executor.made, _Executor.ran, _Executor.fail = [], [], set()
    rs = [GraphResult(m, "forward", "forward", status, path=f"/p/{m}")
          for m, status in (("a", "fail_accuracy"), ("b", "crashed"), ("c", "compile_error"), ("d", "runtime_error"),
                            ("e", "timeout"), ("f", "pass"), ("g", "skipped"))]
    out = locate_mod.locate_failures(Bench("mod:fn", rs, {}, 1.0), tmp_path, timeout_s=5, task=Cut, errors=Crash)
    assert [(type(t.fn).__name__, t.fn.label) for t in _Executor.ran] == [("Cut", "a"), ("Crash", "b"), ("Crash", "c"),
                                                                          ("Crash", "d")]
    assert out == ["a located", "b located", "c located", "d located"]
    _Executor.ran = []
    locate_mod.locate_failures(Bench("mod:fn", rs, {}, 1.0), tmp_path, timeout_s=5, task=Cut)  # no task for errors
    assert [(type(t.fn).__name__, t.fn.label) for t in _Executor.ran] == [("Cut", "a")]


def test_locate_graph_hands_its_culprit_on_and_writes_the_prefix_only_where_then_wrote_none(tmp_path):
    seen = []

    def then(gm, culprit, inputs, tensors, backend, task):
        assert isinstance(gm, torch.fx.GraphModule) and culprit in gm.graph.nodes and culprit.name in tensors
        seen.append((culprit.name, len(inputs), backend.name, task.graph))
        return Minimized(bool(seen[1:]), "r", repro=str(tmp_path / "cut") if seen[1:] else None)

    task = locate_mod.LocateTask(MLP, "mlp", "inference", f"{PLANTED}:first_relu_doubled", "saved", 0, str(tmp_path))
    first = locate_mod.locate_graph(task, then=then)
    assert len(seen) == 1 and seen[0][0] == first.node and seen[0][1] > 0
    assert seen[0][2:] == (f"{PLANTED}:first_relu_doubled", "inference")
    assert first.minimized.repro is None and first.repro is not None and Path(first.repro).is_dir()
    second = locate_mod.locate_graph(replace(task, out_dir=str(tmp_path / "again")), then=then)
    assert second.minimized.repro == str(tmp_path / "cut") and second.repro is None
    assert not (tmp_path / "again").exists()


def test_a_locate_result_says_what_minimising_found_and_where_its_repro_is():
    found = Located("m", "forward", True, "why", node="mul", op="aten.mul.Tensor", input_shapes=["float32[4]"],
                    output_shape="float32[4]", position="1 of 2", prefixes_tried=2)
    found.minimized = Minimized(True, "r", op="aten.mul.Tensor", nodes=1, depth=0, tries=1, repro="cut", script="cut.py")
    assert found.lines()[-2:] == ["    minimised: 1 node(s), node aten.mul.Tensor with 0 level(s) of producers, 1 "
                                  "cut(s) tried: cut", "    standalone: python cut.py"]
    found.minimized, found.repro = Minimized(False, "no cut fails"), "prefix"
    assert found.lines()[-2:] == ["    minimised: no (no cut fails)", "    repro: prefix"]
    found.minimized, found.repro = None, None
    assert found.lines()[-1] == "    repro: not written"
