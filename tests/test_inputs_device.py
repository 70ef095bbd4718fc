"""`device:` in a model entry: capture on a GPU where one is present; a one-line error where not."""

import json

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError, SourceError
from aotpipe.models.inputs_data import device_unavailable, on_device
from aotpipe.pipeline.config import parse_pipeline

NO_CUDA = not torch.cuda.is_available()


def _text(device):
    return ("version: 1\nname: dv\noutput: out\nmodels:\n  - name: mlp\n    source: aotpipe.zoo:mlp\n"
            "    args: {in_features: 8, hidden: 8, depth: 1}\n    inputs: [{shape: [2, 8]}]\n"
            + (f"    device: {device}\n" if device else ""))


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda0", "mps", "CUDA"])
def test_a_device_capture_cannot_run_on_is_an_error(device):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(_text(device), "p.yaml", check_sources=False)
    assert f"models[0].device: device '{device}' is not one capture runs on; use cpu, cuda or cuda:N" in str(e.value)


def test_cpu_is_the_default_and_leaves_the_fingerprint_as_before():
    spec = parse_pipeline(_text("cpu"), "p.yaml", check_sources=False).models[0]
    assert spec.device is None and "device" not in spec.to_json()
    assert spec.to_json() == parse_pipeline(_text(None), "p.yaml", check_sources=False).models[0].to_json()


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA GPU: the error for its absence cannot be seen")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_asked_for_without_a_gpu_is_a_one_line_error(device):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(_text(device), "p.yaml")
    msg = str(e.value)
    assert f"p.yaml:9: models[0].device: device '{device}', but torch sees no CUDA GPU here" in msg
    assert len(msg.splitlines()) == 1


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA GPU")
def test_a_worker_without_the_gpu_refuses_before_capture():
    # validate ran where the GPU was (say); the worker that captures has none
    spec = parse_pipeline(_text("cpu"), "p.yaml", check_sources=False).models[0].model_copy(update={"device": "cuda"})
    with pytest.raises(SourceError, match="model 'mlp': device 'cuda', but torch sees no CUDA GPU"):
        on_device(spec, torch.nn.Linear(2, 2), (torch.ones(2),), {})


def test_the_cpu_needs_no_gpu():
    assert device_unavailable(None) is None and device_unavailable("cpu") is None


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_a_model_captured_on_cuda_replays_there(tmp_path):
    (tmp_path / "p.yaml").write_text(_text("cuda"))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--no-sign"])
    assert r.exit_code == 0, r.output
    art = tmp_path / "out" / "dv" / "mlp"
    inputs = json.loads((art / "mlp_inference_0" / "inputs.json").read_text())["inputs"]
    assert {i["device"] for i in inputs} == {"cuda:0"}
    for kind in ("inference", "forward", "backward", "joint"):
        rr = CliRunner().invoke(main, ["replay", str(art), "--graph", kind])
        assert rr.exit_code == 0 and "match" in rr.output, rr.output
