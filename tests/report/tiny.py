"""A small output tree for fast report tests: the format v2 fixture's two models (mlp and
running_norm, tests/data/format_v2) copied to a temporary folder, and a run.json written by
report.run_record as a run writes it, from entries a test chooses. No model is captured."""

import shutil
from pathlib import Path
from types import SimpleNamespace

from aotpipe.format.records import ModelRun, RunStamp
from aotpipe.report import RUN_JSON, dump_run, run_record
from aotpipe.results import RunResult

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "format_v2"
MODELS = ("mlp", "running_norm")
STAMP = RunStamp(id="20260101T000000Z-aaaaaa", started="2026-01-01T00:00:00Z")
EARLIER = RunStamp(id="20251231T000000Z-bbbbbb", started="2025-12-31T00:00:00Z")


def copy_tree(tmp_path: Path, name: str = "p") -> Path:
    """The fixture's two model folders under tmp_path/name."""
    root = tmp_path / name
    for m in MODELS:
        shutil.copytree(FIXTURE / m, root / m)
    return root


def entry(name: str, status: str = "ok", **fields) -> ModelRun:
    """run.json's entry of a model, measured by this run (STAMP) unless `measured_in` says."""
    fields.setdefault("measured_in", STAMP)
    return ModelRun(name=name, status=status, **fields)


def run_result(root: Path, entries: list[ModelRun], **fields) -> RunResult:
    """A run of pipeline "p" whose run.json lists `entries`."""
    fields.setdefault("seconds", 12.5)
    return RunResult("p", root, [], listed=list(entries), stamp=STAMP, **fields)


PIPELINE = SimpleNamespace(name="p")  # report.py reads only the pipeline's name


def write_run(root: Path, entries: list[ModelRun], **fields) -> Path:
    """root/run.json listing `entries`, as a run writes it."""
    path = root / RUN_JSON
    path.write_text(dump_run(run_record(run_result(root, entries, **fields), PIPELINE)))
    return path
