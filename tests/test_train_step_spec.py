"""The YAML's optimizer: block and graphs: [..., train_step]: the optimizer table held to
torch's own classes, and every mistake a one-line error naming the field and the fix."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError
from aotpipe.format.vocabulary import DEFAULT_KINDS, GraphKind
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.spec.optim import OPTIMIZERS, REFUSED_ARGS, SCHEDULERS, OptimizerSpec


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_table_takes_every_argument_of_the_torch_class_but_those_it_refuses(name):
    info = OPTIMIZERS[name]
    torch_args = set(inspect.signature(getattr(torch.optim, info.cls).__init__).parameters) - {"self", "params"}
    assert set(info.args) <= torch_args, "an argument torch's class does not take"
    assert torch_args - set(info.args) <= set(REFUSED_ARGS), "an argument of torch's class neither taken nor refused"


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_the_scheduler_table_takes_arguments_of_the_torch_class(name):
    info = SCHEDULERS[name]
    params = inspect.signature(getattr(torch.optim.lr_scheduler, info.cls).__init__).parameters
    torch_args = set(params) - {"self", "optimizer", "last_epoch", "verbose"}
    assert set(info.args) == torch_args, "the table and torch's class disagree"


def test_a_scheduler_is_made_by_torch_with_its_arguments_and_described():
    spec = OptimizerSpec.model_validate({"name": "sgd", "lr": 0.1, "scheduler": {"name": "multistep",
                                                                                 "milestones": [1, 3], "gamma": 0.1}})
    assert spec.scheduler is not None and spec.scheduler.args == {"milestones": [1, 3], "gamma": 0.1}
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    getattr(torch.optim.lr_scheduler, spec.scheduler.info.cls)(opt, **spec.scheduler.args)
    assert spec.describe() == "SGD(lr=0.1), learning rate by MultiStepLR(gamma=0.1, milestones=[1, 3]), " \
                              "after 1 eager step(s)"


def test_a_spec_passes_its_arguments_to_the_class_as_torch_takes_them():
    spec = OptimizerSpec.model_validate({"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "foreach": True,
                                         "clip_grad_norm": 1, "warmup_steps": 2})
    assert spec.kwargs() == {"lr": 1e-3, "betas": (0.9, 0.95), "foreach": True}
    assert (spec.clip_grad_norm, spec.warmup_steps) == (1.0, 2)
    opt = getattr(torch.optim, spec.info.cls)([torch.nn.Parameter(torch.ones(2))], **spec.kwargs())
    assert opt.defaults["betas"] == (0.9, 0.95)
    assert spec.describe() == "AdamW(betas=[0.9, 0.95], foreach=True, lr=0.001), clip_grad_norm 1, after 2 eager step(s)"
    assert OptimizerSpec.model_validate({"name": "sgd"}).describe() == "SGD(), after 1 eager step(s)"


GOOD = textwrap.dedent("""\
    version: 1
    name: p
    defaults:
      mode: export
    models:
      - name: m
        source: aotpipe.zoo:mlp
        inputs: [{shape: [2, 16]}]
        graphs: [forward, backward, train_step]
        optimizer: {name: adamw, lr: 1.0e-3}
