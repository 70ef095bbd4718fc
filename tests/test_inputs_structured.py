"""Nested inputs (a dict, a tuple) and non-tensor arguments of forward (forward_args).

A model with either is captured through inputs_data.StructuredCall: the graphs take the
tensors flat, in the order of `inputs:`, and hold the structure and the constants.
"""

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError, SourceError
from aotpipe.models.inputs_data import StructuredCall, call_template, is_structured
from aotpipe.models.sources import build_model, make_example_inputs
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.spec import parse_path, path_problem

MODULE = textwrap.dedent('''
    import torch

    class DictFlag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, batch, scale=1.0, use_mask=False, past=None):
            y = self.lin(batch["x"]) * scale
            if use_mask:
                y = y * batch["mask"].unsqueeze(-1)
            if past is not None:
                y = y + past[0] - past[1]
            return y

    def dict_flag():
        return DictFlag()
''')

INPUTS = '''
      - {name: batch.x, shape: [2, 4], requires_grad: true}
      - {name: batch.mask, shape: [2]}
      - {name: "past[0]", shape: [2, 3]}
      - {name: "past[1]", shape: [2, 3]}'''


def _pipeline(tmp_path, inputs=INPUTS, extra="    forward_args: {use_mask: true, scale: 0.5}\n", module="structmods"):
    (tmp_path / f"{module}.py").write_text(MODULE)
    text = (f"version: 1\nname: st\noutput: out\nmodels:\n  - name: dictflag\n    source: {module}:dict_flag\n"
            f"    inputs:{inputs}\n{extra}")
    (tmp_path / "p.yaml").write_text(text)
    return text


def _spec(tmp_path, **kw):
    text = _pipeline(tmp_path, **kw)
    return parse_pipeline(text, "p.yaml", base_dir=tmp_path).models[0]


def _problems(tmp_path, **kw):
    text = _pipeline(tmp_path, **kw)
    with pytest.raises(ConfigError) as e:
        parse_pipeline(text, "p.yaml", base_dir=tmp_path)
    return str(e.value)


@pytest.mark.parametrize("name", ["x", "batch.input_ids", "past[0][1]", "a.b[2].c"])
def test_argument_names_and_paths_are_input_names(name):
    assert path_problem(name) is None


@pytest.mark.parametrize("name", ["batch..x", "[0]", "0x", "past[a]", "x.", "past[0", "a b"])
def test_malformed_paths_are_refused(name):
    assert "is not an argument name or a path" in path_problem(name)


def test_a_path_parses_into_keys_and_positions():
    assert parse_path("past[0][1]") == ["past", 0, 1]
    assert parse_path("batch.ids[2].m") == ["batch", "ids", 2, "m"]


def test_structure_is_built_as_dicts_and_tuples_with_constants_in_place(tmp_path):
    spec = _spec(tmp_path)
    positional, template = call_template(spec)
    assert positional == 0
    assert set(template) == {"batch", "past", "use_mask", "scale"}
    assert isinstance(template["batch"], dict) and set(template["batch"]) == {"x", "mask"}
    assert isinstance(template["past"], tuple) and len(template["past"]) == 2
    assert template["use_mask"] is True and template["scale"] == 0.5


def test_the_wrapped_model_gets_the_structure_eager_gets(tmp_path):
    spec = _spec(tmp_path)
    assert is_structured(spec)
    model = build_model(spec, tmp_path)
    assert isinstance(model, StructuredCall)
    args, kwargs = make_example_inputs(spec, tmp_path)
    assert kwargs == {} and len(args) == 4
    x, mask, p0, p1 = args
    expected = model.model({"x": x, "mask": mask}, scale=0.5, use_mask=True, past=(p0, p1))
    torch.testing.assert_close(model(*args), expected, rtol=0, atol=0)
    # the flag matters: without it the mask is not applied
    assert not torch.equal(model.model({"x": x, "mask": mask}, scale=0.5, past=(p0, p1)), expected)


def test_a_model_without_structure_is_not_wrapped(tmp_path):
    spec = _spec(tmp_path, inputs="\n      - {name: batch, shape: [2, 4]}", extra="")
    assert not is_structured(spec)
    assert not isinstance(build_model(spec, tmp_path), StructuredCall)


def test_forward_args_alone_make_a_structured_call(tmp_path):
    spec = _spec(tmp_path, inputs="\n      - {shape: [2, 4]}", extra="    forward_args: {scale: 2.0}\n")
    assert is_structured(spec) and call_template(spec) == (1, {"scale": 2.0})


def test_positional_inputs_come_first_in_the_structured_call(tmp_path):
    spec = _spec(tmp_path, inputs="\n      - {shape: [2, 4]}\n      - {name: past.a, shape: [2]}", extra="")
    positional, template = call_template(spec)
    assert positional == 1 and set(template["past"]) == {"a"}


def test_fingerprint_data_has_no_new_keys_when_unused(tmp_path):
    spec = _spec(tmp_path, inputs="\n      - {name: x, shape: [2, 4]}", extra="")
    data = spec.to_json()
    assert "forward_args" not in data
    assert set(data["inputs"][0]) == {"name", "shape", "dtype", "low", "high"}
    used = _spec(tmp_path).to_json()
    assert used["forward_args"] == {"use_mask": True, "scale": 0.5}


