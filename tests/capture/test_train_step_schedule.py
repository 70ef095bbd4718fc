"""A learning-rate scheduler's value per step: the train_step graph takes the rate as an input
(role lr), each chained step is fed the schedule's (checks and replay alike), and a step fed
the wrong rate is caught."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.format import records
from aotpipe.models.train_step import lr_schedule
from aotpipe.replay import steps as replay_steps_module
from aotpipe.spec.optim import OptimizerSpec
from tests.helpers.pipelines import run_yaml

_PIPELINE = """version: 1
name: p
output: out
seed: 0
defaults: {mode: export, loss: mean, graphs: [forward, backward, train_step]}
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 32, hidden: 64, depth: 2}
    inputs: [{shape: [8, 32]}]
    optimizer: {name: sgd, lr: 0.1, momentum: 0.9, warmup_steps: 2, scheduler: {name: step, step_size: 1, gamma: 0.5}}
"""


def _manifest(out: Path) -> records.Manifest:
    return records.read(records.Manifest, out / "p" / "mlp" / records.MANIFEST, out / "p" / "mlp")[1]


def test_the_schedule_is_torchs_scheduler_stepped_after_each_optimizer_step():
    spec = OptimizerSpec.model_validate({"name": "sgd", "lr": 0.1, "scheduler": {"name": "step", "step_size": 2,
                                                                                 "gamma": 0.5}})
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    assert lr_schedule(spec, 5) == seen == [0.1, 0.1, 0.05, 0.05, 0.025]
    assert lr_schedule(OptimizerSpec.model_validate({"name": "sgd", "lr": 0.1}), 5) is None


def test_the_step_takes_the_schedules_rate_and_its_chain_is_checked_and_replayed(tmp_path):
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 0, res.output
    folder = out / "p" / "mlp" / "mlp_train_step_0"
    record = json.loads((folder / "inputs.json").read_text())
    [lr] = [i for i in record["inputs"] if i["role"] == "lr"]
    assert lr["target"] == "lr" and lr["name"] == "lr"
    manifest = _manifest(out)
    checks = manifest.graphs["train_step"].checks
    assert checks.failed == 0 and "update of layers.0.weight after 3 steps" in {i.what for i in checks.items}
    assert any("learning rate by StepLR(gamma=0.5, step_size=1)" in n for n in manifest.capture.notes)
    # the saved rate is the schedule's for the step after the two warm-up steps: 0.1 * 0.5**2
    from aotpipe.artifact.load import load

    ga = load(out / "p" / "mlp").graphs["train_step"]
    saved = ga.saved_inputs()
    [value] = [v for r, v in zip(ga.record.inputs, saved, strict=True) if r.role == "lr"]
    assert float(value) == 0.025
    r = CliRunner().invoke(main, ["replay", str(out / "p" / "mlp"), "--graph", "train_step", "--steps", "3"])
    assert r.exit_code == 0 and "steps      match" in r.output, r.output


def test_a_chain_fed_one_rate_throughout_fails_the_three_step_check(tmp_path, monkeypatch):
    # planted: the chain keeps the first step's rate (no schedule); eager halves it each step
    monkeypatch.setattr("aotpipe.checks.written.schedule_rates", lambda art, record, steps: None)
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 1, res.output
    failed = [i.what for i in _manifest(out).graphs["train_step"].checks.items if not i.passed]
    assert "update of layers.0.weight after 3 steps" in failed
    assert "update of layers.0.weight" not in failed  # the first step has its rate


def test_replay_of_more_steps_without_a_recorded_scheduler_is_one_line(tmp_path):
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 0, res.output
    from aotpipe.artifact.load import load

    art = load(out / "p" / "mlp")
    ga = art.graphs["train_step"]
    assert replay_steps_module.schedule_rates(art, ga.record, 3) == pytest.approx([0.025, 0.0125, 0.00625])
    art.manifest.model.model_extra.pop("optimizer")  # as an artefact made elsewhere, without the optimizer
    assert replay_steps_module.schedule_rates(art, ga.record, 1) is None
    with pytest.raises(Exception) as e:
        replay_steps_module.schedule_rates(art, ga.record, 3)
    assert "takes its learning rate per step (role lr)" in str(e.value) and "--steps 1" in str(e.value)
    assert "\n" not in str(e.value)


def test_with_lr_sets_only_the_rate_in_its_own_dtype():
    from types import SimpleNamespace

    record = SimpleNamespace(inputs=[SimpleNamespace(role="user"), SimpleNamespace(role="lr")])
    x, lr = torch.ones(2), torch.tensor(0.5, dtype=torch.float64)
    new = replay_steps_module.with_lr(record, [x, lr], 0.25)
    assert new[0] is x and new[1].dtype == torch.float64 and float(new[1]) == 0.25
    assert math.isclose(float(lr), 0.5)  # the input itself untouched
