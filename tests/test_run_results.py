"""What a run says of its models and of an artefact on disk: the exit code's rule, a kept
artefact's checks in brief, and why its last run failed it. Read from the manifest of
tests/data/format_v3_early/mlp, changed in memory: nothing is captured."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from aotpipe.errors import AotpipeError
from aotpipe.format.records import (
    CheckItem,
    DuplicatedModel,
    GraphBreakRecord,
    GraphChecks,
    MergeRecord,
    ModelRun,
    OutsideGraphs,
    VerificationEntry,
)
from aotpipe.pipeline.results import (
    ModelResult,
    RunResult,
    checks_summary,
    eager_cell,
    eager_cells,
    failed_last_time,
    graph_results,
    is_partial,
    new_stamp,
    outside_graphs_lines,
    verification_summary,
    why_failed,
    written_manifest,
)

ARTEFACT = Path(__file__).resolve().parent / "data" / "format_v3_early" / "mlp"


@pytest.fixture(scope="module")
def manifest():
    return written_manifest(ARTEFACT)


def changed(manifest, **update):
    return manifest.model_copy(update=update)


def entry(status: str, **kw) -> VerificationEntry:
    return VerificationEntry(status=status, **kw)


# ---------------------------------------------------------------------------------------
# the exit code


def run_of(*statuses: str, allow_partial: bool = False, merge: MergeRecord | None = None,
           listed: list[str] | None = None) -> RunResult:
    models = [ModelResult(name=f"m{i}", status=s) for i, s in enumerate(statuses)]
    return RunResult("p", Path("out"), models, 1.0, allow_partial=allow_partial, merge=merge,
                     listed=None if listed is None else [ModelRun(name=f"k{i}", status=s)
                                                         for i, s in enumerate(listed)])


def test_a_run_is_ok_only_when_every_model_is_ok():
    assert run_of("ok", "ok").ok and run_of().ok
    assert not run_of("ok", "failed").ok and not run_of("failed", "ok").ok


def test_a_partial_model_fails_the_run_unless_partial_is_allowed():
    assert not run_of("ok", "partial").ok
    assert run_of("ok", "partial", allow_partial=True).ok
    assert not run_of("partial", "failed", allow_partial=True).ok


@pytest.mark.parametrize("missing,duplicated,ok", [
    ([], [], True), (["x"], [], False), ([], [DuplicatedModel(name="a", folders=["s1", "s2"])], False)])
def test_a_merge_with_a_model_missing_or_run_twice_fails(missing, duplicated, ok):
    merge = MergeRecord(shards=[], missing=missing, duplicated=duplicated)
    run = run_of("ok", merge=merge, listed=["ok"])
    assert run.ok is ok and run.tree_ok is ok


def test_run_json_lists_the_kept_entries_too_and_its_ok_covers_them():
    run = run_of("ok", listed=["ok", "failed"])
    assert run.ok and not run.tree_ok  # the command's models passed; the tree holds a failure
    assert [m.name for m in run.entries()] == ["k0", "k1"]
    plain = run_of("ok", "ok")
    assert [m.name for m in plain.entries()] == ["m0", "m1"] and plain.tree_ok
    assert all(type(m) is ModelRun for m in plain.entries())
    assert run_of("ok", listed=[]).entries() == [] and run_of("failed", listed=[]).tree_ok


def test_a_models_record_leaves_its_traceback_out():
    r = ModelResult(name="m", status="failed", stage="capture", error="boom", traceback="Traceback ...")
    record = r.to_record()
    assert type(record) is ModelRun and "traceback" not in record.model_dump()
    assert (record.name, record.status, record.stage, record.error) == ("m", "failed", "capture", "boom")


def test_each_run_gets_a_stamp_of_its_own():
    a, b = new_stamp(), new_stamp()
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", a.id) and a.id != b.id
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a.started)
    assert a.id[:8] == a.started[:10].replace("-", "") and a.id[9:15] == a.started[11:19].replace(":", "")


# ---------------------------------------------------------------------------------------
# an artefact's checks in brief


def item(ratio, passed=True) -> CheckItem:
    return CheckItem(what="output 0", passed=passed, error=0.1, bound=1.0, method="fp64", ratio=ratio)


def test_a_graphs_cell_has_its_counts_and_worst_ratio():
    checks = GraphChecks(run=3, passed=2, failed=1, skipped=1, indirect=2, exact=0, floor=1, fp64=2, within_noise=1,
                         skipped_reasons=["no eager"], items=[item(2.0), item(None), item(7.5, passed=False)])
    cell = eager_cell(checks)
    assert (cell.run, cell.passed, cell.failed, cell.skipped, cell.indirect) == (3, 2, 1, 1, 2)
    assert (cell.exact, cell.floor, cell.fp64, cell.within_noise) == (0, 1, 2, 1)
    assert cell.worst_ratio == 7.5 and cell.skipped_reasons == ["no eager"]
    assert eager_cell(checks.model_copy(update={"items": [item(None)]})).worst_ratio is None
    assert eager_cell(None) is None


def test_every_checked_graph_has_a_cell(manifest):
    assert set(eager_cells(manifest)) == {"inference", "forward", "inference.freeze+reinplace"}
    graphs = dict(manifest.graphs)
    graphs["forward"] = graphs["forward"].model_copy(update={"checks": None})
    assert set(eager_cells(changed(manifest, graphs=graphs))) == {"inference", "inference.freeze+reinplace"}


def test_the_checks_summary_names_each_skipped_checks_graph(manifest):
    graphs = dict(manifest.graphs)
    graphs["forward"] = graphs["forward"].model_copy(update={"checks": graphs["forward"].checks.model_copy(
        update={"skipped_reasons": ["2 x no float64 reference", "eager failed"]})})
    graphs["inference"] = graphs["inference"].model_copy(update={"checks": None})
    s = checks_summary(changed(manifest, graphs=graphs))
    assert s.skipped_reasons == ["forward: 2 x no float64 reference", "forward: eager failed"]
    assert (s.run, s.passed, s.failed) == (manifest.checks.run, manifest.checks.passed, manifest.checks.failed)
    assert checks_summary(changed(manifest, checks=None)) is None


def test_a_folder_without_a_readable_manifest_is_an_error_naming_it(tmp_path):
    with pytest.raises(AotpipeError, match=r"manifest.json: missing"):
        written_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[]")
    with pytest.raises(AotpipeError, match=f"{tmp_path}/manifest.json"):
        written_manifest(tmp_path)
    shutil.copytree(ARTEFACT, tmp_path / "m")
    assert written_manifest(tmp_path / "m").format_version == 3


# ---------------------------------------------------------------------------------------
# why the run that wrote an artefact failed it (such an artefact is never up to date)


def test_an_artefact_that_passed_everything_did_not_fail(manifest):
    assert not failed_last_time(manifest) and why_failed(manifest) is None
    v = verification_summary(manifest)
    assert v.ok and v.problems == [] and v.graphs == {k: "recorded" for k in manifest.verification}


@pytest.mark.parametrize("status", ["recorded", "shapes only", "match", "ran"])
def test_a_status_that_is_no_problem_fails_nothing(manifest, status):
    m = changed(manifest, verification={"inference": entry(status)})
    assert verification_summary(m).ok and not failed_last_time(m)


def test_a_graph_that_did_not_run_as_recorded_is_a_problem_line(manifest):
    m = changed(manifest, verification={
        "inference": entry("error", error="it raised"),
        "forward": entry("mismatch", mismatches=["output 0", "output 1"], first_divergence="node addmm"),
        "chain": entry("mismatch", problems=["grad 0 differs"]),
        "joint": entry("changed")})
    v = verification_summary(m)
    assert not v.ok and v.graphs == {"inference": "error", "forward": "mismatch", "chain": "mismatch",
                                     "joint": "changed"}
    assert v.problems == ["inference replay error: it raised",
                          "forward replay mismatch: output 0; output 1 (first divergence: node addmm)",
                          "chain replay mismatch: grad 0 differs", "joint replay changed: "]
    assert failed_last_time(m)
    assert why_failed(m) == "inference replay error: it raised (and 3 more)"
    assert verification_summary(changed(manifest, verification=None)).ok


def test_why_failed_names_the_first_graph_in_key_order_and_cuts_a_long_line(manifest):
    m = changed(manifest, verification={"forward": entry("error", error="f" * 400),
                                        "inference": entry("mismatch", mismatches=["x"])})
    assert why_failed(m) == "inference replay mismatch: x (and 1 more)"
    one = changed(manifest, verification={"forward": entry("error", error="f" * 400)})
    assert why_failed(one) == ("forward replay error: " + "f" * 400)[:300]


@pytest.mark.parametrize("failed", [0, 1, 3])
def test_a_failed_check_fails_the_artefact(manifest, failed):
    m = changed(manifest, checks=manifest.checks.model_copy(update={"failed": failed}))
    assert failed_last_time(m) is (failed > 0)
    assert why_failed(m) == (f"{failed} check(s) failed" if failed else None)


def test_a_failed_pass_chain_fails_the_artefact(manifest):
    m = changed(manifest, pass_failures=["inference.freeze graph differs: " + "d" * 400, "another"])
    assert failed_last_time(m)
    assert why_failed(m) == "pass chain failed: " + ("inference.freeze graph differs: " + "d" * 400)[:300]
    assert not failed_last_time(changed(manifest, pass_failures=[], checks=None))


def test_a_replay_problem_is_named_before_a_failed_check_and_a_check_before_a_chain(manifest):
    checks = manifest.checks.model_copy(update={"failed": 2})
    m = changed(manifest, checks=checks, pass_failures=["chain"], verification={"inference": entry("error", error="e")})
    assert why_failed(m) == "inference replay error: e"
    assert why_failed(changed(manifest, checks=checks, pass_failures=["chain"])) == "2 check(s) failed"


# ---------------------------------------------------------------------------------------
# a partial capture, and the graphs in the order a run writes them


def capture_with(manifest, outside, breaks=None):
    return changed(manifest, capture=manifest.capture.model_copy(update={"outside_graphs": outside,
                                                                         "graph_breaks": breaks}))


def test_a_capture_with_nothing_outside_its_graphs_is_whole(manifest):
    assert not is_partial(manifest) and outside_graphs_lines(manifest) == []
    assert not is_partial(capture_with(manifest, []))


def test_what_ran_outside_the_graphs_is_one_line_per_compile_after_the_first_break(manifest):
    outside = [OutsideGraphs(compile="inference", ops={"aten.nonzero.default": 2}),
               OutsideGraphs(compile="training", ops={}, values=["model output 0"])]
    breaks = [GraphBreakRecord(subgraph=0, reason="data-dependent branch", where="model.py:12", code="if x.sum():"),
              GraphBreakRecord(subgraph=1, reason="print")]
    m = capture_with(manifest, outside, breaks)
    assert is_partial(m)
    after = " after graph break 'data-dependent branch' at model.py:12 (`if x.sum():`) and 1 more"
    assert outside_graphs_lines(m) == [
        f"inference{after}: outside the graphs ran aten.nonzero.default x2",
        f"training{after}: outside the graphs ran model output 0 made by no graph"]
    one = capture_with(manifest, outside[:1], [GraphBreakRecord(subgraph=0, reason="print")])
    assert outside_graphs_lines(one) == ["inference after graph break 'print': outside the graphs ran "
                                         "aten.nonzero.default x2"]
    assert outside_graphs_lines(capture_with(manifest, outside[:1])) == [
        "inference: outside the graphs ran aten.nonzero.default x2"]


def test_graphs_come_captured_first_then_those_passes_made(manifest):
    results = graph_results(manifest)
    assert [g.kind for g in results] == ["inference", "forward", "inference.freeze+reinplace"]
    g = manifest.graphs["inference"]
    assert (results[0].folder, results[0].nodes, results[0].inputs, results[0].outputs) == (
        g.folder, g.nodes, g.inputs, g.outputs)


def test_a_stamp_is_utc_whatever_the_machines_time_zone(monkeypatch):
    import time
    from datetime import datetime, timezone

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30: no hour of it reads as UTC's
    time.tzset()
    try:
        before = datetime.now(timezone.utc).replace(microsecond=0)
        stamp = new_stamp()
        after = datetime.now(timezone.utc)
    finally:
        monkeypatch.undo()
        time.tzset()
    started = datetime.strptime(stamp.started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert before <= started <= after


# a dims: capture: its size checks fail it too (tests/data/dynamic_tiny: batch dynamic, checked at min, max, random)

DYNAMIC = Path(__file__).resolve().parent / "data" / "dynamic_tiny" / "scaled"


def test_a_size_check_that_failed_fails_the_artefact_and_says_where():
    m = written_manifest(DYNAMIC)
    assert m.dims is not None and m.dims.checked and not failed_last_time(m) and why_failed(m) is None
    points = list(m.dims.checked)
    points[1] = points[1].model_copy(update={"problems": ["forward graph differs from the eager model: grad of w",
                                                          "joint graph differs"]})
    bad = changed(m, dims=m.dims.model_copy(update={"checked": points}))
    assert failed_last_time(bad)
    c = points[1]
    at = ", ".join(f"{k}={v}" for k, v in c.sizes.items())
    assert why_failed(bad) == f"at {c.point} ({at}): forward graph differs from the eager model: grad of w"


@pytest.mark.parametrize("auto, checked, fails", [(False, True, True), (True, True, False), (False, False, False)])
def test_a_named_dimension_left_static_fails_only_where_the_sizes_were_checked(auto, checked, fails):
    """After size checks, a named dimension no graph kept symbolic failed the model (even with no
    point left to check: export specialised every one); dims: auto records it, and auto's
    fallback to a capture at the example sizes checks nothing (no budget)."""
    m = written_manifest(DYNAMIC)
    dims = {k: d.model_copy(update={"status": "specialised", "reason": "specialised to 4"})
            for k, d in m.dims.dims.items()}
    static = changed(m, dims=m.dims.model_copy(update={"dims": dims, "auto_dims": auto, "checked": [],
                                                       "budget_bytes": m.dims.budget_bytes if checked else None}))
    assert failed_last_time(static) is fails
    assert why_failed(static) == ("dims: batch is static in every graph (specialised to 4) (and 1 more)" if fails
                                  else None)


def test_sizes_text_says_each_dimension_and_the_size_checks_in_one_line():
    from aotpipe.format.records import CheckTotals, DimRecord, DimsRecord, SizeCheckRecord
    from aotpipe.pipeline.results import sizes_text

    def point(name, run, passed, problems=()):
        return SizeCheckRecord(point=name, sizes={"batch": 1},
                               checks=CheckTotals(run=run, passed=passed, failed=run - passed, skipped=0),
                               problems=list(problems))

    dims = DimsRecord(dims={"batch": DimRecord(min=1, max=16, example=2, status="dynamic"),
                            "seq": DimRecord(min=8, max=None, example=16, status="dynamic")},
                      checked=[point("min", 10, 10), point("max", 7, 6, ["x graph differs"]),
                               SizeCheckRecord(point="random", sizes={"batch": 3})])
    assert sizes_text(dims) == "batch 1..16, seq 8..inf dynamic; checked at min, max, random: 16/17, 1 PROBLEM(S)"
    fixed = DimsRecord(dims={"batch": DimRecord(min=1, max=4, example=2, status="specialised", reason="fixed at m.py:3"),
                             "seq": DimRecord(min=4, max=64, example=16, status="specialised", reason="by dynamo")})
    assert sizes_text(fixed) == "batch fixed at m.py:3; seq by dynamo"
    both = DimsRecord(dims={"batch": DimRecord(min=1, max=4, example=2, status="dynamic"),
                            "seq": DimRecord(min=4, max=64, example=16, status="specialised", reason="fixed")},
                      checked=[point("min", 3, 3)])
    assert sizes_text(both) == "batch 1..4 dynamic; seq fixed; checked at min: 3/3"


def test_a_named_dimension_left_static_is_said_with_its_reason_where_it_has_one():
    from aotpipe.format.records import DimRecord, DimsRecord
    from aotpipe.pipeline.results import static_named_dims

    dims = DimsRecord(budget_bytes=1, dims={
        "batch": DimRecord(min=1, max=4, example=2, status="specialised"),
        "seq": DimRecord(min=4, max=64, example=16, status="specialised", reason="fixed at m.py:3"),
        "x": DimRecord(min=1, max=4, example=2, status="dynamic")})
    assert static_named_dims(dims) == ["dims: batch is static in every graph",
                                       "dims: seq is static in every graph (fixed at m.py:3)"]


def test_a_size_check_problem_is_why_it_failed_cut_at_300_characters(manifest):
    from aotpipe.format.records import DimRecord, DimsRecord, SizeCheckRecord

    dims = DimsRecord(budget_bytes=1, dims={"batch": DimRecord(min=1, max=4, example=2, status="dynamic")},
                      checked=[SizeCheckRecord(point="max", sizes={"batch": 4}, problems=["p" * 400]),
                               SizeCheckRecord(point="min", sizes={"batch": 1}, problems=["q"])])
    m = changed(manifest, dims=dims)
    first = "at max (batch=4): " + "p" * 400
    assert why_failed(m) == first[:300] + " (and 1 more)"
    assert len(why_failed(m)) == 300 + len(" (and 1 more)")
