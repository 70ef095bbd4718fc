"""Limits on what a file handed to aotpipe may make it read, parse or allocate.

Artefacts and pipeline files may come from anyone, and a few hundred bytes can ask for
gigabytes: a shape of [1e12], a YAML alias bomb, a manifest that is a link to /dev/zero
or a FIFO, JSON nested a hundred thousand deep, a graph of millions of nodes. Every limit
here is checked before the read or allocation it guards; a breach is one
:class:`LimitError` line naming the file, what it asks for and the limit, and the CLI
exits 2.

The defaults leave real graphs a wide margin. Each can be changed with an environment
variable (``AOTPIPE_MAX_BYTES=8G``), and the commands that allocate take ``--max-bytes``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import json
import os
import re
import stat
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotpipe.errors import AotpipeError, ArtifactError, LimitError


@dataclass(frozen=True)
class Limits:
    """The limits in force; ``None`` for max_tensor_bytes means max_bytes."""

    max_bytes: int = 2 << 30  # a replay's inputs (sum of storages), a rebuilt model, one tensor
    max_tensor_bytes: int | None = None  # one tensor (a constant, a blob, a factory op's output)
    max_nodes: int = 200_000  # nodes in one graph.json (real graphs: hundreds to tens of thousands)
    max_record_bytes: int = 256 << 20  # one JSON record, .input pickle, module.py or key file
    max_json_depth: int = 64  # nesting of a JSON record (aotpipe writes fewer than 10 levels)
    max_yaml_bytes: int = 16 << 20  # a pipeline file
    max_yaml_values: int = 100_000  # values in a pipeline file once its aliases are expanded
    # values (objects, arrays, numbers, strings) in one JSON record, counted before parsing:
    # parsing costs up to ~200 bytes a value, validating more (real graphs: ~25 a node)
    max_json_values: int = 2_000_000
    max_graphs: int = 512  # graphs in one artefact (a capture with graph breaks: a few per subgraph)
    max_artifact_nodes: int = 200_000  # nodes of all an artefact's graphs together (~6 kB each while loading)
    max_pickle_ops: int = 1_000_000  # opcodes in one .input pickle (real ones: ~10 an input)
    max_walk_entries: int = 500_000  # files and folders one walk of a tree (ls, verify) visits
    max_walk_depth: int = 32  # folders deep a walk goes (an artefact tree: 3 or 4)
    max_rebuild_int: int = 1_000_000  # an integer argument a manifest gives a builtin zoo model
    max_modules: int = 10_000  # modules, parameters and buffers of a model rebuilt from a manifest (BERT: ~400)

    @property
    def tensor_bytes(self) -> int:
        return self.max_tensor_bytes if self.max_tensor_bytes is not None else self.max_bytes


# The environment variable that sets each limit; byte limits accept suffixes (8G, 512M).
ENV = {
    "max_bytes": "AOTPIPE_MAX_BYTES",
    "max_tensor_bytes": "AOTPIPE_MAX_TENSOR_BYTES",
    "max_nodes": "AOTPIPE_MAX_NODES",
    "max_record_bytes": "AOTPIPE_MAX_RECORD_BYTES",
    "max_json_depth": "AOTPIPE_MAX_JSON_DEPTH",
    "max_yaml_bytes": "AOTPIPE_MAX_YAML_BYTES",
    "max_yaml_values": "AOTPIPE_MAX_YAML_VALUES",
    "max_json_values": "AOTPIPE_MAX_JSON_VALUES",
    "max_graphs": "AOTPIPE_MAX_GRAPHS",
    "max_artifact_nodes": "AOTPIPE_MAX_ARTIFACT_NODES",
    "max_pickle_ops": "AOTPIPE_MAX_PICKLE_OPS",
    "max_walk_entries": "AOTPIPE_MAX_WALK_ENTRIES",
    "max_walk_depth": "AOTPIPE_MAX_WALK_DEPTH",
    "max_rebuild_int": "AOTPIPE_MAX_REBUILD_INT",
    "max_modules": "AOTPIPE_MAX_MODULES",
}
_BYTE_LIMITS = {"max_bytes", "max_tensor_bytes", "max_record_bytes", "max_yaml_bytes"}
# Read-only: override() sets a new mapping, never changes the one there (a shared default).
_overrides: contextvars.ContextVar[Mapping[str, int]] = contextvars.ContextVar(
    "aotpipe_limits", default=types.MappingProxyType({}))

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str, what: str) -> int:
    """A byte count from ``123``, ``1e9``, ``512M``, ``8G`` or ``8GiB``; AotpipeError if malformed."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.I)
    if not m:
        raise AotpipeError(f"{what}: {text!r} is not a byte count; write e.g. 4G, 512M or 1000000")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise AotpipeError(f"{what}: {text!r} must be more than 0 bytes")
    return value


