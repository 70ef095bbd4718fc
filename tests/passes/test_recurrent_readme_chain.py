"""A GRU and an LSTM (and the README's worked pipeline, tests/conftest.py's quickstart_run)
pass with the README's pass chain, from the command line: every graph kind captured and
checked, the chain's graph made and replayed."""

import json
import textwrap

import pytest

from aotpipe.artifact.load import load
from aotpipe.replay import replay
from tests.helpers.pipelines import run_yaml

CHAIN = "inference.freeze+fold_conv_bn+channels_last+reinplace"
PIPELINE = textwrap.dedent("""\
    version: 1
    name: rec
    defaults:
      graphs: [inference, forward, backward, joint]
      passes: [freeze, fold_conv_bn, channels_last, reinplace]   # the README's chain
    models:
      - {name: gru, source: "aotpipe.zoo:gru", args: {num_layers: 2}, inputs: [{shape: [4, 2, 8]}]}
      - {name: lstm, source: "aotpipe.zoo:lstm", args: {bidirectional: true}, inputs: [{shape: [4, 2, 8]}]}
    """)


@pytest.mark.slow
def test_a_gru_and_an_lstm_pass_with_the_readme_chain(tmp_path):
    result, out = run_yaml(tmp_path, PIPELINE, "--no-sign")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in ("gru", "lstm"):
        (line,) = [x for x in lines if x.split()[1:2] == [name]]
        assert line.startswith("ok ") and f"{CHAIN}(" in line, line
    run = json.loads((out / "rec" / "run.json").read_text())
    for m in run["models"]:
        assert m["status"] == "ok" and m["skipped_passes"] == [] and list(m["passes"]) == [CHAIN]
        results = replay(load(out / "rec" / m["name"]))
        assert {r.kind: r.status for r in results} == {k: "match" for k in
                                                       ["inference", "forward", "backward", "joint", CHAIN]}


def test_the_readme_worked_pipeline_passes_with_its_chain(quickstart_run):
    root, result = quickstart_run
    run = json.loads((root / "run.json").read_text())
    assert [m["status"] for m in run["models"]] == ["ok"] * 4
    assert all(list(m["passes"]) == [CHAIN] and m["skipped_passes"] == [] for m in run["models"])
