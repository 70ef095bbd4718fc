"""Models start longest first by the last run's times, untimed ones first in pipeline order."""

import json

from aotpipe.artifact.manifest import dump_json, versions
from aotpipe.format.records import ExecutorRecord, ModelRun, RunRecord, RunSummary
from aotpipe.runner import longest_first


def _run_json(folder, models):
    record = RunRecord(format_version=1, pipeline="p", versions=versions(), seconds=1.0,
                       executor=ExecutorRecord(kind="local", workers=1), ok=True,
                       summary=RunSummary(models=len(models), ok=len(models), up_to_date=0, failed=0, graphs=0,
                                          bytes=0), models=models)
    (folder / "run.json").write_bytes(dump_json(record.model_dump(mode="json")))


def test_untimed_first_then_longest_first(tmp_path):
    _run_json(tmp_path, [
        ModelRun(name="a", status="ok", total_seconds=5.0), ModelRun(name="b", status="ok", total_seconds=50.0),
        ModelRun(name="c", status="ok", total_seconds=20.0, skipped=True),  # kept last time: no time of its own
        ModelRun(name="d", status="failed", total_seconds=0.0),  # a worker death has no time
    ])
    names = ["a", "b", "c", "d", "e"]
    assert longest_first([0, 1, 2, 3, 4], names, tmp_path) == [2, 3, 4, 1, 0]
    assert longest_first([0, 4], names, tmp_path) == [4, 0]


def test_no_or_malformed_run_json_keeps_pipeline_order(tmp_path):
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
    (tmp_path / "run.json").write_text("{not json")
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
    (tmp_path / "run.json").write_text(json.dumps({"models": [{"name": "a", "total_seconds": "x"}]}))
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
    _run_json(tmp_path, [ModelRun(name="c", status="ok", total_seconds=9.0)])
    run = json.loads((tmp_path / "run.json").read_text())
    run["models"][0]["total_seconds"] = "9"  # a string where run.json has a number: not a run.json
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
