"""The sandboxed worker: ``python -m aotpipe.trust.sandbox.worker SCRATCH`` (started by launch.py).

In this order: read the request the caller wrote, set the resource limits, open the
progress file, import torch, allocate canaries, run the task, check the canaries, write
the result as JSON, and leave with ``os._exit`` (no interpreter teardown on a heap a graph
may have damaged). Nothing here is trusted to the caller: it reads result.json as data.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any, Callable

from aotpipe.errors import AotpipeError, exception_line
from aotpipe.format.limits import Limits, override
from aotpipe.trust.sandbox.canary import Canaries
from aotpipe.trust.sandbox.progress import Progress, instrument
from aotpipe.trust.sandbox.protocol import PROGRESS, PROTOCOL, REQUEST, RESULT, SandboxRequest, SandboxResult

# The tasks a caller may name; a caller may also name "module:function" (tests, bench).
TASKS = {"replay": "aotpipe.trust.sandbox.replay:replay_task"}
EXIT_BUG = 3  # the worker itself failed before it could write a result


def set_limits(limits: dict[str, Any]) -> None:
    """The request's rlimits, before torch is imported and before any artefact is read."""
    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_DATA, limits["memory_bytes"])
    cap(resource.RLIMIT_AS, limits["address_space_bytes"])
    cpu = int(limits["cpu_seconds"])
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    # SIGXCPU at the soft limit; SIGKILL a few seconds later should the worker catch it
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5 if hard == resource.RLIM_INFINITY else min(cpu + 5, hard)))
    cap(resource.RLIMIT_FSIZE, limits["file_bytes"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.get("nproc"):
        cap(resource.RLIMIT_NPROC, limits["tasks"])


class Worker:
    """What a task gets besides its arguments: progress marks, canaries, graph instrumentation."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.canaries = Canaries()

    def mark(self, text: str) -> None:
        self.progress.mark(text)

    def watch(self, art: Any) -> Any:
        """Every graph of a loaded Artifact instrumented (on build, for deferred ones), with
        canaries allocated beside each as it is built; returns `art`."""
        import torch  # torch: after the worker's rlimits are set

        for key, ga in art.graphs.items():
            built = ga.built
            deferred = not isinstance(built, torch.nn.Module)

            def build(built: Any = built, key: str = key, deferred: bool = deferred) -> Any:
                self.mark(f"while building graph {key}")
                module = built() if deferred else built
                self.canaries.add(f"after graph {key} was built")
                return instrument(module, key, self.progress)

            ga.built = build if deferred else build()  # deferred: constants recomputed on first use
        return art


def _resolve(task: str) -> Callable[[dict[str, Any], Worker], Any]:
    path = TASKS.get(task, task)
    module, sep, name = path.partition(":")
    if not sep:
        raise ValueError(f"unknown task {task!r}")
    return getattr(importlib.import_module(module), name)


def _write_result(scratch: Path, result: SandboxResult) -> None:
    # In place: the caller made result.json and bound it alone writable (the folder is not);
    # it reads it only once this process has ended.
    (scratch / RESULT).write_text(json.dumps(dataclasses.asdict(result), allow_nan=True))


def main(scratch: Path) -> None:
    # Python's own messages (warnings) to a file of their own: what stays on fd 2 is the C
    # library's and the kernels' ("free(): invalid pointer"), which a crash line quotes.
    sys.stderr = open(scratch / "python.log", "w", buffering=1)
    request = SandboxRequest(**json.loads((scratch / REQUEST).read_text()))  # the caller's, trusted
    set_limits(request.limits)
    progress = Progress(scratch / PROGRESS)
    progress.mark("while starting the worker")

    worker = Worker(progress)
    worker.canaries.add("before any graph was built")
    known = set(Limits.__dataclass_fields__)
    byte_limits = {k: v for k, v in request.byte_limits.items() if k in known}
    try:
        with override(**byte_limits):
            value = _resolve(request.task)(request.args, worker)
        result = SandboxResult(protocol=PROTOCOL, status="ok", value=value)
    except AotpipeError as e:
        result = SandboxResult(protocol=PROTOCOL, status="user_error", lines=e.lines(), exit_code=e.exit_code)
    except MemoryError:
        result = SandboxResult(protocol=PROTOCOL, status="memory")
    except Exception as e:
        result = SandboxResult(protocol=PROTOCOL, status="error", line=exception_line(e))
    result.during = progress.text()  # where the task was when it ended
    progress.mark("while checking the canary tensors after the run")
    result.canaries = worker.canaries.check()
    progress.mark("while writing the result")
    _write_result(scratch, result)


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except BaseException as e:  # a bug here, not the graph's doing: say so on stderr
        os.write(2, f"aotpipe sandbox worker: {type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        os._exit(EXIT_BUG)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
