"""Mistakes `validate` used to pass and `run` then captured as something else: each is one
line naming the file, line and field, the value and the fix; the value just inside the
rule passes."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError
from aotpipe.pipeline.config import parse_pipeline

TUPLE_MODEL = textwrap.dedent("""\
    from torch import nn

    def build(hidden: int = 8, kernel: tuple[int, int] = (3, 3), scale: float = 1.0, act=None):
        return nn.Conv2d(3, hidden, kernel)
    """)


def _problems(yaml_text: str, tmp_path) -> list[str]:
    try:
        parse_pipeline(textwrap.dedent(yaml_text), "p.yaml", base_dir=tmp_path)
    except ConfigError as e:
        return [str(p) for p in e.problems]
    return []


def _one_input(inp: str, tmp_path) -> list[str]:
    return _problems(f"""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{inp}]
        """, tmp_path)


@pytest.mark.parametrize("inp, said", [
    ("{shape: [8, 32], dtype: int64, low: 5, high: 3}", "low 5 is not below high 3"),
    ("{shape: [8, 32], dtype: int64, low: 3, high: 3}", "low 3 is not below high 3"),  # high is exclusive
    ("{shape: [8, 32], dtype: int64, low: 2}", "low 2 is not below high 2 (the default)"),
    ("{shape: [8, 32], low: 1.5, high: 0.5}", "low 1.5 is above high 0.5"),
])
def test_an_input_range_whose_low_is_not_below_its_high_is_named(tmp_path, inp, said):
    (p,) = _one_input(inp, tmp_path)
    assert p.startswith("p.yaml:6: models[0].inputs[0]: ") and said in p \
        and p.endswith(("set low below high", "set low at most high")), p


@pytest.mark.parametrize("inp", [
    "{shape: [8, 32], dtype: int64, low: 2, high: 3}",
    "{shape: [8, 32], dtype: int64, low: 1}",
    "{shape: [8, 32], low: 0.5, high: 0.5}",  # a float range may be one value
    "{shape: [8, 32], low: 0.5}",
])
def test_an_input_range_just_inside_the_rule_passes(tmp_path, inp):
    assert _one_input(inp, tmp_path) == []


def _mlp_args(args: str, tmp_path) -> list[str]:
    return _problems(f"""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            args: {args}
            inputs: [{{shape: [8, 32]}}]
        """, tmp_path)


@pytest.mark.parametrize("args, said", [
    ('{hidden: "64"}', "models[0].args.hidden: '64' is a str, but aotpipe.zoo:mlp takes int for hidden; give a "
                       "value of that type (write it without quotes)"),
    ("{hidden: 6.5}", "models[0].args.hidden: 6.5 is a float, but aotpipe.zoo:mlp takes int for hidden"),
])
def test_an_arg_of_another_type_than_the_callable_annotates_is_named(tmp_path, args, said):
    (p,) = _mlp_args(args, tmp_path)
    assert p.startswith("p.yaml:6: " + said), p


def test_args_as_python_would_pass_them_are_accepted(tmp_path):
    (tmp_path / "tuplemodel.py").write_text(TUPLE_MODEL)
    assert _problems("""\
        version: 1
        name: t
        models:
          - name: m
            source: tuplemodel:build
            args: {hidden: 4, kernel: [3, 1], scale: 2, act: "anything"}
            inputs: [{shape: [1, 3, 8, 8]}]
        """, tmp_path) == []
    assert _mlp_args("{hidden: 64}", tmp_path) == []


def test_an_output_that_is_a_file_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    text = "version: 1\nname: t\noutput: {}\nmodels:\n  - {{name: m, source: 'aotpipe.zoo:mlp', inputs: [{{shape: [8, 32]}}]}}\n"
    assert _problems(text.format("afile"), tmp_path) == [
        "p.yaml:3: output: 'afile' is a file, not a folder; choose another output folder"]
    assert _problems(text.format("afile/sub"), tmp_path) == [
        "p.yaml:3: output: 'afile/sub' lies under afile, which is a file, not a folder; choose another output folder"]
    (tmp_path / "adir").mkdir()
    assert _problems(text.format("adir"), tmp_path) == []
    assert _problems(text.format("adir/not/yet"), tmp_path) == []


def test_validate_prints_each_mistake_on_one_line_and_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        version: 1
        name: t
        output: afile
        models:
          - name: m
            source: aotpipe.zoo:mlp
            args: {hidden: "64"}
            inputs: [{shape: [8, 32]}]
        """))
    r = CliRunner().invoke(main, ["validate", "p.yaml"])
    assert r.exit_code == 2, r.output
    assert r.output.splitlines() == [
        "error: p.yaml:3: output: 'afile' is a file, not a folder; choose another output folder",
        "error: p.yaml:7: models[0].args.hidden: '64' is a str, but aotpipe.zoo:mlp takes int for hidden; give a "
        "value of that type (write it without quotes)"]


