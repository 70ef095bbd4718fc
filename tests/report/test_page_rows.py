"""report.html's rows, field by field: what each model's row and details take from run.json
and from the files (manifest, graph.json, inputs.json), and the summary over them. Fast:
the format v2 fixture's two models (tests/report/tiny.py), edited per test; plots stubbed."""

import json
import re
import sys

import pytest

import aotpipe.pipeline.htmlreport as page
from aotpipe.artifact.fsio import OutputError
from aotpipe.errors import AotpipeError
from tests.report.tiny import EARLIER, STAMP, copy_tree, drawn, edit_json, entry, write_run  # noqa: F401

pytestmark = pytest.mark.usefixtures("drawn")
DERIVED = "inference.freeze+fold_conv_bn+channels_last+reinplace"


@pytest.fixture()
def root(tmp_path):
    return copy_tree(tmp_path)


def manifest(root, model="mlp"):
    return root / model / "manifest.json"


def rows(root):
    return {r.name: r for r in page.gather(root).rows}


TIMES = dict(capture_seconds=1.5, passes_seconds=0.25, checks_seconds=2.0, write_seconds=0.5, total_seconds=4.5)


# ---------------------------------------------------------------------------------------
# From run.json


def test_a_row_takes_status_stage_error_times_bytes_and_notes_from_run_json(root):
    write_run(root, [entry("mlp", "failed", stage="checks", error="2 check(s) failed", bytes=1000, notes=["n1"],
                           **TIMES),
                     entry("running_norm", "failed", error="worker died")])
    r = rows(root)
    mlp = r["mlp"]
    assert (mlp.status, mlp.stage, mlp.kept, mlp.bytes, mlp.notes) == ("failed", "checks", None, 1000, ["n1"])
    assert mlp.errors == ["checks: 2 check(s) failed"]
    assert mlp.seconds == {"capture": 1.5, "passes": 0.25, "checks": 2.0, "write": 0.5, "total": 4.5}
    assert r["running_norm"].errors == ["run: worker died"]  # no stage: "run"


def test_an_entry_kept_from_an_earlier_run_says_which_run_or_that_none_timed_it(root):
    write_run(root, [entry("mlp", measured_in=EARLIER, **TIMES), entry("running_norm", skipped=True, measured_in=None)])
    r = rows(root)
    assert r["mlp"].kept == f"kept from run {EARLIER.id} (started {EARLIER.started})" and r["mlp"].seconds["total"] == 4.5
    assert r["running_norm"].kept == "kept, up to date; no measurement" and r["running_norm"].seconds == {}
    write_run(root, [entry("mlp", measured_in=None), entry("running_norm")])  # timed, by no run it names
    assert rows(root)["mlp"].kept == "kept from an earlier run" and rows(root)["running_norm"].kept is None
    html = page.build_html(root)
    assert html.count('class="muted kept"') == 1 and 'title="kept from an earlier run"' in html


def test_a_model_not_in_run_json_is_shown_from_its_manifest_with_a_note(root):
    write_run(root, [entry("mlp")])
    extra = rows(root)["running_norm"]
    assert extra.status == "ok" and extra.notes[-1] == (
        "not in run.json: not part of the pipeline's last run (removed from the pipeline, or copied here); delete "
        "its folder to drop it from this page")
    assert extra.anchor == "m1"  # after run.json's one row
    assert not any(n.startswith("not in run.json") for n in rows(root)["mlp"].notes)


def test_a_model_folder_named_other_than_its_model_is_matched_by_the_manifest_s_name(root):
    (root / "mlp").rename(root / "renamed")
    write_run(root, [entry("mlp"), entry("running_norm")])
    page_ = page.gather(root)
    assert [(r.name, r.status) for r in page_.rows] == [("mlp", "ok"), ("running_norm", "ok")]


def test_a_model_folder_is_matched_by_its_folder_s_name_where_the_manifest_names_the_model_otherwise(root):
    edit_json(manifest(root), lambda m: m["model"].update(name="mlp_renamed"))
    write_run(root, [entry("mlp"), entry("running_norm")])
    page_ = page.gather(root)
    assert [(r.name, r.status, r.errors) for r in page_.rows] == [("mlp", "ok", []), ("running_norm", "ok", [])]
    assert len(page_.rows[0].graphs) == 5  # the folder's graphs, not a missing model's none


