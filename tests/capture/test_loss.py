"""The `loss:` setting: what the training graphs differentiate (sum or mean of the outputs)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.eager import model_loss


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        return y, y.tanh()[:, :2]


def test_model_loss_sums_or_averages_every_floating_output():
    a, b = torch.ones(2, 3), torch.full((4,), 2.0)
    assert model_loss((a, b, torch.ones(2, dtype=torch.int64)), "sum").item() == 6 + 8
    assert model_loss((a, b), "mean").item() == 1 + 2
    with pytest.raises(ValueError, match="unknown loss"):
        model_loss(a, "max")


def test_a_mean_loss_seeds_each_gradient_with_one_over_numel(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "loss_model", sys.modules[__name__])
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: l
        defaults: {save_values: full}
        models:
          - {name: by_sum, source: "loss_model:TwoOutputs", inputs: [{shape: [2, 4]}]}
          - {name: by_mean, source: "loss_model:TwoOutputs", inputs: [{shape: [2, 4]}], loss: mean}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    assert r.exit_code == 0, r.output
    for m in json.loads(r.stdout)["models"]:
        assert m["status"] == "ok" and m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m
    by_sum, by_mean = (load(tmp_path / "out" / "l" / n) for n in ("by_sum", "by_mean"))
    assert by_sum.manifest.capture.options["loss"] == "sum" and by_mean.manifest.capture.options["loss"] == "mean"
    # The forward's first output is the loss itself: the model's outputs, reduced each way.
    outs = {}
    for art, kind in ((by_sum, "sum"), (by_mean, "mean")):
        weight, bias, x = art.graphs["inference"].saved_inputs()
        model = TwoOutputs()
        model.load_state_dict({"fc.weight": weight, "fc.bias": bias})
        outs[kind] = model(x)
        torch.testing.assert_close(art.graphs["forward"].reference_outputs()[0], model_loss(outs[kind], kind))
    # The bias gradient of the mean loss: each row of the first output weighs 1/6, of the
    # second (tanh of the first two columns) 1/4 times tanh's derivative.
    y, t = outs["mean"]
    seed = torch.ones_like(y) / 6
    seed[:, :2] += (1 - t ** 2) / 4
    grads = by_mean.graphs["backward"].reference_outputs()
    bias_grad = next(g for g in grads if isinstance(g, torch.Tensor) and g.shape == (3,))
    torch.testing.assert_close(bias_grad, seed.sum(0).detach())
    assert by_sum.manifest.fingerprint != by_mean.manifest.fingerprint
