"""The caller's side of the sandbox: start a worker under bubblewrap, read back its result.

Torch-free: the caller never imports what the worker runs. What comes back is JSON read
within a size bound and treated as untrusted data (a hostile graph may have taken the
worker over): strings are stripped of control characters before anyone prints them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import aotpipe
from aotpipe.errors import AotpipeError, SandboxError, SandboxUnavailable
from aotpipe.format.limits import current
from aotpipe.trust.sandbox.confine import JOIN_AND_EXEC, Cgroup, make_cgroup, seccomp_filter
from aotpipe.trust.sandbox.progress import read, read_regular
from aotpipe.trust.sandbox.protocol import PROGRESS, PROTOCOL, REQUEST, RESULT, SandboxRequest, SandboxResult

LOG = "worker.log"
# The files a worker writes in its scratch folder, made by the caller before it starts.
WORKER_FILES = (RESULT, PROGRESS, "python.log")
# The worker's answer is read by this (unsandboxed) process: bounded in bytes and in JSON
# values before it is parsed (a parsed value costs tens of bytes; 16 MiB of "[0,0,..." would
# be 8M of them).
MAX_RESULT_BYTES = 16 << 20
MAX_RESULT_VALUES = 1 << 20
INSTALL = "apt-get install -y bubblewrap"
# What a user who cannot install bubblewrap may do instead, for artefacts they trust.
TRUSTED_ALTERNATIVE = "or, for an artefact you trust, sign it (aotpipe sign) and pass --key KEY, or pass --no-sandbox"
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
    file_bytes: int = 256 << 20  # RLIMIT_FSIZE: the largest file the worker may write (scratch, tmpfs)
    tmp_bytes: int = 1 * _GIB  # the size of the worker's TMPDIR, a tmpfs (torch's caches)
    tasks: int = 256  # threads in all (the cgroup's pids.max; RLIMIT_NPROC where there is none)
    cgroup_bytes: Optional[int] = None  # the cgroup's memory bound; default memory_bytes + 1 GiB

    @property
    def total_bytes(self) -> int:
        """The memory bound of the whole sandbox, where a cgroup holds it."""
        return self.cgroup_bytes if self.cgroup_bytes is not None else self.memory_bytes + _GIB

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


NOBODY = 65534  # the uid and gid the worker runs as (the kernel's overflow id, "nobody")
# Tuning variables a worker may keep from the caller's environment (nothing else crosses):
# thread counts and the CPU kernels torch picks change results' last bits, never secrets.
PASSED_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                    "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY")
_TUNING_VALUE = re.compile(r"[A-Za-z0-9_.-]{0,64}")
# Under /proc: kernel settings and triggers. Mounted read-only over the sandbox's own /proc
# (the worker is unprivileged as well; this holds should it ever not be).
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass
class SandboxPlan:
    """What a worker will see and be: what :func:`sandbox_argv` binds, the uid it runs as,
    and the mechanisms in force (each a line of docs/security.md)."""

    read_only: list[Path]  # bound read-only at the same path, nothing else of the host
    symlinks: list[tuple[str, str]]  # (target, link): /lib -> usr/lib on a merged-usr system
    scratch: Path  # the worker's folder: read-only to it but for WORKER_FILES, and its tmpfs TMPDIR
    drop_to_nobody: bool  # root caller: bwrap builds the mounts as root, the worker runs as 65534
    seccomp_fd: Optional[int] = None  # bwrap --seccomp: the compiled filter, open for reading
    copies: dict[Path, Path] = field(default_factory=dict)  # path -> a readable copy bound there instead
    tmpfs_bytes: int = 1 << 30  # the worker's TMPDIR (scratch/tmp): a tmpfs of this size, gone after


def _python_paths(task: str) -> list[Path]:
    """What the interpreter needs to run the worker and `task`: its prefixes, its site folders,
    aotpipe's own package, the task's top-level package, and $PYTHONPATH's entries."""
    import site

    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent,
             Path(_package_root()) / "aotpipe"]
    paths += [Path(p) for p in site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        paths.append(Path(site.getusersitepackages()))
    paths += [Path(p) for p in code_paths()]
    found = _task_code(task)
    if found is not None:  # a "module:function" the caller named: its top-level package (or module) too
        paths.append(found[0])
    return paths


def _task_code(task: str) -> Optional[tuple[Path, Path]]:
    """(what to bind, the folder to put on the worker's path) for the top-level package or
    module of a ``module:function`` task; None for a task of the worker's table."""
    module, sep, _ = task.partition(":")
    if not sep:
        return None
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: its folder
        return origin.parent, origin.parent.parent
    return origin, origin.parent


def code_paths() -> list[str]:
    """$PYTHONPATH's entries the worker may have: absolute folders of code, never "/", the
    home folder or one above it (a relative entry such as "." would bind the caller's working
    folder: a checkout's .git/config may hold a token)."""
    home = Path.home().resolve()
    kept = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        p = Path(os.path.realpath(entry))
        if p == Path("/") or p == home or p in home.parents:
            continue
        kept.append(entry)
    return kept


def _system_paths() -> tuple[list[Path], list[tuple[str, str]]]:
    """(folders to bind, symlinks to make) for the dynamic loader and the C library: /usr, the
    top-level library folders (symlinks into /usr on a merged-usr system), the loader's cache."""
    binds, links = [Path("/usr")], []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append(Path(top))
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"):
        if os.path.exists(f):
            binds.append(Path(f))
    return binds, links


def _minimal(paths: Iterable[Path]) -> list[Path]:
    """`paths` resolved, existing, without those that lie under another (bound with it)."""
    resolved = sorted({Path(os.path.realpath(p)) for p in paths if os.path.exists(p)})
    kept: list[Path] = []
    for p in resolved:
        if not any(_under(p, k) for k in kept):
            kept.append(p)
    return kept


def _readable_by_others(path: Path, limit: int = 100_000) -> bool:
    """Whether uid 65534 (no group of the owner's) may read everything under `path`."""
    def ok(p: str, is_dir: bool) -> bool:
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            return True  # gone, or not ours to judge: the worker's own error says so
        if stat.S_ISLNK(mode):
            return True
        need = stat.S_IROTH | (stat.S_IXOTH if is_dir else 0)
        return mode & need == need

    if not path.is_dir():
        return ok(str(path), False)
    if not ok(str(path), True):
        return False
    seen = 0
    for folder, dirs, files in os.walk(path):
        for d in dirs:
            if not ok(os.path.join(folder, d), True):
                return False
        for f in files:
            if not ok(os.path.join(folder, f), False):
                return False
        seen += len(dirs) + len(files)
        if seen > limit:
            return False  # too many to check: copy (bounded by the tree limits of what reads it)
    return True


def _readable_copy(path: Path, stage: Path) -> Path:
    """A copy of `path` in `stage` that uid 65534 can read (links copied as links)."""
    dst = stage / f"{len(list(stage.iterdir()))}"
    if path.is_dir():
        shutil.copytree(path, dst, symlinks=True)
    else:
        shutil.copy2(path, dst)
    for folder, dirs, files in os.walk(dst):
        os.chmod(folder, 0o755)
        for f in files:
            p = os.path.join(folder, f)
            if not os.path.islink(p):
                os.chmod(p, 0o644)
    return dst


def plan_sandbox(scratch: Path, read_paths: Iterable[str | Path] = (), task: str = "replay",
                 stage: Optional[Path] = None) -> SandboxPlan:
    """What the worker for `task` may read (the interpreter, its packages, `read_paths`) and
    how it runs. As root, the worker drops to uid 65534: a read path it could not read is
    copied into `stage` (made readable) and the copy bound in its place."""
    system, links = _system_paths()
    wanted = [Path(p) for p in read_paths]
    read_only = _minimal(system + _python_paths(task) + wanted)
    scratch = Path(os.path.realpath(scratch))
    read_only = [p for p in read_only if not _under(p, scratch) and not _under(scratch, p)]
    drop = os.geteuid() == 0
    copies: dict[Path, Path] = {}
    if drop and stage is not None:
        for p in _minimal(wanted):
            if not _readable_by_others(p):
                copies[p] = _readable_copy(p, stage)
    return SandboxPlan(read_only, links, scratch, drop, copies=copies)


def sandbox_argv(bwrap: str, plan: SandboxPlan) -> list[str]:
    """bwrap's command line, up to the worker's own: an empty root with only `plan`'s paths
    bound read-only and its own files in the scratch folder writable; new namespaces (mount, pid, network,
    IPC, UTS, cgroup); a fresh /proc whose kernel settings are read-only and a minimal /dev;
    no capabilities, no new privileges, an unprivileged uid; the seccomp filter if any."""
    argv = [bwrap, "--tmpfs", "/"]
    made: set[Path] = set()

    def parents(p: Path) -> None:
        for a in reversed(p.parents):
            if a != Path("/") and a not in made:
                made.add(a)
                argv.extend(["--perms", "0755", "--dir", str(a)])

    for target, link in plan.symlinks:
        argv += ["--symlink", target, link]
    for p in plan.read_only:
        parents(p)
        argv += ["--ro-bind", str(plan.copies.get(p, p)), str(p)]
        made.add(p)
    parents(plan.scratch)
    # The scratch folder read-only but for the files the worker writes (each bound on its
    # own: it can neither make nor replace one), and a size-capped tmpfs for its TMPDIR: all
    # it can put on the host's disk is those files, each under RLIMIT_FSIZE.
    argv += ["--ro-bind", str(plan.scratch), str(plan.scratch)]
    for name in WORKER_FILES:
        argv += ["--bind", str(plan.scratch / name), str(plan.scratch / name)]
    argv += ["--perms", "01777", "--size", str(plan.tmpfs_bytes), "--tmpfs", str(plan.scratch / "tmp")]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for sub in _PROC_READ_ONLY:
        argv += ["--ro-bind-try", f"/proc/{sub}", f"/proc/{sub}"]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--chdir", str(plan.scratch)]
    if plan.seccomp_fd is not None:
        argv += ["--seccomp", str(plan.seccomp_fd)]
    if plan.drop_to_nobody:
        # A user namespace made by root maps the worker's uid to root's (bwrap writes
        # "uid 0 1"): it would still own root's files and write /proc/sys. So bwrap builds
        # the mounts as root, keeps only the capabilities to change uid, and setpriv drops
        # to 65534 with none left (and no way to gain one) before Python starts.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_SETPCAP", "--", _setpriv(), f"--reuid={NOBODY}", f"--regid={NOBODY}",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    else:  # an unprivileged caller: bwrap's own user namespace, uid 65534 inside, no more of them
        argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--disable-userns",
                 "--cap-drop", "ALL"]
    return argv + ["--"]