# ---------------------------------------------------------------------------------------
# From the manifest


def test_without_run_json_status_is_the_manifest_s_own_verdict(root):
    edit_json(manifest(root), lambda m: m.update(pass_failures=["inference graph: pass 'freeze' failed: boom"]))
    edit_json(manifest(root, "running_norm"), lambda m: m["capture"].update(notes=["captured with strict=False"]))
    r = rows(root)
    assert r["mlp"].status == "failed"
    assert r["mlp"].errors == ["pass chain failed: inference graph: pass 'freeze' failed: boom",
                               "pass chain failed: inference graph: pass 'freeze' failed: boom"]  # verdict, then record
    assert (r["running_norm"].status, r["running_norm"].errors) == ("ok", [])
    assert r["running_norm"].notes == ["captured with strict=False"]
    assert (r["mlp"].seconds, r["mlp"].bytes, r["mlp"].kept) == ({}, None, None)


def test_capture_mode_graph_breaks_fallback_and_a_partial_capture(root):
    def dynamo(m):
        m["capture"].update(mode="dynamo", fallback="export refused a print", graph_breaks=[
            {"subgraph": 0, "reason": "print", "where": "m.py:3"}, {"subgraph": 1, "reason": "data-dependent"}],
            outside_graphs=[{"compile": "inference", "ops": {"aten.add.Tensor": 2}}])
    edit_json(manifest(root), dynamo)
    write_run(root, [entry("mlp", notes=["from run.json"]), entry("running_norm")])
    mlp = rows(root)["mlp"]
    assert (mlp.mode, mlp.graph_breaks, mlp.status) == ("dynamo", 2, "partial")  # the manifest says partial
    assert mlp.breaks == ["after subgraph 0: print at m.py:3", "after subgraph 1: data-dependent"]
    assert mlp.notes == ["from run.json", "export failed, dynamo used: export refused a print"]
    assert mlp.outside == ["inference after graph break 'print' at m.py:3 and 1 more: outside the graphs ran "
                           "aten.add.Tensor x2"]
    assert rows(root)["running_norm"].graph_breaks == 0 and rows(root)["running_norm"].mode == "export"
    write_run(root, [entry("mlp", "failed", stage="checks"), entry("running_norm")])
    assert rows(root)["mlp"].status == "failed"  # partial never hides a failure


def test_node_counts_per_kind_other_graphs_and_parameters(root):
    mlp = rows(root)["mlp"]
    assert mlp.nodes == {"inference": 16, "forward": 19, "backward": 40, "joint": 51, "train_step": None}
    assert mlp.other_graphs == 1  # the graph the passes made
    assert mlp.parameters == 586  # 4*... : the elements of the param inputs of its first graph
    edit_json(manifest(root), lambda m: [m["graphs"].pop(k) for k in ("backward", "joint", DERIVED)])
    mlp = rows(root)["mlp"]
    assert mlp.nodes == {"inference": 16, "forward": 19, "backward": None, "joint": None, "train_step": None}
    assert mlp.other_graphs == 0


def test_each_graph_lists_its_ops_most_called_first_with_its_share_of_the_largest(root):
    (g,) = [g for g in rows(root)["mlp"].graphs if g.key == "inference"]
    assert (g.folder, g.nodes, g.distinct_ops, g.more_ops, g.verified, g.problem, g.view) == (
        "mlp_inference_0", 16, 3, 0, "recorded", None, None)
    assert g.ops == [("aten.addmm.default", 3, 1.0), ("aten.permute.default", 3, 1.0), ("aten.relu.default", 2, 2 / 3)] \
        or g.ops == [("aten.permute.default", 3, 1.0), ("aten.addmm.default", 3, 1.0), ("aten.relu.default", 2, 2 / 3)]
    assert [gr.key for gr in rows(root)["mlp"].graphs] == ["inference", DERIVED, "forward", "backward", "joint"]


