"""report.md and run.json's summary (aotpipe/pipeline/report.py), from run entries a test chooses:
each cell and section as a person reads it, every count as a machine reads it. No model is
captured (tests/report/tiny.py)."""

import difflib
import json
import os
import re
from pathlib import Path

import pytest

from aotpipe.artifact.fsio import OutputError
from aotpipe.format.records import (
    CheckSummary,
    DroppedModel,
    DuplicatedModel,
    EagerCell,
    GraphSummary,
    MergedShard,
    MergeRecord,
    PassChainRun,
    RecycledWorker,
    RunRecord,
    ShardRecord,
    TimedPassRecord,
    VerificationSummary,
)
from aotpipe.pipeline.report import (
    REPORT_MD,
    RUN_JSON,
    _checks_cell,
    _replay_cell,
    _worst_ratio,
    dump_run,
    human_size,
    kept_lines,
    report_markdown,
    run_record,
    seconds_cell,
    settled_text,
    settled_totals,
    status_text,
    write_reports,
)
from tests.report.tiny import EARLIER, PIPELINE, STAMP, entry, run_result


def checks(run=4, passed=4, failed=0, skipped=0, indirect=0, exact=None, floor=None, fp64=None, within_noise=None,
           reasons=()):
    return CheckSummary(run=run, passed=passed, failed=failed, skipped=skipped, indirect=indirect, exact=exact,
                        floor=floor, fp64=fp64, within_noise=within_noise, skipped_reasons=list(reasons))


def settled(exact=1, floor=2, fp64=1, within_noise=0, **kw):
    return checks(exact=exact, floor=floor, fp64=fp64, within_noise=within_noise, **kw)


def graph(kind, nodes=10):
    return GraphSummary(kind=kind, folder=f"m_{kind}_0", nodes=nodes, inputs=1, outputs=1)


def md(entries, tmp_path, **fields):
    return report_markdown(run_result(tmp_path, entries, **fields), PIPELINE)


def lines_after(text, heading):
    """The lines of a section (after its heading and blank line, up to the next blank line)."""
    rest = text.split(f"\n{heading}\n\n", 1)[1]
    return rest.split("\n\n", 1)[0].splitlines()


# ---------------------------------------------------------------------------------------
# Cells


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (1024 ** 2 - 1, "1024.0 KiB"),
    (1024 ** 2, "1.0 MiB"), (1024 ** 3 - 1, "1024.0 MiB"), (1024 ** 3, "1.0 GiB"), (1024 ** 4, "1024.0 GiB"),
    (5 * 1024 ** 4, "5120.0 GiB")])
def test_human_size_steps_up_a_unit_at_1024_and_stops_at_gib(n, text):
    assert human_size(n) == text


def test_replay_cell_says_what_was_recorded_and_names_only_the_graphs_that_did_not_match():
    def cell(graphs):
        return _replay_cell(entry("m", verification=VerificationSummary(ok=True, graphs=graphs, problems=[])))

    assert _replay_cell(entry("m")) == "-"
    assert cell({"inference": "recorded", "forward": "recorded"}) == "all 2 recorded"
    assert cell({"forward": "recorded", "backward": "recorded", "chain": "match"}) == "2 graphs recorded, chain match"
    assert cell({"forward": "recorded", "chain": "match", "chain_1": "match"}) == "1 graphs recorded, 2 chains match"
    assert cell({"forward": "recorded", "chainsaw": "match"}) == "all 2 recorded"  # a graph key, not a chain
    assert cell({"forward": "mismatch", "backward": "recorded", "chain": "error"}) == "forward mismatch, chain error"


def test_settled_text_counts_how_checks_were_settled_and_is_empty_before_they_were_counted():
    assert settled_text(None) == ""
    assert settled_text(checks()) == ""  # format version 2: no counts
    assert settled_text(settled(exact=5, floor=60, fp64=5)) == "5 exact, 60 floor, 5 fp64"
    assert settled_text(settled(exact=None, floor=None, fp64=0)) == "0 exact, 0 floor, 0 fp64"
    assert settled_text(settled(within_noise=1)) == "1 exact, 2 floor, 1 fp64 (1 within eager's noise)"


def test_settled_totals_sum_the_models_that_counted_and_skip_those_that_did_not():
    a = entry("a", checks=settled(exact=1, floor=2, fp64=3, within_noise=1, run=6, passed=6, skipped=1))
    b = entry("b", checks=settled(exact=None, floor=4, fp64=0, within_noise=None, run=4, passed=4))
    old = entry("old", checks=checks(run=9, passed=9))  # no counts: left out
    assert settled_totals([a, b, old, entry("none")]).model_dump() == {
        "run": 10, "skipped": 1, "exact": 1, "floor": 6, "fp64": 3, "within_noise": 1}
    assert settled_totals([old, entry("none")]) is None
    assert settled_totals([]) is None