def _from_env(name: str) -> int | None:
    var = ENV[name]
    raw = os.environ.get(var)
    if raw is None or raw == "":
        return None
    if name in _BYTE_LIMITS:
        return parse_bytes(raw, var)
    try:
        value = int(raw)
    except ValueError:
        raise AotpipeError(f"{var}: {raw!r} is not a whole number") from None
    if value <= 0:
        raise AotpipeError(f"{var}: {raw!r} must be more than 0")
    return value


def current() -> Limits:
    """The limits in force: defaults, then environment variables, then :func:`override`."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Limits):
        env = _from_env(f.name)
        if env is not None:
            values[f.name] = env
    values.update(_overrides.get())
    return Limits(**values)


@contextlib.contextmanager
def override(**limits: int | None) -> Iterator[None]:
    """Within the block, these limits replace the defaults and the environment (None: unchanged)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    unknown = set(limits) - known
    if unknown:
        raise TypeError(f"unknown limits: {', '.join(sorted(unknown))}")
    token = _overrides.set({**_overrides.get(), **{k: v for k, v in limits.items() if v is not None}})
    try:
        yield
    finally:
        _overrides.reset(token)


def unbounded_bytes() -> contextlib.AbstractContextManager[None]:
    """No byte limits within the block (node counts and record sizes stay): for checking an
    artefact aotpipe has just written from the model, which is not hostile input; the
    executor's memory limit (memory_gb) bounds that."""
    return override(max_bytes=1 << 62, max_tensor_bytes=1 << 62)


def human(n: int) -> str:
    """A byte count for people: 2.4 GB (decimal units, like df -H)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _how_to_raise(name: str) -> str:
    extra = " or --max-bytes" if name in ("max_bytes",) else ""
    return f"{ENV[name]}{extra}"


def breach(where: Any, asks: str, name: str, limit: int) -> LimitError:
    """The one-line error for a file that asks for more than a limit allows."""
    shown = human(limit) if name in _BYTE_LIMITS else f"{limit:,}"
    return LimitError(f"{where}: {asks}, over the limit of {shown} (raise it with {_how_to_raise(name)})")


class Breach(str):
    """A problem line (as verify reports them) that is a limit breach: the CLI exits 2 for it."""


# ---------------------------------------------------------------------------------------
# files


def check_regular_file(path: Path, root: Path | None = None) -> None:
    """Refuse links, devices, FIFOs and paths that leave `root`: a hostile folder could point
    a record at /dev/zero, at a pipe nobody writes to, or at a file elsewhere."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # reading it says "missing"
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{path}: not a regular file (a link or device in an artefact is refused)")
    if root is not None and not path.resolve().is_relative_to(Path(root).resolve()):
        raise ArtifactError(f"{path}: outside the artefact folder")


def read_bytes(path: Path, *, limit: int, limit_name: str, root: Path | None = None) -> bytes:
    """The bytes of a regular file no larger than `limit`; checked before reading.

    The file is opened without following a final link and without blocking (a FIFO would
    otherwise wait for a writer), and its type and size are taken from the open file, so
    nothing swapped in between the check and the read is read.
    """
    path = Path(path)
    check_regular_file(path, root)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ArtifactError(f"{path}: not a regular file (a link or device in an artefact is refused)") from None
        raise ArtifactError(f"{path}: cannot read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{path}: not a regular file (a link or device in an artefact is refused)")
        if st.st_size > limit:
            raise breach(path, f"{human(st.st_size)} on disk", limit_name, limit)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:  # it grew while being read
            raise breach(path, f"more than {human(limit)}", limit_name, limit)
        return b"".join(chunks)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)