def test_past_the_top_25_ops_the_rest_are_summed(root):
    def distinct(g):
        calls = [n for n in g["nodes"] if n["op"] == "call_function"]
        for i, n in enumerate(calls):
            n["target"] = f"aten.op{i:02d}.default" if i < 27 else "aten.op00.default"
    edit_json(root / "mlp" / "mlp_joint_0" / "graph.json", distinct)
    (g,) = [g for g in rows(root)["mlp"].graphs if g.key == "joint"]
    calls = 42  # the joint graph's call_function nodes
    assert g.distinct_ops == 27 and len(g.ops) == page.TOP_OPS == 25
    assert g.ops[0] == ("aten.op00.default", calls - 26, 1.0) and g.ops[1][1:] == (1, 1 / (calls - 26))
    assert g.more_ops == 2  # op25 and op26, once each


def test_each_pass_step_says_what_it_did(root):
    steps = rows(root)["mlp"].passes
    assert [(s["name"], s["before"], s["after"], s["modified"], s["did"]) for s in steps] == [
        ("freeze", 16, 16, True, "frozen 6"), ("fold_conv_bn", 16, 16, False, "nothing"),
        ("channels_last", 16, 16, False, "nothing"), ("reinplace", 16, 16, True, "ops_reinplaced 2")]
    assert {s["graph"] for s in steps} == {DERIVED}


def test_what_a_pass_did_joins_every_nonzero_count(root):
    edit_json(manifest(root), lambda m: m["graphs"][DERIVED]["passes"][0]["stats"].update(cse_merged=2))
    (freeze,) = [s for s in rows(root)["mlp"].passes if s["name"] == "freeze"]
    assert freeze["did"] == "cse_merged 2, frozen 6"


def test_a_graph_that_calls_no_op_lists_none_and_one_never_replayed_has_no_verdict(root):
    def no_calls(g):
        g["nodes"] = [n for n in g["nodes"] if n["op"] != "call_function"]
    edit_json(root / "mlp" / "mlp_forward_0" / "graph.json", no_calls)
    edit_json(manifest(root), lambda m: m["verification"].pop("joint"))
    graphs = {g.key: g for g in rows(root)["mlp"].graphs}
    assert (graphs["forward"].ops, graphs["forward"].distinct_ops, graphs["forward"].more_ops) == ([], 0, 0)
    assert graphs["joint"].verified is None and graphs["backward"].verified == "recorded"


def test_a_row_made_without_a_run_record_says_nothing_of_kept_and_a_view_without_a_manifest_is_unreadable(root):
    from aotpipe.pipeline.tree import ModelView

    row = page._model_row(0, entry("mlp", measured_in=EARLIER), None, root)
    assert (row.status, row.kept) == ("ok", None)  # which run is "this" one is run.json's to say
    row = page._model_row(3, None, ModelView(name="x", folder=root / "x"), root)
    assert (row.name, row.anchor, row.status, row.errors) == ("x", "m3", "unreadable", [])


def _checks(m, items, **counts):
    c = m["graphs"]["inference"]["checks"]
    c["items"] = items
    c.update(counts)


def test_each_check_s_error_as_a_share_of_its_bound_and_the_worst(root):
    items = [{"what": "output 0", "passed": True, "method": "fp64", "error": 1.0, "bound": 4.0},
             {"what": "output 1", "passed": False, "method": "fp64", "error": 3.0, "bound": 2.0, "detail": "far"},
             {"what": "output 2", "passed": True, "method": "exact", "error": 0.0, "bound": 0.0},
             {"what": "output 3", "passed": True, "method": "floor", "error": None, "bound": 1.0},
             {"what": "output 4", "passed": False, "method": "fp64", "error": float("inf"), "bound": 1.0},
             {"what": "output 5", "passed": False, "method": "fp64", "error": 1.0, "bound": float("nan")}]
    edit_json(manifest(root), lambda m: _checks(m, items, skipped_reasons=["output 6: no float64 reference"]))
    mlp = rows(root)["mlp"]
    got = [(c.what, c.method, c.passed, c.error, c.bound, c.ratio, c.detail) for c in mlp.checks
           if c.graph == "inference"]
    assert got == [("output 0", "fp64", True, 1.0, 4.0, 0.25, None), ("output 1", "fp64", False, 3.0, 2.0, 1.5, "far"),
                   ("output 2", "exact", True, 0.0, 0.0, None, None), ("output 3", "floor", True, None, 1.0, None, None),
                   ("output 4", "fp64", False, None, 1.0, None, None), ("output 5", "fp64", False, 1.0, None, None, None)]
    assert mlp.worst_ratio == 1.5
    assert "inference: check skipped: output 6: no float64 reference" in mlp.errors
    edit_json(manifest(root), lambda m: [g.pop("checks", None) for g in m["graphs"].values()])
    assert rows(root)["mlp"].worst_ratio is None and rows(root)["mlp"].checks == []