def test_checks_cell_says_passed_of_run_and_stresses_failed_and_skipped():
    assert _checks_cell(entry("m")) == "-"
    assert _checks_cell(entry("m", checks=checks(run=4, passed=4))) == "4/4 passed"
    assert _checks_cell(entry("m", checks=settled(run=4, passed=3, failed=1, skipped=2, indirect=5))) == (
        "3/4 passed (1 exact, 2 floor, 1 fp64), **1 failed**, **2 skipped** (+5 through other graphs)")


def test_worst_ratio_is_the_largest_over_the_graphs_in_two_digits():
    def cell(ratio):
        return EagerCell(run=1, passed=1, failed=0, skipped=0, worst_ratio=ratio)

    assert _worst_ratio(entry("m")) == "-"
    assert _worst_ratio(entry("m", eager={"forward": cell(None)})) == "-"
    assert _worst_ratio(entry("m", eager={"forward": cell(0.25), "backward": cell(0.0312), "x": cell(None)})) == "0.25"
    assert _worst_ratio(entry("m", eager={"forward": cell(0.25), "backward": cell(1.234)})) == "1.2"


@pytest.mark.parametrize("fields, kept, text", [
    ({}, False, "ok"),
    ({}, True, "ok, kept"),
    ({"skipped": True}, False, "up to date"),
    ({"skipped": True}, True, "up to date"),  # up to date says it already
    ({"status": "partial"}, False, "**partial**"),
    ({"status": "partial"}, True, "**partial**, kept"),
    ({"status": "partial", "skipped": True}, False, "**partial** (up to date)"),
    ({"status": "failed", "stage": "capture"}, False, "**failed** (capture)"),
    ({"status": "failed", "stage": "checks"}, True, "**failed** (checks), kept"),
    ({"checks": checks(skipped=1)}, False, "ok, 1 checks skipped"),
    ({"checks": checks(skipped=0)}, False, "ok"),
    ({"status": "partial", "checks": checks(skipped=2)}, False, "**partial**, 2 checks skipped"),
])
def test_status_text_of_each_status(fields, kept, text):
    assert status_text(entry("m", **fields), kept) == text


def test_seconds_cell_is_a_dash_where_the_entry_holds_no_measurement():
    assert seconds_cell(entry("m"), 1.234) == "1.23"
    assert seconds_cell(entry("m", skipped=True, measured_in=None), 0.0) == "-"
    assert seconds_cell(entry("m", skipped=True), 0.5) == "0.50"  # kept up to date, timed by an earlier run


def test_kept_lines_name_each_earlier_run_oldest_first_and_the_untimed():
    later = STAMP.model_copy(update={"id": "20251231T120000Z-cccccc", "started": "2025-12-31T12:00:00Z"})
    rec = run_record(run_result(None, [entry("new"), entry("a", measured_in=later), entry("b", measured_in=EARLIER),
                                       entry("c", measured_in=later), entry("u", skipped=True, measured_in=None)]),
                     PIPELINE)
    assert kept_lines(rec) == [
        f"- run {EARLIER.id} (started {EARLIER.started}): b",
        f"- run {later.id} (started {later.started}): a, c",
        "- no measurement (kept as up to date; the run that wrote the artefact did not finish, or timed another "
        "artefact): u; `--force` measures them again"]
    assert kept_lines(run_record(run_result(None, [entry("new")]), PIPELINE)) == []


# ---------------------------------------------------------------------------------------
# run.json's record


def test_run_record_counts_each_status_graphs_bytes_and_kept_entries():
    entries = [entry("a", graphs=[graph("inference"), graph("forward")], bytes=100),
               entry("b", "partial", graphs=[graph("inference")], bytes=50),
               entry("c", "failed", stage="capture"),
               entry("d", skipped=True, measured_in=EARLIER, bytes=7)]
    rec = run_record(run_result(None, entries, seconds=3.14159), PIPELINE)
    assert rec.summary.model_dump(exclude_none=True) == {
        "models": 4, "ok": 2, "up_to_date": 1, "failed": 1, "partial": 1, "graphs": 3, "bytes": 157, "kept": 1}
    assert (rec.ok, rec.seconds, rec.pipeline, rec.run) == (False, 3.142, "p", STAMP)
    assert rec.executor.model_dump(exclude_unset=True) == {"kind": "local", "workers": 1}
    assert run_record(run_result(None, [entry("a")]), PIPELINE).ok is True


