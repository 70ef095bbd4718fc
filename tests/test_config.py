"""Tests of the pipeline YAML: parse_pipeline / load_pipeline and `aotpipe validate` / `aotpipe schema`.

Every config error kind is checked for the exact line (Problem.line), the field path
(Problem.field) and a message that says what would fix it. Nothing here traces a model.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError, Problem
from aotpipe.format.vocabulary import DEFAULT_KINDS, GRAPH_KINDS
from aotpipe.passes.options import FreezeOptions, ReinplaceOptions, RemoveNoopsOptions
from aotpipe.pipeline.config import load_pipeline, parse_pipeline
from aotpipe.spec import DTYPES, ModelSpec, PassStep, Pipeline

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"

MODEL_KEYS = "name, source, args, config, inputs, forward_args, device, mode, graphs, passes, save_inputs, save_values, verify, loss, dims, optimizer, resources, distributed"
TOP_KEYS = "version, name, output, seed, executor, trusted_ops, defaults, models"
INPUT_KEYS = "name, shape, dtype, low, high, requires_grad, data, key"

# A valid pipeline; tests build broken ones from it. Line numbers: version 1, name 2,
# models 3, "- name: m" 4, source 5, inputs 6.
GOOD = textwrap.dedent("""\
    version: 1
    name: t
    models:
      - name: m
        source: aotpipe.zoo:mlp
        inputs: [{shape: [8, 32]}]
""")


def problems(text: str, *, path: str = "p.yaml", check_sources: bool = True) -> list[Problem]:
    """The problems parse_pipeline reports for `text` (which must be invalid)."""
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, path, check_sources=check_sources)
    err = info.value
    assert err.problems, "ConfigError without problems"
    assert all(p.file == path for p in err.problems)
    # the exception text is the problems, one per line
    assert str(err).splitlines() == [str(p) for p in err.problems] == err.lines()
    return err.problems


def only_problem(text: str, **kw) -> Problem:
    """The single problem reported for `text`."""
    ps = problems(text, **kw)
    assert len(ps) == 1, [str(p) for p in ps]
    return ps[0]


def dedent(text: str) -> str:
    return textwrap.dedent(text)


# ---------------------------------------------------------------------------------------
# The baseline is valid


def test_good_pipeline_parses():
    p = parse_pipeline(GOOD, "p.yaml")
    assert isinstance(p, Pipeline)
    assert p.name == "t"
    assert p.path == "p.yaml"
    assert p.output == "artifacts"
    assert p.seed == 0
    assert p.executor.kind == "process" and p.executor.workers == 1 and p.executor.timeout_s is None
    assert [m.name for m in p.models] == ["m"]
    m = p.models[0]
    assert m.source == "aotpipe.zoo:mlp"
    assert m.inputs[0].shape == [8, 32]
    assert m.inputs[0].dtype == "float32"
    assert m.inputs[0].name is None


# ---------------------------------------------------------------------------------------
# 1. One test per error kind


def test_malformed_yaml_bad_indent():
    text = dedent("""\
        version: 1
        name: t
          models: []
    """)
    p = only_problem(text)
    assert p.line == 3
    assert p.field == ""
    assert p.message.startswith("malformed YAML: ")
    assert "mapping values are not allowed here" in p.message
    assert "fix the syntax" in p.message


def test_malformed_yaml_unclosed_bracket_mid_file():
    text = dedent("""\
        version: 1
        name: t
        models:
          - {name: m, source: aotpipe.zoo:mlp, inputs: [{shape: [1]}]
          - {name: n}
    """)
    p = only_problem(text)
    # the parser notices the missing '}' at the next item
    assert p.line == 5
    assert p.field == ""
    assert "malformed YAML" in p.message
    assert "'}'" in p.message
    assert "fix the syntax" in p.message


def test_malformed_yaml_unclosed_bracket_at_end_points_inside_file():
    # regression: the stream-end mark is one line past the last line of the file
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{shape: [8, 32]}
    """)
    n_lines = len(text.splitlines())
    assert n_lines == 6
    p = only_problem(text)
    assert "malformed YAML" in p.message
    # the bracket opens on line 6, which is also the last line of the file
    assert p.line == 6


