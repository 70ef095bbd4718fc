"""Artefacts of format version 2 (written by aotpipe before version 3 recorded the capture's
environment and evidence) still load, replay bit for bit and verify.

The fixture was made at 1 intra-op thread from two small models whose graphs compute the
same bits at any thread count (linears and norms at these sizes), so it replays "match"."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.replay import get_inputs, replay, replay_chain

V2 = Path(__file__).resolve().parent.parent / "data" / "format_v2"


@pytest.fixture
def v2(tmp_path):
    shutil.copytree(V2, tmp_path / "v2")
    return tmp_path / "v2"


@pytest.mark.parametrize("model", ["mlp", "running_norm"])
def test_version_2_loads_and_replays_bit_for_bit(v2, model):
    art = aotpipe.load(v2 / model)
    assert art.manifest.format_version == 2
    assert set(art.graphs) >= {"inference", "forward", "backward", "joint"}
    results = replay(art)
    assert [r.status for r in results] == ["match"] * len(results), [(r.kind, r.mismatches) for r in results]
    assert replay_chain(art, rebuild_source=False).status == "match"
    assert get_inputs(art.graphs["joint"].folder)


def test_version_2_verifies_and_is_listed(v2):
    r = CliRunner().invoke(main, ["verify", str(v2)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ls", str(v2)])
    assert r.output.count("verified") == 2