def test_run_json_holds_a_shard_merge_recycled_and_dropped_only_where_they_apply():
    plain = json.loads(dump_run(run_record(run_result(None, [entry("a")]), PIPELINE)))
    assert not {"shard", "merge", "allow_partial", "dropped"} & set(plain) and "recycled" not in plain["executor"]
    assert plain["run"] == STAMP.model_dump()
    shard = ShardRecord(index=1, count=2, selection=["a", "b"])
    merge = MergeRecord(shards=[MergedShard(folder="s1", shard="1/2", models=1)], missing=[], duplicated=[])
    worker = RecycledWorker(pid=7, after="a", models=1, reason="memory")
    full = json.loads(dump_run(run_record(run_result(
        None, [entry("a")], shard=shard, merge=merge, recycled=[worker], allow_partial=True,
        dropped=[DroppedModel(name="z", reason="gone")]), PIPELINE)))
    assert full["shard"] == shard.model_dump() and full["merge"]["shards"][0]["folder"] == "s1"
    assert full["allow_partial"] is True and full["dropped"] == [{"name": "z", "reason": "gone"}]
    assert full["executor"]["recycled"][0]["pid"] == 7
    assert RunRecord.model_validate(full).shard == shard


# ---------------------------------------------------------------------------------------
# report.md


def test_report_md_heads_with_the_counts_and_has_a_row_per_model(tmp_path):
    entries = [entry("a", graphs=[graph("inference", 16), graph("forward", 37)], bytes=2048, capture_seconds=1.5,
                     passes_seconds=0.25, checks_seconds=2.0, write_seconds=0.125, checks=settled()),
               entry("b", "partial", outside_graphs=["after subgraph 0: print"], bytes=10)]
    text = md(entries, tmp_path, seconds=4.25)
    head = text.splitlines()
    assert head[0] == "# aotpipe run: p"
    assert head[2].startswith("1 of 2 models ok, 1 partial, 2 graphs, 2.0 KiB on disk, 4.2 s (torch ")
    assert head[2].endswith(".") and "kept" not in head[2]
    assert "| a | ok | inference (16), forward (37) | - | 4/4 passed (1 exact, 2 floor, 1 fp64) | - | 1.50 | 0.25 | " \
           "2.00 | 0.12 | 2.0 KiB |" in head
    assert "| b | **partial** | - | - | - | - | 0.00 | 0.00 | 0.00 | 0.00 | 10 B |" in head
    assert md([entry("a")], tmp_path).splitlines()[2].startswith("1 of 1 models ok, 0 graphs")  # no partial count


def test_report_md_lists_failures_partial_captures_and_skipped_checks(tmp_path):
    entries = [entry("f", "failed", stage="capture", error="it raised"),
               entry("p", "partial", outside_graphs=["after subgraph 0: print (m.py:3)", "ops: aten.add"]),
               entry("q", "partial"),
               entry("s", checks=checks(skipped=1, reasons=["forward: no float64 reference"]))]
    text = md(entries, tmp_path)
    assert lines_after(text, "## Failures") == ["- **f** (capture): it raised"]
    partial = text.split("\n## Partial captures\n\n", 1)[1]
    assert partial.split("\n\n")[0].endswith("; the run exits 1 (`run --allow-partial` accepts them).")
    assert partial.split("\n\n")[1].splitlines() == [
        "- **p**: after subgraph 0: print (m.py:3)", "- **p**: ops: aten.add", "- **q**: (what ran outside is not recorded)"]
    assert lines_after(text, "## Skipped checks") == ["- s: forward: no float64 reference"]
    allowed = md(entries, tmp_path, allow_partial=True).split("\n## Partial captures\n\n", 1)[1]
    assert allowed.split("\n\n")[0].endswith(" (`run --allow-partial`: they do not fail the run).")
    clean = md([entry("a")], tmp_path)
    for heading in ("## Failures", "## Partial captures", "## Skipped checks", "## Passes", "## Notes",
                    "## Kept from earlier runs", "## No longer listed", "## Cleaned up", "## Shard",
                    "## Merged shards", "## Recycled workers", "Checks settled:"):
        assert heading not in clean, heading