def test_unknown_key_top_level():
    p = only_problem(GOOD + "colour: red\n")
    assert p.line == 7
    assert p.field == "colour"
    assert p.message == f"unknown key 'colour'; valid keys here: {TOP_KEYS}"


def test_unknown_key_in_model():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            shapes: [8, 32]
            inputs: [{shape: [8, 32]}]
    """)
    p = only_problem(text)
    assert p.line == 6
    assert p.field == "models[0].shapes"
    assert p.message == f"unknown key 'shapes'; valid keys here: {MODEL_KEYS}"


def test_unknown_key_in_input():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - shape: [8, 32]
              - shape: [8, 32]
                dtyp: float32
    """)
    p = only_problem(text)
    assert p.line == 9
    assert p.field == "models[0].inputs[1].dtyp"
    assert p.message == f"unknown key 'dtyp'; valid keys here: {INPUT_KEYS}"


@pytest.mark.parametrize(
    "section, key, valid",
    [
        ("defaults", "colour", "mode, graphs, passes, save_inputs, save_values, verify, loss, dims, optimizer"),
        ("executor", "kinds", "kind, workers, timeout_s, memory_gb, num_cpus, num_gpus, address, max_models_per_worker, "
                              "recycle_memory_gb"),
    ],
)
def test_unknown_key_in_defaults_and_executor(section, key, valid):
    p = only_problem(GOOD + f"{section}:\n  {key}: 1\n")
    assert p.line == 8
    assert p.field == f"{section}.{key}"
    assert p.message == f"unknown key {key!r}; valid keys here: {valid}"


@pytest.mark.parametrize("seed", ['"abc"', "abc", "1.5", "true"])
def test_wrong_type_seed(seed):
    text = dedent(f"""\
        version: 1
        name: t
        seed: {seed}
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{{shape: [8, 32]}}]
    """)
    p = only_problem(text)
    assert p.line == 3
    assert p.field == "seed"
    assert "valid integer" in p.message
    assert "(got " in p.message


def test_wrong_type_seed_quoted_string_names_the_value():
    text = GOOD.replace("name: t\n", 'name: t\nseed: "abc"\n')
    p = only_problem(text)
    assert (p.line, p.field) == (3, "seed")
    assert p.message == "Input should be a valid integer (got 'abc')"


def test_wrong_type_shape_of_names():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - dtype: float32
                shape: [a, b]
    """)
    ps = problems(text)
    assert [(p.line, p.field) for p in ps] == [
        (8, "models[0].inputs[0].shape[0]"),
        (8, "models[0].inputs[0].shape[1]"),
    ]
    # a name in a shape is a dimension's (dims:): one not declared is said so, per position
    assert ps[0].message.startswith("names dimension 'a', which dims: does not declare; declare it")
    assert ps[1].message.startswith("names dimension 'b', which dims: does not declare")


def test_wrong_type_shape_not_a_list():
    text = GOOD.replace("inputs: [{shape: [8, 32]}]", "inputs: [{shape: 8}]")
    p = only_problem(text)
    assert (p.line, p.field) == (6, "models[0].inputs[0].shape")
    assert "valid list" in p.message and "(got 8)" in p.message


def test_unknown_dtype_lists_valid_dtypes():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - shape: [8, 32]
                dtype: float128
    """)
    p = only_problem(text)
    assert p.line == 8
    assert p.field == "models[0].inputs[0].dtype"
    assert "unknown dtype 'float128'" in p.message
    assert p.message.endswith("use one of: " + ", ".join(DTYPES))
    for name in ("float32", "bfloat16", "int64", "bool"):
        assert name in p.message


def test_dtype_aliases_resolve_to_torch_names():
    text = GOOD.replace(
        "inputs: [{shape: [8, 32]}]",
        "inputs: [{shape: [1], dtype: half}, {shape: [1], dtype: long}, {shape: [1], dtype: double}]",
    )
    m = parse_pipeline(text).models[0]
    assert [i.dtype for i in m.inputs] == ["float16", "int64", "float64"]
    assert [i.is_integer for i in m.inputs] == [False, True, False]


