"""train_step under mixed precision (``optimizer: {..., autocast: bfloat16}``): the step's
forward and loss traced under torch.autocast, checked against eager steps under autocast by
the float64 rule with the half-type multiplier, and by a structural check that the graph
computes in bfloat16 where eager does (the value checks cannot see a step that lost its casts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.capture import export as export_capture
from aotpipe.cli import main
from aotpipe.format import records
from aotpipe.models import train_step as eager_steps
from aotpipe.models.eager import model_loss
from aotpipe.models.train_step import LoweredOps
from aotpipe.replay.eager import artifact_optimizer
from tests.capture.test_train_step import _plant
from tests.helpers.pipelines import run_yaml

_PIPELINE = """\
version: 1
name: p
seed: 0
defaults:
  mode: export
  graphs: [forward, backward, train_step]
  optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01, autocast: bfloat16}
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 32, hidden: 64, depth: 2}
    inputs: [{shape: [8, 32]}]
"""
_CNN = """\
  - name: cnn
    source: aotpipe.zoo:small_cnn
    args: {channels: 8}
    inputs: [{shape: [4, 3, 16, 16]}]
    optimizer: {name: sgd, lr: 0.01, momentum: 0.9, autocast: bfloat16}
"""
_AMP_CHECK = "computes in bfloat16 (autocast)"


def _manifest(out: Path, model: str) -> records.Manifest:
    return records.read(records.Manifest, out / "p" / model / records.MANIFEST, out / "p" / model)[1]


def _checks(out: Path, model: str) -> dict[str, bool]:
    return {i.what: i.passed for i in _manifest(out, model).graphs["train_step"].checks.items}


def _graph_nodes(out: Path, model: str) -> list[dict]:
    return json.loads((out / "p" / model / f"{model}_train_step_0" / "graph.json").read_text())["nodes"]


def _dtype(node: dict) -> str | None:
    """The dtype graph.json records for a node of one output."""
    val = node.get("val")
    return val.get("dtype") if isinstance(val, dict) else None


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("amp")
    res, out = run_yaml(tmp, _PIPELINE + _CNN)
    return res, out


def test_a_mixed_step_computes_in_bfloat16_and_passes_against_eager_under_autocast(mixed_run):
    res, out = mixed_run
    assert res.exit_code == 0, res.output
    for model in ("mlp", "cnn"):
        checks = _checks(out, model)
        assert checks[_AMP_CHECK] and all(checks.values()), checks
        nodes = _graph_nodes(out, model)
        low = {n["target"] for n in nodes if n["op"] == "call_function" and _dtype(n) == "bfloat16"}
        matmul = "aten.addmm.default" if model == "mlp" else "aten.convolution.default"
        assert matmul in low  # the matmul (conv) in bfloat16: autocast's casts are in the graph
        casts_back = [n for n in nodes if n.get("target") == "aten._to_copy.default"
                      and _dtype(n) == "float32"]
        assert casts_back  # the weight gradients cast back to the parameters' float32
        record = load(out / "p" / model).graphs["train_step"].record
        params = [i for i in record.inputs if i.role == "param"] + [o for o in record.outputs if o.role == "param"]
        assert params and all(str(i.dtype) == "float32" for i in params)  # master weights stay float32
        manifest = _manifest(out, model)
        notes = " ".join(manifest.capture.notes)
        assert "train_step: autocast bfloat16: " in notes and "compute in bfloat16" in notes
        assert "under autocast bfloat16" in notes  # the optimizer's description
        assert "not against the float32 backward graph's" in notes
    mlp = _checks(out, "mlp")
    assert not [w for w in mlp if "against the backward graph" in w]  # not compared: said in the note instead


def test_a_mixed_step_replays_three_chained_steps_bit_for_bit_and_knows_its_autocast(mixed_run):
    _, out = mixed_run
    res = CliRunner().invoke(main, ["replay", str(out / "p" / "mlp"), "--graph", "train_step", "--steps", "3"])
    assert res.exit_code == 0, res.output
    assert "the outputs after step 3 equal the capture's bit for bit" in res.output
    spec = artifact_optimizer(load(out / "p" / "mlp"))
    assert spec is not None and spec.autocast == "bfloat16"  # replay --bench's eager step runs under it


def test_an_eager_reference_without_autocast_fails_the_mixed_step(tmp_path, monkeypatch):
    import contextlib

    monkeypatch.setattr(eager_steps, "mixed_precision", lambda spec, values: contextlib.nullcontext())
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 1, res.output
    failed = [w for w, ok in _checks(out, "mlp").items() if not ok]
    assert "loss" in failed and _AMP_CHECK in failed  # eager float32 computes nothing in bfloat16


def test_a_step_that_lost_its_casts_fails_only_the_structural_check(tmp_path, monkeypatch):
    def float32_joint(ep, args, kwargs, user_names, int_ranges, state, constants, loss, dtype):
        return export_capture._training_graphs(ep, args, kwargs, user_names, int_ranges, state, constants, loss)[0]

    monkeypatch.setattr(export_capture, "_autocast_joint", float32_joint)
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 1, res.output
    checks = _checks(out, "mlp")
    # float32 throughout is nearer the float64 reference than eager's bfloat16: every value passes
    assert [w for w, ok in checks.items() if not ok] == [_AMP_CHECK]
    item = next(i for i in _manifest(out, "mlp").graphs["train_step"].checks.items if i.what == _AMP_CHECK)
    assert "the graph's none, eager's forward under autocast" in (item.detail or "")


def test_a_wrong_beta2_under_autocast_fails_naming_the_state(tmp_path, monkeypatch):
    planted = _plant(monkeypatch, 0.999, 0.99)
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert planted and res.exit_code == 1, res.output
    failed = [w for w, ok in _checks(out, "mlp").items() if not ok]
    # at the first step the second moments of the weights behind bfloat16 matmuls carry eager's
    # own bfloat16 noise (their gradients are rounded products), which hides a beta2 off by 0.009
    # there; the head's bias gradient comes through no matmul, and three steps show it everywhere
    assert {"state head.bias:exp_avg_sq", "update of layers.0.weight",
            "state layers.0.weight:exp_avg_sq after 3 steps"} <= set(failed)


def test_the_loss_of_half_outputs_is_float32_under_autocast_only():
    out = torch.randn(4, 3).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model_loss(out, "mean").dtype == torch.float32
    assert model_loss(out, "mean").dtype == torch.bfloat16  # a bfloat16 model without autocast: its own dtype


def test_lowered_ops_counts_real_low_precision_compute_not_casts_nor_fake_values():
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with LoweredOps(torch.bfloat16) as ops, torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x)
    assert ops.seen.get("addmm") == 1 and "_to_copy" not in ops.seen
    with LoweredOps(torch.bfloat16) as plain:
        lin(x)
        x.bfloat16()  # a cast alone computes nothing in bfloat16
    assert not plain.seen
    from torch._subclasses.fake_tensor import FakeTensorMode

    with LoweredOps(torch.bfloat16) as faked:
        with FakeTensorMode() as mode:
            a = mode.from_tensor(torch.randn(2, 2).bfloat16())
            (a @ a).sum()
    assert not faked.seen


def test_a_model_without_parameters_is_refused_in_one_line_without_a_mode_hint(tmp_path):
    res, out = run_yaml(tmp_path, _PIPELINE.replace("""    source: aotpipe.zoo:mlp
    args: {in_features: 32, hidden: 64, depth: 2}
    inputs: [{shape: [8, 32]}]""", """    source: 'torch-module:nn.ZeroPad1d'
    args: {sample: 0}"""))
    assert res.exit_code == 1, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("FAILED"))
    assert "capture: train_step: ZeroPad1d has no parameter for the optimizer to update" in line, line
    assert "leave train_step out of graphs; next: rerun with -v" in line and "mode: auto" not in line, line


def test_a_gru_step_under_autocast_rounds_its_hidden_update_as_eager_does(tmp_path):
    """The recurrent decomposition computes the GRU update as eager's CPU cell does,
    (h - n) * z + n with h float32: the textbook (1 - z) * n + z * h rounds twice in
    bfloat16 under autocast, and these two module_db samples' steps then failed against
    eager's (an update of weight_hh_l1; the loss after 3 steps)."""
    pipeline = _PIPELINE.split("models:")[0] + "models:\n" + "".join(
        f"  - {{name: gru{i}, source: 'torch-module:nn.GRU', args: {{sample: {i}}}}}\n" for i in (2, 4))
    res, out = run_yaml(tmp_path, pipeline)
    assert res.exit_code == 0, res.output
    for model in ("gru2", "gru4"):
        checks = _checks(out, model)
        assert checks and all(checks.values()), checks
