"""Durable file writes: fsync'd files, fsync'd folders, atomic replacement."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from aotpipe.errors import AotpipeError


class OutputError(AotpipeError):
    """The output folder cannot be written (read-only, full, not a folder)."""

    exit_code = 1


def describe_os_error(e: OSError, path: Path | str) -> str:
    """One line saying what went wrong writing `path` and what would fix it."""
    if e.errno == errno.ENOSPC:
        return f"no space left on the device writing {path}; free some space and run again"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path}: {e.strerror}; make it writable or choose another folder with --output"
    if e.errno == errno.ENOTDIR:
        return f"cannot write {path}: a parent is a file, not a folder; choose another --output"
    return f"cannot write {path}: {e.strerror or e}"


def write_durable(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` all at once: readers see the old file or the new one."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        write_durable(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