# --- hf: sources (transformers builds its config from any keyword, and the model on meta here)

def _bert(config: str, tmp_path) -> list[str]:
    pytest.importorskip("transformers")
    return _problems(f"""\
        version: 1
        name: t
        models:
          - name: bert
            source: hf:BertModel
            config: {config}
            inputs: [{{name: input_ids, shape: [2, 8], dtype: int64, high: 100}}]
        """, tmp_path)


def test_a_typo_in_an_hf_config_key_names_the_nearest_field(tmp_path):
    assert _bert("{num_hidden_layer: 2, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64}",
                 tmp_path) == [
        "p.yaml:6: models[0].config.num_hidden_layer: BertConfig (the config of BertModel) has no field "
        "'num_hidden_layer'; did you mean num_hidden_layers?"]


def test_config_keys_a_config_takes_otherwise_are_accepted(tmp_path):
    # its __init__'s fields, a settable property (num_labels), one stored under another name
    # (attn_implementation), the base class's (output_hidden_states)
    assert _bert("{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64, "
                 "vocab_size: 100, num_labels: 3, attn_implementation: eager, output_hidden_states: false}",
                 tmp_path) == []


def test_a_config_alias_from_attribute_map_is_accepted():
    pytest.importorskip("transformers")
    from aotpipe.models.sources import config_key_problems

    # GPT2Config's attribute_map: num_hidden_layers -> n_layer
    assert config_key_problems("hf:GPT2Model", {"num_hidden_layers": 1, "n_embd": 32}) == []
    assert [k for k, _ in config_key_problems("hf:GPT2Model", {"n_layers": 1})] == ["n_layers"]


def test_run_refuses_a_config_typo_too_rather_than_build_the_default_model():
    pytest.importorskip("transformers")
    import torch

    from aotpipe.errors import SourceError
    from aotpipe.models.sources import build_model
    from aotpipe.spec import InputSpec, ModelSpec

    spec = ModelSpec(name="b", source="hf:BertModel", args={}, config={"num_hidden_layer": 1},
                     inputs=[InputSpec(shape=[1, 4], dtype="int64")], mode="export", graphs=["inference"],
                     passes=[], save_inputs=True, verify=True, loss="weighted", seed=0)
    with torch.device("meta"), pytest.raises(SourceError, match="did you mean num_hidden_layers"):
        build_model(spec)


def test_heads_that_do_not_divide_the_hidden_size_are_named(tmp_path):
    (p,) = _bert("{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 3, intermediate_size: 64}", tmp_path)
    assert p.startswith("p.yaml:6: models[0].config: building hf:BertModel from its config failed: ValueError: The "
                        "hidden size (32) is not a multiple of the number of attention heads (3)") \
        and p.endswith("; fix config"), p
    assert _bert("{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 4, intermediate_size: 64}",
                 tmp_path) == []
