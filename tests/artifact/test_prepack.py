"""Weights packed at load for this CPU: the same results, checked inputs, dense artefacts."""

import copy

import pytest
import torch
from torch import nn

from aotpipe.artifact.prepack import needs_prepack, packed_linear, prepack
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
    assert prepack(g.gm) == {"conv": 0, "linear": 0}


def test_packed_linear_refuses_an_input_that_does_not_fit_the_packed_weight():
    """mkl._mkl_linear reads the input as wide as the packed weight, unchecked: the wrapper
    must check it, so a hostile graph cannot make it read out of bounds."""
    w, b = torch.randn(8, 32), torch.randn(8)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 4)
    ok = torch.randn(4, 32)
    torch.testing.assert_close(packed_linear(ok, packed, w, b, 4), torch.nn.functional.linear(ok, w, b))
    with pytest.raises(RuntimeError):  # too narrow: linear's own shape check, not a read out of bounds
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
    """_mkl_linear copies one bias value per output: a shorter bias would be read past its end."""
    w = torch.randn(8, 32)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 4)
    with pytest.raises(RuntimeError):
        packed_linear(torch.randn(4, 32), packed, w, torch.randn(3), 4)


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
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 4)
    x = torch.randn(5, 32)
    assert torch.equal(packed_linear(x, packed, w, b, 4), torch.nn.functional.linear(x, w, b))
