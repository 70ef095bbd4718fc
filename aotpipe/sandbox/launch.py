"""The caller's side of the sandbox: start a worker under bubblewrap, read back its result.

Torch-free: the caller never imports what the worker runs. What comes back is JSON read
within a size bound and treated as untrusted data (a hostile graph may have taken the
worker over): strings are stripped of control characters before anyone prints them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from aotpipe.errors import AotpipeError, SandboxError, SandboxUnavailable
from aotpipe.format.limits import current
from aotpipe.sandbox.progress import read
from aotpipe.sandbox.protocol import PROGRESS, PROTOCOL, REQUEST, RESULT, SandboxRequest, SandboxResult

LOG = "worker.log"
MAX_RESULT_BYTES = 64 << 20
INSTALL = "apt-get install -y bubblewrap"
# What a user who cannot install bubblewrap may do instead, for artefacts they trust.
TRUSTED_ALTERNATIVE = "or, for an artefact you trust, sign it (aotpipe sign) and pass --key KEY, or pass --no-sandbox"
# Host folders hidden behind an empty tmpfs: they hold Unix sockets (a read-only mount does
# not stop connect(); /run has the container runtime's and the session bus's, /tmp X11's
# and ssh agents'). Paths the worker needs under them are bound back read-only.
_MASKED = ("/tmp", "/run", "/var/run", "/var/tmp", "/dev/shm")
_GIB = 1 << 30
WORKER_BASE_BYTES = 1 * _GIB  # the interpreter, torch and aotpipe: about 0.25 GB of data measured
ADDRESS_SPACE_SLACK = 8 * _GIB  # libraries and malloc's per-thread arena reservations


@dataclass(frozen=True)
class SandboxLimits:
    """What the worker may use; the worker sets these rlimits before it imports torch."""

    memory_bytes: int  # RLIMIT_DATA: heap, anonymous mappings, thread arenas in use
    address_space_bytes: int  # RLIMIT_AS: a second bound that counts reservations too
    cpu_seconds: int = 3600  # RLIMIT_CPU (all threads together); SIGXCPU past it
    wall_seconds: float = 900.0  # kept by the caller, which kills the worker past it
    file_bytes: int = 1 * _GIB  # RLIMIT_FSIZE: the largest file the worker may write (in scratch)

    @classmethod
    def for_bytes(cls, max_bytes: Optional[int] = None, **kw: Any) -> "SandboxLimits":
        """Limits for a replay under the byte limit `max_bytes` (default: the one in force,
        --max-bytes or AOTPIPE_MAX_BYTES): 1 GiB for the interpreter plus three times it
        (inputs, intermediates, outputs and the references they are compared with)."""
        if max_bytes is None:
            max_bytes = current().max_bytes
        data = WORKER_BASE_BYTES + 3 * max_bytes
        return cls(memory_bytes=data, address_space_bytes=data + ADDRESS_SPACE_SLACK, **kw)


def find_bwrap() -> str:
    """The bwrap executable; SandboxUnavailable (one line, exit 2) saying how to get it."""
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            f"untrusted graphs run only in a sandbox, and bubblewrap (bwrap) is not installed: {INSTALL} "
            f"(Debian/Ubuntu; dnf install bubblewrap on Fedora); {TRUSTED_ALTERNATIVE}")
    return found


def _under(path: Path, folder: str) -> bool:
    return path == Path(folder) or Path(folder) in path.parents


def sandbox_argv(bwrap: str, scratch: Path, read_paths: Iterable[str | Path] = ()) -> list[str]:
    """bwrap's command line, up to the worker's own: the filesystem read-only, the scratch
    folder writable, the masked folders empty but for `read_paths` (and what Python needs)
    found under them, every namespace new, every capability dropped."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    masked = [m for m in _MASKED if os.path.isdir(m) and not os.path.islink(m)]
    for m in masked:
        argv += ["--tmpfs", m]
    wanted = {Path(p).resolve() for p in read_paths}
    wanted |= {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.executable, _package_root())}
    wanted |= {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    for p in sorted(wanted):
        if any(_under(p, m) for m in masked) and p.exists():
            argv += ["--ro-bind", str(p), str(p)]
    scratch = scratch.resolve()
    argv += ["--bind", str(scratch), str(scratch)]
    for m in ["/dev"] + masked:  # nothing writable but the scratch folder (and device nodes)
        argv += ["--remount-ro", m]
    argv += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
             "--chdir", str(scratch), "--"]
    return argv


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


def _worker_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    paths = [_package_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join(paths), TMPDIR=str(tmp), HOME=str(scratch),
               PYTHONDONTWRITEBYTECODE="1",
               # torch's caches under scratch too: a caller that used inductor has set its
               # cache folder in the environment (under /tmp, read-only in the sandbox), and
               # the fake-tensor check before a graph runs imports inductor.
               TORCHINDUCTOR_CACHE_DIR=str(tmp / "torchinductor"), TRITON_CACHE_DIR=str(tmp / "triton"))
    env.pop("XDG_CACHE_HOME", None)
    return env


