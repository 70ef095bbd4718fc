"""Mode meta's inference graph captured in a second process, beside the training graphs.

The promise (aotpipe/pipeline/job.py: beside_kinds, _run_beside; aotpipe/artifact/writer.py:
join_parts): the artefact is the same, file for file, as one process writes; the inference
graph really is captured in another process; a half that fails or dies fails the model in
one line and leaves nothing behind; parts that do not belong together are refused; and the
process executor counts the second process's memory against the worker's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aotpipe.artifact.fsio import TMP_PREFIX
from aotpipe.artifact.writer import join_parts
from aotpipe.errors import ArtifactError
from aotpipe.pipeline import job as job_module
from aotpipe.pipeline.executors.process import rss_bytes
from aotpipe.pipeline.incremental import model_fingerprint
from aotpipe.pipeline.job import ModelJob, _attempt, beside_kinds, run_model
from aotpipe.pipeline.results import ModelResult
from aotpipe.spec import ModelSpec
from aotpipe.spec.modes import capture_mode
from aotpipe.trust.signing import check_signature

KINDS = ["inference", "forward", "backward", "joint"]
TIMINGS = {"total_seconds", "capture_seconds", "passes_seconds", "write_seconds", "checks_seconds", "traceback"}


def _spec(mode: str = "meta", graphs: list[str] = KINDS, blocks: int = 0) -> ModelSpec:
    return ModelSpec.model_validate(dict(
        name="rec", source="tests.helpers.beside_models:recorder", args={"blocks": blocks} if blocks else {},
        config=None, mode=mode, graphs=graphs, passes=[],
        inputs=[{"name": "ids", "shape": [2, 6], "dtype": "int64", "high": 50}], save_inputs=False, verify=False,
        loss="sum", seed=0))


@pytest.fixture
def env(monkeypatch, tmp_path):
    """The model's environment variables (tests/helpers/beside_models.py): pids recorded here."""
    monkeypatch.setenv("AOTPIPE_TEST_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("AOTPIPE_TEST_PARENT", str(os.getpid()))
    return tmp_path / "pids"


def _pids(path: Path) -> set[int]:
    pids = {int(p) for p in path.read_text().split()} if path.exists() else set()
    path.unlink(missing_ok=True)
    return pids


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_processes_write_the_same_files_as_one_and_the_inference_graph_is_the_second_ones(tmp_path, env):
    spec = _spec()
    one = run_model(spec, tmp_path / "one", beside=False)
    assert _pids(env) == {os.getpid()}
    two = run_model(spec, tmp_path / "two", beside=True)
    pids = _pids(env)
    assert len(pids) == 2 and os.getpid() in pids  # the model was built in a second process too
    assert one.status == two.status == "ok", (one.error, two.error)
    # each half notes a constant of its own and one process both, last; the tied weight once
    assert one.notes[-1] == ("tensor constants without values (replays draw them at random): eval_scale, "
                             "train_scale")
    assert any("tied" in n for n in one.notes)
    assert _files(tmp_path / "one" / "rec") == _files(tmp_path / "two" / "rec")  # manifest.json included
    assert one.model_dump(exclude=TIMINGS) == two.model_dump(exclude=TIMINGS)
    assert [g.kind for g in two.graphs] == KINDS
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["rec"]  # no parts left
    # and it is up to date for the next run, as one process's artefact is
    again = run_model(spec, tmp_path / "two", beside=True)
    assert again.skipped and _pids(env) == set()


def test_a_signed_run_signs_the_joined_folder(tmp_path, env):
    key = tmp_path / "k.key"
    key.write_bytes(os.urandom(64))
    r = run_model(_spec(), tmp_path / "out", key=key, beside=True)
    assert r.status == "ok", r.error
    assert check_signature(tmp_path / "out" / "rec", key) == []
    assert len(_pids(env)) == 2
    one = run_model(_spec(), tmp_path / "one", key=key, beside=False)
    assert (r.files, r.bytes) == (one.files, one.bytes)  # counted as one process counts: before signing


def test_a_second_process_that_dies_fails_the_model_in_one_line_and_leaves_nothing(tmp_path, env, monkeypatch):
    monkeypatch.setenv("AOTPIPE_TEST_DIE", "3")
    out = tmp_path / "out"
    r = run_model(_spec(), out, beside=True)
    assert r.status == "failed" and r.stage == "capture"
    assert r.error == ("the process that captured the inference graph beside this one died (exit code 3); next: "
                       "rerun it, or capture it in one process (OMP_NUM_THREADS=1: mode meta computes nothing, one "
                       "core is enough)")
    assert list(out.iterdir()) == []  # neither the parts nor a model folder
    assert run_model(_spec(), tmp_path / "alone", beside=False).status == "ok"  # one process never spawns it


def test_a_half_that_fails_fails_the_model_as_one_process_would(tmp_path, env, monkeypatch):
    monkeypatch.setenv("AOTPIPE_TEST_EVAL_FAILS", "1")
    one = run_model(_spec(), tmp_path / "one", beside=False)
    two = run_model(_spec(), tmp_path / "two", beside=True)
    assert one.status == two.status == "failed" and one.stage == two.stage == "capture"
    assert "this model refuses eval mode, on purpose" in two.error and two.error == one.error
    assert two.exception == one.exception
    assert not (tmp_path / "one").exists() and list((tmp_path / "two").iterdir()) == []  # nothing written, no parts


@pytest.mark.parametrize("case, expected", [
    ("meta", (["inference"], ["forward", "backward", "joint"])),
    ("export", None),  # a mode with values: its checks run eager, in one process
    ("passes", None),
    ("inference only", None),
    ("training only", None),
    ("told not to", None),
    ("one core", None),
])
def test_when_a_job_captures_beside(case, expected):
    spec = {"export": lambda: _spec("export"), "passes": lambda: _spec().model_copy(update={"passes": ["freeze"]}),
            "inference only": lambda: _spec(graphs=["inference"]),
            "training only": lambda: _spec(graphs=["forward", "backward"])}.get(case, _spec)()
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if case == "one core" else 2)
        assert beside_kinds(spec, False if case == "told not to" else None) == expected
    finally:
        torch.set_num_threads(was)


