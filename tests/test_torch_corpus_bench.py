"""benchmarks/torch_corpus_bench.py: which corpus models it runs, and how it names a failure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("torch_corpus_bench", REPO / "benchmarks" / "torch_corpus_bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_subset_is_evenly_spaced_and_keeps_the_pipeline_header(tmp_path):
    path, total = bench.subset(bench.CORPORA["torch-ops"], 10, tmp_path)
    text = path.read_text()
    picked = [ln for ln in text.splitlines() if ln.startswith("- {")]
    assert len(picked) == 10 and total > 600
    assert "name: torch-ops" in text and "executor:" in text
    assert picked[0].startswith("- {name: H.s0,")  # the first, then every total/10-th


def test_failures_are_classed_by_stage_and_error():
    assert bench.classify("capture", "op aten.foo.default is not on the allow-list") == "op not on the allow-list"
    assert bench.classify("capture", "AOTAutograd found no gradient to compute (its outputs are views") == \
        "no gradient to compute"
    assert bench.classify("timeout", "killed after 300 s") == "timeout or worker crash"
    assert bench.classify("verify", "graph.json names 'aten.sym_storage_offset.default', which is not allowed: it "
                          "touches storages") == "op not on the allow-list"
    assert bench.classify("verify", "RuntimeError: view_as_real doesn't work on unresolved conjugated tensors") == \
        "complex values"
    assert bench.classify("capture", "ValueError: something new") == "capture failed (other)"
    assert bench.classify(None, None) == "other"


def test_the_report_counts_passes_and_groups_failures(tmp_path):
    run = {"models": [
        {"name": "a.s0", "status": "ok", "stage": None, "error": None, "checks": {"failed": 0, "skipped": 0}},
        {"name": "b.s0", "status": "ok", "stage": None, "error": None, "checks": {"failed": 0, "skipped": 2}},
        {"name": "c.s0", "status": "failed", "stage": "capture", "error": "Sparse tensors are not supported"},
    ], "seconds": 3.0}
    (tmp_path / "run.json").write_text(json.dumps(run))
    body = bench.report({"torch-ops": {**bench.summarise(tmp_path / "run.json"), "total": 672, "wall": 9.0}})
    assert "| torch-ops | 3 | 672 | 2 (66.7%) | 1 (33.3%) | 1 | 9 |" in body
    assert "### sparse tensors (1)" in body and "- `c.s0` (capture): Sparse tensors" in body
    assert "ok with skipped checks: `b.s0`" in body


def test_a_failure_whose_cause_is_torchs_links_its_reproduction_and_others_do_not(tmp_path):
    run = {"models": [
        {"name": "linalg.lstsq.s0", "status": "failed", "stage": "capture", "error": "DynamicOutputShapeException"},
        {"name": "lstsq_like.s0", "status": "failed", "stage": "capture", "error": "DynamicOutputShapeException"},
    ], "seconds": 1.0}
    (tmp_path / "run.json").write_text(json.dumps(run))
    body = bench.report({"torch-ops": {**bench.summarise(tmp_path / "run.json"), "total": 2, "wall": None}})
    linked = "[lstsq_dynamic_output_shape.py](../../benchmarks/torch_repros/lstsq_dynamic_output_shape.py)"
    assert body.count(linked) == 1 and body.index("`linalg.lstsq.s0`") < body.index(linked) < body.index("`lstsq_like")
    for _, repro, _ in bench.TORCH_CAUSES:  # every named reproduction is there to run
        assert (REPO / "benchmarks" / "torch_repros" / repro).is_file(), repro


def test_an_earlier_runs_page_takes_its_wall_time_and_start_from_its_run_json(tmp_path):
    run = {"run": {"id": "x", "started": "2026-11-27T22:22:16Z"}, "seconds": 1420.8,
           "models": [{"name": "a.s0", "status": "ok", "stage": None, "error": None, "checks": {}}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    body = bench.report({"torch-modules": {**bench.summarise(tmp_path / "run.json"), "total": 1, "wall": None}})
    assert "| torch-modules | 1 | 1 | 1 (100.0%) | 1 (100.0%) | 0 | 1421 |" in body
    assert "Runs started: torch-modules at 2026-11-27T22:22:16Z." in body


def test_a_bool_decided_by_values_is_its_own_class_and_a_break_stays_a_break():
    error = "export failed: DataDependentOutputException: aten.equal.default; dynamo failed: ... (a graph break)"
    assert bench.classify("capture", error) == "a Python bool decided by values (no graph returns one)"
    assert bench.classify("capture", error.replace("aten.equal", "aten.cov")) == "graph break / partial capture"