def _setpriv() -> str:
    found = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise SandboxUnavailable("the sandbox drops root to an unprivileged user with setpriv (util-linux), which "
                                 f"is not installed: apt-get install -y util-linux; {TRUSTED_ALTERNATIVE}")
    return found


def _package_root() -> str:
    """The folder aotpipe is imported from (the one holding aotpipe/), wherever this module sits in it."""
    return str(Path(aotpipe.__file__).resolve().parent.parent)


def _worker_env(scratch: Path, task: str) -> dict[str, str]:
    """The worker's whole environment, built from nothing: no variable of the caller's crosses
    (tokens, signing keys, proxies) but the thread and CPU-kernel settings it may have set."""
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    paths = [_package_root()]
    found = _task_code(task)
    if found is not None:
        paths.append(str(found[1]))
    paths += code_paths()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(tmp), "USER": "nobody",
           "LOGNAME": "nobody", "LANG": "C.UTF-8", "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
           # torch's caches under scratch: the fake-tensor check before a graph runs imports inductor.
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "torchinductor"), "TRITON_CACHE_DIR": str(tmp / "triton")}
    for name in PASSED_VARIABLES:
        value = os.environ.get(name)
        if value is not None and _TUNING_VALUE.fullmatch(value):
            env[name] = value
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
    data = read_regular(scratch / RESULT, MAX_RESULT_BYTES + 1)
    if data is None or len(data) > MAX_RESULT_BYTES:
        return None
    if data.count(b",") + data.count(b"[") + data.count(b"{") + data.count(b":") > MAX_RESULT_VALUES:
        return None  # more values than any answer has (counted before parsing, strings included)
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
    data = read_regular(scratch / LOG, 4096, tail=True)
    lines = [ln for ln in (data or b"").decode("utf-8", "replace").splitlines() if ln.strip()]
    return one_line(lines[-1], limit=300) if lines else ""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def run_task(task: str, args: dict[str, Any], *, limits: Optional[SandboxLimits] = None,
             read_paths: Iterable[str | Path] = ()) -> Any:
    """Run `task` on `args` (JSON data) in a sandboxed worker; returns its JSON result.

    `task`: a name in the worker's table (:data:`aotpipe.trust.sandbox.worker.TASKS`) or a
    ``module:function`` on the worker's path; chosen by the caller, never by an artefact.
    `read_paths`: the files and folders the worker reads (artefacts): nothing else of the
    host's but the interpreter and its packages is there.

    Raises the worker's user error as an AotpipeError (exit 2); a crash, a corruption the
    canaries saw, or a limit overrun as SandboxError (one line, exit 1); SandboxUnavailable
    (exit 2) when the sandbox cannot start here.
    """
    bwrap = find_bwrap()
    limits = limits or SandboxLimits.for_bytes()
    # The scratch folder sits in a folder only the caller may enter: a file the worker makes
    # setuid (its own uid, 65534) is out of every other local user's reach.
    base = Path(tempfile.mkdtemp(prefix="aotpipe-sandbox-")).resolve()
    try:
        scratch, stage = base / "scratch", base / "copies"
        scratch.mkdir()
        stage.mkdir()
        plan = plan_sandbox(scratch, read_paths, task, stage)
        plan.tmpfs_bytes = limits.tmp_bytes
        env = _worker_env(scratch, task)
        for name in WORKER_FILES:  # the only files the worker writes outside its capped tmpfs
            (scratch / name).touch(mode=0o644)
            if plan.drop_to_nobody:
                os.chown(scratch / name, NOBODY, NOBODY)
        plan.seccomp_fd, _ = seccomp_filter()
        cgroup = make_cgroup(limits.total_bytes, limits.tasks)
        # Without a cgroup, RLIMIT_NPROC bounds the tasks of uid 65534 on the host (a caller's
        # own uid in a user namespace would count all of the caller's processes: not there).
        rlimits: dict[str, Any] = {**dataclasses.asdict(limits),
                                   "nproc": int(plan.drop_to_nobody and not cgroup.procs)}
        request = SandboxRequest(protocol=PROTOCOL, task=task, args=args, limits=rlimits,
                                 byte_limits=dataclasses.asdict(current()))
        (scratch / REQUEST).write_text(json.dumps(dataclasses.asdict(request)))
        argv = sandbox_argv(bwrap, plan) + [sys.executable, "-m", "aotpipe.trust.sandbox.worker", str(scratch)]
        if cgroup.procs:  # join the cgroup before bwrap starts: everything it starts is in it
            argv = ["/bin/sh", "-c", JOIN_AND_EXEC, "sh", str(len(cgroup.procs)), *map(str, cgroup.procs)] + argv
        timed_out = False
        try:
            with open(scratch / LOG, "wb") as log:
                fds = (plan.seccomp_fd,) if plan.seccomp_fd is not None else ()
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                        pass_fds=fds)
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
            out_of_memory = cgroup.ran_out_of_memory()
        finally:
            if plan.seccomp_fd is not None:
                os.close(plan.seccomp_fd)
            cgroup.remove()
        if proc.returncode == 97 and cgroup.procs and not read_progress(scratch):
            raise SandboxUnavailable(f"the sandbox could not join its cgroup ({_last_log_line(scratch)}); "
                                     f"{TRUSTED_ALTERNATIVE}")
        return _verdict(scratch, proc.returncode, timed_out, limits, out_of_memory=out_of_memory)
    finally:
        remove_tree(base)


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it, whatever a worker left there; never raises."""
    try:
        shutil.rmtree(path)
        return
    except BaseException:  # RecursionError on a deep tree, say: the C tool has no such bound
        pass
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def confinement() -> list[str]:
    """What bounds a worker started here, one line each (docs/security.md; the tests skip
    what a missing layer cannot show)."""
    fd, seccomp = seccomp_filter()
    if fd is not None:
        os.close(fd)
    cgroup = make_cgroup(SandboxLimits.for_bytes().memory_bytes + _GIB, SandboxLimits.tasks)
    cgroup.remove()
    user = (f"uid {NOBODY} (bwrap builds the mounts as root; setpriv drops root before Python starts)"
            if os.geteuid() == 0 else f"uid {NOBODY} in bwrap's user namespace")
    return [f"bwrap: {shutil.which('bwrap') or 'not installed'}", f"runs as: {user}", seccomp, cgroup.described]


def _verdict(scratch: Path, rc: int, timed_out: bool, limits: SandboxLimits, *, out_of_memory: bool = False) -> Any:
    result = _read_result(scratch)
    doing = read_progress(scratch)
    where = doing or "before it started anything"
    if result is not None and result.during is not None:
        where = one_line(result.during, limit=300) or where
    if result is not None and result.canaries not in (None, "intact"):
        raise SandboxError(f"the graph corrupted memory outside its tensors ({result.canaries}; "
                           f"the worker was last {where})", "corrupted")
    if result is None:
        if out_of_memory:  # the cgroup's bound: the kernel killed the worker
            raise SandboxError(f"the graph ran out of the sandbox's memory ({limits.total_bytes / 1e9:.2g} GB "
                               f"in all; --max-bytes raises it) {where}", "memory")
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