def test_report_md_says_how_the_checks_were_settled_over_the_run(tmp_path):
    text = md([entry("a", checks=settled(exact=1, floor=2, fp64=1, within_noise=1, run=4)),
               entry("b", checks=settled(exact=0, floor=3, fp64=0, within_noise=0, run=4, skipped=1))], tmp_path)
    (line,) = [l for l in text.splitlines() if l.startswith("Checks settled:")]
    assert line == ("Checks settled: 8 run: 1 exactly (integers, shapes, None), 5 within the float-noise floor of "
                    "eager float32, 1 by the float64 rule (1 of them values zero in exact arithmetic, held to eager's "
                    "own noise); 1 skipped (reasons above).")
    quiet = md([entry("a", checks=settled(run=4))], tmp_path)
    assert [l for l in quiet.splitlines() if l.startswith("Checks settled:")][0].endswith("; 0 skipped.")


def test_report_md_tables_each_pass_and_what_it_did(tmp_path):
    def step(name, err, stats, modified=True):
        return TimedPassRecord(name=name, options={}, nodes_before=16, nodes_after=14, modified=modified,
                               max_abs_error=err, stats=stats, seconds=0.0123)

    chain = PassChainRun(seconds=0.1, steps=[step("freeze", None, {"frozen": 6, "folded": 0}),
                                             step("reinplace", 0.000123, {"reinplaced": 0}, False)])
    text = md([entry("a", passes={"inference.freeze+reinplace": chain}), entry("b")], tmp_path)
    rows = [l for l in text.split("\n## Passes\n", 1)[1].splitlines() if l.startswith("| a ")]
    assert rows == ["| a | inference | freeze | 16 | 14 | - | frozen 6 | 0.012 |",
                    "| a | inference | reinplace | 16 | 14 | 0.00012 | nothing | 0.012 |"]


def test_report_md_names_kept_dropped_cleaned_shard_merge_recycled_and_notes(tmp_path):
    entries = [entry("a", notes=["export failed, dynamo used"]), entry("k", measured_in=EARLIER)]
    merge = MergeRecord(shards=[MergedShard(folder="s1", shard="1/2", models=1),
                                MergedShard(folder="s2", shard=None, models=2)],
                        missing=["x", "y"], duplicated=[DuplicatedModel(name="a", folders=["s1", "s2"])])
    text = md(entries, tmp_path, dropped=[DroppedModel(name="z", reason="no longer in the pipeline")],
              previous="run.json before: not a run record", cleaned=["removed tmp"],
              shard=ShardRecord(index=2, count=3, selection=["a", "k", "m", "n"]), merge=merge,
              recycled=[RecycledWorker(pid=42, after="a", models=3, reason="memory above 2 GB")])
    assert text.splitlines()[2].endswith("; 1 kept from earlier runs (below).")
    kept = text.split("\n## Kept from earlier runs\n\n", 1)[1].split("\n\n")
    assert kept[0].startswith("Not redone by this run (up to date, or not selected by `--only`)")
    assert kept[1].splitlines() == [f"- run {EARLIER.id} (started {EARLIER.started}): k"]
    assert lines_after(text, "## No longer listed") == ["- z: no longer in the pipeline",
                                                        "- run.json before: not a run record"]
    assert lines_after(text, "## Cleaned up") == ["- removed tmp"]
    assert lines_after(text, "## Shard") == [
        "Shard 2 of 3: 0 of the 4 models; `aotpipe merge` combines the shards."]
    assert lines_after(text, "## Merged shards") == [
        "- 1/2: 1 model(s) from s1", "- unsharded run: 2 model(s) from s2", "- **missing** (in no shard): x, y",
        "- **duplicated** a: in s1, s2 (the first kept)"]
    assert lines_after(text, "## Recycled workers") == ["- worker 42 replaced after a (3 model(s)): memory above 2 GB"]
    assert lines_after(text, "## Notes") == ["- a: export failed, dynamo used"]
    only_previous = md([entry("a")], tmp_path, previous="cut short")
    assert lines_after(only_previous, "## No longer listed") == ["- cut short"]
    no_gaps = md([entry("a")], tmp_path, merge=MergeRecord(shards=merge.shards, missing=[], duplicated=[]))
    assert "**missing**" not in no_gaps and "**duplicated**" not in no_gaps


def test_write_reports_writes_run_json_and_report_md_and_names_a_folder_it_cannot_write(tmp_path):
    run = run_result(tmp_path, [entry("a")])
    write_reports(run, PIPELINE)
    assert json.loads((tmp_path / RUN_JSON).read_text())["models"][0]["name"] == "a"
    assert (tmp_path / REPORT_MD).read_text() == report_markdown(run, PIPELINE)
    with pytest.raises(OutputError, match=str(tmp_path / "gone" / RUN_JSON)):
        write_reports(run_result(tmp_path / "gone", [entry("a")]), PIPELINE)


