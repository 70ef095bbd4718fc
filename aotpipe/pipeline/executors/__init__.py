"""Executors: where model jobs run. `process` (default): isolated worker processes;
`local`: this process, one by one; `ray`: Ray tasks.

Executors take :class:`~aotpipe.pipeline.executors.base.Task` objects (a name, a callable, its
resources) and know nothing of models: data flows one way, runner -> executor -> job.
"""

from __future__ import annotations

from typing import Optional

from aotpipe.pipeline.executors.base import Executor, Failure, Outcome, Recycled, Resources, Task
from aotpipe.pipeline.executors.local import LocalExecutor
from aotpipe.pipeline.executors.process import ProcessExecutor
from aotpipe.pipeline.executors.ray import RayExecutor

__all__ = ["Executor", "Failure", "Outcome", "Recycled", "Resources", "Task", "make_executor"]


def make_executor(kind: str, *, workers: int = 1, timeout_s: Optional[float] = None,
                  memory_gb: Optional[float] = None, address: Optional[str] = None,
                  max_models_per_worker: Optional[int] = None, recycle_memory_gb: Optional[float] = None) -> Executor:
    """The executor of `kind` (local | process | ray) with its limits; the process executor
    replaces its workers as `max_models_per_worker` and `recycle_memory_gb` say (and lists
    them in its `recycled`), Ray's exit after `max_models_per_worker` models."""
    if kind == "local":
        return LocalExecutor()
    if kind == "process":
        return ProcessExecutor(workers=workers, timeout_s=timeout_s, memory_gb=memory_gb,
                               max_models_per_worker=max_models_per_worker, recycle_memory_gb=recycle_memory_gb)
    if kind == "ray":
        return RayExecutor(address=address, timeout_s=timeout_s, max_models_per_worker=max_models_per_worker)
    raise ValueError(f"unknown executor {kind!r}")
