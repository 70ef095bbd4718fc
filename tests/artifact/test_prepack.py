"""Weights packed at load for this CPU: the same results, checked inputs, dense artefacts."""

import copy

import pytest
import torch
from torch import nn

from aotpipe.artifact.prepack import (
    add_into_residual,
    aten_epilogue,
    mkl_packed_linear,
    needs_prepack,
    packed_linear,
    prepack,
)
from aotpipe.errors import ArtifactError
from tests.passes.helpers import apply, graph_of
from tests.passes.test_mkldnn_fuse import _Block

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _fused(model, *args):
    g = graph_of(model, *args)
    return apply("mkldnn_fuse", apply("channels_last", apply("freeze", g).graph, activations=True).graph).graph


@pytest.mark.parametrize("model,args", [(_Block, (torch.randn(2, 4, 8, 8),)), (_Mlp, (torch.randn(6, 16),))])
def test_packed_graph_gives_the_same_results(model, args):
    torch.manual_seed(0)
    g = _fused(model(), *args)
    assert needs_prepack(g.gm)
    dense = copy.deepcopy(g.gm)
    done = prepack(g.gm)
    assert sum(done.values()) >= 2
    packed = [n for n in g.gm.graph.nodes if n.op == "get_attr" and n.target.endswith("_packed")]
    assert packed and all(getattr(g.gm, n.target).layout != torch.strided for n in packed)
    with torch.no_grad():
        if model is _Block:  # channels-last convolutions: the same oneDNN kernel, packed or not
            assert torch.equal(dense(*g.values)[0], g.gm(*g.values)[0])
        else:  # a small GEMM takes another MKL path than a packed one: float noise
            torch.testing.assert_close(dense(*g.values)[0], g.gm(*g.values)[0])
        # another batch size than the one packed for: still right (MKL falls back, oneDNN reorders)
        other = [torch.cat([v, v]) if v.dim() > 1 else v for v in g.values]
        torch.testing.assert_close(dense(*other)[0], g.gm(*other)[0])


def test_convolutions_on_nchw_activations_stay_dense():
    g = graph_of(_Block(), torch.randn(2, 4, 8, 8))
    fused = apply("mkldnn_fuse", apply("freeze", g).graph).graph
    assert prepack(fused.gm)["conv"] == 0


def test_packed_weights_are_not_saved():
    g = _fused(_Mlp(), torch.randn(6, 16))
    before = set(g.gm.state_dict())
    prepack(g.gm)
    assert set(g.gm.state_dict()) == before


def test_a_node_without_a_recorded_input_shape_stays_dense():
    g = _fused(_Mlp(), torch.randn(6, 16))
    for n in g.gm.graph.nodes:
        n.meta.pop("val", None)
    assert prepack(g.gm) == {"conv": 0, "linear": 0, "epilogue": 0, "in_place": 0}


def _packed(w, rows):
    return torch.ops.mkldnn._reorder_linear_weight(w, rows)


def test_packed_linear_takes_linear_for_an_input_that_does_not_fit_the_packed_weight():
    """The wrapper checks its input before the packed kernel: one that does not fit gets
    linear's own shape check, in linear's words."""
    w, b = torch.randn(8, 32), torch.randn(8)
    packed = _packed(w, 4)
    ok = torch.randn(4, 32)
    torch.testing.assert_close(packed_linear(ok, packed, w, b, 4), torch.nn.functional.linear(ok, w, b))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # too narrow
        packed_linear(torch.randn(4, 8), packed, w, b, 4)
    with pytest.raises(RuntimeError):
        packed_linear(torch.randn(4, 4, 32), packed, w[:, :4], b, 4)


