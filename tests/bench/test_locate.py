"""bench --locate's bisection to the first faulty node, on small inline graphs compiled with
the planted backends (tests/bench/backends.py): no artefact, no worker."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.bench.backends import Backend
from aotpipe.bench.graph import judge
from aotpipe.bench.locate import Located, first_faulty_node, node_check, own_scale, prefix

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