def read_bounded(path: Path, *, limit: int, limit_name: str) -> bytes:
    """At most `limit` bytes of any readable file (a pipe included): for files the user names
    (a pipeline YAML may come from a shell's process substitution), not artefact contents."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise breach(path, f"more than {human(limit)}", limit_name, limit)
    return data


@dataclass(frozen=True)
class WalkEntry:
    """One thing a walk found: its path, depth below the root (1: a child), whether it is a
    folder (links are never folders here) and its size in bytes (0 for a folder)."""

    path: Path
    depth: int
    is_dir: bool
    is_link: bool
    size: int


def walk(root: Path, *, prune: Any = None) -> Iterator[WalkEntry]:
    """Every file and folder under `root`, without following links, within max_walk_entries
    entries and max_walk_depth folders deep (a breach is one LimitError line, raised when it
    is met: nothing is collected first). `prune(entry)` true skips a folder's contents.
    Folders are visited in name order, so the order does not depend on the file system."""
    lim = current()
    root = Path(root)
    stack: list[tuple[Path, int]] = [(root, 0)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = []
                for e in it:
                    seen += 1
                    if seen > lim.max_walk_entries:
                        raise breach(root, f"more than {lim.max_walk_entries:,} files and folders", "max_walk_entries",
                                     lim.max_walk_entries)
                    entries.append(e)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError:
            continue  # what the user cannot read is not theirs to list
        children = []
        for e in sorted(entries, key=lambda e: e.name):
            try:
                is_link = e.is_symlink()
                is_dir = not is_link and e.is_dir(follow_symlinks=False)
                size = 0 if is_dir else e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            entry = WalkEntry(Path(e.path), depth + 1, is_dir, is_link, size)
            yield entry
            if is_dir and not (prune is not None and prune(entry)):
                if depth + 1 >= lim.max_walk_depth:
                    raise breach(entry.path, f"folders nested more than {lim.max_walk_depth} deep under {root}",
                                 "max_walk_depth", lim.max_walk_depth)
                children.append((entry.path, depth + 1))
        stack.extend(reversed(children))


# ---------------------------------------------------------------------------------------
# JSON


_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def json_deeper_than(data: bytes, limit: int) -> bool:
    """Whether a valid JSON text nests containers more than `limit` levels deep (the root
    container is level 1, empty containers count), found from the text with C-speed passes:
    strings cut out, every other character but brackets dropped, then the innermost pairs
    removed once per level. (Walking the parsed value in Python took as long as parsing it.)"""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _INNERMOST.sub(b"", brackets)
    return bool(brackets)


# One structural token of a JSON text (a comma, an empty container, an opening bracket), with
# the strings and other characters before it skipped; possessive, so nothing backtracks. At
# the end of the text the token is empty.
_JSON_TOKEN = re.compile(rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"|[^"\[{,]++)*+(\[\s*+\]|\{\s*+\}|[\[{,]|\Z)')


def json_values_at_most(data: bytes) -> int:
    """An upper bound on the values of a JSON text, counted without parsing it: the root, then
    one value (or key and value) per comma and per container holding anything. Commas and
    brackets inside strings count too here (fast, in C); :func:`count_json_values` skips them."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def count_json_values(data: bytes, stop: int | None = None) -> int:
    """The values of a JSON text (an object's key and value counted once), without parsing it
    and in constant memory; counting ends once past `stop`."""
    n = 1
    for m in _JSON_TOKEN.finditer(data):
        token = m.group(1)
        if len(token) == 1:  # a comma, or a container that holds something
            n += 1
            if stop is not None and n > stop:
                break
    return n


def check_json_values(data: bytes, where: Any) -> None:
    """Refuse, before parsing, a JSON text of more values than the limit: parsing and
    validating cost memory by the value, far more than the text's bytes."""
    limit = current().max_json_values
    if json_values_at_most(data) > limit:
        if count_json_values(data, stop=limit) > limit:
            raise breach(where, f"more than {limit:,} JSON values", "max_json_values", limit)


