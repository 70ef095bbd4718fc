"""benchmarks/zoo_speed_bench.py: the sample it takes and how its table states each target."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("zoo_speed_bench", REPO / "benchmarks" / "zoo_speed_bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _job(cpu, status="ok"):
    return {"status": status, "error": None if status == "ok" else "GuardOnDataDependentSymNode: x", "wall_s": cpu * 2,
            "cpu_s": cpu, "stages": {"capture_seconds": cpu / 2, "checks_seconds": cpu / 4}}


def _results(w1, w2, meta_wall, meta_gb):
    return {"models": {"a": {"aotpipe": _job(10.0), "baseline": _job(4.0), "before": _job(12.5)},
                       "b": {"aotpipe": _job(6.0), "baseline": _job(1.0, "failed"), "before": _job(7.5)}},
            "workers": {"1": {"wall_s": w1, "rc": 0, "ok": 2, "failed": 0, "load_before": 1.0, "load_after": 1.0},
                        "2": {"wall_s": w2, "rc": 0, "ok": 2, "failed": 0, "load_before": 1.0, "load_after": 1.0},
                        "n": 2},
            "meta": {"aotpipe": {"phases": {"capture": {"wall_s": meta_wall, "cpu_s": meta_wall, "peak_rss_gb": meta_gb}},
                                 "wall_s": meta_wall, "cpu_s": meta_wall, "peak_rss_gb": meta_gb, "check_s": 1.0,
                                 "cpu_share": 1.0},
                     "export": {"wall_s": 5.0, "cpu_s": 5.0, "peak_rss_gb": 0.4}}}


def test_the_sample_is_evenly_spaced_over_the_zoo_and_all_takes_every_model():
    import yaml

    names, size = bench.sample_names(bench.ZOO, 4)
    every, _ = bench.sample_names(bench.ZOO, None)
    assert size == len(every) == len(yaml.safe_load(bench.ZOO.read_text())["models"]) and len(names) == 4
    assert [every.index(n) for n in names] == [(2 * i + 1) * size // 8 for i in range(4)]  # the middle of each quarter


def test_each_target_is_met_or_states_its_gap_and_the_zoo_time_is_named_an_extrapolation():
    text = bench.report(_results(w1=100.0, w2=80.0, meta_wall=90.0, meta_gb=1.5), 448, "/work/main")
    assert "2 workers / 1 worker (measured)      x1.25" in text and "missed (gap x1.36)" in text
    assert "zoo, 2 workers (EXTRAPOLATED)" in text and "(gap x9.96)" in text  # 80 s x 448/2 = 298.7 min
    assert "70B meta, wall (measured)" in text and "missed (gap x1.50)" in text
    assert "70B meta, peak RSS (measured)            1.50 GiB     < 2 GiB      met" in text
    # ratios over the models both tools took; before/after over every model
    assert "aotpipe / baseline CPU x2.50" in text and "after / before CPU x0.80" in text
    assert "baseline failed on b: GuardOnDataDependentSymNode: x" in text
    met = bench.report(_results(w1=100.0, w2=50.0, meta_wall=30.0, meta_gb=1.0), 448, None)
    line = {ln.split("  ")[0]: ln for ln in met.splitlines()}
    assert line["2 workers / 1 worker (measured)"].endswith(">= x1.7     met")
    assert line["70B meta, wall (measured)"].endswith("< 60 s       met")


def test_saved_results_make_the_page_without_measuring(tmp_path, capsys, monkeypatch):
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(_results(100.0, 80.0, 90.0, 1.5)))
    monkeypatch.setattr(sys, "argv", ["zoo_speed_bench.py", "--results", str(saved)])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "2 workers / 1 worker (measured)      x1.25" in out
    # the page says its figures come from runs made apart, not from the header's commit and day
    assert out.startswith("results of runs made apart, merged (later ones win): each `measured by` line is one run")


def _zoo_run_json(folder, seconds, statuses, shards=None):
    from aotpipe.artifact.manifest import dump_json, versions
    from aotpipe.format.records import (ExecutorRecord, MergedShard, MergeRecord, ModelRun, RunRecord,
                                        RunSummary)

    models = [ModelRun(name=f"m{i}", status=s, total_seconds=1.0) for i, s in enumerate(statuses)]
    ok = statuses.count("ok")
    merge = None if shards is None else MergeRecord(
        shards=[MergedShard(folder=f"s{i}", shard=f"{i + 1}/{len(shards)}", models=1, seconds=s)
                for i, s in enumerate(shards)], missing=[], duplicated=[])
    record = RunRecord(format_version=1, pipeline="hf-zoo", versions=versions(), seconds=seconds,
                       executor=ExecutorRecord(kind="process", workers=2), ok=ok == len(statuses),
                       summary=RunSummary(models=len(models), ok=ok, up_to_date=0, failed=len(models) - ok, graphs=0,
                                          bytes=0), models=models, merge=merge)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_bytes(dump_json(record.model_dump(mode="json")))
    return folder / "run.json"


def test_a_whole_zoo_run_is_the_measured_zoo_figure(tmp_path):
    one = bench.zoo_run(_zoo_run_json(tmp_path / "one", 1500.0, ["ok", "ok", "failed"]))
    text = bench.report({"zoo_run": one}, 3, None)
    line = next(ln for ln in text.splitlines() if ln.startswith("zoo, 2 workers (MEASURED)"))
    assert "25.0 min" in line and line.endswith("met")
    assert "3 models, process executor, 2 ok, 1 failed; one `aotpipe run`" in text
    # a merge of shards run one after another: their seconds add up (the merge's own is its longest)
    merged = bench.zoo_run(_zoo_run_json(tmp_path / "merged", 700.0, ["ok", "ok"], shards=[700.0, 650.0, 500.0]))
    text = bench.report({"zoo_run": merged}, 3, None)
    line = next(ln for ln in text.splitlines() if ln.startswith("zoo, 2 workers (MEASURED)"))
    assert "30.8 min" in line and "missed (gap x1.03)" in line and "(PARTIAL: 2 of 3 models)" in line
    assert "3 shards run one after another, merged" in text


def test_the_70b_targets_are_the_jobs_as_aotpipe_run_runs_it_when_measured():
    results = _results(w1=100.0, w2=50.0, meta_wall=77.0, meta_gb=1.2)
    results["meta"]["job"] = {"wall_s": 56.9, "cpu_s": 88.6, "peak_rss_gb": 1.65, "processes": 2}
    line = {ln.split("  ")[0]: ln for ln in bench.report(results, 448, None).splitlines()}
    assert line["70B meta, wall (measured)"] == ("70B meta, wall (measured)                56.9 s       < 60 s       met"
                                                 "   (2 processes: inference beside training)")
    assert line["70B meta, peak RSS (measured)"].endswith("met   (both processes' peaks, added)")
    assert line["70B meta, one process, CPU s"].startswith("70B meta, one process, CPU s             77.0 s")
    assert "missed (gap x1.28)" in line["70B meta, one process, CPU s"]
