"""The progress bar: each running model's current stage; never written into a redirected log."""

import io
import textwrap

from tqdm import tqdm

from aotpipe.format.records import ModelRun, VerificationSummary
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.job import _stage
from aotpipe.pipeline.report import _replay_cell
from aotpipe.pipeline.runner import _StageWatch
from tests.helpers.pipelines import run_yaml


def test_the_bar_shows_the_stage_each_running_model_reported():
    spec = parse_pipeline(textwrap.dedent("""\
        version: 1
        name: p
        models:
          - {name: lstm, source: "aotpipe.zoo:lstm", inputs: [{shape: [2, 1, 8]}]}
        """), check_sources=False).models[0]
    bar = tqdm(total=1, file=io.StringIO(), disable=False)
    running = ["lstm"]
    with _StageWatch(bar, running) as watch:
        assert watch.describe() == "lstm"
        _stage(spec, "capture")  # what the job, in its worker, says as it starts capturing
        assert watch.describe() == "lstm: capture"
        _stage(spec, "write")
        assert watch.describe() == "lstm: write"
    _stage(spec, "passes")  # after the run: nowhere to report, and no error
    bar.close()


def test_a_run_whose_output_is_redirected_writes_no_progress_bar(tmp_path):
    # No --no-progress: the CLI's stderr here is not a terminal, so tqdm stays silent.
    from click.testing import CliRunner

    from aotpipe.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        name: p
        executor: {kind: local}
        defaults: {graphs: [inference]}
        models:
          - {name: mlp, source: "aotpipe.zoo:mlp", inputs: [{shape: [2, 32]}]}
        """))
    r = CliRunner().invoke(main, ["run", str(path), "--output", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "%|" not in r.stderr and "model/s" not in r.stderr


def _Model(statuses):
    return ModelRun(name="m", status="ok", verification=VerificationSummary(ok=True, graphs=statuses, problems=[]))


def test_report_counts_no_chain_as_a_graph():
    dynamo = {"inference": "recorded", "inference_1": "recorded", "forward_1": "recorded",
              "backward_1": "recorded", "joint_1": "recorded", "chain_1": "match"}
    assert _replay_cell(_Model(dynamo)) == "5 graphs recorded, chain match"
    export = {"inference": "recorded", "forward": "recorded", "backward": "recorded", "joint": "recorded",
              "chain": "match"}
    assert _replay_cell(_Model(export)) == "4 graphs recorded, chain match"
    assert _replay_cell(_Model({**dynamo, "chain_2": "match"})) == "5 graphs recorded, 2 chains match"
