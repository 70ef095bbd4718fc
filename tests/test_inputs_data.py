"""Real data as example inputs: an input's `data:` (a .pt, .safetensors or .npy file, or a
module:function) and `key:`, checked against the declared shape and dtype."""

import json
import textwrap

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from aotpipe.cli import main
from aotpipe.errors import ConfigError, SourceError
from aotpipe.format.records import ModelRecord
from aotpipe.models.inputs_data import data_code_refusal, is_callable_data
from aotpipe.models.sources import make_example_inputs, rebuild_from_manifest
from aotpipe.pipeline.config import parse_pipeline

MODULE = textwrap.dedent('''
    import torch

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x, ids):
            return self.lin(x).sum(-1) + ids.float()

    def plain():
        return Plain()

    def make_batch():
        return {"x": torch.full((2, 4), 3.0), "ids": torch.arange(2)}

    def make_x():
        return torch.full((2, 4), 5.0)

    def make_list():
        return [1, 2]
''')


@pytest.fixture()
def folder(tmp_path):
    (tmp_path / "datamods.py").write_text(MODULE)
    save_file({"x": torch.arange(8.0).reshape(2, 4), "ids": torch.tensor([7, 9])}, str(tmp_path / "batch.safetensors"))
    torch.save({"x": torch.ones(2, 4)}, tmp_path / "batch.pt")
    torch.save(torch.full((2, 4), 2.0), tmp_path / "x.pt")
    np.save(tmp_path / "x.npy", np.full((2, 4), 4.0, dtype=np.float32))
    return tmp_path


def _text(x_input, ids_input="{name: ids, shape: [2], dtype: int64, data: batch.safetensors, key: ids}",
          module="datamods"):
    return (f"version: 1\nname: d\noutput: out\nmodels:\n  - name: m\n    source: {module}:plain\n    inputs:\n"
            f"      - {x_input}\n      - {ids_input}\n")


def _spec(folder, x_input):
    return parse_pipeline(_text(x_input), "p.yaml", base_dir=folder).models[0]


def _problems(folder, x_input, **kw):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(_text(x_input, **kw), "p.yaml", base_dir=folder)
    return str(e.value)


@pytest.mark.parametrize("x_input, expected", [
    ("{name: x, shape: [2, 4], data: batch.safetensors, key: x}", torch.arange(8.0).reshape(2, 4)),
    ("{name: x, shape: [2, 4], data: batch.pt, key: x}", torch.ones(2, 4)),
    ("{name: x, shape: [2, 4], data: x.pt}", torch.full((2, 4), 2.0)),
    ("{name: x, shape: [2, 4], data: x.npy}", torch.full((2, 4), 4.0)),
    ("{name: x, shape: [2, 4], data: 'datamods:make_batch', key: x}", torch.full((2, 4), 3.0)),
    ("{name: x, shape: [2, 4], data: 'datamods:make_x'}", torch.full((2, 4), 5.0)),
])
def test_each_data_form_gives_its_tensor_exactly(folder, x_input, expected):
    args, kwargs = make_example_inputs(_spec(folder, x_input), folder)
    assert args == ()
    torch.testing.assert_close(kwargs["x"], expected, rtol=0, atol=0)
    torch.testing.assert_close(kwargs["ids"], torch.tensor([7, 9]), rtol=0, atol=0)


