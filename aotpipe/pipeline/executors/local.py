"""The local executor: every task in this process, one after another (no isolation)."""

from __future__ import annotations

from typing import Callable

from aotpipe.pipeline.executors.base import Outcome, Task


class LocalExecutor:
    """Runs tasks in the calling process, in order. A task that crashes the process or
    hangs takes the run with it: use the process executor for untrusted models."""

    def run(self, tasks: list[Task], *, on_start: Callable[[int], None],
            on_done: Callable[[int, Outcome], None]) -> None:
        for i, task in enumerate(tasks):
            on_start(i)
            on_done(i, task.fn())
