"""Models start longest first by the last run's times, untimed ones first in pipeline order."""

import json

from aotpipe.artifact.manifest import dump_json, versions
from aotpipe.format.records import ExecutorRecord, ModelRun, RunRecord, RunSummary
from aotpipe.pipeline.runner import longest_first


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


def test_models_that_ran_out_of_memory_last_time_start_in_a_fresh_worker(tmp_path, monkeypatch):
    # The last run's evidence, as the process executor writes it: a model out of memory in a
    # used worker (its replacement says so, and it passed afresh), one out of memory in a fresh
    # one (its failure), one killed as the OOM killer kills; not a crash, a time limit, or a
    # worker replaced for another reason.
    from aotpipe.format.records import RecycledWorker
    from aotpipe.pipeline import runner
    from aotpipe.pipeline.config import parse_pipeline
    from aotpipe.pipeline.executors.process import OUT_OF_MEMORY

    models = [ModelRun(name="used_oom", status="ok", total_seconds=3.0),
              ModelRun(name="fresh_oom", status="failed", stage="worker",
                       error=f"{OUT_OF_MEMORY}the worker's resident memory reached 9.00 GiB, over the limit of "
                             "8.00 GiB (executor.memory_gb)"),
              ModelRun(name="killed", status="failed", stage="worker",
                       error="the worker crashed: SIGKILL (killed, e.g. by the kernel's out-of-memory killer) "
                             "while running this model"),
              ModelRun(name="segv", status="failed", stage="worker",
                       error="the worker crashed: SIGSEGV (segmentation fault) while running this model"),
              ModelRun(name="slow", status="failed", stage="worker", error="timed out after 5 s (timeout_s)"),
              ModelRun(name="capped", status="ok", total_seconds=1.0),
              ModelRun(name="raised", status="failed", stage="capture", error="out of memory: said by the model"),
              ModelRun(name="old_oom", status="ok", total_seconds=2.0),
              ModelRun(name="old_killed", status="ok", total_seconds=2.0),
              # started afresh for that reason the run before, and passed: still marked
              ModelRun(name="marked", status="ok", total_seconds=2.0, fresh_worker=True)]
    record = RunRecord(format_version=1, pipeline="p", versions=versions(), seconds=1.0,
                       executor=ExecutorRecord(kind="process", workers=2, recycled=[
                           RecycledWorker(pid=1, after="used_oom", models=4, reason="out of memory after 4 ...",
                                          out_of_memory=True),
                           RecycledWorker(pid=2, after="capped", models=2, reason="ran 2 model(s) (...)"),
                           # a run.json from before the field: the reason's words say it
                           RecycledWorker(pid=3, after="old_oom", models=9, reason="out of memory after 9 other "
                                          "model(s) in this worker; old_oom runs again in a fresh worker"),
                           RecycledWorker(pid=4, after="old_killed", models=2, reason="killed (the kernel's OOM "
                                          "killer?) after 2 other model(s) in this worker; old_killed runs again "
                                          "in a fresh worker")]),
                       ok=False, summary=RunSummary(models=10, ok=5, up_to_date=0, failed=5, graphs=0, bytes=0),
                       models=models)
    root = tmp_path / "p"
    root.mkdir()
    (root / "run.json").write_bytes(dump_json(record.model_dump(mode="json", exclude_none=True)))
    oom = {"used_oom", "fresh_oom", "killed", "old_oom", "old_killed", "marked"}
    assert runner.ran_out_of_memory_last_run(root) == oom
    assert runner.ran_out_of_memory_last_run(tmp_path / "nothing") == set()

    # ... and the tasks the runner hands its executor say so.
    pipeline = parse_pipeline("version: 1\nname: p\nexecutor: {kind: process}\n"
                              "defaults: {mode: export, graphs: [inference], passes: []}\nmodels:\n"
                              + "".join(f"  - {{name: {m.name}, source: 'aotpipe.zoo:mlp', inputs: [{{shape: [2, 16]}}]}}\n"
                                        for m in models), check_sources=False)
    seen = {}

    class Recording:
        recycled = []

        def run(self, tasks, *, on_start, on_done):
            for i, t in enumerate(tasks):
                seen[t.name] = t.fresh
                on_done(i, runner.Failure("not run"))

    monkeypatch.setattr(runner, "make_executor", lambda *a, **k: Recording())
    runner.run_pipeline(pipeline, output=tmp_path, progress=False, force=True)
    assert seen == {m.name: m.name in oom for m in models}
    # The marks stay in this run's run.json (none of them ran out of memory in it), for the next.
    assert runner.ran_out_of_memory_last_run(root) == oom