def test_data_paths_are_relative_to_the_pipeline_file(folder, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    spec = _spec(folder, "{name: x, shape: [2, 4], data: x.npy}")
    assert make_example_inputs(spec, folder)[1]["x"].sum().item() == 32.0


def test_requires_grad_applies_to_loaded_data(folder):
    spec = _spec(folder, "{name: x, shape: [2, 4], data: x.npy, requires_grad: true}")
    assert make_example_inputs(spec, folder)[1]["x"].requires_grad


def test_a_missing_file_is_a_one_line_error(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: nothere.safetensors, key: x}")
    assert "p.yaml:8: models[0].inputs[0].data: no such file" in msg and "nothere.safetensors" in msg
    assert len(msg.splitlines()) == 1


def test_a_wrong_key_names_the_keys_there_are(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: batch.safetensors, key: y}")
    assert "models[0].inputs[0].key: 'batch.safetensors' has no tensor 'y'; it has: ids, x" in msg


def test_a_file_of_several_tensors_needs_a_key(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: batch.safetensors}")
    assert "models[0].inputs[0].key: 'batch.safetensors' holds 2 tensors (ids, x); pick one with key" in msg


def test_a_key_into_a_single_tensor_is_an_error(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: x.npy, key: x}")
    assert "models[0].inputs[0].key: 'x.npy' holds a Tensor, not tensors by name; remove key" in msg


def test_a_key_without_data_is_an_error(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], key: x}")
    assert "models[0].inputs[0].key: key picks a tensor from data; add data, or remove key" in msg


def test_a_dtype_mismatch_names_both_dtypes(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], dtype: float64, data: batch.safetensors, key: x}")
    assert ("models[0].inputs[0].dtype: 'batch.safetensors' key 'x' is float32, the input declares float64; "
            "set dtype: float32") in msg


def test_a_shape_mismatch_names_both_shapes(folder):
    msg = _problems(folder, "{name: x, shape: [2, 5], data: x.npy}")
    assert "models[0].inputs[0].shape: 'x.npy' has shape [2, 4], the input declares [2, 5]; set shape: [2, 4]" in msg


def test_the_matching_shape_and_dtype_are_accepted(folder):
    # the boundary of the two checks above: exactly the declared shape and dtype pass
    assert _spec(folder, "{name: x, shape: [2, 4], dtype: float32, data: x.npy}").inputs[0].data == "x.npy"


def test_an_unknown_file_kind_is_an_error(folder):
    (folder / "x.csv").write_text("1,2\n")
    msg = _problems(folder, "{name: x, shape: [2, 4], data: x.csv}")
    assert "'x.csv' is neither a .pt, .safetensors nor .npy file nor a module:function" in msg


def test_a_function_returning_no_tensor_is_an_error(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: 'datamods:make_list'}")
    assert "models[0].inputs[0].data: 'datamods:make_list' gives a list, not a tensor" in msg


def test_a_missing_function_is_an_error_naming_the_field(folder):
    msg = _problems(folder, "{name: x, shape: [2, 4], data: 'datamods:nope'}")
    assert "models[0].inputs[0].data: module 'datamods' has no attribute 'nope'" in msg


def test_an_unreadable_file_is_an_error(folder):
    (folder / "junk.safetensors").write_bytes(b"not a safetensors file")
    msg = _problems(folder, "{name: x, shape: [2, 4], data: junk.safetensors, key: x}")
    assert "models[0].inputs[0].data: cannot read" in msg and "junk.safetensors" in msg


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pt_file_holding_code_is_refused_unrun(folder):
    marker = folder / "ran"
    torch.save({"x": _Payload(marker)}, folder / "hostile.pt")
    msg = _problems(folder, "{name: x, shape: [2, 4], data: hostile.pt, key: x}")
    assert "models[0].inputs[0].data: cannot read" in msg and "hostile.pt" in msg
    assert not marker.exists(), "torch.load ran the pickle's code"


def test_callable_data_is_code_and_files_are_not():
    assert is_callable_data("mod:fn") and is_callable_data("pkg.mod:make")
    assert not is_callable_data("batch.safetensors") and not is_callable_data("dir/x.npy")
    assert not is_callable_data("C:\\data\\x.npy") and not is_callable_data("a:b.pt")


def _record(data):
    return ModelRecord.model_validate({
        "name": "mlp", "source": "aotpipe.zoo:mlp", "args": {"in_features": 32, "hidden": 64, "depth": 2},
        "config": None, "mode": "export", "graphs": ["inference"], "save_inputs": True, "verify": True,
        "loss": "sum", "seed": 0,
        "inputs": [{"name": None, "shape": [8, 32], "dtype": "float32", "low": None, "high": None, "data": data}]})