def test_the_model_s_check_counts_and_how_they_were_settled(root):
    r = rows(root)["mlp"]
    assert (r.checks_run, r.checks_passed, r.checks_failed, r.checks_skipped, r.settled) == (9, 9, 0, 0, "")
    edit_json(manifest(root), lambda m: m["checks"].update(run=7, passed=5, failed=1, skipped=1, exact=2, floor=None,
                                                          fp64=3))
    r = rows(root)["mlp"]
    assert (r.checks_run, r.checks_passed, r.checks_failed, r.checks_skipped, r.settled) == (7, 5, 1, 1,
                                                                                          "2 exact, 0 floor, 3 fp64")
    edit_json(manifest(root), lambda m: m["checks"].update(exact=None, floor=None, fp64=0))
    assert rows(root)["mlp"].settled == "0 exact, 0 floor, 0 fp64"  # counted (fp64 present), none by any rule
    edit_json(manifest(root), lambda m: m.pop("checks"))
    r = rows(root)["mlp"]
    assert (r.checks_run, r.checks_passed, r.checks_failed, r.checks_skipped) == (None, None, None, None)


def test_a_replay_problem_and_a_failed_pass_chain_are_errors(root):
    def damage(m):
        m["verification"]["forward"].update(status="mismatch", error="output 0 differs")
        m["pass_failures"] = ["backward graph: pass 'x' failed"]
    edit_json(manifest(root), damage)
    write_run(root, [entry("mlp"), entry("running_norm")])
    mlp = rows(root)["mlp"]
    assert [g.verified for g in mlp.graphs if g.key == "forward"] == ["mismatch"]
    assert mlp.errors == ["forward: mismatch: output 0 differs", "pass chain failed: backward graph: pass 'x' failed"]


def test_a_graph_whose_records_cannot_be_read_makes_the_model_unreadable(root):
    (root / "mlp" / "mlp_backward_0" / "inputs.json").write_text("[")
    write_run(root, [entry("mlp"), entry("running_norm")])
    mlp = rows(root)["mlp"]
    assert mlp.status == "unreadable" and mlp.errors == []
    (g,) = [g for g in mlp.graphs if g.key == "backward"]
    assert g.problem.startswith(f"{root / 'mlp' / 'mlp_backward_0' / 'inputs.json'}: not valid JSON")
    assert rows(root)["running_norm"].status == "ok"


# ---------------------------------------------------------------------------------------
# The summary, the plots, bench.json


def test_the_summary_counts_models_by_status_graphs_bytes_checks_and_kept(tmp_path):
    root = copy_tree(tmp_path, "out")  # named other than its pipeline ("p")
    edit_json(manifest(root), lambda m: m["checks"].update(exact=4, floor=0, fp64=5, within_noise=2))
    edit_json(manifest(root, "running_norm"), lambda m: m["checks"].update(exact=1, floor=2, fp64=3, within_noise=1))
    # three rows, no two counts alike: a failed model with no folder (and nothing written) is the third
    write_run(root, [entry("mlp", "failed", stage="checks", bytes=100),
                     entry("running_norm", "partial", bytes=28, measured_in=EARLIER),
                     entry("gone", "failed", stage="capture")], seconds=9.5)
    s = page.gather(root).summary
    assert s == {"models": 3, "ok": 0, "partial": 1, "failed": 2, "kept": 1, "graphs": 10, "bytes": 128, "seconds": 9.5,
                 "checks": {"run": 20, "passed": 20, "failed": 0, "skipped": 0},
                 "settled": {"exact": 5, "floor": 2, "fp64": 8, "within_noise": 3}, "size": "128 B"}
    report = page.gather(root)
    assert report.title == "p" and re.fullmatch(r"torch \S+, python \S+, aotpipe \S+", report.versions)
    bare = page.gather(copy_tree(tmp_path, "bare"))
    assert (bare.title, bare.versions, bare.summary["seconds"], bare.summary["ok"]) == ("bare", "", None, 2)


