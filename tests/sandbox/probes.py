"""Test-only tasks for the sandboxed worker (named "tests.sandbox.probes:NAME" by the tests;
no artefact can name a task): they try what a hostile graph would, from inside the worker."""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import socket
from typing import Any


def escape(args: dict[str, Any], worker: Any) -> dict[str, Any]:
    """Try to write outside the scratch folder, reach the network and allocate past the
    memory limit; report what happened, and the limits in force."""
    out: dict[str, Any] = {}
    for i, target in enumerate(args["write"]):
        try:
            with open(target, "w") as f:
                f.write("escaped")
            out[f"write_{i}"] = "written"
        except OSError as e:
            out[f"write_{i}"] = errno.errorcode.get(e.errno, str(e.errno))
    with open(os.path.join(os.environ["TMPDIR"], "inside.txt"), "w") as f:
        f.write("scratch is writable")
    out["scratch_write"] = "written"
    try:
        with socket.create_connection(("127.0.0.1", args["port"]), timeout=5) as s:
            s.sendall(b"escaped")
        out["connect"] = "connected"
    except OSError as e:
        out["connect"] = errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
    import torch

    try:
        torch.empty(args["allocate"], dtype=torch.uint8)
        out["allocate"] = "allocated"
    except RuntimeError as e:
        out["allocate"] = str(e).splitlines()[0]
    out["RLIMIT_DATA"] = resource.getrlimit(resource.RLIMIT_DATA)[0]
    out["RLIMIT_AS"] = resource.getrlimit(resource.RLIMIT_AS)[0]
    out["RLIMIT_CPU"] = resource.getrlimit(resource.RLIMIT_CPU)[0]
    return out


def corrupt_canary(args: dict[str, Any], worker: Any) -> str:
    """Change one element of one canary tensor, as a stray write from a kernel would."""
    _, tensor = worker.canaries._tensors[args["which"]]
    tensor.view(-1)[args["element"]] += 1
    return "done"


def replay_with_crashing_relu(args: dict[str, Any], worker: Any) -> Any:
    """The replay task with aten.relu's CPU kernel replaced by one that dereferences NULL:
    a kernel that crashes on what a graph gave it, at a node the test knows."""
    import torch

    from aotpipe.trust.sandbox.replay import replay_task

    lib = torch.library.Library("aten", "IMPL")

    def crash(x: Any) -> Any:
        ctypes.string_at(0)

    lib.impl("relu", crash, "CPU")
    return replay_task(args, worker)


def spin(args: dict[str, Any], worker: Any) -> str:
    """Burn CPU until a limit stops the worker: a graph that never ends."""
    n = 0
    while True:
        n += 1


def noop(args: dict[str, Any], worker: Any) -> str:
    """Nothing: what a worker costs by itself (start, import torch, canaries, result)."""
    import torch  # noqa: F401 (what every real task imports)

    return "done"


def exhaust_memory(args: dict[str, Any], worker: Any) -> str:
    """Ask Python for more memory than the sandbox allows."""
    worker.mark("while allocating too much")
    return str(len(bytearray(args["bytes"])))


def _errno(action: Any) -> str:
    try:
        action()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    return "done"


def taken_over(args: dict[str, Any], worker: Any) -> dict[str, Any]:
    """What a graph that has taken its worker over could reach: kernel settings, the caller's
    secrets (files, variables, sockets), new processes and namespaces, its own privileges.
    Writes nothing it could reach: a setting is probed by opening it for appending, never written."""
    import subprocess

    out: dict[str, Any] = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
        out[k] = status.get(k, "").strip()
    for setting in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/panic", "/proc/sys/vm/drop_caches",
                    "/proc/sysrq-trigger"):
        out[setting] = _errno(lambda: open(setting, "a").close())
    for secret in args["secrets"]:
        out[secret] = _errno(lambda: open(secret, "rb").close())
    out["environ"] = sorted(os.environ)
    for i, path in enumerate(args["sockets"]):
        def connect(path: str = path) -> None:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
        out[f"socket_{i}"] = _errno(connect)
    out["fork"] = _errno(lambda: os._exit(0) if os.fork() == 0 else None)
    out["subprocess"] = _errno(lambda: subprocess.run(["/bin/true"], check=False))
    libc = ctypes.CDLL(None, use_errno=True)

    def unshare_user() -> None:
        if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), "unshare")
    out["unshare"] = _errno(unshare_user)
    out["root_entries"] = sorted(os.listdir("/"))
    return out


def big_answer(args: dict[str, Any], worker: Any) -> list[int]:
    """An answer of many small JSON values (what would cost the caller far more to parse)."""
    return [0] * args["values"]


def touch_memory(args: dict[str, Any], worker: Any) -> str:
    """Write one byte in every page of `bytes` bytes (resident, unlike a zeroed allocation)."""
    worker.mark("while touching memory")
    block = bytearray(args["bytes"])
    for i in range(0, len(block), 4096):
        block[i] = 1
    return "touched"


def fill_disk(args: dict[str, Any], worker: Any) -> dict[str, Any]:
    """Where a worker could put bytes on the host: new files and folders in its scratch
    folder, and more than its TMPDIR holds; and memory no rlimit counts."""
    scratch = os.getcwd()
    out: dict[str, Any] = {"scratch": scratch}
    out["new_file"] = _errno(lambda: open(os.path.join(scratch, "filler"), "wb").close())
    out["new_folder"] = _errno(lambda: os.mkdir(os.path.join(scratch, "d")))
    out["replace_result"] = _errno(lambda: os.rename(os.path.join(scratch, "result.json"),
                                                     os.path.join(scratch, "moved")))
    chunk = b"x" * (1 << 20)

    def fill_tmp() -> None:
        for i in range(args["tmp_files"]):
            with open(os.path.join(os.environ["TMPDIR"], f"f{i}"), "wb") as f:
                for _ in range(args["mib_per_file"]):
                    f.write(chunk)
    out["fill_tmp"] = _errno(fill_tmp)
    out["memfd"] = _errno(lambda: os.close(os.memfd_create("x")))
    return out
