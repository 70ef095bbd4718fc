"""Outputs whose true value is zero (a conv's bias gradient before a batch norm) are judged by
the float64 reference and eager's own noise, as the capture's checks judge them, not failed for
rounding against the absolute floor; a real fault on them still fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.corpus.bench.graph import judge, nudged_run, reference64
from aotpipe.corpus.bench.noise import sequential_sum
from tests.bench.test_bench import PLANTED, bench_json, by_graph


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def conv_bn() -> nn.Module:
    """A conv with a bias, then a batch norm, then an upsampling (whose backward makes its
    zeros with dtype=float32 named)."""
    return nn.Sequential(ConvBN(), nn.Upsample(scale_factor=2.0))


@pytest.fixture(scope="module")
def bias_grads():
    """(conv bias gradient in float32, the same in float64, the same summed in another valid
    order: channels-last, left to right, as a compiler may sum it)."""
    torch.manual_seed(0)
    m = ConvBN()
    x, w = torch.randn(8, 3, 16, 16), torch.randn(8, 8, 16, 16)

    def grads(model, x, w):
        kept = {}
        y = model.conv(x)
        y.register_hook(lambda g: kept.setdefault("g", g))
        (F.relu(model.bn(y)) * w).sum().backward()
        return model.conv.bias.grad, kept["g"]

    b32, g32 = grads(m, x, w)
    m64 = ConvBN()
    m64.load_state_dict(m.state_dict())
    b64, _ = grads(m64.double(), x.double(), w.double())
    # summed right to left: left to right gave ATen's bits at one intra-op thread (error 0: the
    # floor settled it), right to left is another valid order at any thread count
    other = sequential_sum(g32.permute(0, 2, 3, 1).flip(0, 1, 2).contiguous(), [0, 1, 2])
    return b32, b64, other


def test_a_conv_bias_gradient_zero_in_exact_arithmetic_passes_within_eagers_noise(bias_grads):
    b32, b64, other = bias_grads
    assert float(b64.abs().max()) < 1e-12 < float((b32.double() - b64).abs().max())  # true value zero
    c, _ = judge(other, b32, b64, None, "grad conv.bias")
    assert c.passed and c.method == "fp64" and c.detail.startswith("zero in exact arithmetic"), c.line()
    # Without the float64 reference the absolute floor (1e-7) alone fails it: the failure.
    floor_only, _ = judge(other, b32, None, None, "grad conv.bias")
    assert not floor_only.passed and floor_only.method == "floor"


def test_a_planted_offset_on_a_zero_valued_gradient_still_fails(bias_grads):
    b32, b64, other = bias_grads
    c, _ = judge(other + 1e-3, b32, b64, None, "grad conv.bias")
    assert not c.passed and "10x eager float32's own" in c.detail, c.line()


def test_the_float64_reference_widens_the_float32_an_op_names_and_keeps_other_dtypes():
    def f(x, idx, h):
        z = torch.zeros(6, dtype=torch.float32)  # as upsample's backward makes its zeros
        return torch.ops.aten.index_put.default(z, [idx], x, True), h.to(torch.float16)

    args = [torch.randn(3), torch.tensor([0, 2, 2]), torch.randn(2)]
    gm = make_fx(f)(*args)
    out = reference64(gm, args)
    assert out is not None, "the float64 run failed: float32 named by an op was not widened"
    assert out[0].dtype == torch.float64 and out[1].dtype == torch.float16
    expected = torch.zeros(6, dtype=torch.float64).index_put_([args[1]], args[0].double(), accumulate=True)
    assert torch.equal(out[0], expected)


def test_a_nudged_run_moves_each_float_input_by_one_ulp_but_saved_activations_and_integers():
    gm = make_fx(lambda x, i, s: (x * 1.0, i + 0, s * 1.0))(torch.ones(4), torch.arange(4), torch.ones(4))
    out = nudged_run(gm, [torch.ones(4), torch.arange(4), torch.ones(4)], 1, ["param", "user", "saved"])
    ulp = torch.nextafter(torch.ones(1), torch.full((1,), 2.0)) - 1
    assert bool(((out[0] - 1).abs() <= ulp).all()) and bool((out[0] != 1).all())
    assert torch.equal(out[1], torch.arange(4)) and torch.equal(out[2], torch.ones(4))


@pytest.fixture(scope="module")
def conv_bn_run(tmp_path_factory):
    from click.testing import CliRunner

    from aotpipe.cli import main

    out = tmp_path_factory.mktemp("convbn")
    (out / "p.yaml").write_text(
        "version: 1\nname: convbn\noutput: out\nexecutor: {kind: local}\n"
        "defaults: {mode: export, graphs: [forward, backward], passes: []}\n"
        "models:\n  - name: conv_bn\n    source: tests.bench.test_zero_values:conv_bn\n"
        "    inputs: [{shape: [4, 3, 16, 16]}]\n")
    r = CliRunner().invoke(main, ["run", str(out / "p.yaml"), "-o", str(out), "--no-progress", "--no-sign"])
    assert r.exit_code == 0, r.output
    return out / "convbn"


@pytest.mark.slow
def test_inductor_passes_a_conv_bn_backward_and_a_planted_bias_gradient_offset_fails(conv_bn_run):
    r, data = bench_json(str(conv_bn_run), "--backend", "inductor", "--no-sandbox", "--graphs", "backward")
    g = by_graph(data)["backward"]
    assert r.exit_code == 0 and g["status"] == "pass", g["reason"]
    r, data = bench_json(str(conv_bn_run), "--backend", f"{PLANTED}:conv_bias_grad_plus_1e_2", "--no-sandbox",
                         "--graphs", "backward")
    g = by_graph(data)["backward"]
    assert r.exit_code == 1 and g["status"] == "fail_accuracy", g["reason"]
    assert [f.split(":")[0] for f in g["failed_outputs"]] == ["output 1 (grad 0.conv.bias)"], g["failed_outputs"]