BIG = job_module.BESIDE_MIN_MODULES  # as blocks: a model with more modules than the threshold


def test_by_default_a_small_model_stays_in_one_process_and_a_large_one_splits(tmp_path, env):
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        # Recorder is 6 modules (itself, 4 layers, the block list) and its blocks
        small = run_model(_spec(blocks=BIG - 7), tmp_path / "small")  # one module short of the threshold
        assert small.status == "ok" and _pids(env) == {os.getpid()}
        large = run_model(_spec(blocks=BIG - 6), tmp_path / "large")  # at it
        assert large.status == "ok" and len(_pids(env)) == 2
    finally:
        torch.set_num_threads(was)


@pytest.fixture
def parts(tmp_path, env):
    """Two parts of one artefact: rec with the inference graph, and with the training graphs."""
    spec, made = _spec(), []
    for i, kinds in enumerate((["inference"], ["forward", "backward", "joint"])):  # as job._run_beside makes them
        job = ModelJob(spec, capture_mode("meta"), tmp_path / f"p{i}", None, None, ModelResult(name="rec", status="failed"),
                   fingerprint=model_fingerprint(spec, None), kinds=kinds)
        _attempt(job)
        assert job.result.status == "ok", job.result.error
        made.append(tmp_path / f"p{i}" / "rec")
    return made


def _edit(folder: Path, **fields) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    m.update(fields)
    (folder / "manifest.json").write_text(json.dumps(m))


def test_parts_of_other_models_or_machines_are_refused_by_field(parts, tmp_path):
    _edit(parts[1], fingerprint="1" * 64)
    with pytest.raises(ArtifactError, match=r"its manifest's fingerprint is not .*p0/rec's: the parts of one "
                                            r"artefact must come from one model, spec and machine"):
        join_parts(parts, tmp_path / "out", "rec")
    assert not (tmp_path / "out" / "rec").exists() and (parts[1] / "manifest.json").exists()


def test_a_graph_in_two_parts_is_refused(parts, tmp_path):
    shutil.copytree(parts[0], tmp_path / "copy")
    with pytest.raises(ArtifactError, match=r"graph inference \(rec_inference_0\) is in another part too"):
        join_parts([parts[0], tmp_path / "copy"], tmp_path / "out", "rec")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_the_joined_manifest_sums_the_checks_and_keeps_each_note_once(parts, tmp_path):
    m0 = json.loads((parts[0] / "manifest.json").read_text())
    m1 = json.loads((parts[1] / "manifest.json").read_text())
    _edit(parts[0], capture={**m0["capture"], "notes": ["a", "b"]})
    _edit(parts[1], capture={**m1["capture"], "notes": ["b", "c"]})
    written = join_parts(parts, tmp_path / "out", "rec")
    m = json.loads((written.path / "manifest.json").read_text())
    assert m["capture"]["notes"] == ["a", "b", "c"]
    assert m["checks"]["skipped"] == m0["checks"]["skipped"] + m1["checks"]["skipped"] > 0
    assert sorted(m["graphs"]) == sorted(KINDS) and m["partition"] == m1["partition"]
    assert sorted(m["files"]) == sorted(p for p in _files(written.path) if p != "manifest.json")


