"""What bounds a sandboxed worker besides bwrap's namespaces: a seccomp filter and a cgroup.

- :func:`seccomp_filter`: a BPF program (built with libseccomp through ``pyseccomp``) that
  allows every system call but the ones a replay never needs and an attacker would: new
  processes (``fork``, ``vfork``, a ``clone`` that is not a thread), namespaces and mounts,
  tracing other processes, loading kernel code or BPF, keyrings, ``userfaultfd``,
  ``io_uring``, injecting terminal input, memory no rlimit counts (``memfd_create``, System V
  and POSIX shared memory), and sockets of any family but ``AF_UNIX``. One
  process per sandbox is what makes its per-process rlimits a bound for the whole sandbox.
- :class:`Cgroup`: where the machine lets this process make one (cgroup v2, or v1's
  ``memory`` and ``pids`` hierarchies), one memory and task bound for everything the
  worker and its threads do, and the kernel's word on whether it ran out of memory.

Both are best-effort by design: where neither exists, the worker's rlimits still hold per
process, and :func:`describe` says what is in force (``docs/security.md``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# System calls refused with EPERM (names unknown to this kernel's libseccomp are left out).
DENIED = (
    # new processes: a sandbox is one process and its threads (clone is refused below unless
    # it makes a thread; clone3 answers ENOSYS so that the C library falls back to clone)
    "fork", "vfork",
    # namespaces, mounts, root changes
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # other processes and the kernel's insides
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "perf_event_open", "bpf", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
    "acct", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "quotactl", "quotactl_fd",
    "lookup_dcookie", "open_by_handle_at", "name_to_handle_at", "uselib", "ustat", "sysfs", "vhangup", "iopl",
    "ioperm", "nfsservctl", "sethostname", "setdomainname", "fanotify_init", "personality",
    "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # memory no rlimit counts (a memfd's pages, System V and POSIX shared memory), and rarely
    # used kernel surface
    "memfd_create", "memfd_secret", "shmget", "shmat", "mq_open", "modify_ldt",
)
CLONE_THREAD = 0x00010000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # push bytes into a terminal's input; console tricks
AF_UNIX = 1


def seccomp_filter() -> tuple[Optional[int], str]:
    """(a file descriptor open on the compiled filter, for ``bwrap --seccomp``, or None; what
    is in force, in words). None where libseccomp or pyseccomp is missing."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # OSError: pyseccomp found no libseccomp.so.2
        return None, f"no seccomp filter ({type(e).__name__}: libseccomp and pyseccomp are needed)"
    f = sc.SyscallFilter(sc.ALLOW)
    # A call through another architecture's entry (x32, i386's int 0x80) kills the whole
    # worker, not one thread (the others would keep it alive until the wall-clock limit).
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(1)
    for name in DENIED:
        try:
            f.add_rule(eperm, name)
        except (ValueError, RuntimeError, OSError):  # not a system call on this architecture
            continue
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(38), "clone3")  # ENOSYS: the C library then uses clone, filtered above
    for request in (TIOCSTI, TIOCLINUX):  # the kernel reads the request's low 32 bits only
        f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    f.add_rule(sc.ERRNO(97), "socket", sc.Arg(0, sc.NE, AF_UNIX))  # EAFNOSUPPORT
    fd, path = tempfile.mkstemp(prefix="aotpipe-seccomp-")
    os.unlink(path)
    with os.fdopen(os.dup(fd), "wb") as out:
        f.export_bpf(out)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, "a seccomp filter (one process, no namespaces, mounts, tracing or kernel loading)"


@dataclass
class Cgroup:
    """A cgroup of its own for one sandbox: `procs` are the files a process writes its pid to
    in order to join (all of them), `folders` what to remove afterwards."""

    procs: list[Path] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    memory_events: Optional[Path] = None  # v2 memory.events, or v1 memory.oom_control
    described: str = "no cgroup (rlimits per process only)"

    def ran_out_of_memory(self) -> bool:
        """Whether the kernel killed something in this cgroup for want of memory."""
        if self.memory_events is None:
            return False
        try:
            text = self.memory_events.read_text()
        except OSError:
            return False
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("oom_kill", "oom") and value.strip().isdigit() and int(value) > 0:
                return True
        return False

    def remove(self) -> None:
        for folder in reversed(self.folders):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def _own_path(hierarchy: str) -> str:
    """This process's cgroup path in `hierarchy` ("" for v2), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (hierarchy == "" and controllers == "") or hierarchy in controllers.split(","):
            return path
    return "/"


def _make(base: Path, name: str) -> Optional[Path]:
    folder = base / name
    try:
        folder.mkdir()
    except OSError:
        return None
    return folder


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def make_cgroup(memory_bytes: int, tasks: int, root: Path = Path("/sys/fs/cgroup")) -> Cgroup:
    """A cgroup that caps memory at `memory_bytes` and tasks (threads included) at `tasks`,
    where this process may make one; else an empty Cgroup (nothing to join)."""
    name = f"aotpipe-sandbox-{os.getpid()}-{os.urandom(4).hex()}"
    # cgroup v2: the unified hierarchy at the root, with both controllers offered to children
    if (root / "cgroup.controllers").exists():
        base = root / _own_path("").lstrip("/")
        folder = _make(base, name)
        if folder is not None:
            cg = Cgroup(folders=[folder])
            offered = (folder / "cgroup.controllers").read_text().split() if (folder / "cgroup.controllers").exists() else []
            if {"memory", "pids"} <= set(offered) and _write(folder / "memory.max", str(memory_bytes)) \
                    and _write(folder / "pids.max", str(tasks)):
                _write(folder / "memory.swap.max", "0")
                cg.procs = [folder / "cgroup.procs"]
                cg.memory_events = folder / "memory.events"
                cg.described = f"a cgroup (v2): {memory_bytes / 2 ** 30:.3g} GiB and {tasks} tasks in all"
                return cg
            cg.remove()
        return Cgroup()
    # cgroup v1: one hierarchy per controller
    memory, pids = root / "memory" / _own_path("memory").lstrip("/"), root / "pids" / _own_path("pids").lstrip("/")
    if not (memory / "memory.limit_in_bytes").exists() or not (pids / "cgroup.procs").exists():
        return Cgroup()
    mfolder = _make(memory, name)
    pfolder = _make(pids, name)
    cg = Cgroup(folders=[f for f in (mfolder, pfolder) if f is not None])
    if mfolder is None or pfolder is None or not _write(mfolder / "memory.limit_in_bytes", str(memory_bytes)) \
            or not _write(pfolder / "pids.max", str(tasks)):
        cg.remove()
        return Cgroup()
    _write(mfolder / "memory.memsw.limit_in_bytes", str(memory_bytes))  # no swap either, where accounted
    cg.procs = [mfolder / "cgroup.procs", pfolder / "cgroup.procs"]
    cg.memory_events = mfolder / "memory.oom_control"
    cg.described = f"a cgroup (v1 memory and pids): {memory_bytes / 2 ** 30:.3g} GiB and {tasks} tasks in all"
    return cg


# Run by /bin/sh before bwrap: join each cgroup named (its first N arguments), then become bwrap.
JOIN_AND_EXEC = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n-1)); done; exec "$@"'