def test_a_manifest_naming_a_data_function_is_rebuilt_only_with_trust(tmp_path, monkeypatch):
    marker = tmp_path / "called"
    (tmp_path / "payloadmod.py").write_text(f"def run():\n    open({str(marker)!r}, 'w').close()\n    return 1\n")
    monkeypatch.chdir(tmp_path)  # where a rebuild would import it from
    record = _record("payloadmod:run")
    assert "--trust-code" in data_code_refusal(record.model_dump(), trust_code=False)
    assert rebuild_from_manifest(record, trust_code=False, where="m") is None
    assert not marker.exists()
    assert data_code_refusal(record.model_dump(), trust_code=True) is None
    assert rebuild_from_manifest(record, trust_code=True, where="m") is None  # it ran, and gave no tensor
    assert marker.exists()


def test_a_manifest_naming_a_data_file_needs_no_trust():
    assert data_code_refusal(_record("batch.safetensors").model_dump(), trust_code=False) is None


def test_load_outside_validation_names_the_model(folder):
    spec = _spec(folder, "{name: x, shape: [2, 4], data: x.npy}")
    (folder / "x.npy").unlink()
    with pytest.raises(SourceError, match="model 'm' input x.data: no such file"):
        make_example_inputs(spec, folder)


@pytest.mark.slow
def test_a_model_fed_from_safetensors_captures_and_replays_that_batch(folder):
    (folder / "datamods_e2e.py").write_text(MODULE)
    (folder / "p.yaml").write_text(_text("{name: x, shape: [2, 4], data: batch.safetensors, key: x}",
                                         module="datamods_e2e"))
    r = CliRunner().invoke(main, ["run", str(folder / "p.yaml"), "-o", str(folder / "out"), "--no-progress",
                                  "--no-sign"])
    assert r.exit_code == 0, r.output
    art = folder / "out" / "d" / "m"
    import aotpipe

    graph = aotpipe.load(art).graphs["inference"]
    saved = {rec.target: v for rec, v in zip(graph.record.inputs, graph.saved_inputs()) if rec.role == "user"}
    torch.testing.assert_close(saved["x"], torch.arange(8.0).reshape(2, 4), rtol=0, atol=0)
    torch.testing.assert_close(saved["ids"], torch.tensor([7, 9]), rtol=0, atol=0)
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["model"]["inputs"][0]["data"] == "batch.safetensors"
    for kind in ("inference", "forward", "backward", "joint"):
        rr = CliRunner().invoke(main, ["replay", str(art), "--graph", kind])
        assert rr.exit_code == 0 and "match" in rr.output and "saved inputs" in rr.output, rr.output


def test_changing_a_data_file_changes_the_fingerprint(folder):
    from aotpipe.pipeline.incremental import model_fingerprint

    spec = _spec(folder, "{name: x, shape: [2, 4], data: x.npy}")
    before = model_fingerprint(spec, folder)
    assert model_fingerprint(spec, folder) == before
    np.save(folder / "x.npy", np.full((2, 4), 4.5, dtype=np.float32))
    assert model_fingerprint(spec, folder) != before


def test_a_model_without_data_fingerprints_its_code_alone(folder):
    from aotpipe.artifact.manifest import file_sha256, fingerprint
    from aotpipe.pipeline.incremental import model_fingerprint, source_file
    from aotpipe.spec.modes import capture_options

    text = _text("{name: x, shape: [2, 4]}", "{name: ids, shape: [2], dtype: int64}")
    spec = parse_pipeline(text, "p.yaml", base_dir=folder).models[0]
    code = file_sha256(source_file(spec, folder))
    assert model_fingerprint(spec, folder) == fingerprint(spec.to_json(), code, capture_options(spec.mode, spec.loss))


def test_an_npy_file_of_pickled_objects_is_refused_unrun(folder):
    marker = folder / "ran_npy"
    np.save(folder / "objects.npy", np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    msg = _problems(folder, "{name: x, shape: [2, 4], data: objects.npy}")
    assert "models[0].inputs[0].data: cannot read" in msg and "objects.npy" in msg
    assert not marker.exists(), "numpy unpickled the file"
