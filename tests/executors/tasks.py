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
