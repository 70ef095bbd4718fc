"""Durable file writes: fsync'd files, fsync'd folders, atomic replacement, and cleaning up
after runs that were killed midway. No torch import (the runner uses it before any model)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from aotpipe.format.records import MANIFEST
from aotpipe.errors import AotpipeError

# A model folder is written as <TMP_PREFIX><model>-<pid>, and one it replaces is moved to
# <OLD_PREFIX><model>-<pid> for the moment of the swap.
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


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


def clean_stale(out_dir: Path) -> list[str]:
    """Remove what killed runs (or killed workers) left behind; returns what was done, one line each.

    A `.tmp-<model>-<pid>` folder of a dead process is deleted. A `.old-<model>-<pid>`
    folder is a complete earlier artefact that was being replaced: it is put back if the
    new one never arrived, else deleted. Folders of live processes (other workers) are left.
    """
    done: list[str] = []
    if not out_dir.is_dir():
        return done
    for p in sorted(out_dir.iterdir()):
        for prefix in (TMP_PREFIX, OLD_PREFIX):
            if not p.name.startswith(prefix) or not p.is_dir():
                continue
            name, _, pid = p.name[len(prefix):].rpartition("-")
            if not pid.isdigit() or (int(pid) != os.getpid() and pid_alive(int(pid))):
                continue
            final = out_dir / name
            if prefix == OLD_PREFIX and not final.exists() and (p / MANIFEST).exists():
                os.rename(p, final)
                done.append(f"restored {name} from an interrupted replacement")
            else:
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed {p.name} left by an interrupted run")
    return done