# ---------------------------------------------------------------------------------------
# The whole page, against a reviewed copy


GOLDEN = Path(__file__).parent / "data" / "report.golden.md"


def every_section(tmp_path):
    """A run whose report.md has every section: each status, kept and untimed entries, passes,
    skipped checks, notes, dropped entries, a cleaned folder, a shard, a merge, a recycled worker."""
    step = TimedPassRecord(name="freeze", options={}, nodes_before=16, nodes_after=12, modified=True,
                           max_abs_error=1.5e-07, stats={"frozen": 6, "folded": 2, "cse_merged": 0}, seconds=0.0123)
    entries = [
        entry("a", graphs=[graph("inference", 16), graph("inference.freeze", 12)], bytes=4096, capture_seconds=1.5,
              checks=settled(run=5, passed=5, exact=1, floor=3, fp64=1, within_noise=1, indirect=2),
              verification=VerificationSummary(ok=True, graphs={"inference": "recorded", "chain": "match"}, problems=[]),
              eager={"inference": EagerCell(run=1, passed=1, failed=0, skipped=0, worst_ratio=0.5)},
              passes={"inference.freeze": PassChainRun(seconds=0.02, steps=[step])}, notes=["export failed, dynamo used"]),
        entry("b", "partial", outside_graphs=["after subgraph 0: print (m.py:3)"], measured_in=EARLIER, bytes=10),
        entry("c", "failed", stage="checks", error="1 check(s) failed",
              checks=settled(run=4, passed=3, failed=1, skipped=1, reasons=["forward: no float64 reference"])),
        entry("d", skipped=True, measured_in=None),
    ]
    merge = MergeRecord(shards=[MergedShard(folder="s1", shard="1/2", models=2), MergedShard(folder="s2", shard=None,
                                                                                             models=2)],
                        missing=["x"], duplicated=[DuplicatedModel(name="a", folders=["s1", "s2"])])
    return md(entries, tmp_path, seconds=7.25, dropped=[DroppedModel(name="z", reason="no longer in the pipeline")],
              previous="run.json before: not a run record", cleaned=["removed a stale folder"],
              shard=ShardRecord(index=1, count=2, selection=["a", "b", "c", "d", "e"]), merge=merge,
              recycled=[RecycledWorker(pid=42, after="a", models=3, reason="memory above 2 GB")])


def test_report_md_with_every_section_reads_as_reviewed(tmp_path):
    """report.md is read by people: a change to any of its words or its layout is deliberate
    (rewrite the copy with AOTPIPE_UPDATE_GOLDEN=1 and review the diff)."""
    text = re.sub(r"\(torch [^,]+, python [^,]+, aotpipe [^)]+\)", "(torch T, python P, aotpipe A)",
                  every_section(tmp_path))
    if os.environ.get("AOTPIPE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "".join(difflib.unified_diff(
        GOLDEN.read_text().splitlines(True), text.splitlines(True), "golden", "now"))


def test_dropped_entries_alone_are_listed_without_a_previous_line(tmp_path):
    text = md([entry("a")], tmp_path, dropped=[DroppedModel(name="z", reason="gone")])
    assert lines_after(text, "## No longer listed") == ["- z: gone"]


def test_replay_cell_leaves_out_matching_graphs_when_another_did_not_match():
    v = VerificationSummary(ok=False, graphs={"forward": "mismatch", "chain": "match", "backward": "recorded"},
                            problems=[])
    assert _replay_cell(entry("m", verification=v)) == "forward mismatch"


def test_status_text_without_kept_is_a_run_s_own_entry():
    assert status_text(entry("m")) == "ok"


def test_kept_runs_are_listed_by_when_they_started_not_by_id():
    early = STAMP.model_copy(update={"id": "zzz", "started": "2025-01-01T00:00:00Z"})
    late = STAMP.model_copy(update={"id": "aaa", "started": "2025-06-01T00:00:00Z"})
    rec = run_record(run_result(None, [entry("new"), entry("b", measured_in=late), entry("a", measured_in=early),
                                       entry("u", skipped=True, measured_in=None),
                                       entry("v", skipped=True, measured_in=None)]), PIPELINE)
    lines = kept_lines(rec)
    assert [l.split()[2] for l in lines[:2]] == ["zzz", "aaa"]
    assert ": u, v; `--force` measures them again" in lines[2]
