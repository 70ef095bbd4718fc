"""Where the worker is: a small memory-mapped file in its scratch folder.

The worker writes what it is about to do ("in node mm_3 (aten.mm.default) of graph
forward", "while loading the artefact") into a shared mapping of the file: plain memory
writes, no system call per node, and the page outlives the process, so the caller reads
the last one after a crash. Graphs are instrumented with one marker node before each node
that calls something, and one before the output; the markers return None and touch no tensor.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import Any, Optional

SIZE = 4096
_HEADER = 4  # little-endian length of the UTF-8 text that follows


class Progress:
    """The worker's writer of its progress file."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    @staticmethod
    def encode(text: str) -> bytes:
        data = text.encode("utf-8", "replace")[: SIZE - _HEADER]
        return len(data).to_bytes(_HEADER, "little") + data

    def write(self, encoded: bytes) -> None:
        """Record an :meth:`encode` d text (encoded ahead of time for the per-node markers)."""
        self._map[: len(encoded)] = encoded

    def mark(self, text: str) -> None:
        self.write(self.encode(text))

    def text(self) -> str:
        """The last text written."""
        return _decode(bytes(self._map))


def read_regular(path: Path, limit: int, tail: bool = False) -> Optional[bytes]:
    """Up to `limit` bytes of the regular file at `path` (its last ones if `tail`), or None.

    For the caller reading what a worker left in its scratch folder: the worker owns that
    folder, so a name there may be a symlink to a file of the caller's (a key, say), a FIFO
    that would block, or a device: none of those is followed or opened for reading."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if tail and info.st_size > limit:
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def read(path: Path) -> str:
    """The last text written to the progress file at `path`, or "" (none, or unreadable)."""
    data = read_regular(path, SIZE)
    return "" if data is None else _decode(data)


def _decode(data: bytes) -> str:
    if len(data) < _HEADER:
        return ""
    n = int.from_bytes(data[:_HEADER], "little")
    if n > len(data) - _HEADER:
        return ""
    return data[_HEADER:_HEADER + n].decode("utf-8", "replace")


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None) or type(target).__name__
    module = getattr(target, "__module__", "") or ""
    if module.startswith("torch._ops"):  # an OpOverload: aten.mm.default
        return str(target)
    return name


def instrument(gm: Any, graph: str, progress: Progress) -> Any:
    """`gm` (a torch.fx.GraphModule), changed in place so that each node that calls
    something first records "in node NAME (TARGET) of graph `graph`"; returns it. Other
    modules (an imported module.py) are left alone: the progress then names only the graph."""
    import torch.fx  # torch: kept off the torch-free path (the caller reads progress without torch)

    if not isinstance(gm, torch.fx.GraphModule) or gm.__dict__.get("_aotpipe_instrumented"):
        return gm
    g = gm.graph
    for node in list(g.nodes):
        if node.op in ("call_function", "call_method", "call_module"):
            text = f"in node {node.name} ({_target_name(node.target)}) of graph {graph}"
        elif node.op == "output":
            text = f"after the last node of graph {graph}"
        else:
            continue
        with g.inserting_before(node):
            g.call_function(progress.write, (Progress.encode(text),))
    gm.recompile()
    gm.__dict__["_aotpipe_instrumented"] = True
    return gm
