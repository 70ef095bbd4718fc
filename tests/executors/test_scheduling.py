"""Models start longest first by the last run's times, untimed ones first in pipeline order."""

import json

from aotpipe.runner import longest_first


def test_untimed_first_then_longest_first(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"models": [
        {"name": "a", "total_seconds": 5.0}, {"name": "b", "total_seconds": 50.0},
        {"name": "c", "total_seconds": 20.0, "skipped": True},  # kept last time: no time of its own
        {"name": "d", "total_seconds": 0.0},  # a worker death has no time
    ]}))
    names = ["a", "b", "c", "d", "e"]
    assert longest_first([0, 1, 2, 3, 4], names, tmp_path) == [2, 3, 4, 1, 0]
    assert longest_first([0, 4], names, tmp_path) == [4, 0]


def test_no_or_malformed_run_json_keeps_pipeline_order(tmp_path):
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
    (tmp_path / "run.json").write_text("{not json")
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
    (tmp_path / "run.json").write_text(json.dumps({"models": [{"name": "a", "total_seconds": "x"}]}))
    assert longest_first([0, 1, 2], ["a", "b", "c"], tmp_path) == [0, 1, 2]