""")


def _problems(text: str):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(text, check_sources=False)
    return e.value.problems


@pytest.mark.parametrize("optimizer,field_says", [
    ("{name: adamx}", "unknown optimizer 'adamx'; choose one of sgd, adam, adamw, adagrad, rmsprop"),
    ("{lr: 1.0}", "names no optimizer; add name: one of sgd"),
    ("{name: adamw, beta2: 0.9}", "adamw (AdamW) has no argument 'beta2'; its arguments: amsgrad, betas, eps"),
    ("{name: sgd, momentum: high}", "sgd's momentum takes a number, not 'high'"),
    ("{name: adam, betas: [0.9]}", "adam's betas takes a pair of numbers"),
    ("{name: adam, betas: [true, 0.9]}", "adam's betas takes a pair of numbers, not [True, 0.9]"),
    ("{name: sgd, nesterov: 1}", "sgd's nesterov takes true or false, not 1"),
    ("{name: adamw, fused: true}", "adamw takes no fused here: torch 2.13 cannot trace the fused kernels"),
    ("{name: adam, capturable: true}", "adam takes no capturable here"),
    ("{name: adamw, clip_grad_norm: 0}", "greater than 0"),
    ("{name: adamw, warmup_steps: 0}", "greater than or equal to 1"),
    ("{name: sgd, scheduler: {name: onecycle}}", "unknown scheduler 'onecycle'; choose one of step, multistep"),
    ("{name: sgd, scheduler: {gamma: 0.5}}", "names no scheduler; choose one of step"),
    ("{name: sgd, scheduler: {name: step, step: 2}}", "scheduler step (StepLR) has no argument 'step'; its "
                                                     "arguments: gamma, step_size"),
    ("{name: sgd, scheduler: {name: step, step_size: 1.5}}", "scheduler step's step_size takes a whole number"),
    ("{name: sgd, scheduler: {name: multistep, milestones: [1, 2.5]}}", "takes a list of whole numbers"),
    ("{name: adamw, foreach: true, scheduler: {name: step, step_size: 2}}",
     "adamw with foreach: true takes no scheduler here"),
    ("{name: adamw, autocast: float16}", "autocast 'float16' is not taken: float16 training needs a gradient "
                                         "scaler (torch.amp.GradScaler)"),
    ("{name: adamw, autocast: bf16}", "autocast 'bf16' is not taken; choose one of bfloat16, or leave autocast out"),
    ("{name: adamw, autocast: true}", "autocast True is not taken; choose one of bfloat16"),
    ("{name: adamw, beta2: 0.9}", "(and aotpipe's clip_grad_norm, warmup_steps, scheduler, autocast)"),
])
def test_a_bad_optimizer_is_one_line_naming_its_line_and_the_choices(optimizer, field_says):
    text = GOOD.replace("{name: adamw, lr: 1.0e-3}", optimizer)
    [p] = _problems(text)
    assert p.line == 10 and p.field.startswith("models[0].optimizer")
    assert field_says in p.message


def test_train_step_without_an_optimizer_is_refused_naming_the_fix():
    [p] = _problems(GOOD.replace("    optimizer: {name: adamw, lr: 1.0e-3}\n", ""))
    assert (p.line, p.field) == (9, "models[0].graphs")
    assert "graphs lists train_step, which needs an optimizer; add optimizer: {name: adamw" in p.message


@pytest.mark.parametrize("mode", ["dynamo", "meta"])
def test_train_step_in_a_mode_without_export_joint_is_refused(mode):
    [p] = _problems(GOOD.replace("mode: export", f"mode: {mode}"))
    assert p.field == "models[0].graphs" and f"mode {mode} does not capture one; use mode export or auto" in p.message


def test_train_step_with_dims_is_refused_since_the_step_is_traced_at_the_example_sizes():
    text = GOOD.replace("inputs: [{shape: [2, 16]}]", "inputs: [{shape: [batch, 16]}]\n    dims: {batch: {min: 2, max: 8}}")
    [p] = _problems(text)
    assert p.field == "models[0].graphs" and "traced at the example sizes only; remove dims" in p.message


def test_the_default_graphs_leave_train_step_out_and_the_optimizer_off_the_fingerprint():
    spec = parse_pipeline(GOOD.replace("    graphs: [forward, backward, train_step]\n", "")
                          .replace("    optimizer: {name: adamw, lr: 1.0e-3}\n", ""), check_sources=False).models[0]
    assert spec.graphs == list(DEFAULT_KINDS) and GraphKind.TRAIN_STEP not in spec.graphs
    assert "optimizer" not in spec.to_json()  # fingerprints of pipelines without one stay as they were
    stepped = parse_pipeline(GOOD, check_sources=False).models[0]
    assert stepped.to_json()["optimizer"] == {"name": "adamw", "args": {"lr": 1e-3}, "clip_grad_norm": None,
                                               "warmup_steps": 1}


def test_autocast_is_on_the_fingerprint_only_where_it_is_asked_and_described():
    mixed = parse_pipeline(GOOD.replace("{name: adamw, lr: 1.0e-3}", "{name: adamw, lr: 1.0e-3, autocast: bfloat16}"),
                           check_sources=False).models[0]
    assert mixed.optimizer.autocast == "bfloat16" and mixed.to_json()["optimizer"]["autocast"] == "bfloat16"
    assert "autocast" not in parse_pipeline(GOOD, check_sources=False).models[0].to_json()["optimizer"]
    assert mixed.optimizer.describe() == "AdamW(lr=0.001), under autocast bfloat16, after 1 eager step(s)"


def test_a_model_optimizer_replaces_the_defaults_whole():
    text = GOOD.replace("  mode: export\n", "  mode: export\n  optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n")
    assert parse_pipeline(text, check_sources=False).models[0].optimizer.name == "adamw"
    inherited = parse_pipeline(text.replace("    optimizer: {name: adamw, lr: 1.0e-3}\n", ""),
                               check_sources=False).models[0].optimizer
    assert inherited.name == "sgd" and inherited.args == {"lr": 0.1, "momentum": 0.9}


def test_validate_says_the_optimizer_problem_from_the_command_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("lr: 1.0e-3", "lr: 1.0e-3, beta2: 0.9"))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code != 0
    assert f"{path}:10: models[0].optimizer" in r.output and "has no argument 'beta2'" in r.output
    assert "Traceback" not in r.output