def test_the_page_walks_the_tree_once_and_holds_op_counts_not_nodes(root, monkeypatch):
    """A zoo's nodes held at once took 7 GB: the page keeps each graph's op counts only."""
    import aotpipe.trust.verify as verify

    walks, views = [], []
    find = verify.find_artifacts
    read_tree = page.read_tree
    monkeypatch.setattr(verify, "find_artifacts", lambda r: walks.append(r) or find(r))
    monkeypatch.setattr(page, "read_tree", lambda *a, **k: views.extend(read_tree(*a, **k)) or views)
    report = page.gather(root)
    assert walks == [root] and [r.name for r in report.rows] == ["mlp", "running_norm"]
    graphs = [g for v in views for g in v.graphs]
    assert len(graphs) == 10 and all(g.nodes is None and g.op_counts for g in graphs)


def test_the_plots_are_given_each_timed_model_and_each_check_with_a_ratio(root, drawn):
    edit_json(manifest(root), lambda m: _checks(m, [
        {"what": "o", "passed": True, "method": "fp64", "error": 1.0, "bound": 2.0},
        {"what": "p", "passed": True, "method": "fp64", "error": None, "bound": 2.0}]))
    # "gone": timed (all zero: it failed at once) but no folder, so no parameter count
    write_run(root, [entry("mlp", **TIMES), entry("running_norm", skipped=True, measured_in=None),
                     entry("gone", "failed", stage="capture")])
    report = page.gather(root)
    assert drawn["capture"] == [("mlp", 586, 1.5), ("gone", 0, 0.0)]
    assert drawn["stages"] == [("mlp", [1.5, 0.25, 2.0, 0.5]), ("gone", [0.0, 0.0, 0.0, 0.0])]
    assert max(drawn["ratios"]) == 0.5 and None not in drawn["ratios"]  # the rest: the fixture's errors of 0
    assert [(pid, caption) for pid, caption, _ in report.plots] == [
        ("plot-capture", "Capture seconds against parameter count (parameters: elements of the graphs' param inputs)."),
        ("plot-stages", "Seconds per stage: capture, passes, checks (every written graph run once against the eager "
                        "model), write."),
        ("plot-ratios", "Each check's error against its bound (the float64 rule or the noise floor); above 1 fails.")]
    assert "bench" not in drawn


def test_a_plot_that_draws_nothing_is_left_out(root, monkeypatch):
    monkeypatch.setattr(page.plots, "seconds_per_stage", lambda data: "")
    assert [pid for pid, _, _ in page.gather(root).plots] == ["plot-capture", "plot-ratios"]


