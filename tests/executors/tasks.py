"""Top-level task functions the executor tests send to worker processes (they must pickle)."""

from __future__ import annotations

import os
import time


def sleep_and_time(seconds: float) -> tuple[float, float, int]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time(), os.getpid()


def square(x: int) -> int:
    return x * x


def raise_value_error() -> None:
    raise ValueError("bad value\nsecond line")


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def exit_3() -> None:
    os._exit(3)


def hang() -> None:
    time.sleep(3600)


def hog_memory() -> None:
    keep = []
    while True:
        keep.append(bytearray(64 << 20))  # 64 MiB, touched
        for i in range(0, len(keep[-1]), 4096):
            keep[-1][i] = 1


def unpicklable_result():
    return lambda: None


_LEAKED: list[bytearray] = []  # what leak_and_pid keeps alive in its worker, as a careless model would


def leak_and_pid(mib: int) -> tuple[int, int]:
    """Keep `mib` MiB (touched) in a module global; the worker's pid and how much it now holds."""
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _LEAKED.append(block)
    return os.getpid(), sum(len(b) for b in _LEAKED) >> 20


def pid() -> int:
    return os.getpid()


def ray_assigned() -> tuple[dict, int]:
    """Inside a Ray task: the resources Ray reserved for it, and torch's intra-op thread count."""
    import ray
    import torch

    return dict(ray.get_runtime_context().get_assigned_resources()), torch.get_num_threads()


def hold_and_pid(mib: int) -> int:
    """Touch `mib` MiB for a moment, then free it (a model's peak, not a leak); the worker's pid."""
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(0.5)  # long enough for the parent to see the peak
    return os.getpid()


def own_rss_mib() -> int:
    """The worker's resident memory in MiB (what the parent's memory watch reads)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def leak_wait_and_pid(mib: int, seconds: float) -> tuple[int, int]:
    """leak_and_pid, then wait `seconds` (so that another worker takes the next task)."""
    out = leak_and_pid(mib)
    time.sleep(seconds)
    return out


def sigkill_self() -> None:
    """Die as the kernel's out-of-memory killer kills: SIGKILL, no word said."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def worker_pid() -> int:
    """The pid of the process that runs this task."""
    return os.getpid()


def child_hogs_memory() -> None:
    """Starts a process that holds 800 MiB, and waits for it (a job's second process)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import time; b = bytearray(800 << 20); b[::4096] = b'x' * len(b[::4096]); "
                    "time.sleep(60)"], check=False)
