"""The process executor: isolation, limits, parallel workers (plain tasks, no models)."""

from __future__ import annotations

import functools
import os

import pytest

from aotpipe.pipeline.executors import Failure, Resources, Task
from aotpipe.pipeline.executors.base import Recycled
from aotpipe.pipeline.executors.process import ProcessExecutor, _Worker, ran_out_of_memory, retried_out_of_memory
from tests.executors import tasks


def _run(executor, task_list):
    done, started = {}, []
    executor.run(task_list, on_start=started.append, on_done=lambda i, o: done.__setitem__(i, o))
    assert sorted(done) == list(range(len(task_list))) and sorted(started) == sorted(set(started))
    return [done[i] for i in range(len(task_list))]


def _task(name, fn, *args, **res):
    return Task(name, functools.partial(fn, *args), Resources(**res))


def test_values_come_back_in_task_order():
    out = _run(ProcessExecutor(workers=2), [_task(f"t{i}", tasks.square, i) for i in range(5)])
    assert out == [0, 1, 4, 9, 16]


def test_two_workers_run_two_tasks_at_once():
    out = _run(ProcessExecutor(workers=2), [_task("a", tasks.sleep_and_time, 1.5), _task("b", tasks.sleep_and_time, 1.5)])
    (s1, e1, p1), (s2, e2, p2) = out
    assert p1 != p2 and p1 != os.getpid()
    assert max(s1, s2) < min(e1, e2)  # they overlapped


def test_one_worker_runs_tasks_one_after_another_in_the_same_process():
    (s1, e1, p1), (s2, e2, p2) = _run(ProcessExecutor(workers=1), [_task("a", tasks.sleep_and_time, 0.2),
                                                                     _task("b", tasks.sleep_and_time, 0.2)])
    assert p1 == p2 and s2 >= e1  # the worker is reused


def test_a_task_that_raises_is_a_failure_and_the_worker_goes_on():
    out = _run(ProcessExecutor(workers=1), [_task("bad", tasks.raise_value_error), _task("good", tasks.square, 3)])
    assert isinstance(out[0], Failure) and "ValueError: bad value" in out[0].reason and "\n" not in out[0].reason
    assert "Traceback" in out[0].detail
    assert out[1] == 9


def test_crashes_hangs_and_memory_hogs_cost_only_their_own_task():
    out = _run(ProcessExecutor(workers=2, timeout_s=60), [
        _task("segv", tasks.segfault),
        _task("exit", tasks.exit_3),
        _task("hang", tasks.hang, timeout_s=3),
        _task("hog", tasks.hog_memory, memory_gb=0.5),
        _task("ok", tasks.square, 7),
        _task("unpicklable", tasks.unpicklable_result),
    ])
    segv, exit3, hang, hog, ok, unpicklable = out
    assert isinstance(segv, Failure) and "SIGSEGV" in segv.reason, segv
    assert "segfault" in (segv.detail or ""), segv.detail  # faulthandler's stack names the function
    assert isinstance(exit3, Failure) and "exited with status 3" in exit3.reason, exit3
    assert isinstance(hang, Failure) and "timed out after 3 s" in hang.reason, hang
    assert isinstance(hog, Failure) and "out of memory" in hog.reason and "0.50 GiB" in hog.reason, hog
    assert ok == 49
    assert isinstance(unpicklable, Failure), unpicklable
    # What the runner reads back from run.json to start a model afresh next time.
    assert ran_out_of_memory(hog.reason)
    assert not any(ran_out_of_memory(f.reason) for f in (segv, exit3, hang, unpicklable))


def test_a_worker_killed_as_the_oom_killer_kills_counts_as_out_of_memory():
    (killed,) = _run(ProcessExecutor(workers=1), [_task("killed", tasks.sigkill_self)])
    assert isinstance(killed, Failure) and "SIGKILL" in killed.reason and ran_out_of_memory(killed.reason), killed


def test_the_executors_memory_limit_applies_to_every_task():
    (hog,) = _run(ProcessExecutor(workers=1, memory_gb=0.5), [_task("hog", tasks.hog_memory)])
    assert isinstance(hog, Failure) and "executor.memory_gb" in hog.reason