def test_malformed_input_name_is_a_one_line_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: 'batch..x', shape: [2, 4]}")
    assert "models[0].inputs[0].name: name 'batch..x' is not an argument name" in msg


def test_unknown_key_beside_forward_args_is_an_error(tmp_path):
    msg = _problems(tmp_path, extra="    forward_arg: {scale: 1.0}\n")
    assert "models[0].forward_arg: unknown key 'forward_arg'" in msg and "forward_args" in msg


def test_a_path_given_twice_is_an_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: batch.x, shape: [2, 4]}\n      - {name: batch.x, shape: [2, 4]}",
                    extra="")
    assert "models[0].inputs: batch.x is given twice" in msg


def test_a_constant_clashing_with_a_tensor_input_is_an_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: batch.x, shape: [2, 4]}", extra="    forward_args: {batch: 1}\n")
    assert "models[0].inputs: batch is given twice" in msg


def test_a_value_used_as_a_container_is_an_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: batch, shape: [2, 4]}\n      - {name: batch.x, shape: [2, 4]}",
                    extra="")
    assert "batch.x goes inside 'batch', which is already a value" in msg


def test_a_tuple_with_a_missing_position_is_an_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: batch.x, shape: [2, 4]}\n      - {name: 'past[1]', shape: [2, 3]}",
                    extra="")
    assert "models[0].inputs: past has no item [0]" in msg


def test_keys_and_positions_mixed_in_one_container_is_an_error(tmp_path):
    msg = _problems(tmp_path, inputs="\n      - {name: 'past[0]', shape: [2, 3]}\n      - {name: past.a, shape: [2, 3]}",
                    extra="")
    assert "past has both named keys and [positions]" in msg


def test_call_template_names_the_model_outside_validation(tmp_path):
    spec = _spec(tmp_path).model_copy(update={"forward_args": {"bad name": 1}})
    with pytest.raises(SourceError, match="model 'dictflag': forward_args: name 'bad name'"):
        call_template(spec)


@pytest.mark.slow
def test_dict_and_flag_model_captures_every_graph_and_replays(tmp_path):
    """A model taking a dict of tensors, a tuple and a bool flag, through the real CLI."""
    _pipeline(tmp_path, module="structmods_e2e")
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--no-sign"])
    assert r.exit_code == 0, r.output
    art = tmp_path / "out" / "st" / "dictflag"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["model"]["forward_args"] == {"use_mask": True, "scale": 0.5}
    assert any("use_mask=True" in n and "constants of the graphs" in n for n in manifest["capture"]["notes"])
    inputs = json.loads((art / "dictflag_inference_0" / "inputs.json").read_text())["inputs"]
    assert [i["target"] for i in inputs if i["role"] == "user"] == ["batch.x", "batch.mask", "past[0]", "past[1]"]
    code = (art / "dictflag_inference_0" / "module.py").read_text()
    assert "aten.mul.Tensor(addmm, 0.5)" in code  # the scale, a constant of the graph
    for kind in ("inference", "forward", "backward", "joint"):
        rr = CliRunner().invoke(main, ["replay", str(art), "--graph", kind])
        assert rr.exit_code == 0 and "match" in rr.output, rr.output


def test_the_original_call_is_rebuilt_from_a_manifest_record(tmp_path):
    from aotpipe.models.inputs_data import call_from_record

    spec = _spec(tmp_path)
    record = json.loads(json.dumps(spec.to_json()))  # as the manifest holds it
    tensors = [torch.full((1,), float(i)) for i in range(4)]
    args, kwargs = call_from_record(record, tensors)
    assert args == ()
    assert kwargs["batch"]["x"] is tensors[0] and kwargs["batch"]["mask"] is tensors[1]
    assert kwargs["past"][0] is tensors[2] and kwargs["past"][1] is tensors[3]
    assert kwargs["use_mask"] is True and kwargs["scale"] == 0.5
    with pytest.raises(SourceError, match="3 tensors given for its 4 inputs"):
        call_from_record(record, tensors[:3])


def test_meta_capture_gets_the_structured_inputs_flat(tmp_path):
    from aotpipe.capture.meta import meta_example_inputs

    args, kwargs = meta_example_inputs(_spec(tmp_path))
    assert kwargs == {} and [list(t.shape) for t in args] == [[2, 4], [2], [2, 3], [2, 3]]
    assert all(t.device.type == "meta" for t in args)


EMBED = textwrap.dedent('''
    import torch

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, batch, flag=False):
            return self.emb(batch["ids"])

    def embed():
        return Embed()
''')


@pytest.mark.parametrize("high, ok", [(10, True), (11, False)])
def test_embedding_ranges_are_checked_through_the_structure(tmp_path, high, ok):
    (tmp_path / "embedmods.py").write_text(EMBED)
    text = ("version: 1\nname: e\nmodels:\n  - name: m\n    source: embedmods:embed\n    inputs:\n"
            f"      - {{name: batch.ids, shape: [2, 3], dtype: int64, high: {high}}}\n    forward_args: {{flag: true}}\n")
    if ok:
        parse_pipeline(text, "p.yaml", base_dir=tmp_path)
        return
    with pytest.raises(ConfigError, match=r"models\[0\].inputs\[0\].high: high: 11 does not fit embedding 'model.emb'"):
        parse_pipeline(text, "p.yaml", base_dir=tmp_path)
