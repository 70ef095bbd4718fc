"""train_step: forward, loss, backward and the optimizer's update in one functional graph,
checked one step and three chained against eager ``optimizer.step()``, replayed in chains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.capture import train_step as capture_step
from aotpipe.cli import main
from aotpipe.format import records
from aotpipe.replay.inputs import get_inputs
from aotpipe.replay.steps import replay_steps
from tests.helpers.pipelines import run_yaml

MODELS = [f"{m}_{o}" for m in ("mlp", "small_cnn", "tiny_transformer", "running_norm") for o in ("adamw", "sgd")] + \
    ["mlp_sgd_steplr", "mlp_adamw_bf16"]


def _manifest(root: Path, model: str) -> records.Manifest:
    return records.read(records.Manifest, root / model / records.MANIFEST, root / model)[1]


def _step_folder(root: Path, model: str) -> Path:
    return root / model / f"{model}_train_step_0"


def _inputs(root: Path, model: str) -> dict:
    return json.loads((_step_folder(root, model) / "inputs.json").read_text())


@pytest.mark.slow  # pipelines/quickstart-train.yaml, run once per session: about a minute
@pytest.mark.parametrize("model", MODELS)
def test_every_quickstart_model_steps_with_adamw_and_sgd_checked_against_eager(train_run, model):
    root, _ = train_run
    manifest = _manifest(root, model)
    checks = manifest.graphs["train_step"].checks
    assert checks is not None and checks.failed == 0 and checks.skipped == 0, checks
    whats = {i.what for i in checks.items}
    record = _inputs(root, model)
    params = [i["target"] for i in record["inputs"] if i["role"] == "param"]
    states = [i["target"] for i in record["inputs"] if i["role"] == "state"]
    assert params and states
    assert {"loss", "loss after 3 steps"} <= whats
    grads = [o["target"] for o in record["outputs"] if o["role"] == "grad"]
    for p in params:  # one step and three
        assert {f"update of {p}", f"update of {p} after 3 steps"} <= whats, p
    mixed = model.endswith("_bf16")  # autocast: the backward graph is float32's, not compared (the note says so)
    for g in grads:  # and the step's gradient against eager's and (float32 steps) the backward graph's
        assert f"gradient of {g}" in whats, g
        assert (f"gradient of {g} against the backward graph's" in whats) != mixed, g
    assert ("computes in bfloat16 (autocast)" in whats) == mixed
    # a parameter the loss does not reach (the transformer's pooler) has no gradient, as the capture notes
    missing = set(params) - set(grads)
    assert not missing or any("get no gradient" in n and all(m in n for m in missing) for n in manifest.capture.notes)
    for s in states:
        assert {f"state {s}", f"state {s} after 3 steps"} <= whats, s
    keys = {s.rpartition(":")[2] for s in states}
    assert keys == ({"exp_avg", "exp_avg_sq", "step"} if "adamw" in model else {"momentum_buffer"})
    steps = manifest.verification["steps"]
    assert steps.compared == 3 and len(steps.digests) == len(record["outputs"])


@pytest.mark.slow  # pipelines/quickstart-train.yaml, run once per session: about a minute
def test_the_step_is_functional_plain_aten_and_says_what_each_value_is(train_run):
    root, _ = train_run
    graph = json.loads((_step_folder(root, "small_cnn_adamw") / "graph.json").read_text())
    targets = {n["target"] for n in graph["nodes"] if n["op"] == "call_function"}
    # no in-place op (nothing written at the boundary), no profiler marks, no foreach or fused kernel
    assert not [t for t in targets if t.split(".")[1].endswith("_") and not t.split(".")[1].startswith("_")]
    assert not [t for t in targets if t.startswith("profiler.") or "_foreach_" in t or "_fused_" in t]
    record = _inputs(root, "small_cnn_adamw")
    roles = [i["role"] for i in record["inputs"]]
    first = {r: roles.index(r) for r in ("param", "buffer", "state", "user")}
    assert first["param"] < first["buffer"] < first["state"] and "user" in roles
    out_roles = [o["role"] for o in record["outputs"]]
    assert out_roles[0] == "user" and record["outputs"][0]["target"] == "loss"
    assert {"param", "mutation", "state", "grad"} <= set(out_roles)  # batch norm's running stats: mutation
    # every parameter, buffer and state an input is fed by an output of the same target
    fed = {("param", "param"), ("buffer", "mutation"), ("state", "state")}
    outs = {(o["role"], o["target"]) for o in record["outputs"]}
    for i in record["inputs"]:
        if i["role"] in ("param", "state"):
            assert any((o_role, i["target"]) in outs for role, o_role in fed if role == i["role"]), i["target"]


@pytest.mark.slow  # pipelines/quickstart-train.yaml, run once per session: about a minute
def test_replay_chains_three_steps_bit_for_bit_and_says_when_it_has_nothing_to_compare(train_run):
    root, _ = train_run
    runner = CliRunner()
    r = runner.invoke(main, ["replay", str(root / "mlp_adamw"), "--graph", "train_step", "--steps", "3",
                             "--no-sandbox"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("steps"))
    assert "match" in line and "bit for bit" in line and line.count(",") >= 2  # a loss per step
    r = runner.invoke(main, ["replay", str(root / "mlp_adamw"), "--graph", "train_step", "--steps", "2",
                             "--no-sandbox", "--json"])
    assert r.exit_code == 0, r.output
    steps = json.loads(r.output)["steps"]
    assert steps["status"] == "ran" and "chained 3 steps, not 2" in steps["why"] and len(steps["losses"]) == 2
    r = runner.invoke(main, ["replay", str(root / "mlp_adamw"), "--graph", "forward", "--steps", "1", "--no-sandbox"])
    assert r.exit_code == 0, r.output  # the train_step runs whatever --graph replays


@pytest.mark.slow  # pipelines/quickstart-train.yaml, run once per session: about a minute
def test_a_step_that_differs_from_the_recorded_chain_is_a_mismatch_naming_the_output(train_run):
    root, _ = train_run
    art = load(root / "small_cnn_sgd")
    ok = replay_steps(art, 3)
    assert ok.status == "match" and ok.compared > 0 and ok.ok
    record = art.graphs["train_step"].record
    k = next(i for i, o in enumerate(record.outputs) if o.role == "state")
    art.manifest.verification["steps"].digests[k] = "0" * 64
    bad = replay_steps(art, 3)
    assert bad.status == "mismatch" and not bad.ok
    assert bad.differing == [f"state {record.outputs[k].target}"]


def test_replay_steps_refuses_an_artefact_without_a_train_step_in_one_line(tmp_path):
    res, out = run_yaml(tmp_path, _PIPELINE.replace("graphs: [forward, backward, train_step]", "graphs: [inference]"))
    assert res.exit_code == 0, res.output
    r = CliRunner().invoke(main, ["replay", str(out / "p" / "mlp"), "--steps", "3", "--no-sandbox"])
    assert r.exit_code != 0 and "has none" in r.output and "train_step" in r.output
    assert "Traceback" not in r.output


@pytest.mark.slow  # pipelines/quickstart-train.yaml, run once per session: about a minute
def test_random_inputs_draw_step_counts_from_one_and_second_moments_not_negative(train_run):
    root, _ = train_run
    record = _inputs(root, "mlp_adamw")
    for seed in range(3):
        values = get_inputs(_step_folder(root, "mlp_adamw"), seed=seed)
        for rec, v in zip(record["inputs"], values, strict=True):
            key = (rec["target"] or "").rpartition(":")[2] if rec["role"] == "state" else None
            if key == "step":
                assert 1 <= float(v) < 100
            elif key == "exp_avg_sq":
                assert float(v.min()) >= 0 and float(v.max()) < 1
            elif rec["role"] in ("param", "user") or key == "exp_avg":
                assert float(v.min()) < 0  # N(0, 1): the range applies to those state entries only


_PIPELINE = """version: 1
name: p
output: out
seed: 0
defaults: {mode: export, graphs: [forward, backward, train_step], optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}}
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 32, hidden: 64, depth: 2}
    inputs: [{shape: [8, 32]}]
