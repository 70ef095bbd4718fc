"""The Ray executor: each task a Ray task, with its own CPUs, GPUs and memory.

Needs the `ray` extra (``pip install 'aotpipe[ray]'``). The cluster is the YAML's
`executor.address`, else ``$RAY_ADDRESS``, else a local Ray instance started for the run
(and stopped after it). Workers write into the output folder directly, so on a real
cluster it must be a filesystem every node shares.

A task whose worker dies (crash, Ray's out-of-memory killer) or that passes
`executor.timeout_s` (cancelled, its worker killed) is reported like the process
executor's; the other tasks go on.

Worker reuse is Ray's: a Ray worker runs task after task. `executor.max_models_per_worker`
is Ray's own `max_calls`, a worker exits after that many models; `recycle_memory_gb` and
the fresh start of a model that ran out of memory in the last run are the process
executor's alone (Ray gives a task no say in which worker runs it, nor a way to retire its
worker once it has returned); the CLI says so when a pipeline sets recycle_memory_gb with Ray.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from aotpipe.errors import AotpipeError, exception_line
from aotpipe.pipeline.executors.base import Failure, Outcome, Task


def _run(fn: Callable[[], Any], threads: int) -> Any:
    import torch  # torch: kept off the torch-free path (the runner imports the executors)

    if threads > 0:
        torch.set_num_threads(threads)
    return fn()


@dataclass
class RayExecutor:
    address: Optional[str] = None
    timeout_s: Optional[float] = None
    max_models_per_worker: Optional[int] = None  # Ray's max_calls: a worker exits after this many

    def _init(self) -> bool:
        """Connect to (or start) Ray; True if this run started it and must stop it."""
        try:
            import ray
        except ImportError:
            raise AotpipeError("executor: ray needs Ray installed: pip install 'aotpipe[ray]'") from None
        if ray.is_initialized():
            return False
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except Exception as e:  # noqa: BLE001 - an unreachable cluster is the user's to fix
            where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
            raise AotpipeError(f"executor: ray: cannot connect to {where} ({type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); check "
                               "executor.address or $RAY_ADDRESS") from None
        return address is None

    def run(self, tasks: list[Task], *, on_start: Callable[[int], None],
            on_done: Callable[[int, Outcome], None]) -> None:
        import ray

        started_here = self._init()
        try:
            # max_calls 0: Ray's default, a worker runs any number of tasks
            remote = ray.remote(max_retries=0, max_calls=self.max_models_per_worker or 0)(_run)
            # No more tasks in flight than the cluster has CPUs for, so that a task's time
            # limit counts from when it starts, not from when it was queued.
            cluster = ray.cluster_resources()
            cpus = float(cluster.get("CPU", 1.0))
            pending = []
            for i, t in enumerate(tasks):
                too_big = _infeasible(t, cluster)
                if too_big is not None:  # Ray would queue it forever
                    on_done(i, Failure(too_big))
                else:
                    pending.append(i)
            refs: dict[Any, int] = {}
            started: dict[int, float] = {}
            in_use = 0.0
            while pending or refs:
                while pending and (not refs or in_use + tasks[pending[0]].resources.num_cpus <= cpus):
                    i = pending.pop(0)
                    r = tasks[i].resources
                    opts: dict[str, Any] = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus}
                    if r.memory_gb is not None:
                        opts["memory"] = int(r.memory_gb * 2**30)
                    refs[remote.options(**opts).remote(tasks[i].fn, max(1, int(r.num_cpus)))] = i
                    started[i] = time.monotonic()
                    in_use += r.num_cpus
                    on_start(i)
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.2)
                for ref in ready:
                    i = refs.pop(ref)
                    in_use -= tasks[i].resources.num_cpus
                    try:
                        value = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - the worker died or the task raised
                        value = Failure(_reason(e))
                    on_done(i, value)
                now = time.monotonic()
                for ref, i in list(refs.items()):
                    timeout = tasks[i].resources.timeout_s or self.timeout_s
                    if timeout is not None and now - started[i] > timeout:
                        ray.cancel(ref, force=True)
                        refs.pop(ref)
                        in_use -= tasks[i].resources.num_cpus
                        on_done(i, Failure(f"timed out after {timeout:g} s (timeout_s); the Ray task was "
                                           "cancelled and its worker killed"))
        finally:
            if started_here:
                ray.shutdown()


def _infeasible(task: Task, cluster: dict[str, float]) -> Optional[str]:
    """Why no node of the cluster as a whole could ever run `task` (one line), or None. Ray
    itself would keep such a task pending for ever, waiting for a node that never comes."""
    r = task.resources
    asked = [("CPU", r.num_cpus, "num_cpus", "CPUs"), ("GPU", r.num_gpus, "num_gpus", "GPUs"),
             ("memory", (r.memory_gb or 0) * 2**30, "memory_gb", "bytes of memory")]
    for key, want, field, unit in asked:
        have = float(cluster.get(key, 0.0))
        if want and want > have:
            shown = (f"{want / 2**30:g} GiB", f"{have / 2**30:.3g} GiB") if key == "memory" else (f"{want:g} {unit}",
                                                                                                   f"{have:g}")
            return (f"not run: it asks for {shown[0]} ({field}) and the whole Ray cluster has {shown[1]}; lower "
                    f"resources.{field} for this model or executor.{field}, or add nodes")
    return None


def _reason(e: BaseException) -> str:
    import ray.exceptions as rx

    if isinstance(e, rx.OutOfMemoryError):
        return "out of memory: Ray's memory monitor killed the worker"
    if isinstance(e, (rx.WorkerCrashedError, rx.LocalRayletDiedError)):
        return "the Ray worker crashed while running this model"
    if isinstance(e, rx.TaskCancelledError):
        return "the Ray task was cancelled"
    if isinstance(e, rx.RayTaskError):
        cause = e.cause if getattr(e, "cause", None) is not None else e

        return f"the task raised {exception_line(cause)}"
    text = str(e).strip().splitlines()
    return f"ray: {type(e).__name__}: {text[0] if text else ''}"