def test_missing_source():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            inputs: [{shape: [8, 32]}]
    """)
    p = only_problem(text)
    # a missing key has no line of its own: the model's line
    assert p.line == 4
    assert p.field == "models[0].source"
    assert p.message == "missing required field 'source'; add it (e.g. source: aotpipe.zoo:mlp)"


def test_missing_models():
    p = only_problem("version: 1\nname: t\n")
    assert (p.line, p.field) == (1, "models")
    assert p.message == "missing required field 'models'; add it"


def test_duplicate_model_name():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{shape: [8, 32]}]
          - name: other
            source: aotpipe.zoo:mlp
            inputs: [{shape: [8, 32]}]
          - name: m
            source: aotpipe.zoo:small_cnn
            inputs: [{shape: [8, 3, 32, 32]}]
    """)
    p = only_problem(text)
    assert p.line == 10  # the second 'm'
    assert p.field == "models[2].name"
    assert "duplicate model name 'm'" in p.message
    assert "(first at line 4)" in p.message
    assert "unique" in p.message


def test_source_module_cannot_be_imported():
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", "aotpipe.nonexistent:foo"))
    assert p.line == 5
    assert p.field == "models[0].source"
    assert "cannot import module 'aotpipe.nonexistent'" in p.message
    assert "check the module path, or install it" in p.message


def test_source_attribute_missing_lists_what_module_has():
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", "aotpipe.zoo:nope"))
    assert p.line == 5
    assert p.field == "models[0].source"
    assert "aotpipe's zoo has no model 'nope'" in p.message  # a table lookup, not an attribute path
    assert "it has: " in p.message
    for name in ("mlp", "small_cnn", "tiny_transformer", "running_norm"):
        assert name in p.message


def test_source_not_callable():
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", "aotpipe.pipeline.config:SCHEMA_VERSION"))
    assert (p.line, p.field) == (5, "models[0].source")
    assert "is not callable" in p.message and "nn.Module" in p.message


def test_source_checks_skipped_when_asked():
    text = GOOD.replace("aotpipe.zoo:mlp", "aotpipe.nonexistent:foo")
    p = parse_pipeline(text, check_sources=False)
    assert p.models[0].source == "aotpipe.nonexistent:foo"


def test_hf_class_that_transformers_does_not_have():
    pytest.importorskip("transformers")
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", "hf:NoSuchModelXyz"))
    assert p.line == 5
    assert p.field == "models[0].source"
    assert "transformers has no model class 'NoSuchModelXyz'" in p.message
    assert "BertModel" in p.message  # an example of what to write instead


@pytest.mark.parametrize("source", ["aotpipe.models.zoo.mlp", "mlp", "':mlp'"])
def test_bad_source_form(source):
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", source))
    assert p.line == 5
    assert p.field == "models[0].source"
    assert "is not 'module:callable' (e.g. aotpipe.zoo:mlp) or 'hf:<ClassName>'" in p.message


def test_bad_hf_source_form():
    p = only_problem(GOOD.replace("aotpipe.zoo:mlp", "'hf:'"))
    assert (p.line, p.field) == (5, "models[0].source")
    assert "after 'hf:' put a transformers class name" in p.message


def test_version_2():
    p = only_problem(GOOD.replace("version: 1", "version: 2"))
    assert p.line == 1
    assert p.field == "version"
    assert p.message == "schema version 2 is not one this aotpipe reads; set version: 1"


def test_version_as_string():
    p = only_problem(GOOD.replace("version: 1", "version: '1'"))
    assert (p.line, p.field) == (1, "version")
    assert "set version: 1" in p.message


def test_unknown_pass_in_model():
    text = GOOD + "    passes: [fuse_everything]\n"
    p = only_problem(text)
    assert p.line == 7
    assert p.field == "models[0].passes[0]"
    assert p.message.startswith("unknown pass 'fuse_everything'; valid passes: ")


@pytest.mark.parametrize("mode", ["[]", "{meta: 1}", "[meta]"])
def test_a_mode_that_is_not_a_string_is_one_problem_with_passes_set(mode):
    # The field-combination rule (a mode without values takes no passes) looks the mode up in
    # the capture-mode table: a list or mapping there is the schema's error, not a TypeError.
    text = GOOD + f"    mode: {mode}\n    passes: [freeze]\n"
    p = only_problem(text)
    assert p.line == 7 and p.field == "models[0].mode"
    assert p.message.startswith("Input should be 'export', 'dynamo', 'meta' or 'auto'")


