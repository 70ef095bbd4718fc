"""The Ray executor, against a real local Ray instance that these tests start."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import ray  # the test extra installs it
from click.testing import CliRunner

from aotpipe.cli import main

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_runs_models_and_reports_a_crash_and_a_timeout(local_ray, tmp_path):
    (tmp_path / "bad.py").write_text("import os, time\n\ndef exits():\n    os._exit(3)\n\n"
                                     "def hang():\n    time.sleep(3600)\n")
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: r
        executor: {kind: ray, num_cpus: 1}
        models:
          - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
          - {name: exits, source: "bad:exits", inputs: [{shape: [1]}]}
          - {name: hang, source: "bad:hang", inputs: [{shape: [1]}], resources: {timeout_s: 20}}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 1, r.output
    run = json.loads(r.stdout)
    assert run["executor"]["kind"] == "ray"
    by = {m["name"]: m for m in run["models"]}
    assert by["mlp"]["status"] == "ok" and by["mlp"]["checks"]["failed"] == 0
    assert by["exits"]["stage"] == "worker" and "crashed" in by["exits"]["error"], by["exits"]
    assert by["hang"]["stage"] == "worker" and "timed out after 20 s" in by["hang"]["error"], by["hang"]
    assert sorted(p.name for p in (tmp_path / "out" / "r").iterdir()) == ["mlp", "report.html", "report.md", "run.json"]


@pytest.mark.slow
def test_ray_runs_zoo_hf_and_writes_what_the_process_executor_writes(local_ray, zoo_run, tmp_path):
    r = CliRunner().invoke(main, ["run", str(PIPELINES / "zoo-hf.yaml"), "-o", str(tmp_path / "ray"),
                                  "--no-progress", "--json", "--executor", "ray"])
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)
    assert run["executor"]["kind"] == "ray"
    assert all(m["status"] == "ok" and not m["skipped"] for m in run["models"])
    out = {"ray": tmp_path / "ray" / "zoo-hf", "process": zoo_run[0]}  # the session's process-executor run
    # Every graph, input record and blob is the same; manifests may differ in the eager
    # checks' float32 error figures, which depend on the thread count (Ray: 1 per task).
    files = sorted(p.relative_to(out["ray"]) for p in out["ray"].rglob("*")
                   if p.is_file() and p.name not in ("manifest.json", "run.json", "report.md", "report.html"))
    assert len(files) > 100
    for f in files:
        assert (out["ray"] / f).read_bytes() == (out["process"] / f).read_bytes(), f


@pytest.mark.slow
def test_each_task_gets_the_resources_its_model_asks_for_and_an_impossible_ask_fails_at_once(local_ray):
    import functools
    import time

    from aotpipe.pipeline.executors import Failure, Resources, Task
    from aotpipe.pipeline.executors.ray import RayExecutor
    from tests.executors import tasks

    todo = [Task("two_cpus", tasks.ray_assigned, Resources(num_cpus=2, memory_gb=0.25)),
            Task("one_cpu", tasks.ray_assigned, Resources(num_cpus=1)),
            Task("too_many", functools.partial(tasks.square, 3), Resources(num_cpus=64)),
            Task("too_much_memory", functools.partial(tasks.square, 3), Resources(memory_gb=100000))]
    done = {}
    start = time.monotonic()
    RayExecutor().run(todo, on_start=lambda i: None, on_done=lambda i, o: done.__setitem__(i, o))
    assert time.monotonic() - start < 120  # the impossible asks did not wait for a node
    (res2, threads2), (res1, threads1) = done[0], done[1]
    assert res2["CPU"] == 2.0 and res2["memory"] == 0.25 * 2**30 and threads2 == 2
    assert res1["CPU"] == 1.0 and "memory" not in res1 and threads1 == 1
    assert isinstance(done[2], Failure) and done[2].reason == (
        "not run: it asks for 64 CPUs (num_cpus) and the whole Ray cluster has 2; lower resources.num_cpus for "
        "this model or executor.num_cpus, or add nodes")
    assert isinstance(done[3], Failure) and "asks for 100000 GiB (memory_gb)" in done[3].reason


@pytest.mark.slow
def test_max_models_per_worker_retires_ray_workers_and_recycle_memory_is_said_not_applied(local_ray, tmp_path):
    """executor.max_models_per_worker is Ray's max_calls: no Ray worker runs more models than
    that. Without it Ray runs task after task in the same workers. recycle_memory_gb, which Ray
    cannot apply, gets a note rather than silence."""
    from aotpipe.pipeline.executors import Resources, Task
    from aotpipe.pipeline.executors.ray import RayExecutor
    from tests.executors import tasks

    def pids(**kw):
        todo = [Task(f"t{i}", tasks.worker_pid, Resources(num_cpus=1)) for i in range(6)]
        done = {}
        RayExecutor(**kw).run(todo, on_start=lambda i: None, on_done=lambda i, o: done.__setitem__(i, o))
        assert all(isinstance(p, int) for p in done.values()), done
        return [done[i] for i in range(6)]

    reused = pids()
    assert len(set(reused)) < 6, reused  # the fault the setting guards against: workers run many models
    once = pids(max_models_per_worker=1)
    assert len(set(once)) == 6, once
    twice = pids(max_models_per_worker=2)
    assert max(twice.count(p) for p in twice) <= 2, twice

    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: r
        executor: {kind: process, recycle_memory_gb: 1}
        models:
          - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--executor", "ray"])
    assert r.exit_code == 0, r.output
    assert (f"note: {tmp_path / 'p.yaml'}: executor.recycle_memory_gb is not applied with the Ray executor"
            in r.stderr), r.stderr
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out2"), "--no-progress"])
    assert r.exit_code == 0 and "note:" not in r.stderr, r.stderr
