"""The `loss:` setting: what the training graphs differentiate (weighted, sum or mean of the outputs)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.models.eager import model_loss, output_weights


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        return y, y.tanh()[:, :2]


def test_model_loss_weighs_sums_or_averages_every_floating_output():
    a, b = torch.ones(2, 3), torch.full((4,), 2.0)
    assert model_loss((a, b, torch.ones(2, dtype=torch.int64)), "sum").item() == 6 + 8
    assert model_loss((a, b), "mean").item() == 1 + 2
    # weights 1 + ((3i + 0) mod 7)/8 + ((3j + 1) mod 7)/8: rows [1.125, 1.5, 1], [1.5, 1.875, 1.375]
    assert output_weights(a).tolist() == [[1.125, 1.5, 1.0], [1.5, 1.875, 1.375]]
    assert model_loss((a, b)).item() == 8.375 + 2 * (1 + 1.375 + 1.75 + 1.25)
    with pytest.raises(ValueError, match="unknown loss 'max'; one of weighted, sum, mean"):
        model_loss(a, "max")


def test_the_weighted_loss_of_normalised_outputs_is_not_constant():
    # LayerNorm rows sum to zero: the sum loss is constant (its gradients zero in exact
    # arithmetic); the weighted loss is not, in any dtype, with the same weights in each.
    x = torch.randn(4, 5, 8, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.layer_norm(x, (8,))
    assert abs(model_loss(y, "sum").item()) < 1e-12
    (g,) = torch.autograd.grad(model_loss(y), x)
    assert g.abs().min() > 0 and g.abs().mean() > 0.01
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert torch.equal(output_weights(y.to(dtype)).double(), output_weights(y))


def test_the_weights_are_built_in_the_graph_not_stored(tmp_path):
    from aotpipe.capture import capture_export

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.ln(x)

    cap = capture_export(Norm(), (torch.randn(4, 8),), {}, name="n", graphs=["forward"], input_names=["x"])
    fw = cap.graphs["forward"]
    assert cap.options["loss"] == "weighted" and not cap.constants
    assert sum(n.target is torch.ops.aten.arange.start_step or n.target is torch.ops.aten.arange.default
               for n in fw.gm.graph.nodes) == 2  # one per dimension
    assert [gi.role for gi in fw.inputs] == ["param", "param", "user"]


def test_each_loss_seeds_the_gradients_as_it_says(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "loss_model", sys.modules[__name__])
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: l
        defaults: {save_values: full}
        models:
          - {name: by_default, source: "loss_model:TwoOutputs", inputs: [{shape: [2, 4]}]}
          - {name: by_sum, source: "loss_model:TwoOutputs", inputs: [{shape: [2, 4]}], loss: sum}
          - {name: by_mean, source: "loss_model:TwoOutputs", inputs: [{shape: [2, 4]}], loss: mean}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.stdout)["models"]:
        assert m["status"] == "ok" and m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m
    arts = {kind: load(tmp_path / "out" / "l" / n) for kind, n in
            (("weighted", "by_default"), ("sum", "by_sum"), ("mean", "by_mean"))}
    assert {k: a.manifest.capture.options["loss"] for k, a in arts.items()} == {k: k for k in arts}
    # The forward's first output is the loss itself: the model's outputs, reduced each way.
    outs = {}
    for kind, art in arts.items():
        weight, bias, x = art.graphs["inference"].saved_inputs()
        model = TwoOutputs()
        model.load_state_dict({"fc.weight": weight, "fc.bias": bias})
        outs[kind] = model(x)
        torch.testing.assert_close(art.graphs["forward"].reference_outputs()[0], model_loss(outs[kind], kind))
    # The bias gradient: each element of the first output weighs its weight (weighted) or
    # 1/6 (mean); of the second (tanh of the first two columns) its weight or 1/4 times
    # tanh's derivative.
    for kind in ("weighted", "mean"):
        y, t = (o.detach() for o in outs[kind])
        seed = output_weights(y) if kind == "weighted" else torch.ones_like(y) / 6
        seed[:, :2] += (1 - t ** 2) * (output_weights(t) if kind == "weighted" else 1 / 4)
        grads = arts[kind].graphs["backward"].reference_outputs()
        bias_grad = next(g for g in grads if isinstance(g, torch.Tensor) and g.shape == (3,))
        torch.testing.assert_close(bias_grad, seed.sum(0))
    assert len({a.manifest.fingerprint for a in arts.values()}) == 3


class Normalised(torch.nn.Module):
    """Every output a LayerNorm's: rows sum to zero, so their sum is constant."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32, elementwise_affine=False)

    def forward(self, x):
        return self.ln(self.fc(x) * 100)


def test_a_normalised_model_gets_real_gradients_from_the_weighted_loss(tmp_path, monkeypatch):
    # With the sum loss every gradient is zero in exact arithmetic (float32 leaves rounding
    # noise); with the weighted loss each is a real value, checked against eager.
    monkeypatch.setitem(sys.modules, "loss_model", sys.modules[__name__])
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: l
        defaults: {graphs: [forward, backward], save_values: full}
        models:
          - {name: weighted, source: "loss_model:Normalised", inputs: [{shape: [8, 16]}]}
          - {name: by_sum, source: "loss_model:Normalised", inputs: [{shape: [8, 16]}], loss: sum}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.stdout)["models"]:
        c = m["checks"]
        assert c["failed"] == c["skipped"] == 0 and c["exact"] + c["floor"] + c["fp64"] == c["run"] == 3, m
    rms = {}
    for name in ("weighted", "by_sum"):
        bw = load(tmp_path / "out" / "l" / name).graphs["backward"]
        grads = dict(zip((o.target for o in bw.record.outputs), bw.reference_outputs()))
        rms[name] = float(grads["fc.weight"].pow(2).mean().sqrt())
    assert rms["by_sum"] < 1e-3 and rms["weighted"] > 1, rms


@pytest.mark.parametrize("version", ["format_v1", "format_v2"])
def test_an_older_artefact_is_replayed_with_the_loss_it_recorded(version, monkeypatch):
    from pathlib import Path

    import aotpipe.replay.run
    from aotpipe.replay import replay_chain
    from aotpipe.replay.eager import artifact_loss

    art = load(Path(__file__).parent.parent / "data" / version / "mlp")
    assert artifact_loss(art) == "sum"
    chain = replay_chain(art)  # the eager model rebuilt, its gradients of the recorded loss
    assert (chain.status, chain.eager_within_tolerance, chain.problems) == ("match", True, [])
    # The default loss is another function: its gradients are not the artefact's.
    monkeypatch.setattr(aotpipe.replay.run, "artifact_loss", lambda a: "weighted")
    chain = replay_chain(art)
    assert chain.eager_within_tolerance is False and "off the eager model: gradient of " in chain.problems[0]


def test_the_yaml_offers_the_losses_capture_knows_and_defaults_to_weighted():
    from typing import get_args

    from aotpipe.pipeline.config import Defaults
    from aotpipe.spec import Loss
    from aotpipe.spec.modes import DEFAULT_LOSS, LOSSES

    assert get_args(Loss) == LOSSES and DEFAULT_LOSS == "weighted" == Defaults().loss