def test_without_matplotlib_the_page_says_so_and_draws_nothing(root, drawn, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = page.gather(root)
    assert report.plots == [] and drawn == {}
    assert report.problems == ["no plots: matplotlib is not installed (pip install matplotlib -c constraints.txt)"]


def test_bench_json_is_plotted_and_a_bare_list_is_its_results(root, drawn):
    (root / "bench.json").write_text('[{"model": "mlp", "graph": "inference", "status": "ok", "speedup": 1.8},'
                                     ' {"model": "mlp", "graph": "forward", "status": "fail_accuracy"}]')
    report = page.gather(root)
    assert drawn["bench"] == [("mlp/inference", "ok", 1.8), ("mlp/forward", "fail_accuracy", None)]
    assert [(b.model, b.graph, b.speedup) for b in report.bench.results] == [("mlp", "inference", 1.8),
                                                                            ("mlp", "forward", None)]
    assert report.plots[-1][:2] == ("plot-bench", "Bench (backend): speedup over eager per graph; red: not ok "
                                                  "(speedup 0 where none was measured).")
    (root / "bench.json").write_text('{"backend": "inductor", "results": []}')
    assert page.gather(root).plots[-1][1].startswith("Bench (inductor): ")
    (root / "bench.json").write_text('{"results": "fast"}')
    report = page.gather(root)
    assert report.bench is None and report.problems[0].startswith(
        f"{root / 'bench.json'}: not a bench result (field results: Input should be a valid list")
    assert report.problems[0].endswith('expected {"results": [{"model", "graph", "status", "speedup"}], '
                                       '"scores": {...}}')


def test_a_folder_that_is_not_one_or_holds_nothing_is_a_user_error(tmp_path):
    with pytest.raises(AotpipeError, match=r"absent: not a folder; pass a pipeline's output folder"):
        page.gather(tmp_path / "absent")
    with pytest.raises(AotpipeError) as e:
        page.gather(tmp_path)
    assert str(e.value) == (f"{tmp_path}: no run.json and no artefacts (manifest.json) found in it or below; pass a "
                            "pipeline's output folder, e.g. artifacts/quickstart")
    write_run(tmp_path, [])
    assert page.gather(tmp_path).rows == []  # a run.json alone is a page


# ---------------------------------------------------------------------------------------
# The page and the terminal


def test_the_page_marks_each_row_s_status_and_shows_missing_numbers_as_dashes(root):
    write_run(root, [entry("mlp", "partial", skipped=True, measured_in=None),
                     entry("running_norm", "failed", stage="capture")])
    html = page.build_html(root)
    got = re.findall(r'<tr class="model-row" data-status="(\w+)">\s*<td><a href="#(m\d)">([^<]*)</a></td>\s*'
                     r'<td class="(\w*)">([^<]*?) ?(?:<span class="muted kept"[^>]*>kept</span>)?</td>', html)
    assert got == [("partial", "m0", "mlp", "partial", "partial"),
                   ("failed", "m1", "running_norm", "failed", "failed (capture)")]
    assert re.search(r'id="sum-partial" class="partial">1<', html)
    assert '<td class="n" data-v="">-</td>' in html  # no times: "-"


def test_not_ok_lines_list_failed_and_unreadable_models_not_partial_ones(root):
    write_run(root, [entry("mlp", "failed"), entry("running_norm", "failed", stage="write", error="disk full")])
    assert page.not_ok_lines(page.gather(root)) == ["2 of 2 models not ok:", "  mlp: failed",
                                                    "  running_norm: failed (write): write: disk full"]
    (root / "running_norm" / "manifest.json").write_text("{")
    write_run(root, [entry("mlp", "partial"), entry("running_norm")])
    assert page.not_ok_lines(page.gather(root)) == [
        "1 of 2 models not ok:",
        f"  running_norm: unreadable: {root / 'running_norm' / 'manifest.json'}: not valid JSON (line 1: Expecting "
        "property name enclosed in double quotes)"]
    write_run(root, [entry("mlp", "partial"), entry("running_norm", "partial")])
    (root / "running_norm" / "manifest.json").unlink()
    assert page.not_ok_lines(page.gather(copy_tree(root.parent, "clean"))) == []


def test_write_page_writes_where_told_and_never_into_a_model_folder(root, tmp_path):
    path, report = page.write_page(root)
    assert path == root / "report.html" and path.read_text() == page.render(report)
    with pytest.raises(AotpipeError) as e:
        page.write_page(root / "mlp")
    assert str(e.value) == (f"{root / 'mlp'} is a model folder; write its page elsewhere (aotpipe report "
                            f"{root / 'mlp'} -o FILE) or pass the output folder above it")
    path, report = page.write_page(root / "mlp", tmp_path / "mlp.html")
    assert path == tmp_path / "mlp.html" and [r.name for r in report.rows] == ["mlp"]
    assert page.write_html(root) == root / "report.html"
    with pytest.raises(OutputError, match=str(tmp_path / "no" / "such" / "page.html")):
        page.write_page(root, tmp_path / "no" / "such" / "page.html")


# ---------------------------------------------------------------------------------------
# Links


def test_a_link_is_a_relative_path_to_a_file_inside_the_page_s_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    tmp_path = tmp_path / "page"
    tmp_path.mkdir()
    (tmp_path / "a b").mkdir()
    (tmp_path / "a b" / "v#1.json").write_text("{}")
    assert page.relative_link(tmp_path, tmp_path / "a b" / "v#1.json") == "./a%20b/v%231.json"
    assert page.relative_link(tmp_path, tmp_path / "a b") is None  # a folder
    assert page.relative_link(tmp_path, tmp_path) is None
    assert page.relative_link(tmp_path, tmp_path / "a b" / "absent.json") is None
    assert page.relative_link(tmp_path / "a b", tmp_path / "x.json") is None  # outside
    assert page.relative_link(tmp_path, tmp_path / "a b" / ".." / "a b" / "v#1.json") is None  # climbs
    assert page.relative_link(tmp_path, tmp_path / "." / "a b" / "v#1.json") == "./a%20b/v%231.json"  # "." folds away
    (tmp_path / "a b" / "out").symlink_to(outside)
    assert page.relative_link(tmp_path, tmp_path / "a b" / "out" / "secret.json") is None  # a link out of the folder
    (tmp_path / "a b" / "loop").symlink_to(tmp_path / "a b" / "loop")
    assert page.relative_link(tmp_path, tmp_path / "a b" / "loop") is None


def test_a_graph_links_the_tree_s_view_before_the_model_folder_s_own(root):
    own = root / "mlp" / "views" / "joint.model-explorer.json"
    own.parent.mkdir()
    own.write_text("{}")
    links = {g.key: g.view for g in rows(root)["mlp"].graphs}
    assert links["joint"] == "./mlp/views/joint.model-explorer.json" and links["forward"] is None
    tree_view = root / "views" / "mlp" / "joint.model-explorer.json"
    tree_view.parent.mkdir(parents=True)
    tree_view.write_text("{}")
    assert {g.key: g.view for g in rows(root)["mlp"].graphs}["joint"] == "./views/mlp/joint.model-explorer.json"


@pytest.mark.parametrize("name", ["XXXX", "XX.XX", "...", ".hidden", "-"])
def test_a_file_of_any_name_but_dot_and_dot_dot_is_linked(tmp_path, name):
    (tmp_path / name).mkdir()
    (tmp_path / name / name).write_text("{}")
    assert page.relative_link(tmp_path, tmp_path / name / name) == f"./{name}/{name}"


def test_a_name_too_long_for_the_file_system_is_not_linked(tmp_path):
    """A graph key makes a view's file name: one past the system's limit is no file, not an error."""
    assert page.relative_link(tmp_path, tmp_path / ("k" * 300 + ".model-explorer.json")) is None


def test_the_csp_hash_is_the_sha256_of_the_script_s_exact_text():
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(b"x();").digest()).decode()
    assert page._csp_hash("x();") == f"'sha256-{digest}'"