def parse_json(data: bytes, where: Any) -> Any:
    """JSON data from UTF-8 bytes; malformed or too deeply nested data, or more values than the
    limit (counted before parsing), is one ArtifactError line."""
    check_json_values(data, where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ArtifactError(f"{where}: not UTF-8 (byte {data[e.start]:#04x} on line {line})") from None
    limit = current().max_json_depth
    try:
        value = json.loads(text)
    except RecursionError:
        raise breach(where, f"JSON nested more than {limit} levels deep", "max_json_depth", limit) from None
    except MemoryError:  # under a memory cap (ulimit -v, a container) below what the limits allow
        raise LimitError(f"{where}: out of memory parsing {human(len(data))} of JSON; lower the limits "
                         f"({ENV['max_json_values']}, {ENV['max_record_bytes']}) or raise the memory cap") from None
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{where}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ArtifactError(f"{where}: not valid JSON ({str(e).split(';')[0]})") from None
    if isinstance(value, (dict, list)) and json_deeper_than(data, limit):
        raise breach(where, f"JSON nested more than {limit} levels deep", "max_json_depth", limit)
    if _SURROGATE_ESCAPE.search(data):
        try:  # a \ud800 escape alone is no character: no name, key or path may hold one
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ArtifactError(f"{where}: a string holds a lone surrogate ({ascii(e.object[e.start:e.end])}), "
                                "which is not text") from None
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def read_json(path: Path, root: Path | None = None) -> Any:
    """A JSON record of an artefact: a regular file, within the size and depth limits."""
    lim = current()
    return parse_json(read_bytes(path, limit=lim.max_record_bytes, limit_name="max_record_bytes", root=root), path)


# ---------------------------------------------------------------------------------------
# graphs and tensors


def check_nodes(count: int, where: Any) -> None:
    limit = current().max_nodes
    if count > limit:
        raise breach(where, f"{count:,} nodes", "max_nodes", limit)


def check_graphs(count: int, where: Any) -> None:
    """Refuse an artefact of more graphs than the limit, before loading any of them."""
    limit = current().max_graphs
    if count > limit:
        raise breach(where, f"{count:,} graphs", "max_graphs", limit)


class NodeBudget:
    """The nodes of one artefact's graphs, counted as each graph.json is read (before it is
    built): each graph within max_nodes, all of them within max_artifact_nodes."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, count: int, where: Any) -> None:
        check_nodes(count, where)
        limit = current().max_artifact_nodes
        if self.used + count > limit:
            raise breach(where, f"{count:,} nodes after {self.used:,} in the artefact's other graphs",
                         "max_artifact_nodes", limit)
        self.used += count


def numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def check_tensor_bytes(nbytes: int, where: Any, what: str) -> None:
    """Refuse one tensor of `nbytes` (`what` says which tensor, e.g. 'input 3: float32[600000000]')."""
    limit = current().tensor_bytes
    name = "max_tensor_bytes" if current().max_tensor_bytes is not None else "max_bytes"
    if nbytes > limit:
        raise breach(where, f"{what} needs {human(nbytes)}", name, limit)


def check_total_bytes(parts: list[tuple[str, int]], where: Any, what: str) -> None:
    """Refuse a replay (or rebuild) whose tensors, (label, bytes) each, need more than max_bytes in all."""
    for label, nbytes in parts:
        check_tensor_bytes(nbytes, where, f"{what}: {label}")
    total = sum(n for _, n in parts)
    limit = current().max_bytes
    if total > limit:
        biggest = max(parts, key=lambda p: p[1])[0]
        raise breach(where, f"{what} need {human(total)} in all (largest: {biggest})", "max_bytes", limit)


def extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Number of storage elements a (shape, stride) view spans from its offset; 0 if empty."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=False))


def record_parts(storages: Any, inputs: Any) -> list[tuple[str, int]]:
    """(label, bytes) of every tensor replay allocates for a graph's inputs, from validated
    records (format/records.py): each storage, and each input made afresh (a tangent)."""
    import torch  # torch: kept off the torch-free path (the format's limits are read without torch)

    parts = []
    for k, s in enumerate(storages):
        itemsize = getattr(torch, s.dtype).itemsize
        parts.append((f"storage {k}: {s.dtype}[{s.numel}]", s.numel * itemsize))
    for i, rec in enumerate(inputs):
        if rec.source in ("ones", "weights") and rec.type == "tensor" and None not in (rec.shape, rec.stride, rec.dtype):
            # (one without a layout is refused when its inputs are built)
            parts.append((f"input {i}: {rec.dtype}{rec.shape}",
                          extent(tuple(rec.shape), tuple(rec.stride)) * getattr(torch, rec.dtype).itemsize))
    return parts


def check_record_bytes(storages: Any, inputs: Any, where: Any) -> None:
    """Refuse, before allocating, a graph whose inputs need more than the limits allow."""
    check_total_bytes(record_parts(storages, inputs), where, "its inputs")


# ---------------------------------------------------------------------------------------
# rebuilding a model a manifest names


def check_rebuild_args(args: Any, where: Any) -> None:
    """Refuse builtin zoo arguments from a manifest that would make the builder itself
    allocate before any tensor is sized (``mlp(depth=10**10)`` builds a list of 10**10
    layer sizes): every integer within max_rebuild_int, and few values in all."""
    limit = current().max_rebuild_int
    stack, seen = [("args", args)], 0
    while stack:
        name, v = stack.pop()
        seen += 1
        if seen > 10_000:
            raise breach(where, "model args of more than 10,000 values", "max_rebuild_int", limit)
        if isinstance(v, dict):
            stack.extend((f"{name}.{k}", x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{name}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
            raise breach(where, f"model {name} = {str(v)[:20]}{'...' if len(str(v)) > 20 else ''}",
                         "max_rebuild_int", limit)


@contextlib.contextmanager
def bounded_build(where: Any) -> Iterator[None]:
    """Within the block, building more than max_modules modules, parameters and buffers in
    all is refused as it happens (torch's global registration hooks), so a model whose
    arguments ask for a million layers stops at the limit, not after building them."""
    # torch: kept off the torch-free path (the format's limits are read without torch)
    from torch.nn.modules import module as nn_module

    limit = current().max_modules
    count = [0]

    def counted(*_: Any) -> None:
        count[0] += 1
        if count[0] > limit:
            raise breach(where, f"a model of more than {limit:,} modules, parameters and buffers",
                         "max_modules", limit)

    handles = [nn_module.register_module_module_registration_hook(counted),
               nn_module.register_module_parameter_registration_hook(counted),
               nn_module.register_module_buffer_registration_hook(counted)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


_SIZE_ARGS = ("size", "input_sizes")


# A call's keyword arguments as torch takes them (an op's "dtype", "stride"): no record.
OpKwargs = dict[str, Any]


def check_op_sizes(op: Any, args: Any, kwargs: OpKwargs, where: Any) -> None:
    """Refuse, at load, a call that makes a fresh tensor of a literal size over the per-tensor
    limit (aten.full([1e12]), slice_backward's input_sizes). Sizes computed while the graph
    runs are not known here."""
    import torch  # torch: kept off the torch-free path (the format's limits are read without torch)

    schema = getattr(op, "_schema", None)
    if schema is None or any(r.alias_info is not None for r in schema.returns):
        return  # a view: it allocates nothing
    names = [a.name for a in schema.arguments]
    for name in _SIZE_ARGS:
        if name not in names:
            continue
        i = names.index(name)
        size = kwargs.get(name) if name in kwargs else (args[i] if i < len(args) else None)
        if not isinstance(size, (list, tuple)) or not all(isinstance(s, int) for s in size):
            continue
        dtype = kwargs.get("dtype")
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 8  # unknown: the widest common
        stride = kwargs.get("stride") if "stride" in kwargs else (
            args[names.index("stride")] if "stride" in names and names.index("stride") < len(args) else None)
        if isinstance(stride, (list, tuple)) and len(stride) == len(size) and all(isinstance(s, int) for s in stride):
            n = extent(tuple(size), tuple(stride))
        else:
            n = numel(size)
        check_tensor_bytes(max(n, 0) * itemsize, where, f"{getattr(op, '__name__', op)} of size {list(size)[:8]}")
