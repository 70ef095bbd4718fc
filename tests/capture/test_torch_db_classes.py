"""Capture failure classes a run over torch's own test databases (module_db, op_db samples
wrapped as models, default settings) showed, each reproduced with a small model of our own
and run through the real pipeline (mode auto, the default)."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from aotpipe.artifact.load import load
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.runner import run_pipeline

HERE = "tests.capture.test_torch_db_classes"


def _run(tmp_path, models_yaml, **defaults):
    d = {"graphs": "[inference, forward, backward, joint]", "passes": "[]", **defaults}
    text = ("version: 1\nname: classes\nexecutor: {kind: local}\ndefaults: {"
            + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}\nmodels:\n" + models_yaml)
    run = run_pipeline(parse_pipeline(text, str(tmp_path / "p.yaml")), output=tmp_path / "out", progress=False)
    return {m.name: m for m in run.models}


def _manifest(tmp_path, name):
    return json.loads((tmp_path / "out" / "classes" / name / "manifest.json").read_text())


def _checked(manifest, kind):
    return {c["what"]: c for c in manifest["graphs"][kind]["checks"]["items"]}


# 1. Lazy modules: their parameters exist only after a first call. Capture materialises them
# by one eager call on the example inputs, seeded from the model's seed.

class LazyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.LazyConv2d(4, 3)
        self.bn = torch.nn.LazyBatchNorm2d()
        self.up = torch.nn.LazyConvTranspose1d(2, 2)
        self.lin = torch.nn.LazyLinear(5)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.lin(y.flatten(1)), self.up(y.flatten(2))


def lazy_net():
    return LazyNet()


def test_lazy_modules_are_materialised_before_capture_and_noted(tmp_path):
    models = _run(tmp_path, f"  - {{name: lazy, source: '{HERE}:lazy_net', inputs: [{{shape: [2, 3, 6, 6]}}]}}\n")
    m = models["lazy"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run > 0
    man = _manifest(tmp_path, "lazy")
    assert man["capture"].get("fallback") is None  # export took it, not dynamo
    note = next(n for n in man["capture"]["notes"] if n.startswith("lazy module(s) materialised"))
    assert "LazyConv2d" in note and "LazyLinear" in note and "conv, bn, up, lin" in note
    # eager's running statistics were not moved by the materialising call (eval mode)
    art = load(tmp_path / "out" / "classes" / "lazy")
    assert {g.kind for g in art.graphs.values()} == {"inference", "forward", "backward", "joint"}


def _materialised(seed):
    from aotpipe.capture.export import materialise_lazy_modules

    torch.manual_seed(seed)  # as sources.build_model seeds the model's weights
    model = LazyNet()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    before = torch.random.get_rng_state()
    assert materialise_lazy_modules(model, (x,), {}) is not None
    assert torch.equal(torch.random.get_rng_state(), before)  # the global generator is left as it was
    assert not any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in model.parameters())
    assert torch.equal(model.bn.running_mean, torch.zeros(4))  # the call ran in eval mode
    assert model.training
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_lazy_weights_are_the_same_for_the_same_seed_and_differ_for_another():
    a, b, c = _materialised(7), _materialised(7), _materialised(8)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lin.weight"], c["lin.weight"])


def test_a_model_without_lazy_modules_is_left_alone():
    from aotpipe.capture.export import materialise_lazy_modules

    model = torch.nn.Linear(3, 3)
    assert materialise_lazy_modules(model, (torch.ones(1, 3),), {}) is None


# 2. Effect tokens: linalg.inv, solve, cholesky, lu_factor, tensorinv and tensorsolve call
# aten._linalg_check_errors, an ordered effect in torch: functionalisation threaded an effect
# token through every graph, an input and output aotpipe's format has no role for.

class Linalg(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4) * 0.1)

    def forward(self, x):
        a = x @ x.mT + 4 * torch.eye(4) + self.w
        lu, _ = torch.linalg.lu_factor(a)
        return (torch.linalg.inv(a), torch.linalg.cholesky(a @ a.mT), torch.linalg.solve(a, x), lu,
                torch.linalg.tensorinv(a.reshape(4, 2, 2), ind=1),
                torch.linalg.tensorsolve(a.reshape(2, 2, 4), x[0].reshape(2, 2)))


def linalg():
    return Linalg()


LINALG_YAML = f"  - {{name: linalg, source: '{HERE}:linalg', inputs: [{{shape: [4, 4]}}]}}\n"


def test_linalg_checks_are_captured_as_plain_nodes_without_effect_tokens(tmp_path):
    models = _run(tmp_path, LINALG_YAML)
    m = models["linalg"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run > 0
    man = _manifest(tmp_path, "linalg")
    assert man["capture"].get("fallback") is None
    assert any(n.startswith("aten._linalg_check_errors.default (an ordered effect") for n in man["capture"]["notes"])
    art = load(tmp_path / "out" / "classes" / "linalg")
    for key, ga in art.graphs.items():
        roles = {i.role for i in ga.record.inputs} | {o.role for o in ga.record.outputs}
        assert roles <= {"param", "buffer", "constant", "user", "tangent", "saved", "mutation", "grad", "none"}
        targets = [n.target for n in ga.structure.graph.nodes if n.op == "call_function"]
        assert torch.ops.higher_order.with_effects not in targets
        checks = targets.count(torch.ops.aten._linalg_check_errors.default)
        # forward and inference check each linalg call's info; the backward does not repeat it
        assert checks == (0 if ga.kind == "backward" else 6), (key, checks)
    assert set(_checked(man, "inference")) >= {f"output {i}" for i in range(6)}


def test_a_captured_linalg_graph_raises_on_a_singular_input_as_eager_does(tmp_path):
    _run(tmp_path, LINALG_YAML, graphs="[inference]")
    art = load(tmp_path / "out" / "classes" / "linalg").build_all()
    ga = art.graphs["inference"]
    inputs = ga.saved_inputs()
    user = next(i for i, r in enumerate(ga.record.inputs) if r.role == "user")
    param = next(i for i, r in enumerate(ga.record.inputs) if r.role == "param")
    inputs[user] = torch.zeros(4, 4)
    inputs[param] = -4 * torch.eye(4)  # a = 0: singular
    with pytest.raises(RuntimeError, match="lu_factor: U\[1,1\] is zero"):  # the first check, as in eager
        ga.module(*inputs)


def test_capture_leaves_torch_s_effect_registrations_as_they_were():
    from torch._higher_order_ops.effects import _get_effect

    from aotpipe.capture.export import capture_export

    check = torch.ops.aten._linalg_check_errors.default
    before = _get_effect(check)
    capture_export(Linalg(), (torch.randn(4, 4),), {}, name="linalg", graphs=["inference"], input_names=["x"])
    assert _get_effect(check) == before is not None
    assert check not in torch.fx.node._side_effectful_functions


def test_linalg_graphs_load_anywhere_under_the_derived_list(tmp_path):
    # the ops these graphs hold are in the list for artefacts from elsewhere: no note says otherwise,
    # and a plain load (not the capture's own) takes them
    _run(tmp_path, LINALG_YAML, graphs="[inference, forward, backward]")
    man = _manifest(tmp_path, "linalg")
    assert not [n for n in man["capture"]["notes"] if "refuses in artefacts from elsewhere" in n]
    names = {n.target for ga in load(tmp_path / "out" / "classes" / "linalg").graphs.values()
             for n in ga.structure.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._linalg_check_errors.default in names


# 3. User inputs updated in place: running statistics passed to F.batch_norm and
# F.instance_norm as the model's inputs, in training mode.

class NormWithInputStats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(3, 1) + 0.5)

    def forward(self, x, running_mean, running_var, inst_mean, inst_var):
        y = x * self.scale
        return (F.batch_norm(y, running_mean, running_var, training=True)
                + F.instance_norm(y, inst_mean, inst_var, use_input_stats=True))


def norm_with_input_stats():
    return NormWithInputStats()


STATS = ("running_mean", "running_var", "inst_mean", "inst_var")


def test_user_inputs_updated_in_place_are_mutations_checked_against_eager(tmp_path):
    stats = ", ".join(f"{{name: {n}, shape: [3]" + (", low: 0.5, high: 1.5}" if n.endswith("var") else "}")
                      for n in STATS)
    m = _run(tmp_path, f"  - {{name: norm, source: '{HERE}:norm_with_input_stats', "
                       f"inputs: [{{name: x, shape: [4, 3, 5]}}, {stats}]}}\n")["norm"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0
    man = _manifest(tmp_path, "norm")
    for kind in ("inference", "forward"):
        checked = _checked(man, kind)
        for n in STATS:
            assert checked[f"new value of {n}"]["passed"], (kind, n)
    art = load(tmp_path / "out" / "classes" / "norm")
    assert art.graphs["forward"].record.partition.mutated_inputs == list(STATS)
    joint = art.graphs["joint"].record
    assert [o.target for o in joint.outputs if o.role == "mutation"] == list(STATS)


# 4. A sparse intermediate: the format holds dense, strided tensors only.

class SparseRoundTrip(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).to_sparse().to_dense() * 2


def sparse_round_trip():
    return SparseRoundTrip()


@pytest.mark.parametrize("mode", ["auto", "export"])  # dynamo breaks the graph around to_sparse: captured
def test_a_sparse_intermediate_is_refused_in_one_line_naming_the_node(tmp_path, mode):
    m = _run(tmp_path, f"  - {{name: sparse, source: '{HERE}:sparse_round_trip', inputs: [{{shape: [2, 4]}}]}}\n",
             mode=mode)["sparse"]
    assert m.status == "failed" and m.stage == "write"
    assert "\n" not in m.error and "NotImplementedError" not in m.error
    assert re.search(r"the inference graph's node '\w*to_sparse\w*' \(aten\._?to_sparse[\w.]*\) at "
                     r"tests/capture/test_torch_db_classes\.py:\d+ is a torch\.sparse_coo tensor: sparse tensors are "
                     r"outside aotpipe's format", m.error), m.error
    assert not (tmp_path / "out" / "classes" / "sparse").exists()


# 5. An op that re-seeds the generator inside forward: the seeding runs once while tracing and
# is not in the graph, whose dropout then draws other masks than eager's.

class ReseedThenDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        torch.manual_seed(123)
        return F.dropout(self.lin(x), 0.5, self.training)


def reseed_then_dropout():
    return ReseedThenDropout()


RESEED_YAML = f"  - {{name: reseed, source: '{HERE}:reseed_then_dropout', inputs: [{{shape: [2, 4]}}]}}\n"


def test_reseeding_inside_forward_is_named_as_the_cause_in_mode_export(tmp_path):
    m = _run(tmp_path, RESEED_YAML, mode="export")["reseed"]
    assert m.status == "failed" and m.stage == "capture"
    assert "\n" not in m.error
    assert re.search(r"the model re-seeds the random generator inside forward \(torch\.manual_seed at "
                     r"tests/capture/test_torch_db_classes\.py:\d+\) and its \w+ graph draws random numbers "
                     r"\(aten\.native_dropout\.default\)", m.error), m.error


def test_reseeding_inside_forward_is_the_named_cause_in_mode_auto_too(tmp_path):
    # export refuses, naming the cause; dynamo's graphs alone (the composition check feeds them
    # no eager glue, and the re-seed is glue) do not reproduce the model's draws: failed, not ok
    m = _run(tmp_path, RESEED_YAML)["reseed"]
    assert m.status == "failed" and m.stage == "capture", (m.stage, m.error)
    assert "\n" not in m.error
    assert "re-seeds the random generator inside forward (torch.manual_seed at" in m.error
    assert "do not reproduce the model" in m.error


def test_reseeding_without_random_draws_is_captured(tmp_path):
    m = _run(tmp_path, RESEED_YAML, mode="export", graphs="[inference]")["reseed"]
    assert m.status == "ok", (m.stage, m.error)


def test_the_seed_aotpipe_itself_sets_is_not_the_model_s():
    from aotpipe.capture.export import materialise_lazy_modules, model_reseeds

    before = (torch.manual_seed, torch.random.manual_seed, torch.set_rng_state, torch.seed)
    with model_reseeds() as calls:
        # materialise_lazy_modules seeds the generator, in aotpipe's code
        assert materialise_lazy_modules(LazyNet(), (torch.ones(2, 3, 6, 6),), {}) is not None
        torch.manual_seed(5)  # this file's: a model's code would be here
    assert calls == [f"torch.manual_seed at tests/capture/test_torch_db_classes.py:{_line_of('torch.manual_seed(5)')}"]
    assert (torch.manual_seed, torch.random.manual_seed, torch.set_rng_state, torch.seed) == before  # put back


def _line_of(text):
    lines = open(__file__, encoding="utf-8").read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


# 6. Complex outputs (an fft, torch.polar, casts to complex64 and complex32): checked through
# their real view, and differentiated through their real part, not skipped.

class ComplexOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return torch.fft.fft(y), torch.polar(y.abs(), y), y.to(torch.cfloat) * (1 + 2j), y.to(torch.chalf)


def complex_outputs():
    return ComplexOutputs()


@pytest.mark.parametrize("mode", ["auto", "dynamo"])
def test_complex_outputs_and_their_gradients_are_checked_not_skipped(tmp_path, mode):
    m = _run(tmp_path, f"  - {{name: cplx, source: '{HERE}:complex_outputs', inputs: [{{shape: [2, 8]}}]}}\n",
             mode=mode)["cplx"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.skipped == 0 and m.checks.failed == 0
    man = _manifest(tmp_path, "cplx")
    assert man["capture"].get("fallback") is None  # export differentiates them too
    assert set(_checked(man, "inference")) == {f"output {i}" for i in range(4)}
    assert {"gradient of lin.weight", "gradient of lin.bias"} <= set(_checked(man, "backward"))


def test_the_loss_takes_a_complex_output_by_its_real_part():
    from aotpipe.models.eager import model_loss, output_weights

    z = torch.randn(3, 4, dtype=torch.cfloat)
    assert model_loss(z).dtype == torch.float32
    torch.testing.assert_close(model_loss(z), (z.real * output_weights(z.real)).sum())
    torch.testing.assert_close(model_loss((z, z.real), "sum"), 2 * z.real.sum())


class ComplexWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, dtype=torch.cfloat))

    def forward(self, x):
        return x * self.w


def test_the_float64_reference_of_a_complex_output_is_complex128():
    from aotpipe.models.eager import EagerReference

    ref = EagerReference(ComplexWeight(), (torch.randn(4, dtype=torch.cfloat),), {}, user_names=["x"])
    assert ref.run("inference").outputs[0].dtype == torch.complex64
    assert ref.run("inference", fp64=True).outputs[0].dtype == torch.complex128
    assert ref.run("training", fp64=True).grads["w"].dtype == torch.complex128


def _noisy(scale, dtype, n=10_000):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(n, dtype=torch.complex128, generator=g)
    noise = torch.randn(n, dtype=torch.complex128, generator=g)
    return ref, lambda k: (ref + k * scale * noise).to(dtype)


def test_a_complex_value_is_judged_by_the_float64_rule_on_its_real_view():
    from aotpipe.runtime.accuracy import compare

    ref, off = _noisy(1e-4, torch.cfloat)
    assert compare(off(1.5), off(1), lambda: ref).passed
    c = compare(off(3), off(1), lambda: ref, what="output 0")
    assert not c.passed and c.method == "fp64" and "float64" in c.line()
    # the error is an RMS over the (real, imaginary) pairs
    assert c.error == pytest.approx(3e-4 / 2 ** 0.5, rel=0.05)


def test_complex32_is_judged_by_the_half_precision_rule():
    from aotpipe.runtime.accuracy import compare

    ref, off = _noisy(1e-2, torch.chalf)
    c = compare(off(2.5), off(1), lambda: ref)  # within 3x (half's multiplier), beyond float32's 2x
    assert c.passed and c.method == "fp64", c.line()
    assert not compare(off(4), off(1), lambda: ref).passed


@pytest.mark.parametrize("which", ["lazy", "linalg"])
def test_mode_dynamo_captures_lazy_and_linalg_models_too(tmp_path, which):
    yaml = (f"  - {{name: lazy, source: '{HERE}:lazy_net', inputs: [{{shape: [2, 3, 6, 6]}}]}}\n" if which == "lazy"
            else LINALG_YAML)
    m = _run(tmp_path, yaml, mode="dynamo")[which]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run > 0
    if which == "lazy":
        assert any("lazy module(s) materialised" in n for n in _manifest(tmp_path, "lazy")["capture"]["notes"])


def test_a_complex_output_that_is_a_conjugate_view_is_differentiated_too():
    # torch.fft.ifft of a real input returns a lazily conjugated view, which view_as_real refuses
    from aotpipe.capture.export import capture_export
    from aotpipe.models.eager import model_loss

    z = torch.fft.ihfft(torch.randn(8))
    assert z.is_conj()
    torch.testing.assert_close(model_loss(z, "sum"), z.real.sum())
    x = torch.randn(8, requires_grad=True)
    cap = capture_export(IHfft(), (x,), {}, name="ihfft", graphs=["forward", "backward"], input_names=["x"])
    assert {"forward", "backward"} <= set(cap.graphs)


class IHfft(torch.nn.Module):
    def forward(self, x):
        return torch.fft.ihfft(x)


class IHfftOfLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.fft.ihfft(self.lin(x))


def ihfft_of_linear():
    return IHfftOfLinear()


def test_a_conjugate_view_output_is_checked_and_replayed(tmp_path):
    # the checks' float64 rule and the evidence read a complex output through view_as_real,
    # which refused the lazily conjugated view ihfft returns
    m = _run(tmp_path, f"  - {{name: ihfft, source: '{HERE}:ihfft_of_linear', inputs: [{{shape: [2, 8]}}]}}\n",
             mode="export")["ihfft"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.skipped == 0 and m.checks.run > 0
