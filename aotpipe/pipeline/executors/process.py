"""The process executor: each task in a worker process, `workers` at a time, isolated.

A worker imports torch once and runs tasks one after another; the parent watches each
task's time and the worker's resident memory, and kills the worker (its whole process
group) when a task passes the time limit or the memory limit. A worker that dies (a
segfault, ``os._exit``, the kernel's OOM killer, a kill) costs only the task it was
running, which is reported with the reason; a fresh worker takes the next task.

Recycling: a worker is also replaced, between tasks and without failing anything, after
`max_models_per_worker` tasks, or when its resident memory has grown by more than
`recycle_memory_gb` since it was ready (its imports done), or (with `memory_gb` and no
`recycle_memory_gb`) when it holds over half the memory limit. What one model leaked (a
growing global, a cache) then dies with its worker instead of pushing later models over
the limit. Each replacement is listed in `recycled` (the runner puts it in run.json).

A task that runs out of memory (over the limit, or killed by the kernel's OOM killer) in a
worker that had run other tasks before runs once more, in a fresh worker, and that run's
outcome is the task's: a worker's resident memory carries what earlier tasks left (the
allocator's cache, a library's), so a model at the edge of the limit would otherwise pass
or fail by which worker it drew, and a run split in shards would not match the whole run.
A task marked `fresh` (the runner marks the models that ran out of memory in the last run)
starts in a fresh worker from the outset: when it comes next, a used idle worker retires to
make room unless a fresh one is already starting, so the task keeps its place in the order
and no run of it in a used worker is wasted first.

Threads: N workers share torch's default intra-op thread count (what a local run uses: the
cores, or ``OMP_NUM_THREADS``) and take ``default // N`` each (at least 1), so that they do
not oversubscribe the machine; `threads` sets a count instead. Some kernels' bits depend on
it (a convolution's weight gradient), so the manifest records the count each model was
checked at (manifest.environment.threads) and replay runs at that count by default.
"""

from __future__ import annotations

import collections
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Optional

from aotpipe.pipeline.executors.base import Failure, Outcome, Recycled, Task

POLL_S = 0.05  # how often the parent looks at its workers' time and memory
_MAKE_ROOM = "a model that ran out of memory in a used worker waits to run again in a fresh one"
_MAKE_ROOM_FOR = "{} ran out of memory in the last run: it starts in a fresh worker"
START_ATTEMPTS = 3  # workers that die before they are ready, in a row, before giving up
TAIL_LINES = 20


