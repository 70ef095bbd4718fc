"""Run `aotpipe run`, SIGKILLing ourselves at the K-th durable file step.

    python -m tests.helpers.killed_run K PIPELINE OUTPUT [run options...]

Used by the atomicity test to stop a run at exact points of the write phase. A step is a
file write (killed half-way through it: half the bytes are on disk) or a folder rename
(killed just before it). K = 0 never kills; it prints each step ("STEP n rename SRC DST")
and the number of steps at exit.
"""

import atexit
import os
import signal
import sys


def main() -> None:
    k = int(sys.argv[1])
    import aotpipe.artifact.fsio as fsio
    import aotpipe.artifact.writer as writer

    count = [0]
    real_write, real_rename = fsio.write_durable, os.rename

    def write(path, data):
        count[0] += 1
        if count[0] == k:
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(path, data)

    def rename(src, dst):
        count[0] += 1
        if k == 0:
            sys.stderr.write(f"STEP {count[0]} rename {os.path.basename(src)} {os.path.basename(dst)}\n")
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        real_rename(src, dst)

    fsio.write_durable = write
    writer._write = write
    os.rename = rename
    if k == 0:
        atexit.register(lambda: sys.stderr.write(f"\nSTEPS {count[0]}\n"))
    from aotpipe.cli import main as cli

    # In this process (the local executor): the write steps counted are this process's own.
    # The process executor's worker deaths are tested in tests/executors.
    sys.argv = ["aotpipe", "run", sys.argv[2], "--output", sys.argv[3], "--no-progress", "--executor", "local",
                *sys.argv[4:]]
    cli()


if __name__ == "__main__":
    main()