def test_numbers_on_the_page_format_and_none_is_a_dash(root):
    edit_json(manifest(root), lambda m: _checks(m, [
        {"what": "o", "passed": True, "method": "fp64", "error": 0.000123456, "bound": 0.5},
        {"what": "p", "passed": True, "method": "floor", "error": 0.0000123456, "bound": None}]))
    path = write_run(root, [entry("mlp", **TIMES), entry("running_norm", **TIMES)])
    edit_json(path, lambda r: r["models"][1].update(capture_seconds=float("inf")))  # "Infinity": Python's JSON reads it
    html = page.build_html(root)
    assert '<td class="n" data-v="1.5">1.50</td>' in html
    assert ">0.000123<" in html and ">0.5<" in html
    assert '<td>floor</td><td class="n">1.23e-05</td><td class="n">-</td><td class="n">-</td>' in html
    assert '<td class="n" data-v="inf">inf</td>' in html  # as Python writes it (run.json may say Infinity)


def test_the_page_shows_names_as_text_and_each_plot_s_svg_as_drawn(root):
    edit_json(manifest(root), lambda m: m["model"].update(name="<i>mlp</i>"))
    html = page.build_html(root)
    assert "&lt;i&gt;mlp&lt;/i&gt;" in html and "<i>mlp</i>" not in html
    assert '<figure id="plot-capture"><svg>capture</svg><figcaption>Capture seconds against' in html  # the stub's


def test_the_page_s_source_starts_with_its_doctype_and_keeps_no_indent_of_the_template_s_tags(root):
    html = page.build_html(root)
    assert html.startswith("<!DOCTYPE html>\n")
    assert '\n<th class="n" data-type="num">inference nodes</th>' in html
    assert "\n<script>(function () {\n" in html


