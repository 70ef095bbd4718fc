"""Artefacts of format version 1 (aotpipe 0.1.0: every value stored as a blob) still load,
replay bit for bit and verify."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.replay import get_inputs, replay, replay_chain

V1 = Path(__file__).resolve().parent.parent / "data" / "format_v1"


@pytest.fixture
def v1(tmp_path):
    shutil.copytree(V1, tmp_path / "v1")
    return tmp_path / "v1"


@pytest.mark.parametrize("model", ["mlp", "running_norm"])
def test_version_1_loads_and_replays_bit_for_bit(v1, model):
    art = aotpipe.load(v1 / model)
    assert art.manifest.format_version == 1
    assert set(art.graphs) >= {"inference", "forward", "backward", "joint"}
    results = replay(art)
    assert [r.status for r in results] == ["match"] * len(results), [(r.kind, r.mismatches) for r in results]
    assert replay_chain(art, rebuild_source=False).status == "match"
    ref = art.graphs["forward"].reference_outputs()  # version 1 stores the values themselves
    assert len(ref) == len(art.graphs["forward"].record.outputs)
    assert get_inputs(art.graphs["joint"].folder)


def test_version_1_verifies_and_is_listed(v1):
    r = CliRunner().invoke(main, ["verify", str(v1)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ls", str(v1)])
    assert r.output.count("verified") == 2
