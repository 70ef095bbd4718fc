"""Re-runs keep what they did not redo: run.json (version 3), report.md, report.html and tree
diffs after a no-op re-run, an --only run, an edited model, a removed model, a failed model, an
interrupted run, and over run.json files of versions 1 and 2.

One tree (two tiny models, inference graphs only) is made once; each test re-runs a copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.format.records import RECORD_VERSIONS, RUN_FORMAT_VERSION, load_run
from aotpipe.pipeline import runner
from aotpipe.pipeline.htmlreport import build_html

PIPELINE = """
version: 1
name: tiny
seed: 0
executor: {{kind: local}}
defaults: {{mode: export, graphs: [inference], passes: [], verify: true}}
models:
  - {{name: a, source: 'aotpipe.zoo:mlp', args: {{in_features: 4, hidden: {a_hidden}, depth: 1}}, inputs: [{{shape: [2, 4]}}]}}
{b}"""
B = "  - {{name: b, source: 'aotpipe.zoo:mlp', args: {{in_features: 4, hidden: 6, depth: 1}}, inputs: [{{shape: [2, {b_in}]}}]}}\n"


def pipeline(a_hidden: int = 8, b: bool = True, b_in: int = 4) -> str:
    return PIPELINE.format(a_hidden=a_hidden, b=B.format(b_in=b_in) if b else "")


def run(folder: Path, text: str, *extra: str):
    """`aotpipe run` of pipeline `text` into folder/out, in this process; (the CLI result, the tree)."""
    path = folder / "pipeline.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["run", str(path), "--output", str(folder / "out"), "--executor", "local",
                                       "--no-progress", "--no-sign", *extra])
    return result, folder / "out" / "tiny"


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """report.html without its plots (matplotlib's drawing is most of a no-op re-run's time;
    tests/report draws them)."""
    import aotpipe.pipeline.htmlreport as page

    blank = lambda *args, **kwargs: ""  # noqa: E731
    monkeypatch.setattr(page, "plots", SimpleNamespace(
        STAGES=page.plots.STAGES, capture_vs_parameters=blank, seconds_per_stage=blank, ratio_histogram=blank,
        bench_speedups=blank))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The tree of one run of both models (never changed: tests re-run copies)."""
    folder = tmp_path_factory.mktemp("rerun")
    result, tree = run(folder, pipeline())
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture()
def copy(first, tmp_path):
    """A copy of the first run's folder (pipeline and tree) to re-run."""
    shutil.copytree(first, tmp_path / "c")
    return tmp_path / "c"


def entries(tree: Path) -> dict[str, dict]:
    return {m["name"]: m for m in json.loads((tree / "run.json").read_text())["models"]}


def entry_text(tree: Path, name: str) -> str:
    """The bytes of model `name`'s entry in run.json, as written."""
    text = (tree / "run.json").read_text()
    start = text.index(f'   "name": "{name}"')
    start = text.rindex("  {\n", 0, start)
    return text[start:text.index("\n  }", start) + 4]