def test_a_value_the_template_needs_and_the_report_lacks_fails_the_page_rather_than_showing_blank(root):
    import jinja2

    report = page.gather(root)
    del report.summary["graphs"]
    with pytest.raises(jinja2.UndefinedError, match="graphs"):
        page.render(report)


def test_a_distributed_ranks_row_says_its_collectives_per_step_and_per_inference_call(root):
    assert not [n for n in rows(root)["mlp"].notes if "collectives" in n]
    rank = dict(world_size=2, strategy="ddp", mesh=[2], mesh_dims=["dp"], rank=0, coords={"dp": 0},
                groups={"0": {"dim": "dp", "ranks": [0, 1]}}, shards={},
                collectives=[dict(graph="backward", node="n0", op="all_reduce", group="0", dim="dp", bytes=64),
                             dict(graph="inference", node="n1", op="all_gather_into_tensor", group="0", dim="dp",
                                  bytes=32)])
    edit_json(manifest(root), lambda d: d.update(distributed=rank))
    notes = [n for n in rows(root)["mlp"].notes if "collectives" in n]
    # two ranks: an all-reduce sends 2 * 1/2 of its output
    assert notes == ["rank 0 of a world of 2 (ddp): collectives of a training step (forward then backward): "
                     "all-reduce 1; sends 64 B; of an inference call: all-gather 1; sends 16 B (bytes sent in a ring "
                     "algorithm)"]


def test_bench_json_as_bench_prints_it_graphs_per_kind_scores_and_bugs(root):
    (root / "bench.json").write_text(json.dumps({
        "backend": "inductor",
        "graphs": [{"artifact": "mlp", "graph": "inference", "status": "pass", "speedup": 1.5, "reason": "ok"},
                   {"artifact": "mlp", "graph": "forward", "status": "crashed", "speedup": None}],
        "scores": {"all": {"graphs": 2, "passed": 1, "geomean_speedup": 1.5, "pass_rate": 0.5},
                   "forward": {"graphs": 1, "passed": 0, "geomean_speedup": None}},
        "bugs": [{"signature": "crashed: SIGSEGV", "status": "crashed", "graphs": ["mlp forward", "x backward"],
                  "models": ["mlp", "x"], "repro": "r/mlp-forward-le-min", "repro_nodes": 1, "first": "mlp forward"},
                 {"signature": "fail_accuracy at aten.gelu.default(float32)", "status": "fail_accuracy",
                  "graphs": ["y inference"], "models": ["y"]}]}))
    report = page.gather(root)
    b = report.bench
    assert [(r.model, r.graph, r.status, r.speedup) for r in b.results] == [
        ("mlp", "inference", "pass", 1.5), ("mlp", "forward", "crashed", None)]
    assert b.score_texts() == ["all: 1/2 pass, geomean 1.5x", "forward: 0/1 pass"]
    assert b.bug_graphs() == 3 and [x.repro_nodes for x in b.bugs] == [1, None]
    html = page.build_html(root)
    assert "Scores: all: 1/2 pass, geomean 1.5x; forward: 0/1 pass</p>" in html
    assert '<h3 id="triage">Triage: 2 unique bug(s) among 3 failing graph(s)</h3>' in html
    assert ('<tr><td>crashed: SIGSEGV</td><td class="n">2</td><td class="n" title="mlp, x">2</td><td>mlp forward</td>'
            '<td>r/mlp-forward-le-min (1 node(s))</td></tr>') in html
    assert ('<tr><td>fail_accuracy at aten.gelu.default(float32)</td><td class="n">1</td><td class="n" title="y">1'
            '</td><td>y inference</td><td>-</td></tr>') in html
    (root / "bench.json").write_text(json.dumps({"scores": {"S(0)": 1.25, "ES(0)": None, "S(4)": 1.23456e-05},
                                                 "results": []}))
    b = page.gather(root).bench
    assert b.score_texts() == ["S(0) 1.25", "ES(0) -", "S(4) 1.23e-05"] and b.bugs == [] and 'id="triage"' not in page.build_html(root)