def test_the_process_executor_counts_a_workers_children_in_its_memory():
    # What this process and the children it already has hold (an earlier test in this
    # process may have left one for its life: multiprocessing's forkserver, ~240 MB).
    before = rss_bytes(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(300 << 20); b[::4096] = b'x' * "
                              "len(b[::4096]); print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        with open(f"/proc/{child.pid}/statm", "rb") as f:  # its own pages: resident less file-backed
            _, resident, shared = (int(x) for x in f.read().split()[:3])
            own = (resident - shared) * os.sysconf("SC_PAGE_SIZE")
        assert own > 300 << 20
        mine = rss_bytes(os.getpid())
        with open(f"/proc/{os.getpid()}/statm", "rb") as f:
            alone = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert mine >= alone + own - (16 << 20)  # this process's memory and its child's
    finally:
        child.kill()
        child.wait()
    time.sleep(0.1)
    assert rss_bytes(os.getpid()) < before + (64 << 20)  # the child no longer counted


def test_a_worker_of_the_process_executor_captures_beside_and_its_limit_covers_both_processes(tmp_path, env):
    import functools

    from aotpipe.pipeline.executors import Resources, Task
    from aotpipe.pipeline.executors.process import ProcessExecutor
    from tests.executors import tasks

    done = {}
    tasks_ = [Task("rec", functools.partial(run_model, _spec(blocks=BIG), tmp_path / "out"), Resources()),
              Task("hog", tasks.child_hogs_memory, Resources(memory_gb=0.5))]
    ProcessExecutor(workers=1, threads=2).run(tasks_, on_start=lambda i: None,
                                              on_done=lambda i, o: done.__setitem__(i, o))
    rec, hog = done[0], done[1]
    assert rec.status == "ok", rec.error
    pids = _pids(env)
    assert len(pids) == 2 and os.getpid() not in pids  # the worker and its second process
    assert _files(tmp_path / "out" / "rec").keys() >= {"manifest.json", "rec_inference_0/graph.json"}
    assert hog.reason.startswith("out of memory: the worker's resident memory reached")  # its child's 800 MiB


def test_the_parts_folder_of_a_killed_job_is_removed_by_the_next_run(tmp_path):
    from aotpipe.artifact.fsio import clean_stale

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{TMP_PREFIX}rec.parts-{dead.pid}"
    (left / "0" / "rec").mkdir(parents=True)
    assert clean_stale(tmp_path) == [f"removed {left.name} left by an interrupted run"]
    assert not left.exists()


def test_the_second_process_dies_with_the_first(tmp_path, env):
    """A worker killed (its memory limit, the OOM killer, a killed run) leaves no second
    process capturing for nobody: it is killed with its parent (PR_SET_PDEATHSIG)."""
    code = ("import os, sys; from pathlib import Path; sys.path[:0] = [sys.argv[1]]; "
            "os.environ['AOTPIPE_TEST_PARENT'] = str(os.getpid()); "  # the second process sleeps 60 s
            "from tests.test_meta_beside import _spec; from aotpipe.pipeline.job import run_model; "
            "run_model(_spec(), Path(sys.argv[2]), beside=True)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent),
                               str(tmp_path / "out")], env={**os.environ, "AOTPIPE_TEST_SLOW": "60"})
    try:
        deadline = time.monotonic() + 120
        while len(_read_pids(env)) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.05)  # both processes have built the model: the second is capturing
        (child,) = _read_pids(env) - {parent.pid}
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _read_pids(path: Path) -> set[int]:
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie has died (its parent is gone or has not reaped it)
    except OSError:
        return False


@pytest.mark.parametrize("theirs, mine, expected", [
    (("verify", "inference graph: output 0 is wrong"), ("capture", "torch.export (training) failed"),
     ("capture", "torch.export (training) failed")),  # one process would not have reached the checks
    (("capture", "torch.export (inference) failed"), ("capture", "torch.export (training) failed"),
     ("capture", "torch.export (inference) failed")),  # one process captures inference first
    (("verify", "a"), ("verify", "b"), ("verify", "a; b")),  # both halves' problems
    (None, ("write", "disk full"), ("write", "disk full")),
])
def test_a_failing_half_gives_the_failure_one_process_would(theirs, mine, expected):
    from aotpipe.pipeline.job import _failed_as_one

    def half(failure):
        if failure is None:
            return ModelResult(name="rec", status="ok")
        return ModelResult(name="rec", status="failed", stage=failure[0], error=failure[1])

    result = ModelResult(name="rec", status="ok")
    _failed_as_one(result, [half(theirs), half(mine)])
    assert (result.status, result.stage, result.error) == ("failed", *expected)
