"""The process executor's worker: runs tasks sent by its parent, one at a time, until told to stop.

Started as ``python -m aotpipe.pipeline.executors.worker READ_FD WRITE_FD THREADS PARENT_PID``; THREADS
is an intra-op thread count, or ``/N`` for torch's default count divided by N (at least 1),
0 for torch's default. It speaks with its
parent over two pipes (multiprocessing connections): it says ``("ready",)`` once its imports
are done, then for each task it receives (a picklable callable) it answers ``("done", value)``
or, if the callable raised, ``("raised", one line, traceback)``. End of input: it exits.

Its stdout and stderr go to a log file the parent reads when the worker dies: with
faulthandler on, a segfault leaves the Python stack there.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection

import aotpipe.pipeline.job
from aotpipe.errors import exception_line


def _die_with_parent(parent: int) -> None:
    """Be killed when the parent dies (Linux): a killed `aotpipe run` leaves no worker behind,
    still capturing a model nobody waits for. Elsewhere, end of input stops an idle worker."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def intra_op_threads(arg: str, default: int) -> int:
    """The worker's intra-op thread count from its THREADS argument and torch's default."""
    if arg.startswith("/"):
        return max(1, default // max(1, int(arg[1:])))
    return int(arg) if int(arg) > 0 else default


def main(argv: list[str]) -> int:
    read_fd, write_fd, threads = int(argv[0]), int(argv[1]), argv[2]
    if len(argv) > 3:
        _die_with_parent(int(argv[3]))
    faulthandler.enable()
    conn_in = Connection(read_fd, writable=False)
    conn_out = Connection(write_fd, readable=False)
    import torch  # once, before the first task: the parent's time limit is for the model

    torch.set_num_threads(intra_op_threads(threads, torch.get_num_threads()))
    conn_out.send(("ready",))
    while True:
        try:
            fn = conn_in.recv()
        except EOFError:
            return 0
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - the parent records it; the worker goes on

            conn_out.send(("raised", exception_line(e), traceback.format_exc()))
            if not isinstance(e, Exception):
                return 1  # KeyboardInterrupt, SystemExit: stop here
            continue
        conn_out.send(("done", value))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
