"""A small output tree for fast report tests: the format v2 fixture's two models (mlp and
running_norm, tests/data/format_v2) copied to a temporary folder, and a run.json written by
report.run_record as a run writes it, from entries a test chooses. No model is captured."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import aotpipe.pipeline.htmlreport as page
from aotpipe.format.records import ModelRun, RunStamp
from aotpipe.pipeline.report import RUN_JSON, dump_run, run_record
from aotpipe.pipeline.results import RunResult

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


def edit_json(path: Path, change) -> None:
    """Rewrite the JSON file `path` with `change(data)` applied to it."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture()
def drawn(monkeypatch):
    """The plots stubbed (matplotlib's drawing is most of a page's time): what each was given,
    by plot; each draws a stand-in SVG naming itself."""
    calls = {}

    def recorder(name):
        def draw(data):
            calls[name] = data
            return f"<svg>{name}</svg>"
        return draw

    monkeypatch.setattr(page, "plots", SimpleNamespace(
        STAGES=page.plots.STAGES, capture_vs_parameters=recorder("capture"), seconds_per_stage=recorder("stages"),
        ratio_histogram=recorder("ratios"), bench_speedups=recorder("bench")))
    return calls
