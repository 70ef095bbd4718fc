"""torch-op: and torch-module: sources (torch's own op_db and module_db), and inputs that need gradients."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError
from aotpipe.models.sources import build_model, is_builtin, make_example_inputs
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.spec import ModelSpec
from tests.helpers.pipelines import run_yaml

REPO = Path(__file__).resolve().parent.parent


def spec(source: str, sample: int = 0, *, seed: int = 0, graphs=("inference", "forward", "backward", "joint")) -> ModelSpec:
    return ModelSpec(name="m", source=source, args={"sample": sample}, config=None, inputs=[], mode="auto",
                     graphs=list(graphs), passes=[], save_inputs=True, verify=True, loss="weighted", seed=seed)


def problem_lines(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(textwrap.dedent(text), "p.yaml")
    return info.value.lines()


# ---------------------------------------------------------------------------------------
# building models and inputs from a sample


def test_an_op_sample_is_a_module_whose_inputs_are_the_samples_tensors():
    from torch.testing._internal.common_methods_invocations import op_db

    s = spec("torch-op:add")
    model = build_model(s)
    args, kwargs = make_example_inputs(s)
    assert kwargs == {} and all(isinstance(a, torch.Tensor) for a in args)
    assert all(a.requires_grad and a.is_leaf for a in args if a.is_floating_point())  # add supports autograd
    ref = next(o for o in op_db if o.name == "add" and not o.variant_test_name)
    assert torch.equal(model(*args), ref.op(*[a.detach() for a in args], **model.template[1]))


def test_a_tensor_list_is_flattened_into_separate_inputs():
    s = spec("torch-op:cat")
    args, _ = make_example_inputs(s)
    assert len(args) >= 2  # cat's first sample: a list of tensors
    model = build_model(s)
    (_, *rest), kwargs = model.template  # the list's place, then cat's baked dim
    assert torch.equal(model(*args), torch.cat([a.detach() for a in args], *rest, **kwargs))


def test_samples_are_seeded_by_the_pipeline_seed_and_the_same_each_time():
    a, _ = make_example_inputs(spec("torch-op:add"))
    b, _ = make_example_inputs(spec("torch-op:add"))
    c, _ = make_example_inputs(spec("torch-op:add", seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0] is not b[0]  # copies: a model's run never changes another's inputs


def test_inputs_are_the_same_in_another_process():
    a, _ = make_example_inputs(spec("torch-op:cat", 1))
    code = ("import sys; from tests.test_torch_corpus import spec; from aotpipe.models.sources import make_example_inputs;"
            "a, _ = make_example_inputs(spec('torch-op:cat', 1)); sys.stdout.write(repr([t.sum().item() for t in a]))")
    out = __import__("subprocess").run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                                       check=True).stdout
    assert out == repr([t.detach().sum().item() for t in a])


def test_a_module_sample_gets_its_constructor_arguments():
    s = spec("torch-module:nn.Linear", 0)
    model = build_model(s)
    linear = getattr(model, "module", model)  # wrapped: this sample passes its input by keyword
    assert isinstance(linear, torch.nn.Linear) and (linear.in_features, linear.out_features) == (10, 8)
    assert [n for n, _ in model.named_parameters()] == ["module.weight", "module.bias"]
    args, _ = make_example_inputs(s)
    assert args[0].shape[-1] == linear.in_features and args[0].requires_grad
    assert torch.equal(model(*args), linear(args[0]))


def test_a_variant_is_named_after_its_op():
    from aotpipe.models.torch_corpus import op_table

    assert "max.reduction_with_dim" in op_table() and "nn.functional.conv2d" in op_table()
    assert isinstance(build_model(spec("torch-op:max.reduction_with_dim")), torch.nn.Module)


def test_corpus_sources_rebuild_like_the_builtin_zoo():
    assert is_builtin("torch-op:add") and is_builtin("torch-module:nn.Linear")


# ---------------------------------------------------------------------------------------
# validate: one line each


def test_an_unknown_op_names_close_matches():
    lines = problem_lines("""\
        version: 1
        name: t
        models:
          - {name: m, source: "torch-op:nn.functional.conv2", args: {sample: 0}}
    """)
    assert lines == [lines[0]] and lines[0].startswith("p.yaml:4: models[0].source: ")
    assert "has no entry 'nn.functional.conv2'" in lines[0] and "nn.functional.conv2d" in lines[0]


def test_an_unknown_module_names_close_matches():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - {name: m, source: "torch-module:nn.Linaer"}
    """)
    assert "module_db has no entry 'nn.Linaer'" in line and "nn.Linear" in line


