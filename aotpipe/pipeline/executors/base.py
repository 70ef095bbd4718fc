"""What every executor does: run tasks somewhere, report each one's outcome as it ends.

An executor knows nothing of models or artefacts. It gets :class:`Task` objects (a name,
a callable with no arguments and the resources it asks for) and calls back when a task
starts and when it ends, with the callable's return value or a :class:`Failure` when the
place it ran in died: a crash, a time limit, a memory limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union


@dataclass(frozen=True)
class Resources:
    """What one task asks of a worker; executors that cannot reserve them ignore them."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_gb: Optional[float] = None  # also the memory limit of the process executor's worker
    timeout_s: Optional[float] = None  # this task's time limit, if not the executor's


@dataclass(frozen=True)
class Task:
    name: str
    fn: Callable[[], Any]  # picklable for the process and ray executors
    resources: Resources = Resources()
    # Start it in a worker that has run nothing else (the process executor; others ignore it):
    # it ran out of memory in the last run, where a used worker's leftovers weigh.
    fresh: bool = False


@dataclass(frozen=True)
class Failure:
    """A task whose worker did not return: why (one line), and what the worker said last."""

    reason: str
    detail: Optional[str] = None  # e.g. the tail of the worker's stderr (a crash's stack)


Outcome = Union[Any, Failure]


@dataclass(frozen=True)
class Recycled:
    """A worker an executor replaced between tasks (not a failure): which, after what, and why."""

    pid: int
    after: str  # the name of the last task it ran
    tasks: int  # how many tasks it ran
    reason: str  # one line
    out_of_memory: bool = False  # replaced because `after` ran out of memory in it (it runs again afresh)


class Executor(Protocol):
    def run(self, tasks: list[Task], *, on_start: Callable[[int], None],
            on_done: Callable[[int, Outcome], None]) -> None:
        """Run every task; call `on_start(i)` when task i starts and `on_done(i, outcome)`
        when it ends (in this process, one call at a time)."""