def test_unknown_pass_in_defaults():
    text = GOOD.replace("models:", "defaults:\n  passes:\n    - bogus\nmodels:")
    p = only_problem(text)
    assert p.line == 5
    assert p.field == "defaults.passes[0]"
    assert p.message.startswith("unknown pass 'bogus'; valid passes: ")


def test_unknown_pass_lists_registered_passes():
    p = only_problem(GOOD + "    passes: [freeze, bogus]\n")
    assert (p.line, p.field) == (7, "models[0].passes[1]")
    assert p.message == ("unknown pass 'bogus'; valid passes: freeze, fold_conv_bn, fold_scale, channels_last, "
                         "sdpa, remove_copies, mkldnn_fuse, view_to_reshape, remove_noops, reinplace, to_device")


def test_pass_on_a_graph_kind_it_cannot_take():
    p = only_problem(GOOD + "    passes: [{freeze: {graphs: [forward]}}]\n")
    assert (p.line, p.field) == (7, "models[0].passes[0].freeze.graphs")
    assert p.message == "pass 'freeze' cannot take forward graphs; it accepts: inference"


def test_unknown_pass_option_lists_the_options():
    text = GOOD + "    passes:\n      - freeze: {fold: false, colour: red}\n"
    p = only_problem(text)
    assert (p.line, p.field) == (8, "models[0].passes[0].freeze.colour")
    assert p.message == "pass 'freeze' has no option 'colour'; its options: fold, cse, graphs"


def test_pass_options_become_typed_and_complete():
    text = GOOD + "    passes: [freeze, {reinplace: {graphs: [forward, backward]}}]\n"
    (m,) = parse_pipeline(text, check_sources=False).models
    assert m.passes == [PassStep("freeze", FreezeOptions()),
                        PassStep("reinplace", ReinplaceOptions(graphs=("forward", "backward")))]
    assert m.to_json()["passes"] == [
        {"name": "freeze", "options": {"fold": True, "cse": True, "graphs": ["inference"]}},
        {"name": "reinplace", "options": {"graphs": ["forward", "backward"]}},
    ]


def test_config_on_non_hf_source():
    text = GOOD + "    config: {hidden_size: 3}\n"
    p = only_problem(text)
    assert p.line == 7
    assert p.field == "models[0].config"
    assert p.message == "config is only for hf: sources; pass constructor arguments with args"


def test_args_on_hf_source():
    pytest.importorskip("transformers")
    text = GOOD.replace("aotpipe.zoo:mlp", "hf:BertModel") + "    args: {hidden_size: 3}\n"
    p = only_problem(text)
    assert (p.line, p.field) == (7, "models[0].args")
    assert "move these fields under config" in p.message


def test_positional_input_after_named_one():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - {shape: [8, 32]}
              - {name: x, shape: [8, 32]}
              - {shape: [8, 32]}
    """)
    p = only_problem(text)
    assert p.line == 9
    assert p.field == "models[0].inputs[2]"
    assert "positional input (no name) follows a named one" in p.message
    assert "put positional inputs first" in p.message


def test_negative_shape_dimension():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - dtype: float32
                shape: [8, -1]
    """)
    p = only_problem(text)
    assert p.line == 8
    assert p.field == "models[0].inputs[0].shape"
    assert p.message == "shape [8, -1] has a negative size; sizes must be >= 0"


def test_zero_shape_dimension_is_allowed():
    text = GOOD.replace("[8, 32]", "[0, 32]")
    assert parse_pipeline(text).models[0].inputs[0].shape == [0, 32]


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden"])
def test_unsafe_model_name(name):
    p = only_problem(GOOD.replace("name: m", f"name: '{name}'"))
    assert (p.line, p.field) == (4, "models[0].name")
    assert "not a safe folder name" in p.message


def test_a_name_ending_in_a_newline_is_no_name_but_the_name_alone_is():
    p = only_problem(GOOD.replace("name: m", 'name: "m\\n"'))  # YAML's escape: a trailing newline
    assert (p.field, "not a safe folder name" in p.message) == ("models[0].name", True)
    assert parse_pipeline(GOOD.replace("name: m", 'name: "m"')).models[0].name == "m"


def test_bad_graph_kind_lists_valid_kinds():
    p = only_problem(GOOD + "    graphs: [inference, forwards]\n")
    assert (p.line, p.field) == (7, "models[0].graphs[1]")
    for kind in GRAPH_KINDS:
        assert repr(kind) in p.message
    assert "(got 'forwards')" in p.message