class _AttentionOut(nn.Module):
    """A linear on a non-contiguous 3-d input: the matmul decomposition writes a bmm."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(x.transpose(0, 1))


def test_a_bmm_with_a_broadcast_weight_becomes_one_linear():
    g = graph_of(_AttentionOut(), torch.randn(5, 3, 16))
    assert any(n.target is torch.ops.aten.bmm.default for n in g.gm.graph.nodes)
    r = apply("mkldnn_fuse", apply("freeze", g).graph)
    assert r.stats["batched_linear"] == 1
    assert not any(n.target is torch.ops.aten.bmm.default for n in r.graph.gm.graph.nodes)
    from tests.passes.helpers import assert_same_results

    assert_same_results(g, r.graph)


def test_packed_linear_refuses_a_bias_of_the_wrong_length():
    w = torch.randn(8, 32)
    with pytest.raises(RuntimeError):
        packed_linear(torch.randn(4, 32), _packed(w, 4), w, torch.randn(3), 4)


@pytest.mark.parametrize("shape", [[2**31, 4, 8, 8], [2, 5, 8, 8], [0, 4, 8, 8], [2, 4, 8]])
def test_a_recorded_convolution_input_that_does_not_fit_leaves_it_dense(shape):
    """An artefact from someone else may record any "val": one that is not what the
    convolution reads (too big, wrong channels, empty, wrong rank) is not packed for."""
    g = _fused(_Block(), torch.randn(2, 4, 8, 8))
    conv = next(n for n in g.gm.graph.nodes if n.target is torch.ops.mkldnn._convolution_pointwise.default)
    x = conv.args[0]
    x.meta.pop("val")
    x.meta["saved_val"] = {"shape": shape, "stride": [1] * len(shape)}
    dense = copy.deepcopy(g.gm)
    prepack(g.gm)
    assert conv.args[1].op == "get_attr" and not conv.args[1].target.endswith("_packed")
    with torch.no_grad():
        assert torch.equal(dense(*g.values)[0], g.gm(*g.values)[0])


@pytest.mark.parametrize("rows", [2**31, 0, "8"])
def test_a_recorded_linear_input_that_does_not_fit_leaves_it_dense(rows):
    g = _fused(_Mlp(), torch.randn(6, 16))
    linear = next(n for n in g.gm.graph.nodes if n.target is torch.ops.aten.linear.default)
    linear.args[0].meta.pop("val")
    linear.args[0].meta["saved_val"] = {"shape": [rows, 16], "stride": [16, 1]}
    prepack(g.gm)
    assert linear.target is torch.ops.aten.linear.default
    with torch.no_grad():
        g.gm(*g.values)


def test_packed_linear_takes_linear_for_another_row_count():
    w, b = torch.randn(8, 32), torch.randn(8)
    x = torch.randn(5, 32)
    assert torch.equal(packed_linear(x, _packed(w, 4), w, b, 4), torch.nn.functional.linear(x, w, b))


# What an inference graph keeps of each (capture decomposes silu to x * sigmoid(x), which fuses
# as oneDNN's swish; hardswish to arithmetic, which does not).
_ACTS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
         "silu": nn.functional.silu, "gelu": nn.functional.gelu,
         "gelu_tanh": lambda y: nn.functional.gelu(y, approximate="tanh"),
         "hardtanh": lambda y: nn.functional.hardtanh(y, -0.5, 0.5),
         "leaky_relu": lambda y: nn.functional.leaky_relu(y, 0.2)}


class _Act(nn.Module):
    """act(linear(x)) on a 3-d input: the linear runs on x viewed 2-d, a view between it and act."""

    def __init__(self, act):
        super().__init__()
        self.fc, self.act = nn.Linear(16, 24), act

    def forward(self, x):
        return self.act(self.fc(x))


@pytest.mark.parametrize("act", sorted(_ACTS))
def test_a_linear_epilogue_is_fused_into_the_gemm(act):
    """Every unary the convolutions take fuses into the packed linear, through the view;
    where the packed kernel does not apply, the wrapper computes linear and the act in ATen."""
    torch.manual_seed(0)
    g = _fused(_Act(_ACTS[act]), torch.randn(2, 5, 16))
    dense = copy.deepcopy(g.gm)
    done = prepack(g.gm)
    assert done["linear"] == 1 and done["epilogue"] == 1
    calls = [n for n in g.gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls if n.target is packed_linear] == [packed_linear]
    assert not any(n.target in (torch.ops.aten.relu.default, torch.ops.aten.gelu.default, torch.ops.aten.silu.default,
                                torch.ops.aten.sigmoid.default, torch.ops.aten.tanh.default,
                                torch.ops.aten.hardtanh.default, torch.ops.aten.leaky_relu.default,
                                torch.ops.aten.hardswish.default) for n in calls)
    with torch.no_grad():
        torch.testing.assert_close(g.gm(*g.values)[0], dense(*g.values)[0])
        # Another row count than the one packed for: linear and act in ATen, as the dense graph.
        node = next(n for n in calls if n.target is packed_linear)
        args = [getattr(g.gm, a.target) if isinstance(a, torch.fx.Node) else a for a in node.args[1:]]
        x, (w, b) = torch.randn(7, 16), args[1:3]
        assert torch.equal(packed_linear(x, *args), _ACTS[act](nn.functional.linear(x, w, b)))


def test_an_epilogue_whose_input_is_used_elsewhere_stays_in_the_graph():
    class _Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 8)

        def forward(self, x):
            y = self.fc(x)
            return torch.relu(y), y

    g = _fused(_Both(), torch.randn(6, 16))
    dense = copy.deepcopy(g.gm)
    assert prepack(g.gm)["epilogue"] == 0
    assert any(n.target is torch.ops.aten.relu.default for n in g.gm.graph.nodes)
    with torch.no_grad():
        for a, b in zip(g.gm(*g.values), dense(*g.values), strict=True):
            torch.testing.assert_close(a, b)


def test_aten_epilogue_names_what_it_does_not_know():
    y = torch.randn(3)
    assert torch.equal(aten_epilogue(y, "none", [], None), y)
    with pytest.raises(ValueError, match="no epilogue 'mish'"):
        aten_epilogue(y, "mish", [], None)


class _Residuals(nn.Module):
    """Two bottleneck-like residual blocks on a conv's result: the second block's residual
    is the first's sum; `keep` reads the first residual after the blocks."""

    def __init__(self, keep=None, c=4):
        super().__init__()
        self.s = nn.Conv2d(c, c, 1)
        self.a, self.b, self.c, self.d = (nn.Conv2d(c, c, 3, padding=1) for _ in range(4))
        self.keep = keep

    def forward(self, x):
        r = torch.relu(self.s(x))
        if self.keep == "conv input":  # the residual is also what the convolution reads
            return torch.relu(self.b(r) + r)
        y = torch.relu(self.b(torch.relu(self.a(r))) + r)
        z = torch.relu(self.d(torch.relu(self.c(y))) + y)
        if self.keep == "output":
            return z, r
        if self.keep == "read after":
            return z * r
        return z


