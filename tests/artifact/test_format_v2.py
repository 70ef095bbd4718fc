"""Artefacts of format version 2 (written by aotpipe before version 3 recorded the capture's
environment and evidence) still load, replay and verify.

The fixture was made at 1 intra-op thread from two small models whose graphs compute the
same bits at any thread count (linears and norms at these sizes), so where it was made it
replays "match". It does not say where that was, and another CPU gives other matmul bits:
there, an output whose digest differs is judged by the sums of its sampled elements, all
version 2 records of it."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.replay import get_inputs, replay, replay_chain
from tests.helpers.replays import assert_match_or_close_for_want_of_a_recorded_cpu

V2 = Path(__file__).resolve().parent.parent / "data" / "format_v2"


@pytest.fixture
def v2(tmp_path):
    shutil.copytree(V2, tmp_path / "v2")
    return tmp_path / "v2"


@pytest.mark.parametrize("model", ["mlp", "running_norm"])
def test_version_2_loads_and_replays(v2, model):
    art = aotpipe.load(v2 / model)
    assert art.manifest.format_version == 2
    assert set(art.graphs) >= {"inference", "forward", "backward", "joint"}
    results = replay(art)
    assert_match_or_close_for_want_of_a_recorded_cpu(results, art.manifest.environment)
    assert replay_chain(art, rebuild_source=False).status == "match"
    assert get_inputs(art.graphs["joint"].folder)


def test_version_2_verifies_and_is_listed(v2):
    r = CliRunner().invoke(main, ["verify", str(v2)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ls", str(v2)])
    assert r.output.count("verified") == 2


@pytest.mark.parametrize("shift", [0.1, 1e-7, 0.0])
def test_sampled_sums_beyond_float_noise_are_a_mismatch_from_an_unknown_machine(v2, shift):
    """The planted fault: a version 2 output whose digest differs and whose recorded sampled
    sum is 0.1 away from the replay's (as if an element were off by 0.1, where float noise
    allows about 1e-4 each) is a mismatch. With sums within float noise (1e-7 apart, or
    equal) it is "unverified", not ok: sums can refute closeness, not prove it."""
    import json

    from aotpipe.runtime import accuracy
    from tests.helpers.forge import reseal

    folder = v2 / "mlp" / "mlp_inference_0"
    rec = json.loads((folder / "inputs.json").read_text())
    out = rec["outputs"][0]
    out["digest"] = "0" * 64  # another machine's bits
    art = aotpipe.load(v2 / "mlp")
    ga = art.graphs["inference"]
    from aotpipe.runtime.execution import run_graph

    now = accuracy.sampled_summary(run_graph(ga.module, ga.saved_inputs())[0])
    out["summary"]["sum"] = now.sum + shift
    out["summary"]["abs_sum"] = now.abs_sum
    (folder / "inputs.json").write_text(json.dumps(rec))
    reseal(v2 / "mlp")
    (r,) = replay(aotpipe.load(v2 / "mlp"), graphs=["inference"])
    if shift > 1e-3:
        assert r.status == "mismatch", (r.status, r.mismatches)
        assert "times the element-wise bound" in r.mismatches[0], r.mismatches
    else:
        assert (r.status, r.ok, r.bit_identical) == ("unverified", False, False), (r.status, r.mismatches)
        assert r.environment == ["its CPU is not recorded: an artefact of format version < 3"]
        assert "sampled sums are within float noise" in r.mismatches[0], r.mismatches
        out = CliRunner().invoke(main, ["replay", str(v2 / "mlp"), "--graph", "inference", "--no-sandbox"])
        assert out.exit_code == 1 and "unverified (its CPU is not recorded" in out.output, out.output


def test_integer_outputs_must_be_equal_and_a_permutation_is_not_within_noise():
    """What the sums cannot see, they do not excuse: an integer or bool output that differs
    is refused whatever its sums; a float output permuted keeps its sums, so it is only ever
    "unverified" (not ok), never close."""
    import torch

    from aotpipe.replay.run import _sums_beyond_noise
    from aotpipe.runtime import accuracy

    ints = torch.arange(12).reshape(3, 4)
    rec = accuracy.sampled_summary(ints)
    assert _sums_beyond_noise(ints.flip(0), rec) == \
        "not bit-identical; integer and bool outputs must be equal, here and elsewhere"
    assert _sums_beyond_noise(ints > 5, accuracy.sampled_summary(ints > 5)).startswith("not bit-identical; integer")
    x = torch.randn(4, 10)
    assert _sums_beyond_noise(x.flip(0), accuracy.sampled_summary(x)) is None  # sums cannot refute it
    assert "times the element-wise bound" in _sums_beyond_noise(x + 0.1 * (x.abs() < 9), accuracy.sampled_summary(x))