@pytest.mark.parametrize(
    "text, line, field, valid",
    [
        (GOOD + "int: 1\n", 7, "int", TOP_KEYS),
        (GOOD + "list: [1]\n", 7, "list", TOP_KEYS),
        (GOOD + "'a[0]': 1\n", 7, "a[0]", TOP_KEYS),
        (GOOD + "    dict: {}\n", 7, "models[0].dict", MODEL_KEYS),
        (GOOD.replace("[{shape: [8, 32]}]", "[{shape: [8, 32], float: 1}]"), 6, "models[0].inputs[0].float", INPUT_KEYS),
    ],
    ids=["top-int", "top-list", "top-bracket", "model-dict", "input-float"],
)
def test_unknown_key_named_like_a_type(text, line, field, valid):
    # regression: keys named like pydantic's union tags used to be dropped from the
    # location (IndexError at top level, 'unknown key 0' on the wrong line in a model)
    p = only_problem(text)
    assert p.line == line
    assert p.field == field
    assert p.message.endswith(f"valid keys here: {valid}")


def test_union_tags_are_not_part_of_the_field_path():
    text = dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs:
              - shape: [8, 32]
                low: x
    """)
    ps = problems(text)
    # one error per member of Union[int, float], both at the field itself
    assert {(p.line, p.field) for p in ps} == {(8, "models[0].inputs[0].low")}
    assert all("(got 'x')" in p.message for p in ps)


def test_null_key_points_at_its_line():
    p = only_problem(GOOD + "null: 1\n")
    assert p.line == 7
    assert "should be strings" in p.message


# ---------------------------------------------------------------------------------------
# 2. Every error in a file is reported at once, sorted by line


def test_several_errors_reported_together_sorted_by_line():
    text = dedent("""\
        version: 2
        name: t
        seed: abc
        models:
          - name: m
            source: aotpipe.zoo:nope
            inputs: [{shape: [8, -1], dtype: nope}]
          - name: m
            source: aotpipe.zoo:mlp
            colour: 1
            config: {a: 1}
            inputs:
              - {name: x, shape: [1]}
              - {shape: [1]}
    """)
    ps = problems(text)
    assert [(p.line, p.field) for p in ps] == [
        (1, "version"),
        (3, "seed"),
        (6, "models[0].source"),
        (7, "models[0].inputs[0].dtype"),
        (7, "models[0].inputs[0].shape"),
        (8, "models[1].name"),
        (10, "models[1].colour"),
        (11, "models[1].config"),
        (14, "models[1].inputs[1]"),
    ]
    lines = [p.line for p in ps]
    assert lines == sorted(lines)
    assert "first at line 5" in ps[5].message


def test_several_errors_via_load_pipeline_name_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(GOOD.replace("version: 1", "version: 3") + "colour: red\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline(f)
    ps = info.value.problems
    assert [(p.file, p.line, p.field) for p in ps] == [(str(f), 1, "version"), (str(f), 7, "colour")]
    assert str(ps[0]).startswith(f"{f}:1: version: ")


# ---------------------------------------------------------------------------------------
# 3. Defaults resolution


def test_model_inherits_defaults_and_overrides_each():
    text = dedent("""\
        version: 1
        name: t
        seed: 1234
        defaults:
          graphs: [inference, forward]
          passes: [remove_noops]
          save_inputs: false
          verify: true
        models:
          - name: inherits
            source: aotpipe.zoo:mlp
            inputs: [{shape: [8, 32]}]
          - name: overrides
            source: aotpipe.zoo:mlp
            inputs: [{shape: [8, 32]}]
            graphs: [joint]
            passes: []
            save_inputs: true
            verify: false
    """)
    p = parse_pipeline(text)
    inherits, overrides = p.models
    assert isinstance(inherits, ModelSpec)
    assert inherits.graphs == ["inference", "forward"]
    assert inherits.passes == [PassStep("remove_noops", RemoveNoopsOptions(graphs=("inference",)))]
    assert inherits.to_json()["passes"] == [{"name": "remove_noops", "options": {"graphs": ["inference"]}}]
    assert inherits.save_inputs is False
    assert inherits.verify is True
    assert inherits.mode == "auto" and inherits.loss == "weighted"

    assert overrides.graphs == ["joint"]
    assert overrides.passes == []  # an empty list overrides, it does not inherit
    assert overrides.save_inputs is True
    assert overrides.verify is False

    assert p.seed == 1234
    assert inherits.seed == 1234 and overrides.seed == 1234


def test_override_with_false_is_kept():
    text = GOOD + "    save_inputs: false\n    verify: false\n"
    m = parse_pipeline(text).models[0]
    assert m.save_inputs is False and m.verify is False


def test_builtin_defaults_when_no_defaults_section():
    m = parse_pipeline(GOOD).models[0]
    assert m.graphs == list(DEFAULT_KINDS)
    assert m.passes == []
    assert m.save_inputs is True
    assert m.verify is True
    assert m.seed == 0
    assert m.args == {} and m.config is None


def test_model_spec_to_json_has_resolved_fields():
    text = GOOD.replace("name: t\n", "name: t\nseed: 7\n")
    js = parse_pipeline(text).models[0].to_json()
    assert js["seed"] == 7
    assert js["graphs"] == list(DEFAULT_KINDS)
    assert js["inputs"] == [{"name": None, "shape": [8, 32], "dtype": "float32", "low": None, "high": None}]


# ---------------------------------------------------------------------------------------
# 4. Every shipped pipeline validates

SHIPPED = sorted(PIPELINES_DIR.glob("*.yaml"))


def test_shipped_pipelines_found():
    assert PIPELINES_DIR / "quickstart.yaml" in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_pipeline_validates(path):
    p = load_pipeline(path)
    assert p.path == str(path)
    assert p.name
    assert len(p.models) >= 1
    assert len({m.name for m in p.models}) == len(p.models)


def test_quickstart_contents():
    p = load_pipeline(PIPELINES_DIR / "quickstart.yaml")
    assert p.name == "quickstart"
    assert [m.name for m in p.models] == ["mlp", "small_cnn", "tiny_transformer", "running_norm"]
    tt = p.models[2]
    assert [i.name for i in tt.inputs] == ["input_ids", "attention_mask"]
    assert tt.inputs[0].dtype == "int64" and tt.inputs[0].high == 1000
    assert p.models[3].inputs[0].dtype == "float32"  # the default dtype
    assert all(m.graphs == ["inference", "forward", "backward", "joint"] for m in p.models)


# ---------------------------------------------------------------------------------------
# 5. CLI: validate and schema

BAD = textwrap.dedent("""\
    version: 2
    name: t
    models:
      - name: m
        source: aotpipe.zoo:nope
        colour: 1
        inputs: [{shape: [8, 32], dtype: float128}]