@pytest.mark.parametrize("keep,in_place", [(None, 2), ("output", 1), ("read after", 1), ("conv input", 0)])
def test_a_dead_residual_is_added_into_in_place(keep, in_place):
    """In place only where nothing reads the residual after the convolution (an output, a
    later op) nor the convolution itself as its input: the values stay bit for bit those
    of the dense graph, and so do the inputs."""
    torch.manual_seed(0)
    g = _fused(_Residuals(keep), torch.randn(2, 4, 8, 8))
    dense = copy.deepcopy(g.gm)
    assert prepack(g.gm)["in_place"] == in_place
    assert sum(n.target is add_into_residual for n in g.gm.graph.nodes) == in_place
    inputs = [v.clone() for v in g.values]
    with torch.no_grad():
        for a, b in zip(g.gm(*g.values), dense(*g.values), strict=True):
            assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(inputs, g.values, strict=True))


def test_add_into_residual_takes_the_out_of_place_kernel_where_in_place_is_not_safe():
    """Run-time guard: a residual in another layout, or sharing the input's memory, is
    left untouched."""
    torch.manual_seed(0)
    w, b, cl = torch.randn(4, 4, 3, 3), torch.randn(4), torch.channels_last
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=cl)
    args = (w.contiguous(memory_format=cl), b, [1, 1], [1, 1], [1, 1], 1, "relu", [], None)
    want = torch.relu(nn.functional.conv2d(x, w, b, padding=1) + x)
    for other in (torch.randn(2, 4, 8, 8), x):  # NCHW; the input itself
        kept = other.clone()
        with torch.no_grad():
            got = add_into_residual(other, x, *args)
        torch.testing.assert_close(got, torch.relu(nn.functional.conv2d(x, w, b, padding=1) + kept))
        assert torch.equal(other, kept)
    other = x.clone()
    with torch.no_grad():
        got = add_into_residual(other, x, *args)
    assert got.data_ptr() == other.data_ptr()  # in place
    torch.testing.assert_close(got, want)