def rss_bytes(pid: int, *, own: bool = False) -> Optional[int]:
    """Resident memory of a process and of the processes it started (Linux /proc: a job may
    start one, job.beside_kinds), None where the process's own cannot be read. A started
    process counts its own pages only (`own`): resident less file-backed, so the libraries
    it maps as its parent does (torch's) are not counted twice."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        total = (int(fields[1]) - (int(fields[2]) if own else 0)) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    return total + sum(rss_bytes(child, own=True) or 0 for child in _children(pid))


def _children(pid: int) -> list[int]:
    """The processes `pid` started, by /proc/<pid>/task/*/children (those it can read)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue  # a thread that ended while listing
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


OUT_OF_MEMORY = "out of memory: "  # how the reason of a task killed over its memory limit begins


# What a task out of memory in a used worker is called in that worker's replacement
# (`recycled`), before "after N other model(s) ...".
_RETRY_OUT_OF_MEMORY = "out of memory"
_RETRY_KILLED = "killed (the kernel's OOM killer?)"


def retried_out_of_memory(reason: str) -> bool:
    """Whether a replacement's reason says its task ran out of memory and ran again afresh: how
    a run.json written before RecycledWorker.out_of_memory existed says it."""
    return reason.startswith((f"{_RETRY_OUT_OF_MEMORY} after ", f"{_RETRY_KILLED} after "))


def ran_out_of_memory(reason: str) -> bool:
    """Whether a task's Failure reason (a failed model's error in run.json) says that it ran
    out of memory: over the limit, or killed as the kernel's out-of-memory killer kills."""
    return reason.startswith(OUT_OF_MEMORY) or f"crashed: {_signal_name(signal.SIGKILL)}" in reason


def _signal_name(num: int) -> str:
    try:
        name = signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
    described = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGBUS": "bus error",
                 "SIGILL": "illegal instruction", "SIGFPE": "arithmetic error",
                 "SIGKILL": "killed, e.g. by the kernel's out-of-memory killer"}
    return f"{name} ({described[name]})" if name in described else name


@dataclass
class _Worker:
    proc: subprocess.Popen
    send: Connection
    recv: Connection
    log: Path
    ready: bool = False
    task: Optional[int] = None
    started: float = 0.0
    peak_rss: int = 0
    done: int = 0  # tasks it finished
    last: Optional[int] = None  # the last of them
    base_rss: Optional[int] = None  # resident memory when it said ready

    def tail(self) -> Optional[str]:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return None
        lines = [ln for ln in lines if ln.strip()]
        return "\n".join(lines[-TAIL_LINES:]) or None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def close(self) -> None:
        for c in (self.send, self.recv):
            try:
                c.close()
            except OSError:
                pass


@dataclass
class ProcessExecutor:
    """`workers` worker processes; per task: `timeout_s` of wall time, and the worker's resident
    memory at most the task's `memory_gb` (or `memory_gb` here)."""

    workers: int = 1
    timeout_s: Optional[float] = None
    memory_gb: Optional[float] = None
    threads: Optional[int] = None  # intra-op threads per worker; default: see the module's docstring
    # Where workers are started from (their sys.path[0]): the runner's base folder.
    cwd: Optional[Path] = None
    max_models_per_worker: Optional[int] = None
    recycle_memory_gb: Optional[float] = None
    recycled: list[Recycled] = field(default_factory=list)  # workers replaced between tasks, in order
    _fresh_only: set[int] = field(default_factory=set, repr=False)  # tasks that run only in a fresh worker
    _retries: set[int] = field(default_factory=set, repr=False)  # of those, the ones started once already
    _logs: Optional[tempfile.TemporaryDirectory] = field(default=None, repr=False)

    def _threads(self) -> str:
        """Intra-op threads per worker, as the worker takes them: "N", or "/N" for a share
        of torch's default count (which the worker knows once it has imported torch)."""
        if self.threads is not None:
            return str(self.threads)
        return f"/{max(1, self.workers)}"

    def _start(self) -> _Worker:
        assert self._logs is not None
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        log = Path(self._logs.name) / f"worker-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "aotpipe.pipeline.executors.worker", str(to_child_r), str(from_child_w),
                 self._threads(), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(to_child_r, from_child_w),
                start_new_session=True, cwd=self.cwd,
            )
        os.close(to_child_r)
        os.close(from_child_w)  # so that the worker's death is an EOF here
        return _Worker(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False), log)

    def run(self, tasks: list[Task], *, on_start: Callable[[int], None],
            on_done: Callable[[int, Outcome], None]) -> None:
        pending = collections.deque(range(len(tasks)))
        pool: list[_Worker] = []
        failed_starts = 0
        self.recycled = []
        self._fresh_only = {i for i, t in enumerate(tasks) if t.fresh}
        self._retries = set()
        self._logs = tempfile.TemporaryDirectory(prefix="aotpipe-workers-")
        try:
            while pending or any(w.task is not None for w in pool):
                busy = sum(w.task is not None for w in pool)
                while len(pool) < min(self.workers, busy + len(pending)):
                    pool.append(self._start())
                for w in list(pool):
                    if w.ready and w.task is None and pending:
                        i = self._pick(w, pool, pending)
                        if i is None:  # a task that must start afresh comes next: make room
                            first = next(j for j in pending if j in self._fresh_only)
                            why = _MAKE_ROOM if first in self._retries else _MAKE_ROOM_FOR.format(tasks[first].name)
                            self.recycled.append(Recycled(w.proc.pid, tasks[w.last].name if w.last is not None
                                                          else "", w.done, why))
                            self._retire(w, pool)
                            continue
                        pending.remove(i)
                        try:
                            w.send.send(tasks[i].fn)
                        except (OSError, pickle.PicklingError) as e:
                            on_done(i, Failure(f"could not send the task to its worker: {e}"))
                            continue
                        w.task, w.started, w.peak_rss = i, time.monotonic(), 0
                        if i not in self._retries:  # a retry: started already, as the caller sees it
                            on_start(i)
                for conn in wait([w.recv for w in pool], timeout=POLL_S):
                    w = next(w for w in pool if w.recv is conn)
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        failed_starts = self._died(w, pool, tasks, pending, on_done, failed_starts)
                        continue
                    except Exception as e:  # the task's value did not unpickle here
                        msg = ("raised", f"its result could not be read back: {type(e).__name__}: {e}", None)
                    if msg[0] == "ready":
                        w.ready, failed_starts = True, 0
                        w.base_rss = rss_bytes(w.proc.pid)
                    elif w.task is not None:
                        i, w.task = w.task, None
                        w.done, w.last = w.done + 1, i
                        on_done(i, msg[1] if msg[0] == "done" else Failure(f"the task raised {msg[1]}", msg[2]))
                        why = self._recycle_reason(w, tasks[i]) if pending else None  # else it retires anyway
                        if why is not None:  # what the task left behind: start the next one afresh
                            self.recycled.append(Recycled(w.proc.pid, tasks[i].name, w.done, why))
                            self._retire(w, pool)
                for w in list(pool):
                    if w.task is not None:
                        self._watch(w, pool, tasks, pending, on_done)
        finally:
            for w in list(pool):
                self._retire(w, pool, wait_s=2.0)
            self._logs.cleanup()
            self._logs = None

    def _pick(self, w: _Worker, pool: list[_Worker], pending: collections.deque) -> Optional[int]:
        """The task idle worker `w` runs next, or None if it should retire to make room for a
        fresh worker: a task that must start afresh is next and no fresh worker is starting,
        or only such tasks wait."""
        if w.done == 0:
            return pending[0]
        if pending[0] in self._fresh_only and not any(o is not w and o.done == 0 and o.task is None for o in pool):
            return None
        return next((j for j in pending if j not in self._fresh_only), None)

    def _recycle_reason(self, w: _Worker, task: Task) -> Optional[str]:
        """Why worker `w`, having just finished `task`, should be replaced (one line), or None."""
        if self.max_models_per_worker is not None and w.done >= self.max_models_per_worker:
            return f"ran {w.done} model(s) (max_models_per_worker: {self.max_models_per_worker})"
        rss = rss_bytes(w.proc.pid)
        if rss is None:
            return None
        if self.recycle_memory_gb is not None:
            grown = rss - (w.base_rss or 0)
            if grown > self.recycle_memory_gb * 2**30:
                return (f"its resident memory grew by {_gib(grown)} since it started (to {_gib(rss)}), past "
                        f"recycle_memory_gb ({self.recycle_memory_gb:g} GiB)")
            return None
        limit = self._limit(task)
        if limit is not None and rss > limit / 2:
            return f"its resident memory ({_gib(rss)}) is over half the memory limit ({_gib(limit)})"
        return None

    def _limit(self, task: Task) -> Optional[float]:
        gb = task.resources.memory_gb if task.resources.memory_gb is not None else self.memory_gb
        return gb * 2**30 if gb is not None else None

    def _over_memory(self, w: _Worker, task: Task) -> Optional[int]:
        limit = self._limit(task)
        rss = rss_bytes(w.proc.pid)
        if rss is None:
            return None
        w.peak_rss = max(w.peak_rss, rss)
        return rss if limit is not None and rss > limit else None

    def _again_in_a_fresh_worker(self, w: _Worker, i: int, tasks: list[Task], pending: collections.deque,
                                 reason: str) -> bool:
        """Whether task `i`, out of memory in worker `w`, goes back to run in a fresh worker
        (once, and only if `w` had run other tasks first); says so in `recycled`."""
        if w.done == 0 or i in self._fresh_only:
            return False
        self._fresh_only.add(i)
        self._retries.add(i)
        pending.appendleft(i)
        self.recycled.append(Recycled(w.proc.pid, tasks[i].name, w.done,
                                      f"{reason} after {w.done} other model(s) in this worker; "
                                      f"{tasks[i].name} runs again in a fresh worker", out_of_memory=True))
        return True

    def _watch(self, w: _Worker, pool: list[_Worker], tasks: list[Task], pending: collections.deque,
               on_done: Callable[[int, Outcome], None]) -> None:
        assert w.task is not None
        task = tasks[w.task]
        rss = self._over_memory(w, task)
        limit = self._limit(task)
        elapsed = time.monotonic() - w.started
        if rss is not None and limit is not None:
            reason = (f"{OUT_OF_MEMORY}the worker's resident memory reached {_gib(rss)}, over the limit of "
                      f"{_gib(limit)} (executor.memory_gb)")
        elif (timeout := task.resources.timeout_s or self.timeout_s) is not None and elapsed > timeout:
            reason = f"timed out after {timeout:g} s (timeout_s); the worker was killed"
        else:
            return
        i = w.task
        w.kill()
        pool.remove(w)
        w.close()
        if rss is not None and self._again_in_a_fresh_worker(w, i, tasks, pending, _RETRY_OUT_OF_MEMORY):
            return
        on_done(i, Failure(reason, w.tail()))

    def _died(self, w: _Worker, pool: list[_Worker], tasks: list[Task], pending: collections.deque,
              on_done: Callable[[int, Outcome], None], failed_starts: int) -> int:
        code = w.proc.wait()
        pool.remove(w)
        w.close()
        if code < 0:
            how = f"crashed: {_signal_name(-code)}"
        else:
            how = f"exited with status {code}"
        if w.task is not None:
            i = w.task
            if code == -signal.SIGKILL and self._again_in_a_fresh_worker(w, i, tasks, pending,
                                                                          _RETRY_KILLED):
                return 0
            on_done(i, Failure(f"the worker {how} while running this model", w.tail()))
            return 0
        if not w.ready:
            failed_starts += 1
            if failed_starts >= START_ATTEMPTS:
                detail = w.tail()
                last = detail.splitlines()[-1] if detail else ""
                while pending:
                    on_done(pending.popleft(), Failure(f"no worker could start: it {how}" +
                                                       (f" ({last})" if last else ""), detail))
        return failed_starts

    def _retire(self, w: _Worker, pool: list[_Worker], wait_s: float = 10.0) -> None:
        if w in pool:
            pool.remove(w)
        w.close()  # end of input: an idle worker exits
        try:
            w.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            w.kill()