@pytest.mark.parametrize("workers", [1, 3])
def test_no_worker_outlives_the_run(workers):
    ex = ProcessExecutor(workers=workers)
    pids = [p for _, _, p in _run(ex, [_task(f"t{i}", tasks.sleep_and_time, 0.05) for i in range(4)])]
    for pid in set(pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_worker_is_replaced_after_max_models_per_worker():
    ex = ProcessExecutor(workers=1, max_models_per_worker=2)
    pids = _run(ex, [_task(f"t{i}", tasks.pid) for i in range(4)])
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert [(r.pid, r.after, r.tasks) for r in ex.recycled] == [(pids[1], "t1", 2)]  # none after the last
    assert ex.recycled[0].reason == "ran 2 model(s) (max_models_per_worker: 2)"


def test_a_worker_whose_memory_grew_past_the_threshold_is_replaced_and_the_next_task_starts_afresh():
    ex = ProcessExecutor(workers=1, recycle_memory_gb=0.1)
    out = _run(ex, [_task("small", tasks.leak_and_pid, 10), _task("leaky", tasks.leak_and_pid, 200),
                    _task("next", tasks.leak_and_pid, 10)])
    (p1, held1), (p2, held2), (p3, held3) = out
    assert p1 == p2 and held2 == 210  # 10 MiB grew nothing worth a new worker; the leak stays
    assert p3 != p2 and held3 == 10  # the next task runs in a fresh worker: the leak is gone
    assert len(ex.recycled) == 1 and ex.recycled[0].after == "leaky" and ex.recycled[0].pid == p2
    assert "grew by" in ex.recycled[0].reason and "past recycle_memory_gb (0.1 GiB)" in ex.recycled[0].reason



def test_out_of_memory_after_other_models_runs_again_in_a_fresh_worker_and_its_outcome_counts():
    # A model at the edge of the limit must not pass or fail by the worker it drew. The first
    # task leaves 500 MiB behind; the second needs 700 MiB for a moment: over the limit in that
    # worker, within it in a fresh one. Out of memory in a fresh worker stays a failure.
    (base,) = _run(ProcessExecutor(workers=1), [_task("probe", tasks.own_rss_mib)])
    limit_gb = (base + 850) / 1024
    ex = ProcessExecutor(workers=1, memory_gb=limit_gb, recycle_memory_gb=100)  # growth alone never recycles
    (p_leaky, held), p_edge, p_after = _run(ex, [_task("leaky", tasks.leak_and_pid, 500),
                                                 _task("edge", tasks.hold_and_pid, 700), _task("after", tasks.pid)])
    assert held == 500 and isinstance(p_edge, int) and p_edge != p_leaky, p_edge
    assert p_after == p_edge  # the fresh worker goes on with the rest
    (r,) = ex.recycled
    assert (r.pid, r.after, r.tasks) == (p_leaky, "edge", 1)
    assert r.reason == "out of memory after 1 other model(s) in this worker; edge runs again in a fresh worker"
    assert r.out_of_memory and retried_out_of_memory(r.reason)  # what the next run reads (runner.py)
    # Over the limit in a fresh worker: a failure, not retried.
    ex = ProcessExecutor(workers=1, memory_gb=limit_gb, recycle_memory_gb=100)
    (too_big,) = _run(ex, [_task("too_big", tasks.hold_and_pid, 1200)])
    assert isinstance(too_big, Failure) and "out of memory" in too_big.reason and ex.recycled == []


def test_a_retry_waits_for_a_fresh_worker_and_a_used_idle_one_makes_room():
    # Two workers, each left holding 500 MiB by its first task; the third task needs 700 MiB:
    # out of memory in either. Its retry is not given to the other (used) worker, which is
    # retired instead, and a fresh worker runs it.
    from aotpipe.pipeline.executors.process import _MAKE_ROOM

    (base,) = _run(ProcessExecutor(workers=1), [_task("probe", tasks.own_rss_mib)])
    ex = ProcessExecutor(workers=2, memory_gb=(base + 850) / 1024, recycle_memory_gb=100)
    (p1, _), (p2, _), p_edge = _run(ex, [_task("leaky1", tasks.leak_wait_and_pid, 500, 5),
                                         _task("leaky2", tasks.leak_wait_and_pid, 500, 5),
                                         _task("edge", tasks.hold_and_pid, 700)])
    assert p1 != p2 and isinstance(p_edge, int) and p_edge not in (p1, p2), (p1, p2, p_edge)
    reasons = sorted(r.reason for r in ex.recycled)
    assert reasons == sorted([_MAKE_ROOM, "out of memory after 1 other model(s) in this worker; edge runs again "
                                          "in a fresh worker"]), reasons


def test_a_task_marked_fresh_starts_in_a_fresh_worker_and_a_used_one_makes_room():
    # The edge task of the test above, marked fresh (it ran out of memory in the last run):
    # it never runs in the worker the leak is in. That worker retires when edge comes next,
    # saying why; edge runs once, in a fresh worker, and passes. Unmarked, it first runs
    # out of memory in the used worker (the test above).
    (base,) = _run(ProcessExecutor(workers=1), [_task("probe", tasks.own_rss_mib)])
    ex = ProcessExecutor(workers=1, memory_gb=(base + 850) / 1024, recycle_memory_gb=100)
    edge = Task("edge", functools.partial(tasks.hold_and_pid, 700), fresh=True)
    started = []
    done = {}
    ex.run([_task("leaky", tasks.leak_and_pid, 500), edge, _task("after", tasks.pid)],
           on_start=started.append, on_done=lambda i, o: done.__setitem__(i, o))
    (p_leaky, held), p_edge, p_after = done[0], done[1], done[2]
    assert held == 500 and isinstance(p_edge, int) and p_edge != p_leaky and p_after == p_edge, done
    assert started == [0, 1, 2]  # each started once, as the caller sees it
    assert ex.recycled == [Recycled(p_leaky, "leaky", 1, "edge ran out of memory in the last run: it starts in a "
                                                         "fresh worker")]


def _worker(done, task=None):
    return _Worker(proc=None, send=None, recv=None, log=None, task=task, done=done)


def test_which_task_an_idle_worker_takes_when_one_must_start_afresh():
    import collections

    ex = ProcessExecutor(workers=2)
    ex._fresh_only = {0}
    used, fresh_idle, fresh_busy = _worker(3), _worker(0), _worker(0, task=5)
    pending = collections.deque([0, 1, 2])
    assert ex._pick(fresh_idle, [used, fresh_idle], pending) == 0  # a fresh worker takes the head, marked or not
    assert ex._pick(used, [used, fresh_idle], pending) == 1  # a fresh one is there for 0: go on with the rest
    assert ex._pick(used, [used, fresh_busy], pending) is None  # none is: make room, 0 keeps its place
    assert ex._pick(used, [used], collections.deque([1, 0])) == 1  # 0 is not next yet
    assert ex._pick(used, [used, fresh_idle], collections.deque([0])) is None  # only 0 waits: make room