"""


def _plant(monkeypatch, old: float, new: float) -> list[int]:
    """Capture the step, then change every constant `old` in its graph to `new`."""
    capture = capture_step.capture_train_step
    planted: list[int] = []

    def with_fault(*args, **kwargs):
        made = capture(*args, **kwargs)
        gm = made.graph.gm
        for node in gm.graph.nodes:
            changed = tuple(new if isinstance(a, float) and math.isclose(a, old, rel_tol=1e-12) else a
                            for a in node.args)
            if changed != node.args:
                node.args = changed
                planted.append(1)
        gm.recompile()
        return made

    monkeypatch.setattr(capture_step, "capture_train_step", with_fault)
    return planted


def _failed_checks(out: Path) -> list[str]:
    manifest = records.read(records.Manifest, out / "p" / "mlp" / records.MANIFEST, out / "p" / "mlp")[1]
    return [i.what for i in manifest.graphs["train_step"].checks.items if not i.passed]


def test_a_wrong_beta2_in_the_graph_fails_naming_the_state_and_parameters_it_changes(tmp_path, monkeypatch):
    planted = _plant(monkeypatch, 0.999, 0.99)
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert planted and res.exit_code == 1, res.output
    assert "FAILED  mlp" in res.output and "train_step graph differs from the eager model" in res.output
    failed = _failed_checks(out)
    assert "state layers.0.weight:exp_avg_sq" in failed  # the second moment, at the first step
    assert "update of layers.0.weight" in failed


def test_a_weight_decay_left_out_of_the_graph_fails_naming_the_parameters(tmp_path, monkeypatch):
    planted = _plant(monkeypatch, 1 - 1e-3 * 0.01, 1.0)  # AdamW's decay: p * (1 - lr * weight_decay)
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert planted and res.exit_code == 1, res.output
    assert "update of layers.0.weight" in res.output
    failed = _failed_checks(out)
    assert {"update of head.weight", "update of head.bias"} <= set(failed)
    assert not [w for w in failed if w.startswith("state ") and "after" not in w]  # decoupled: the state is not


def test_without_the_fault_the_same_pipeline_passes(tmp_path):
    res, out = run_yaml(tmp_path, _PIPELINE)
    assert res.exit_code == 0, res.output
    assert _failed_checks(out) == []


def test_mode_auto_that_falls_back_to_dynamo_refuses_the_step_in_one_line(tmp_path, monkeypatch):
    from aotpipe.format.ir import CapturedGraphs

    captured = CapturedGraphs(model="m", mode="dynamo", graphs={}, contract=None, seconds=0.0,
                              fallback="export failed: a data-dependent branch")
    with pytest.raises(Exception) as e:
        capture_step.add_train_step(captured, torch.nn.Linear(2, 2), (torch.ones(1, 2),), {}, "sum",
                                    _spec("adamw"), {}, keep_joint=False)
    assert "captured by dynamo (export failed: export failed: a data-dependent branch)" in str(e.value)
    assert "use mode export" in str(e.value)


def _spec(name: str, **args):
    from aotpipe.spec.optim import OptimizerSpec

    return OptimizerSpec.model_validate({"name": name, **args})


# ---------------------------------------------------------------------------------------
# the per-tensor form of foreach calls and of tensor scales (_TensorScalars)


def _lists(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=g) for _ in range(n)]


@pytest.mark.parametrize("case", ["maximum_", "addcdiv_scalars", "addcmul_value", "add_alpha", "norm", "pow_scalar",
                                  "mul_tensor", "sqrt", "lerp_"])
def test_a_foreach_call_is_made_as_the_per_tensor_calls_it_stands_for(case):
    a, b, c = _lists(seed=1), _lists(seed=2), [t.abs() + 1 for t in _lists(seed=3)]
    calls = {
        "maximum_": lambda f, x: f(torch._foreach_maximum_, x, b),
        "addcdiv_scalars": lambda f, x: f(torch._foreach_addcdiv_, x, b, c, torch.tensor([0.5, -1.0, 2.0])),
        "addcmul_value": lambda f, x: f(torch._foreach_addcmul_, x, b, c, 0.25),
        "add_alpha": lambda f, x: f(torch._foreach_add_, x, b, alpha=-0.5),
        "norm": lambda f, x: f(torch._foreach_norm, x, 2),
        "pow_scalar": lambda f, x: f(torch._foreach_pow, 0.9, [t.abs() for t in x]),
        "mul_tensor": lambda f, x: f(torch._foreach_mul, x, torch.tensor(3.0)),
        "sqrt": lambda f, x: f(torch._foreach_sqrt, [t.abs() for t in x]),
        "lerp_": lambda f, x: f(torch._foreach_lerp_, x, b, 0.1),
    }
    direct = [t.clone() for t in a]
    expected = calls[case](lambda fn, *args, **kw: fn(*args, **kw), direct)
    mine = [t.clone() for t in a]
    with capture_step._TensorScalars():
        got = calls[case](lambda fn, *args, **kw: fn(*args, **kw), mine)
    if case.endswith("_") or case in ("addcdiv_scalars", "addcmul_value", "add_alpha"):  # in place: the lists
        assert got is mine and expected is direct
    assert len(got) == len(expected)
    for x, y in zip(got, expected, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_a_tensor_scale_is_computed_from_its_parts_and_written_back_in_place():
    p, a, b = _lists(seed=4)
    b = b.abs() + 1
    scale = torch.tensor(-0.3)
    expected = p.clone().addcdiv_(a, b, value=-0.3)
    with capture_step._TensorScalars():
        out = p.addcdiv_(a, b, value=scale)
        q = torch.add(p, a, alpha=torch.tensor(2.0))
    assert out is p
    torch.testing.assert_close(p, expected)
    torch.testing.assert_close(q, expected + 2 * a)


TIED = '''
import torch


class Tied(torch.nn.Module):
    """An embedding and an output layer sharing one weight (GPT-2's wte and lm_head)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def build():
    return Tied()
'''


@pytest.mark.parametrize("optimizer", ["{name: adamw, lr: 1.0e-3}", "{name: sgd, lr: 0.1, momentum: 0.9}"])
def test_a_tied_weight_is_updated_by_the_gradient_of_both_its_uses(tmp_path, optimizer):
    (tmp_path / "tied_model.py").write_text(TIED)
    text = _PIPELINE.replace("source: aotpipe.zoo:mlp", "source: tied_model:build").replace(
        "args: {in_features: 32, hidden: 64, depth: 2}\n    inputs: [{shape: [8, 32]}]",
        "inputs: [{name: ids, shape: [2, 8], dtype: int64, high: 50}]").replace(
        "{name: adamw, lr: 1.0e-3, weight_decay: 0.01}", optimizer)
    res, out = run_yaml(tmp_path, text)
    assert res.exit_code == 0, res.output
    manifest = records.read(records.Manifest, out / "p" / "mlp" / records.MANIFEST, out / "p" / "mlp")[1]
    items = {i.what: i for i in manifest.graphs["train_step"].checks.items}
    record = json.loads((out / "p" / "mlp" / "mlp_train_step_0" / "inputs.json").read_text())
    tied = [i["target"] for i in record["inputs"] if i["role"] == "param" and i["target"] in ("emb.weight", "head.weight")]
    assert tied  # export lifts the tensor under one name or both; each is updated by the whole gradient
    for name in tied:  # its update and its gradient (the embedding's and the head's uses summed) checked
        assert items[f"update of {name}"].passed and items[f"gradient of {name}"].passed
        assert items[f"update of {name} after 3 steps"].passed
    assert "is tied to" in " ".join(manifest.capture.notes)


@pytest.mark.parametrize("cls,kwargs", [(torch.optim.AdamW, {"lr": 1e-3}), (torch.optim.Adam, {"lr": 1e-3}),
                                        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                        (torch.optim.Adagrad, {"lr": 0.1})])
def test_torch_still_cannot_trace_a_fused_step_functionally_which_is_why_fused_is_refused(cls, kwargs):
    """spec.optim refuses `fused` because torch cannot trace it the way the step is traced
    (make_fx over functionalize): when this test fails, torch can, and the refusal is worth
    revisiting (with checked forms of the fused kernels for the loader)."""
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(params, grads):
        params = [p.clone() for p in params]
        opt = cls(params, fused=True, **kwargs)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        with torch.compiler._compile_session_context():
            opt.step()
        return params

    with pytest.raises((RuntimeError, NotImplementedError), match=r"functional|Meta kernel"):
        make_fx(functionalize(step, remove="mutations_and_views"))([torch.randn(4, 3)], [torch.randn(4, 3)])
