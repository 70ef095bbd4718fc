"""torch's own branches on tensor values, made static while capturing (capture/torch_branches.py):
a hint takes the route right for every value, a validation becomes a node of the graph."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.transformer as transformer
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from aotpipe.capture.torch_branches import KERNELS, NEGATIVE_VAR, REPLACEMENTS, static_library_branches

CAUSAL_NOTE = next(r.note for r in REPLACEMENTS if r.name == "_detect_is_causal_mask")
GAUSSIAN_NOTE = next(r.note for r in REPLACEMENTS if r.name == "gaussian_nll_loss")


def _export(model, args):
    return torch.export.export(model, args, strict=False)


# --- the causal-mask probe (a hint) -------------------------------------------------------------

class Encoder(torch.nn.Module):
    """A one-layer encoder called with a mask and no is_causal hint (torch probes the mask)."""

    def __init__(self, is_causal=None):
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(4, 1, dim_feedforward=8, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.is_causal = is_causal

    def forward(self, x, mask):
        return self.enc(x, mask=mask, is_causal=self.is_causal)


CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(3)
NOT_CAUSAL = CAUSAL.t().contiguous()  # a mask of the same size that is not causal
X = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def encoder_graph():
    """The encoder exported in eval mode with a causal mask as the example, and its notes."""
    model = Encoder().eval()
    notes: list[str] = []
    with static_library_branches(notes):
        ep = _export(model, (X, CAUSAL))
    return model, ep.module(), notes


def test_torch_probes_the_mask_values_so_export_fails_without_the_replacement():
    with pytest.raises(GuardOnDataDependentSymNode, match=re.escape("Eq(u0, 1)")):
        _export(Encoder().eval(), (X, CAUSAL))


def test_a_mask_without_a_hint_is_captured_and_noted(encoder_graph):
    _, _, notes = encoder_graph
    assert notes == [CAUSAL_NOTE]


@pytest.mark.parametrize("mask", [CAUSAL, NOT_CAUSAL], ids=["causal", "not-causal"])
def test_the_graph_computes_what_eager_computes_for_a_causal_and_a_non_causal_mask(encoder_graph, mask):
    # eager takes the is_causal route for the causal mask and applies the mask otherwise; the graph
    # always applies the mask, including one that is not the example's
    model, graph, _ = encoder_graph
    with torch.no_grad():
        torch.testing.assert_close(graph(X, mask), model(X, mask))
        assert not torch.allclose(graph(X, NOT_CAUSAL), graph(X, CAUSAL))  # the mask is read, not baked in


@pytest.mark.parametrize("hint", [True, False])
def test_an_explicit_hint_is_passed_on_unchanged_and_not_noted(hint):
    notes: list[str] = []
    with static_library_branches(notes):
        assert transformer._detect_is_causal_mask(CAUSAL, hint, 3) is hint
        assert transformer._detect_is_causal_mask(None, None, 3) is False
    assert notes == []


def test_in_training_the_replaced_probe_gives_eagers_values_and_gradients():
    model = Encoder().train()
    x = X.clone().requires_grad_(True)
    ref = model(x, CAUSAL)
    ref_grad = torch.autograd.grad(ref.square().sum(), [x, *model.parameters()])
    with static_library_branches([]):
        got = model(x, CAUSAL)
        got_grad = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got_grad, ref_grad)


# --- the variance check of gaussian_nll_loss (a validation) -------------------------------------

def _gauss_inputs(var_shape=(3, 4), low=0.5):
    g = torch.Generator().manual_seed(2)
    return (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g),
            torch.rand(var_shape, generator=g) + low)


@pytest.mark.parametrize("var_shape,full,reduction", [
    ((3, 4), False, "mean"), ((3, 4), True, "none"), ((3,), False, "sum"), ((3, 1), True, "mean"),
    ((1, 4), False, "none")])
def test_the_replaced_loss_gives_torchs_values_and_gradients(var_shape, full, reduction):
    inputs = [t.requires_grad_(True) for t in _gauss_inputs(var_shape, low=0.0)]
    with torch.no_grad():
        inputs[2][..., 0] = 1e-9  # below eps: clamped, and the clamp is not differentiated
    ref = F.gaussian_nll_loss(*inputs, full=full, reduction=reduction)
    ref_grad = torch.autograd.grad(ref.sum(), inputs)
    notes: list[str] = []
    with static_library_branches(notes):
        got = F.gaussian_nll_loss(*inputs, full=full, reduction=reduction)
        got_grad = torch.autograd.grad(got.sum(), inputs)
    assert torch.equal(got, ref)
    for a, b in zip(got_grad, ref_grad):
        assert torch.equal(a, b)
    assert notes == [GAUSSIAN_NOTE]


@pytest.mark.parametrize("var,reduction,message", [
    (torch.rand(2, 4) + 0.5, "mean", "var is of incorrect size"),
    (torch.rand(3, 2) + 0.5, "mean", "var is of incorrect size"),
    (torch.rand(3, 4) + 0.5, "average", "average is not valid"),
    (-1.0, "mean", NEGATIVE_VAR)])
def test_the_replaced_loss_refuses_what_torch_refuses(var, reduction, message):
    x, y, _ = _gauss_inputs()
    with pytest.raises(ValueError, match=re.escape(message)):
        F.gaussian_nll_loss(x, y, var, reduction=reduction)
    with static_library_branches([]), pytest.raises(ValueError, match=re.escape(message)):
        F.gaussian_nll_loss(x, y, var, reduction=reduction)


def test_a_float_variance_takes_torchs_own_path_and_is_not_noted():
    x, y, _ = _gauss_inputs()
    notes: list[str] = []
    with static_library_branches(notes):
        got = F.gaussian_nll_loss(x, y, 0.7)
    assert torch.equal(got, F.gaussian_nll_loss(x, y, 0.7)) and notes == []


@pytest.fixture(scope="module")
def gaussian_graph():
    notes: list[str] = []
    with static_library_branches(notes):
        ep = _export(torch.nn.GaussianNLLLoss(), _gauss_inputs())
    return ep.module(), notes


def test_gaussian_nll_loss_exports_only_with_the_replacement_and_notes_it(gaussian_graph):
    with pytest.raises(GuardOnDataDependentSymNode):
        _export(torch.nn.GaussianNLLLoss(), _gauss_inputs())
    graph, notes = gaussian_graph
    assert notes == [GAUSSIAN_NOTE]
    assert torch.ops.aten._assert_async.msg in {n.target for n in graph.graph.nodes}


@pytest.mark.parametrize("edge", [0.0, float("nan")], ids=["zero", "nan"])
def test_the_graph_accepts_what_eager_accepts(gaussian_graph, edge):
    graph, _ = gaussian_graph
    x, y, var = _gauss_inputs()
    var[1, 2] = edge  # just inside: eager refuses only a var below zero
    torch.testing.assert_close(graph(x, y, var), F.gaussian_nll_loss(x, y, var), equal_nan=True)


@pytest.mark.parametrize("negative", [-1e-30, -3.0])
def test_the_graph_refuses_a_negative_variance_as_eager_does(gaussian_graph, negative):
    graph, _ = gaussian_graph
    x, y, var = _gauss_inputs()
    var[2, 3] = negative  # just outside
    with pytest.raises(ValueError, match=re.escape(NEGATIVE_VAR)):
        F.gaussian_nll_loss(x, y, var)
    with pytest.raises(RuntimeError, match=re.escape(NEGATIVE_VAR)):
        graph(x, y, var)


# --- aten.cov's C++ composition (validations and a select) ------------------------------------------

COV_NOTE = next(iter(KERNELS.values()))[0]
G = torch.Generator().manual_seed(3)
OBS = torch.randn(3, 5, generator=G, dtype=torch.float64)
FW = torch.randint(0, 4, (5,), generator=G)
AW = torch.rand(5, generator=G, dtype=torch.float64)


def _cov_cases():
    one = OBS[:, :1]
    return [(OBS, {}), (OBS, {"correction": 0}), (OBS, {"correction": 5}), (OBS[0], {}), (OBS, {"fweights": FW}),
            (OBS, {"aweights": AW}), (OBS, {"fweights": FW, "aweights": AW}),
            (OBS, {"fweights": FW, "aweights": AW, "correction": 2}), (OBS, {"fweights": FW, "correction": 40}),
            (one, {"aweights": AW[:1]}), (one, {"fweights": FW[:1] + 1}), (OBS.to(torch.complex128), {}),
            (torch.randint(0, 9, (2, 4), generator=G), {})]


def test_the_cov_kernel_gives_torchs_values_in_every_branch():
    # includes each of torch's special cases: no degrees of freedom left, one observation with one
    # kind of weights, complex input, integer input
    for x, kw in _cov_cases():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's "degrees of freedom is <= 0", for the cases without any
            ref = torch.cov(x, **kw)
        notes: list[str] = []
        with static_library_branches(notes), enable_python_dispatcher():  # as tracing consults py_kernels
            got = torch.ops.aten.cov.default(x, **kw)
        torch.testing.assert_close(got, ref, equal_nan=True, msg=lambda m: f"{x.shape} {kw}: {m}")
        assert notes == [COV_NOTE]
    assert torch.ops.aten.cov.default.py_kernels == {}  # torch's kernel is back


class Cov(torch.nn.Module):
    def forward(self, x, fw, aw):
        return torch.corrcoef(x) + torch.cov(x, fweights=fw, aweights=aw)


@pytest.fixture(scope="module")
def cov_graph():
    x = OBS.float()
    notes: list[str] = []
    with pytest.raises(Exception, match="aten.equal"):
        _export(Cov(), (x, FW, AW.float()))
    with static_library_branches(notes):
        ep = _export(Cov(), (x, FW, AW.float()))
    return ep.module(), notes


def test_cov_and_corrcoef_export_only_with_the_kernel_and_match_eager(cov_graph):
    graph, notes = cov_graph
    assert notes == [COV_NOTE]
    x, aw = torch.randn(3, 5, generator=G), torch.rand(5, generator=G)  # other values than the example's
    torch.testing.assert_close(graph(x, FW, aw), Cov()(x, FW, aw))


@pytest.mark.parametrize("what,bad", [("fweights", -1), ("aweights", -1e-30), ("sum", 0)])
def test_the_cov_graph_refuses_negative_weights_and_a_zero_sum_as_eager_does(cov_graph, what, bad):
    graph, _ = cov_graph
    fw, aw = FW.clone(), AW.float().clone()
    if what == "fweights":
        fw[2] = bad
        message = "cov(): fweights cannot be negative"
    elif what == "aweights":
        aw[2] = bad
        message = "cov(): aweights cannot be negative"
    else:
        fw.zero_()
        message = "cov(): weights sum to zero, can't be normalized"
    x = OBS.float()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.cov(x, fweights=fw, aweights=aw)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        graph(x, fw, aw)


def test_the_cov_graph_accepts_zero_weights_that_do_not_sum_to_zero(cov_graph):
    graph, _ = cov_graph
    fw, aw = FW.clone(), AW.float().clone()
    fw[0], aw[1] = 0, 0.0  # just inside: zero is not negative
    x = OBS.float()
    torch.testing.assert_close(graph(x, fw, aw), Cov()(x, fw, aw))


# --- installing and restoring ---------------------------------------------------------------------

def test_torchs_functions_are_back_after_the_block_even_when_it_raises():
    before = {r.qualname: getattr(__import__(r.module, fromlist=[r.name]), r.name) for r in REPLACEMENTS}
    with pytest.raises(KeyError, match="inside"):
        with static_library_branches([]):
            assert F.gaussian_nll_loss is not before["torch.nn.functional.gaussian_nll_loss"]
            raise KeyError("inside")
    after = {r.qualname: getattr(__import__(r.module, fromlist=[r.name]), r.name) for r in REPLACEMENTS}
    assert after == before


# --- through the pipeline (slow: real runs) ------------------------------------------------------

HERE = "tests.capture.test_torch_branches"


class MaskedLoss(torch.nn.Module):
    """An encoder probed for causality, a Gaussian NLL loss and a covariance: each of torch's value
    branches made static."""

    def __init__(self):
        super().__init__()
        self.enc = Encoder().enc
        self.register_buffer("mask", NOT_CAUSAL.clone())
        self.loss = torch.nn.GaussianNLLLoss()

    def forward(self, x, var):
        h = self.enc(x, mask=self.mask)
        return self.loss(h, x, var) + torch.cov(h.flatten(0, 1).t()).mean()


def masked_loss():
    return MaskedLoss()


def _run(tmp_path, models_yaml, **defaults):
    from aotpipe.pipeline.config import parse_pipeline
    from aotpipe.pipeline.runner import run_pipeline

    d = {"graphs": "[inference, forward, backward, joint]", "passes": "[]", **defaults}
    text = ("version: 1\nname: branches\nexecutor: {kind: local}\ndefaults: {"
            + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}\nmodels:\n" + models_yaml)
    run = run_pipeline(parse_pipeline(text, str(tmp_path / "p.yaml")), output=tmp_path / "out", progress=False)
    return {m.name: m for m in run.models}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["export", "dynamo"])
def test_both_branches_are_captured_whole_and_checked_in_either_mode(tmp_path, mode):
    models = _run(tmp_path, f"  - {{name: m, source: '{HERE}:masked_loss', inputs: [{{shape: [2, 3, 4]}}, "
                            f"{{shape: [2, 3, 4], low: 0.5, high: 1.5}}]}}\n", mode=mode)
    m = models["m"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.outside_graphs is None
    assert m.checks.failed == 0 and m.checks.run >= 4 and not m.checks.skipped
    assert CAUSAL_NOTE in m.notes and GAUSSIAN_NOTE in m.notes and COV_NOTE in m.notes


# Every torch-modules sample and torch-ops operator that failed on these branches before
# (GuardOnDataDependentSymNode in _detect_is_causal_mask or gaussian_nll_loss, aten.equal in cov):
# nn.Transformer s32-s63 (a float src_mask and a bool tgt_mask, no hint), nn.TransformerEncoder
# s19-s34 (a mask, no hint), nn.GaussianNLLLoss, and the ops gaussian_nll_loss, cov, corrcoef.
# Every fourth Transformer sample (all 56 took ~13 minutes on 2 loaded cores; the corpus
# benchmark, benchmarks/torch_corpus_bench.py, runs every one).
AFFECTED = ([("module", f"nn.Transformer.s{k}") for k in range(32, 64, 4)]
            + [("module", f"nn.TransformerEncoder.s{k}") for k in range(19, 35, 4)]
            + [("module", f"nn.GaussianNLLLoss.s{k}") for k in range(5)]
            + [("op", f"{n}.s0") for n in ("nn.functional.gaussian_nll_loss", "cov", "corrcoef")])


@pytest.mark.slow
def test_every_affected_torch_corpus_sample_is_ok_with_every_check_run(tmp_path):
    lines = "".join(f"  - {{name: {n}, source: 'torch-{kind}:{n.rsplit('.s', 1)[0]}', "
                    f"args: {{sample: {n.rsplit('.s', 1)[1]}}}}}\n" for kind, n in AFFECTED)
    models = _run(tmp_path, lines, mode="auto")
    bad = {n: (m.status, m.stage, m.error) for n, m in models.items()
           if m.status != "ok" or m.checks.failed or m.checks.skipped or not m.checks.run}
    assert not bad, bad
    for n, m in models.items():
        note = GAUSSIAN_NOTE if "aussian" in n else COV_NOTE if n.startswith("co") else CAUSAL_NOTE
        assert note in m.notes, (n, m.notes)