def report_row(tree: Path, name: str) -> list[str]:
    line = next(ln for ln in (tree / "report.md").read_text().splitlines() if ln.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")]


TIMES = ("capture_seconds", "passes_seconds", "checks_seconds", "write_seconds", "total_seconds")


def test_a_no_op_rerun_keeps_every_entry_and_its_timings_marked_kept(first, copy):
    tree = copy / "out" / "tiny"
    before = entries(tree)
    run1 = load_run(tree).run
    result, _ = run(copy, pipeline())
    assert result.exit_code == 0, result.output
    after, record = entries(tree), load_run(tree)
    assert record.format_version == RUN_FORMAT_VERSION == 3 and record.run.id != run1.id
    for name in ("a", "b"):
        assert after[name] == before[name] | {"skipped": True}  # timings, status, checks as measured
        assert after[name]["measured_in"] == run1.model_dump() and before[name]["total_seconds"] > 0
    assert record.summary.kept == 2 and all(record.kept(m) for m in record.models)
    row = report_row(tree, "a")
    assert row[1] == "up to date" and row[6] == f"{before['a']['capture_seconds']:.2f}"
    md = (tree / "report.md").read_text()
    assert f"- run {run1.id} (started {run1.started}): a, b" in md
    assert f"kept from run {run1.id} (started {run1.started})" in (tree / "report.html").read_text()
    kept_once = (tree / "run.json").read_text()
    run(copy, pipeline())
    assert entry_text(tree, "a") in kept_once and entry_text(tree, "b") in kept_once  # byte for byte, again


def test_only_updates_its_model_and_leaves_the_others_byte_for_byte(copy):
    tree = copy / "out" / "tiny"
    a_before, b_before = entry_text(tree, "a"), entries(tree)["b"]
    result, _ = run(copy, pipeline(), "--only", "b", "--force")
    assert result.exit_code == 0, result.output
    record = load_run(tree)
    assert [m.name for m in record.models] == ["a", "b"] and record.summary.models == 2
    assert entry_text(tree, "a") in (tree / "run.json").read_text() and entry_text(tree, "a") == a_before
    b = next(m for m in record.models if m.name == "b")
    assert b.measured_in == record.run and not b.skipped and b.total_seconds != b_before["total_seconds"]
    assert record.kept(record.models[0]) and not record.kept(b) and record.summary.kept == 1
    assert report_row(tree, "a")[1] == "ok, kept" and report_row(tree, "b")[1] == "ok"
    html = (tree / "report.html").read_text()
    assert html.count('class="muted kept"') == 1


def test_editing_one_models_config_redoes_only_that_one(copy):
    tree = copy / "out" / "tiny"
    before = entries(tree)
    result, _ = run(copy, pipeline(a_hidden=9))
    assert result.exit_code == 0, result.output
    record, after = load_run(tree), entries(tree)
    assert after["a"]["measured_in"]["id"] == record.run.id and not after["a"]["skipped"]
    assert after["a"]["manifest_sha256"] != before["a"]["manifest_sha256"]
    assert after["b"] == before["b"] | {"skipped": True}


def test_a_model_removed_from_the_pipeline_is_dropped_with_a_note(copy):
    tree = copy / "out" / "tiny"
    result, _ = run(copy, pipeline(b=False))
    assert result.exit_code == 0, result.output
    record = load_run(tree)
    assert [m.name for m in record.models] == ["a"]
    assert [(d.name, d.reason) for d in record.dropped] == [
        ("b", "no longer in the pipeline (its folder b/ is left on disk: delete it to drop it from report.html)")]
    assert "- b: no longer in the pipeline (its folder b/" in (tree / "report.md").read_text()
    assert "not in run.json: not part of the pipeline&#39;s last run" in (tree / "report.html").read_text()
    run(copy, pipeline(b=False))  # said once: the run.json before no longer lists b
    assert load_run(tree).dropped is None


def test_a_failed_model_keeps_its_failure_and_never_lends_it_to_an_artefact(copy):
    tree = copy / "out" / "tiny"
    result, _ = run(copy, pipeline(b_in=5))  # b's input no longer fits its first layer
    assert result.exit_code == 1
    failed = entries(tree)["b"]
    assert failed["status"] == "failed" and failed["manifest_sha256"] is None
    result, _ = run(copy, pipeline(b_in=5), "--only", "a")
    assert result.exit_code == 0, result.output  # what --only selected passed
    record = load_run(tree)
    assert entries(tree)["b"] == failed and not record.ok  # run.json: the tree, b still failed
    assert report_row(tree, "b")[1] == "**failed** (source), kept"  # the input mistake, named before capture
    # b's config back: its earlier artefact (left in place by the failure) is up to date; the
    # failed entry's figures are not its own, so it is kept with no measurement
    result, _ = run(copy, pipeline())
    assert result.exit_code == 0, result.output
    b = next(m for m in load_run(tree).models if m.name == "b")
    assert b.status == "ok" and b.skipped and b.measured_in is None and not b.has_measurement()
    assert all(getattr(b, t) == 0 for t in TIMES)
    assert report_row(tree, "b")[6:10] == ["-", "-", "-", "-"]


def test_after_an_interrupted_run_the_kept_artefact_has_no_measurement_and_diff_says_dash(copy, monkeypatch):
    tree = copy / "out" / "tiny"
    big(tree)
    original = copy.parent / "original"
    shutil.copytree(tree, original)
    # killed after writing a's new artefact, before run.json: the run.json before times the old one
    monkeypatch.setattr(runner, "write_reports", lambda *args: None)
    monkeypatch.setattr(runner, "write_html", lambda *args: None)
    run(copy, pipeline(a_hidden=9))
    monkeypatch.undo()
    result, _ = run(copy, pipeline(a_hidden=9))
    assert result.exit_code == 0, result.output
    a = next(m for m in load_run(tree).models if m.name == "a")
    assert a.skipped and not a.has_measurement() and a.total_seconds == 0
    assert report_row(tree, "a")[6:10] == ["-", "-", "-", "-"]
    assert "- no measurement (kept as up to date;" in (tree / "report.md").read_text()
    assert "kept, up to date; no measurement" in (tree / "report.html").read_text()
    out = CliRunner().invoke(main, ["diff", str(original), str(tree), "--json"])
    data = json.loads(out.output)
    assert not [d for d in data["differences"] if d["section"] == "time"]
    assert any(n.startswith("time not compared for 1 model(s)") and "a 50.00 s -> -" in n
               for n in data["notes"]), data["notes"]


def big(tree: Path) -> None:
    """Tree's run.json as if its models were big: 50 s each (a tiny model's few tenths of a
    second hide any change below diff's 1 s floor)."""
    data = json.loads((tree / "run.json").read_text())
    for m in data["models"]:
        m["total_seconds"] = 50.0
    (tree / "run.json").write_text(json.dumps(data))


def test_diff_compares_kept_entries_by_their_original_measurement(copy):
    tree = copy / "out" / "tiny"
    big(tree)
    fresh = copy.parent / "fresh"
    shutil.copytree(tree, fresh)
    result, _ = run(copy, pipeline())  # a no-op re-run: every entry kept
    assert result.exit_code == 0, result.output
    out = CliRunner().invoke(main, ["diff", str(fresh), str(tree), "--json"])
    data = json.loads(out.output)
    assert out.exit_code == 0 and data["same"] and not data["notes"], out.output  # no +22573%

    # Another run's measurement, 10x slower: kept entries compare by it, as the runs measured them
    run_json = json.loads((fresh / "run.json").read_text())
    for m in run_json["models"]:
        m["measured_in"] = {"id": "elsewhere", "started": "2026-01-01T00:00:00Z"}
        m["total_seconds"] = m["total_seconds"] * 10 + 2
    (fresh / "run.json").write_text(json.dumps(run_json))
    data = json.loads(CliRunner().invoke(main, ["diff", str(fresh), str(tree), "--json"]).output)
    times = {d["where"]: d for d in data["differences"] if d["section"] == "time"}
    assert set(times) == {"a", "b"} and times["a"]["b"] == entries(tree)["a"]["total_seconds"]
    assert "%" in times["a"]["text"]


def older(run_json: dict, version: int) -> dict:
    """`run_json` as an aotpipe writing run.json version `version` (1 or 2) wrote it."""
    data = json.loads(json.dumps(run_json))
    data["format_version"] = version
    for key in ("run", "dropped"):
        data.pop(key, None)
    data["summary"].pop("kept", None)
    if version == 1:
        data["summary"].pop("partial", None)
        data.pop("allow_partial", None)
    for m in data["models"]:
        for key in ("measured_in", "manifest_sha256") + (("outside_graphs",) if version == 1 else ()):
            m.pop(key, None)
    return data


@pytest.mark.parametrize("version", [1, 2])
def test_run_json_of_versions_1_and_2_reads_reports_and_reruns(copy, version):
    assert RECORD_VERSIONS["run.json"] == (3, (1, 2, 3))
    tree = copy / "out" / "tiny"
    data = older(json.loads((tree / "run.json").read_text()), version)
    data["models"][1]["skipped"] = True  # b kept as up to date then: its times are the check's
    (tree / "run.json").write_text(json.dumps(data))
    record = load_run(tree)
    assert record.format_version == version and record.run is None
    assert [record.kept(m) for m in record.models] == [False, True]  # before version 3: kept = up to date
    assert [m.has_measurement() for m in record.models] == [True, False]
    assert build_html(tree).count('class="muted kept"') == 1
    if version == 1:
        return  # what follows reads a run.json only as the versions before 3 do
    # --only a: b's entry, of the older version, as it was; a re-measured
    result, _ = run(copy, pipeline(), "--only", "a", "--force")
    assert result.exit_code == 0, result.output
    after = json.loads((tree / "run.json").read_text())
    assert after["format_version"] == 3 and after["models"][1] == data["models"][1]
    assert report_row(tree, "b")[6:10] == ["-", "-", "-", "-"]
    # an older run.json names no artefact: a plain re-run keeps b with no measurement
    (tree / "run.json").write_text(json.dumps(data))
    run(copy, pipeline())
    b = next(m for m in load_run(tree).models if m.name == "b")
    assert b.skipped and not b.has_measurement()


def test_a_run_json_of_an_unknown_version_is_named_and_nothing_is_kept_from_it(copy):
    tree = copy / "out" / "tiny"
    data = json.loads((tree / "run.json").read_text())
    data["format_version"] = 4
    (tree / "run.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"run.json: field format_version: Input should be 1, 2 or 3 \(got 4\)"):
        load_run(tree)
    result, _ = run(copy, pipeline())
    assert result.exit_code == 0, result.output
    md = (tree / "report.md").read_text()
    assert "- the run.json before this run could not be read, so no entry was kept from it: " in md
    assert all(not m.has_measurement() for m in load_run(tree).models)


def test_a_shard_lists_its_own_share_only(copy):
    tree = copy / "out" / "tiny"
    result, _ = run(copy, pipeline(), "--shard", "1/2")
    assert result.exit_code == 0, result.output
    record = load_run(tree)
    assert len(record.models) == 1 and record.shard.selection == ["a", "b"] and record.dropped is None


def test_a_carried_entry_whose_artefact_is_gone_is_dropped_with_a_note(copy):
    tree = copy / "out" / "tiny"
    shutil.rmtree(tree / "b")
    result, _ = run(copy, pipeline(), "--only", "a")
    assert result.exit_code == 0, result.output
    record = load_run(tree)
    assert [m.name for m in record.models] == ["a"]
    assert [(d.name, d.reason) for d in record.dropped] == [("b", "its artefact (b/) is gone; run it to make it")]