def test_a_sample_past_the_last_is_refused_with_the_count():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - name: m
            source: "torch-module:nn.Linear"
            args: {sample: 999}
    """)
    assert line.startswith("p.yaml:6: models[0].args.sample: ") and "use sample: 0 to" in line


def test_an_op_that_eager_cannot_run_on_cpu_is_refused():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - {name: m, source: "torch-op:jiterator_unary"}
    """)
    assert line.startswith("p.yaml:4: models[0].source: ") and "eager fails on CPU in float32" in line


def test_an_op_without_float32_on_cpu_is_refused():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - {name: m, source: "torch-op:bitwise_not"}
    """)
    assert "does not support float32 on CPU" in line


def test_inputs_other_args_and_mode_meta_are_refused_on_a_corpus_source():
    lines = problem_lines("""\
        version: 1
        name: t
        models:
          - name: m
            source: "torch-op:add"
            mode: meta
            inputs: [{shape: [2]}]
    """)
    assert lines[0].startswith("p.yaml:6: models[0].mode: mode meta builds no values")
    assert lines[1].startswith("p.yaml:7: models[0].inputs: a torch-op or torch-module source takes its inputs from")
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - {name: m, source: "torch-op:add", args: {sampel: 1}}
    """)
    assert line.startswith("p.yaml:4: models[0].args.sampel: torch-op and torch-module sources take no argument")


def test_a_source_without_inputs_still_needs_them():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
    """)
    assert line == "p.yaml:4: models[0].inputs: missing required field 'inputs'; add it"


def test_requires_grad_on_an_integer_input_is_one_line_with_its_line():
    [line] = problem_lines("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - {shape: [8, 32]}
              - name: ids
                shape: [8]
                dtype: int64
                requires_grad: true
    """)
    assert line.startswith("p.yaml:11: models[0].inputs[1].requires_grad: a int64 input has no gradient")


def test_requires_grad_false_leaves_the_fingerprint_as_it_was():
    text = "version: 1\nname: t\nmodels:\n  - {name: m, source: aotpipe.zoo:mlp, inputs: [{shape: [8, 32]%s}]}\n"
    a = parse_pipeline(text % "", check_sources=False).models[0]
    b = parse_pipeline(text % ", requires_grad: false", check_sources=False).models[0]
    c = parse_pipeline(text % ", requires_grad: true", check_sources=False).models[0]
    assert a.to_json() == b.to_json() and "requires_grad" not in json.dumps(a.to_json())
    assert c.to_json()["inputs"][0]["requires_grad"] is True
    args, _ = make_example_inputs(c)
    assert args[0].requires_grad and not make_example_inputs(a)[0][0].requires_grad


# ---------------------------------------------------------------------------------------
# end to end: graphs give the input's gradient, checked against eager


def _grad_checks(out: Path, model: str) -> dict[str, list[str]]:
    manifest = json.loads((out / "t" / model / "manifest.json").read_text())
    return {kind: [i["what"] for i in g["checks"]["items"] if i["what"].startswith("gradient of")]
            for kind, g in manifest["graphs"].items() if g.get("checks")}


@pytest.mark.parametrize("requires_grad", [True, False])
def test_an_input_that_requires_grad_gets_its_gradient_checked_against_eager(tmp_path, requires_grad):
    result, out = run_yaml(tmp_path, textwrap.dedent(f"""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{{shape: [4, 32], requires_grad: {str(requires_grad).lower()}}}]
    """))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "t" / "m" / "manifest.json").read_text())
    assert ("arg0" in manifest["partition"]["grad_of"]) is requires_grad
    assert ("gradient of arg0" in _grad_checks(out, "m")["backward"]) is requires_grad
    for kind in ("backward", "joint"):
        outputs = json.loads((out / "t" / "m" / f"m_{kind}_0" / "inputs.json").read_text())["outputs"]
        grads = {o["target"] for o in outputs if o["role"] == "grad"}
        assert {"head.weight", "layers.0.bias"} <= grads
        assert ("arg0" in grads) is requires_grad, (kind, grads)
    checks = manifest["checks"]
    assert checks["failed"] == 0 and checks["skipped"] == 0


