"""Artefacts of format version 1 (aotpipe 0.1.0: every value stored as a blob) still load,
replay (bit for bit where they were made; elsewhere, since they do not say where that was,
within float noise of their stored values) and verify."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.replay import get_inputs, replay, replay_chain
from tests.helpers.replays import assert_match_or_close_for_want_of_a_recorded_cpu

V1 = Path(__file__).resolve().parent.parent / "data" / "format_v1"


@pytest.fixture
def v1(tmp_path):
    shutil.copytree(V1, tmp_path / "v1")
    return tmp_path / "v1"


@pytest.mark.parametrize("model", ["mlp", "running_norm"])
def test_version_1_loads_and_replays(v1, model):
    art = aotpipe.load(v1 / model)
    assert art.manifest.format_version == 1
    assert set(art.graphs) >= {"inference", "forward", "backward", "joint"}
    results = replay(art)
    assert_match_or_close_for_want_of_a_recorded_cpu(results, art.manifest.environment)
    assert replay_chain(art, rebuild_source=False).status == "match"
    ref = art.graphs["forward"].reference_outputs()  # version 1 stores the values themselves
    assert len(ref) == len(art.graphs["forward"].record.outputs)
    assert get_inputs(art.graphs["joint"].folder)


def test_version_1_verifies_and_is_listed(v1):
    r = CliRunner().invoke(main, ["verify", str(v1)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ls", str(v1)])
    assert r.output.count("verified") == 2


def test_a_stored_output_off_by_more_than_float_noise_is_a_mismatch_even_from_an_unknown_machine(v1):
    """The planted fault: with no CPU recorded, a bit difference is judged, not excused. A
    stored reference output moved by 1e-3 (a new blob, references and hashes following) is
    refused."""
    import json

    from safetensors.torch import load_file

    from aotpipe.artifact.blobs import encode
    from tests.helpers.forge import reseal

    model = v1 / "mlp"
    rec = json.loads((model / "mlp_inference_0" / "inputs.json").read_text())
    old = rec["outputs"][0]["blob"]
    t = load_file(str(model / "blobs" / f"{old}.safetensors"))["tensor"]
    new, data = encode(t + 1e-3)
    (model / "blobs" / f"{new}.safetensors").write_bytes(data)
    path = model / "mlp_inference_0" / "inputs.json"
    path.write_text(path.read_text().replace(old, new))
    reseal(model)
    (r,) = replay(aotpipe.load(model), graphs=["inference"])
    assert r.status == "mismatch", (r.status, r.mismatches)
    assert "over the bound" in r.mismatches[0], r.mismatches
    assert 5e-4 < r.errors[0].max_abs_error < 2e-3