""")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_cli_validate_ok(runner, tmp_path):
    f = tmp_path / "good.yaml"
    f.write_text(GOOD)
    result = runner.invoke(main, ["validate", str(f)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok")
    assert result.stdout.strip() == f"ok: {f}: pipeline 't', 1 model(s)"
    assert result.stderr == ""


def test_cli_validate_quickstart(runner):
    result = runner.invoke(main, ["validate", str(PIPELINES_DIR / "quickstart.yaml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok")
    assert "'quickstart', 4 model(s)" in result.stdout


def test_cli_validate_bad_file(runner, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    result = runner.invoke(main, ["validate", str(f)])
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    expected = [(1, "version"), (5, "models[0].source"), (6, "models[0].colour"), (7, "models[0].inputs[0].dtype")]
    assert len(lines) == len(expected)
    for line, (n, field) in zip(lines, expected):
        assert line.startswith(f"error: {f}:{n}: {field}: ")
    # the same lines as the library reports
    with pytest.raises(ConfigError) as info:
        load_pipeline(f)
    assert lines == [f"error: {p}" for p in info.value.problems]


def test_cli_validate_missing_file(runner, tmp_path):
    f = tmp_path / "nope.yaml"
    result = runner.invoke(main, ["validate", str(f)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"error: {f}: no such file; check the path"]


def test_cli_schema_is_json(runner):
    result = runner.invoke(main, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    assert {"version", "name", "models"} <= set(schema["properties"])
    assert set(schema["required"]) == {"version", "name", "models"}
    assert schema["properties"]["version"]["const"] == 1
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["additionalProperties"] is False


def test_cli_verbose_validate_bad_file_raises(runner, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    result = runner.invoke(main, ["-v", "validate", str(f)])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)
    assert result.exc_info is not None and result.exc_info[2] is not None  # a traceback
    assert [p.line for p in result.exception.problems] == [1, 5, 6, 7]
    assert "error: " not in result.stderr


# ---------------------------------------------------------------------------------------
# 6. Empty file and a non-mapping top level

NOT_A_MAPPING = "a pipeline must be a mapping with version, name and models; see `aotpipe schema`"


@pytest.mark.parametrize(
    "text",
    ["", "\n", "# only a comment\n", "- version: 1\n- name: t\n", "just a string\n"],
    ids=["empty", "newline", "comment", "list", "scalar"],
)
def test_non_mapping_file(tmp_path, text):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(f)
    assert info.value.problems == [Problem(str(f), 1, "", NOT_A_MAPPING)]
    assert str(info.value) == f"{f}:1: {NOT_A_MAPPING}"


@pytest.mark.parametrize("text", ["", "- a\n- b\n"], ids=["empty", "list"])
def test_cli_non_mapping_file_one_line(runner, tmp_path, text):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    result = runner.invoke(main, ["validate", str(f)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"error: {f}:1: {NOT_A_MAPPING}"]


def test_duplicate_key_in_a_mapping_is_an_error():
    ps = problems(dedent("""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            source: aotpipe.zoo:small_cnn
            inputs: [{shape: [2, 32]}]
    """))
    assert [(p.line, p.field) for p in ps] == [(6, "models[0].source")]
    assert "appears twice" in ps[0].message


def test_recursive_alias_is_a_clear_error():
    ps = problems("version: 1\nname: t\nx: &a [*a]\n")
    assert len(ps) == 1 and "refers to itself" in ps[0].message


RECYCLING = """
version: 1
name: r
executor: {{kind: process{fields}}}
models:
  - {{name: m, source: aotpipe.zoo:mlp, inputs: [{{shape: [2, 8]}}]}}