def test_an_op_sample_runs_checks_and_replays_from_its_saved_inputs(tmp_path):
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: t
        models:
          - {name: cat, source: "torch-op:cat", args: {sample: 1}}
    """))
    assert result.exit_code == 0, result.output
    grads = _grad_checks(out, "cat")
    assert {"gradient of arg0", "gradient of arg1"} <= set(grads["backward"])
    manifest = json.loads((out / "t" / "cat" / "manifest.json").read_text())
    assert manifest["checks"]["failed"] == 0 and manifest["checks"]["skipped"] == 0
    inputs = json.loads((out / "t" / "cat" / "cat_forward_0" / "inputs.json").read_text())
    users = [i for i in inputs["inputs"] if i["role"] == "user"]
    assert len(users) >= 2 and all(i["requires_grad"] and i["source"] == "blob" for i in users)
    r = CliRunner().invoke(main, ["replay", str(out / "t" / "cat")])
    assert r.exit_code == 0, r.output
    assert r.output.count("match") == 4, r.output


def test_a_random_op_draws_what_eager_draws_without_op_db_s_reseed(tmp_path):
    # op_db calls normal through wrapper_set_seed, which re-seeds before each call: the graph
    # (which has no re-seed) then drew other numbers than the eager model, and the check failed
    from torch.testing._internal import common_methods_invocations as cmi

    from aotpipe.models.torch_corpus import op_table

    op_table()
    assert cmi.wrapper_set_seed.__name__ == "_without_reseed"
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: t
        executor: {kind: local}
        models:
          - {name: normal, source: "torch-op:normal", args: {sample: 0}}
          - {name: uniform, source: "torch-op:uniform", args: {sample: 0}, graphs: [inference]}
    """))
    assert result.exit_code == 0, result.output
    for name in ("normal", "uniform"):
        manifest = json.loads((out / "t" / name / "manifest.json").read_text())
        assert manifest["checks"]["failed"] == 0 and manifest["checks"]["run"] > 0


# ---------------------------------------------------------------------------------------
# the generated corpora


def _tool():
    spec_ = importlib.util.spec_from_file_location("torch_corpus_tool", REPO / "tools" / "torch_corpus.py")
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def test_the_corpora_name_one_model_per_line_with_graphs_by_autograd():
    ops = (REPO / "pipelines" / "torch-ops.yaml").read_text()
    modules = (REPO / "pipelines" / "torch-modules.yaml").read_text()
    assert f"torch {torch.__version__}" in ops.splitlines()[0]
    assert "- {name: nn.functional.conv2d.s0, source: 'torch-op:nn.functional.conv2d', args: {sample: 0}}" in ops
    assert "source: 'torch-op:argmax', args: {sample: 0}, graphs: [inference]}" in ops  # no gradient
    assert "- {name: nn.Linear.s1, source: 'torch-module:nn.Linear', args: {sample: 1}}" in modules
    p = parse_pipeline(ops, check_sources=False)
    assert len(p.models) > 600


@pytest.mark.slow
def test_the_checked_in_corpora_are_the_tools_output_for_this_torch(tmp_path):
    tool = _tool()
    assert tool.main(["--out", str(tmp_path)]) == 0
    for name in ("torch-ops.yaml", "torch-modules.yaml"):
        assert (tmp_path / name).read_text() == (REPO / "pipelines" / name).read_text(), \
            f"pipelines/{name} is stale: run .venv/bin/python tools/torch_corpus.py"


def test_without_expecttest_a_corpus_source_says_which_extra_to_install(monkeypatch):
    # torch's test databases import expecttest, which plain torch does not install (the import,
    # as it fails in an environment without it)
    from aotpipe.errors import SourceError
    from aotpipe.models import torch_corpus

    def without_expecttest():
        raise ModuleNotFoundError("No module named 'expecttest'", name="expecttest")

    monkeypatch.setattr(torch_corpus, "op_table", without_expecttest)
    with pytest.raises(SourceError, match=r"pip install 'aotpipe\[corpus\]' -c constraints.txt") as e:
        torch_corpus.entry("torch-op:cat")
    assert "\n" not in str(e.value) and "expecttest" in str(e.value)