def test_a_residual_that_is_a_graph_input_is_never_written():
    g = _fused(_Block(), torch.randn(2, 4, 8, 8))  # relu(conv(y) + x): x is the graph's input
    x = g.values[0].clone()
    assert prepack(g.gm)["in_place"] == 0
    with torch.no_grad():
        g.gm(*g.values)
    assert torch.equal(g.values[0], x)


def test_add_into_residual_refuses_a_residual_of_another_shape_than_the_output():
    """The in-place kernel writes the output's shape into the residual, unchecked."""
    cl = torch.channels_last
    x = torch.randn(1, 4, 8, 8).contiguous(memory_format=cl)
    w = torch.randn(4, 4, 3, 3).contiguous(memory_format=cl)
    small = torch.randn(1, 4, 4, 4).contiguous(memory_format=cl)
    with pytest.raises(RuntimeError, match=r"a residual of shape \[1, 4, 4, 4\] for a convolution output of shape "
                                           r"\[1, 4, 8, 8\]"):
        add_into_residual(small, x, w, None, [1, 1], [1, 1], [1, 1], 1, None, [], None)



@pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL")
def test_mkl_packed_linear_of_older_artefacts_refuses_an_input_that_does_not_fit_the_packed_weight():
    """mkl._mkl_linear reads the input as wide as the packed weight and one bias value per
    output, unchecked: the wrapper older artefacts load with checks both first, so a hostile
    graph cannot make it read out of bounds."""
    w, b = torch.randn(8, 32), torch.randn(8)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 4)
    ok = torch.randn(4, 32)
    torch.testing.assert_close(mkl_packed_linear(ok, packed, w, b, 4), nn.functional.linear(ok, w, b))
    with pytest.raises(RuntimeError):  # too narrow: linear's own shape check
        mkl_packed_linear(torch.randn(4, 8), packed, w, b, 4)
    with pytest.raises(RuntimeError):
        mkl_packed_linear(torch.randn(4, 32), packed, w, torch.randn(3), 4)


@pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL")
def test_the_legacy_packing_packs_linears_for_mkl_and_fuses_nothing():
    torch.manual_seed(0)
    g = _fused(_Mlp(), torch.randn(6, 16))  # b(relu(a(x)))
    dense = copy.deepcopy(g.gm)
    done = prepack(g.gm, "mkl")
    assert done == {"conv": 0, "linear": 2, "epilogue": 0, "in_place": 0}
    targets = [n.target for n in g.gm.graph.nodes if n.op == "call_function"]
    assert targets.count(mkl_packed_linear) == 2 and torch.ops.aten.relu.default in targets
    with torch.no_grad():
        torch.testing.assert_close(g.gm(*g.values)[0], dense(*g.values)[0])


def test_a_packing_scheme_prepack_does_not_know_is_refused():
    g = _fused(_Mlp(), torch.randn(6, 16))
    with pytest.raises(ArtifactError, match="'blocked-v9', which this aotpipe does not know"):
        prepack(g.gm, "blocked-v9")