"""


@pytest.mark.parametrize("fields,expected", [
    (", max_models_per_worker: 0", "r.yaml:4: executor.max_models_per_worker: Input should be greater than or equal "
                                   "to 1 (got 0)"),
    (", recycle_memory_gb: -1", "r.yaml:4: executor.recycle_memory_gb: Input should be greater than 0 (got -1)"),
    (", memory_gb: 2, recycle_memory_gb: 2", "r.yaml:4: executor.recycle_memory_gb: 2 GiB is not below memory_gb "
                                             "(2 GiB): a worker would be killed before it is recycled; set "
                                             "recycle_memory_gb below memory_gb"),
])
def test_worker_recycling_fields_are_checked_with_one_line_each(fields, expected):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(RECYCLING.format(fields=fields), "r.yaml", check_sources=False)
    assert [str(p) for p in e.value.problems] == [expected]


def test_worker_recycling_fields_reach_the_pipeline():
    p = parse_pipeline(RECYCLING.format(fields=", memory_gb: 4, recycle_memory_gb: 1.5, max_models_per_worker: 20"),
                       "r.yaml", check_sources=False)
    assert (p.executor.max_models_per_worker, p.executor.recycle_memory_gb) == (20, 1.5)


def test_the_source_check_finds_a_module_where_the_job_imports_it_from(tmp_path, monkeypatch):
    # Beside the pipeline file or in the working folder (spec.source_import_path), as building
    # the model does: the check once searched beside the pipeline only, and refused a model the
    # job would have built.
    import sys

    from aotpipe.pipeline.config import check_sources

    (tmp_path / "pipe").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work" / "workmod_check_sources.py").write_text("def build():\n    return None\n")
    path = tmp_path / "pipe" / "p.yaml"
    path.write_text(GOOD.replace("aotpipe.zoo:mlp", "workmod_check_sources:build"))
    pipeline = load_pipeline(str(path), check_sources=False)
    before = list(sys.path)
    monkeypatch.chdir(tmp_path / "work")
    check_sources(pipeline, pipeline.models)  # found in the working folder
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="cannot import module 'workmod_check_sources'"):
        check_sources(pipeline, pipeline.models)
    assert sys.path == before