def one_line(text: Any, limit: int = 2000) -> str:
    """`text` as one printable line of bounded length (what a worker says is untrusted; the
    CLI escapes what it prints again, with aotpipe.errors.printable)."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(text))
    s = " ".join(s.split())
    return s if len(s) <= limit else s[:limit] + " ..."


def _clean(value: Any, depth: int = 0) -> Any:
    """The worker's JSON with every string printable (keys too); refuses deep nesting."""
    if depth > 32:
        raise ValueError("nested too deeply")
    if isinstance(value, str):
        return one_line(value, limit=20000)
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {one_line(k, 200): _clean(v, depth + 1) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=1)
def _result_adapter() -> Any:
    """The validator of the worker's answer (pydantic reads the protocol's dataclasses)."""
    # pydantic: not at import, which the sandbox worker pays before its first progress mark
    import pydantic

    return pydantic.TypeAdapter(SandboxResult)


def _read_result(scratch: Path) -> Optional[SandboxResult]:
    """The worker's answer, or None where there is none that fits the protocol."""
    path = scratch / RESULT
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RESULT_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_RESULT_BYTES:
        return None
    try:
        result = json.loads(data)
    except (ValueError, RecursionError):
        return None
    try:
        return _result_adapter().validate_python(_clean(result))
    except (ValueError, RecursionError):  # pydantic's ValidationError is a ValueError
        return None


def read_progress(scratch: Path) -> str:
    """What the worker said it was doing last ("in node X of graph K", "while ..."), or ""."""
    return one_line(read(scratch / PROGRESS), limit=300)


def _last_log_line(scratch: Path) -> str:
    try:
        with open(scratch / LOG, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return one_line(lines[-1], limit=300) if lines else ""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def run_task(task: str, args: dict[str, Any], *, limits: Optional[SandboxLimits] = None,
             read_paths: Iterable[str | Path] = ()) -> Any:
    """Run `task` on `args` (JSON data) in a sandboxed worker; returns its JSON result.

    `task`: a name in the worker's table (:data:`aotpipe.sandbox.worker.TASKS`) or a
    ``module:function`` on the worker's path; chosen by the caller, never by an artefact.
    `read_paths`: files the worker reads that may lie under a masked folder (/tmp, /run).

    Raises the worker's user error as an AotpipeError (exit 2); a crash, a corruption the
    canaries saw, or a limit overrun as SandboxError (one line, exit 1); SandboxUnavailable
    (exit 2) when the sandbox cannot start here.
    """
    bwrap = find_bwrap()
    limits = limits or SandboxLimits.for_bytes()
    with tempfile.TemporaryDirectory(prefix="aotpipe-sandbox-") as tmp:
        scratch = Path(tmp).resolve()
        request = SandboxRequest(protocol=PROTOCOL, task=task, args=args, limits=dataclasses.asdict(limits),
                                 byte_limits=dataclasses.asdict(current()))
        (scratch / REQUEST).write_text(json.dumps(dataclasses.asdict(request)))
        argv = sandbox_argv(bwrap, scratch, read_paths) + [
            sys.executable, "-m", "aotpipe.sandbox.worker", str(scratch)]
        timed_out = False
        with open(scratch / LOG, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env=_worker_env(scratch))
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()  # bwrap; --die-with-parent takes the worker with it
                proc.wait()
            except BaseException:  # Ctrl-C: take the worker down too, then go on
                proc.kill()
                proc.wait()
                raise
        return _verdict(scratch, proc.returncode, timed_out, limits)


def _verdict(scratch: Path, rc: int, timed_out: bool, limits: SandboxLimits) -> Any:
    result = _read_result(scratch)
    doing = read_progress(scratch)
    where = doing or "before it started anything"
    if result is not None and result.during is not None:
        where = one_line(result.during, limit=300) or where
    if result is not None and result.canaries not in (None, "intact"):
        raise SandboxError(f"the graph corrupted memory outside its tensors ({result.canaries}; "
                           f"the worker was last {where})", "corrupted")
    if result is None:
        if timed_out:
            raise SandboxError(f"the graph ran past the sandbox's time limit of {limits.wall_seconds:g} s {where}", "wall_time")
        # bwrap exits 128 + N when the worker died of signal N (the worker itself exits 0 or 3)
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else None
        if sig == signal.SIGXCPU:
            raise SandboxError(f"the graph used up the sandbox's CPU time limit of {limits.cpu_seconds} s {where}", "cpu_time")
        if sig is not None:  # with what the C library said, if anything (glibc: "free(): invalid pointer")
            said = _last_log_line(scratch)
            raise SandboxError(f"the graph crashed the sandbox: {_signal_name(sig)} {where}"
                               + (f" ({said})" if said else ""), "crashed")
        if not doing:  # bwrap itself failed: no namespaces for this user, say
            why = _last_log_line(scratch) or f"bwrap exited with {rc}"
            raise SandboxUnavailable(f"the sandbox did not start ({why}); {TRUSTED_ALTERNATIVE}")
        raise SandboxError(f"the sandboxed worker stopped without a result (exit {rc}) {where}: "
                           f"{_last_log_line(scratch)}".rstrip(": "))
    status = result.status
    if status == "ok":
        return result.value
    if status == "user_error":
        raise AotpipeError("; ".join(result.lines or ["(no message)"]))
    if status == "memory":
        raise SandboxError(f"the graph ran out of the sandbox's memory ({limits.memory_bytes / 1e9:.2g} GB "
                           f"of data; --max-bytes raises it) {where}", "memory")
    raise SandboxError(f"the sandboxed worker failed {where}: {result.line or status}")
