"""A sandbox that assumes the worker is taken over (issue 36, round three): one worker runs
tests.sandbox.probes:taken_over, which tries what a hostile graph in control of the worker
would, and each test checks that one door is shut. Nothing on the host is changed: kernel
settings are probed by opening them for appending, secrets and sockets are fakes made here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest

import aotpipe
from aotpipe.errors import SandboxError
from aotpipe.trust.sandbox import launch
from aotpipe.trust.sandbox.launch import NOBODY, SandboxLimits, run_task

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (.ci/run installs it)")

SECRET_VARIABLES = {"AOTPIPE_SIGNING_KEY": "planted-signing-key", "GITHUB_TOKEN": "planted-token",
                    "AWS_SECRET_ACCESS_KEY": "planted-aws"}


@pytest.fixture(scope="module")
def taken_over(tmp_path_factory):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    key = home / ".ssh" / "id_ed25519"
    key.write_text("planted private key")
    key.chmod(0o600)
    world = home / "world-readable-secret.txt"  # even a file anyone may read is not there
    world.write_text("planted")
    world.chmod(0o644)
    path_socket = str(home / "agent.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path_socket)
    listener.listen(1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0aotpipe-test-abstract-socket")
    abstract.listen(1)
    from aotpipe.trust.keyring import own_key

    signing_key = str(own_key())  # the user's own key: never in a sandbox
    saved = {k: os.environ.get(k) for k in SECRET_VARIABLES}
    os.environ.update(SECRET_VARIABLES)
    try:
        out = run_task("tests.sandbox.probes:taken_over",
                       {"secrets": [str(key), str(world), signing_key, "/etc/shadow", "/etc/passwd",
                                    "/root/.bash_history"],
                        "sockets": [path_socket, "\0aotpipe-test-abstract-socket"]})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        listener.close()
        abstract.close()
    return out, key, world, signing_key


def test_kernel_settings_are_not_writable_from_the_sandbox(taken_over):
    out, *_ = taken_over
    for setting in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/panic", "/proc/sys/vm/drop_caches",
                    "/proc/sysrq-trigger"):
        assert out[setting] in ("EACCES", "EROFS", "ENOENT", "EPERM"), (setting, out[setting])


def test_the_worker_runs_unprivileged_with_no_capabilities(taken_over):
    out, *_ = taken_over
    assert (out["uid"], out["euid"], out["gid"]) == (NOBODY, NOBODY, NOBODY), out
    assert out["CapEff"] == out["CapPrm"] == out["CapAmb"] == "0000000000000000", out
    assert out["NoNewPrivs"] == "1"


def test_no_secret_file_of_the_host_is_there(taken_over):
    out, key, world, signing_key = taken_over
    for secret in (str(key), str(world), signing_key, "/etc/shadow", "/etc/passwd", "/root/.bash_history"):
        assert out[secret] == "ENOENT", (secret, out[secret])
    # an empty root: the system's libraries and what the interpreter needs, nothing else. Where the
    # checkout, the interpreter and the temporary folder live differs by machine (CI clones under
    # /check), so their top folders are read from here, not listed.
    where = {Path(p).resolve().parts[1] for p in (aotpipe.__file__, sys.prefix, sys.base_prefix,
                                                   sys.executable, tempfile.gettempdir())}
    system = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp"}
    assert set(out["root_entries"]) <= system | where, (out["root_entries"], where)
    assert "root" not in out["root_entries"] or "root" in where


def test_no_variable_of_the_callers_environment_crosses(taken_over):
    out, *_ = taken_over
    assert not set(SECRET_VARIABLES) & set(out["environ"]), out["environ"]
    allowed = {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "LANG", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
               "PYTHONNOUSERSITE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "LC_CTYPE", "PWD",
               *launch.PASSED_VARIABLES}
    assert set(out["environ"]) <= allowed, set(out["environ"]) - allowed


def test_no_socket_of_the_host_is_reachable(taken_over):
    out, *_ = taken_over
    assert out["socket_0"] == "ENOENT", out  # a path-bound socket: its folder is not there
    assert out["socket_1"] == "ECONNREFUSED", out  # an abstract one: another network namespace


def test_the_worker_cannot_start_processes_or_namespaces(taken_over):
    out, *_ = taken_over
    if out["Seccomp"] != "2":
        pytest.skip(f"no seccomp filter here ({launch.confinement()[2]})")
    assert out["fork"] == "EPERM" and out["subprocess"] == "EPERM", out
    assert out["unshare"] == "EPERM", out


@needs_bwrap
def test_an_oversized_answer_is_refused_before_it_is_parsed(monkeypatch):
    # just inside the bound: an answer of that many values is read
    monkeypatch.setattr(launch, "MAX_RESULT_VALUES", 20_000)
    assert run_task("tests.sandbox.probes:big_answer", {"values": 10_000}) == [0] * 10_000
    # just outside: no result, whatever the worker said
    with pytest.raises(SandboxError) as e:
        run_task("tests.sandbox.probes:big_answer", {"values": 20_001})
    assert str(e.value).startswith("the sandboxed worker stopped without a result"), e.value


def test_the_value_count_is_checked_before_json_parses(tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr(launch.json, "loads", lambda data: called.append(1))
    (tmp_path / "result.json").write_bytes(b"[" + b"0," * (launch.MAX_RESULT_VALUES + 1) + b"0]")
    assert launch._read_result(tmp_path) is None and not called


def test_a_read_path_nobody_may_read_is_bound_as_a_readable_copy(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the worker drops to uid 65534 only for a root caller")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "graph.json").write_text("{}")
    (private / "graph.json").chmod(0o600)
    stage = tmp_path / "stage"
    stage.mkdir()
    plan = launch.plan_sandbox(tmp_path / "scratch", [private], "replay", stage)
    copy = plan.copies[private.resolve()]
    assert copy.parent == stage and (copy / "graph.json").read_text() == "{}"
    assert launch._readable_by_others(copy)
    argv = launch.sandbox_argv("bwrap", plan)
    assert argv[argv.index(str(copy)) + 1] == str(private.resolve())
    # a readable one is bound as it is
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    assert public.resolve() not in launch.plan_sandbox(tmp_path / "scratch", [public], "replay", stage).copies


def test_the_command_line_builds_an_empty_root_and_drops_root(tmp_path):
    plan = launch.plan_sandbox(tmp_path, [], "replay", None)
    argv = launch.sandbox_argv("bwrap", plan)
    assert argv[1:3] == ["--tmpfs", "/"]
    assert ["--ro-bind", "/", "/"] not in [argv[i:i + 3] for i in range(len(argv))]
    assert "--ro-bind-try" in argv and "/proc/sys" in argv
    if os.geteuid() == 0:
        assert "--unshare-user" not in argv and f"--reuid={NOBODY}" in argv and "--bounding-set=-all" in argv
    else:
        assert "--unshare-user" in argv and "--disable-userns" in argv


@needs_bwrap
def test_the_sandbox_is_bounded_as_a_whole_where_a_cgroup_can_be_made():
    from aotpipe.trust.sandbox.confine import make_cgroup

    cg = make_cgroup(1 << 30, 64)
    try:
        if not cg.procs:
            pytest.skip("no cgroup can be made here")
        assert cg.described.startswith("a cgroup")
    finally:
        cg.remove()
    assert all(not f.exists() for f in cg.folders)
    # The worker lives in it: a task that touches more memory than the cgroup allows (its
    # rlimits far above) is killed by the kernel, and that is reported as memory.
    limits = SandboxLimits(memory_bytes=16 << 30, address_space_bytes=32 << 30, cgroup_bytes=1536 << 20)
    assert run_task("tests.sandbox.probes:touch_memory", {"bytes": 512 << 20}, limits=limits) == "touched"
    with pytest.raises(SandboxError) as e:
        run_task("tests.sandbox.probes:touch_memory", {"bytes": 3 << 30}, limits=limits)
    assert e.value.kind == "memory" and "ran out of the sandbox's memory (1.6 GB in all" in str(e.value), e.value


@pytest.mark.parametrize("name", ["result.json", "progress", "worker.log"])
def test_the_caller_follows_no_link_the_worker_leaves_in_its_scratch_folder(tmp_path, name):
    """The worker owns its scratch folder: a file there replaced by a symlink to one of the
    caller's (its signing key, say) must not be read into a result or an error line."""
    from aotpipe.trust.sandbox.launch import _verdict

    secret = tmp_path / "signing-key.pem"
    secret.write_text('{"protocol": 1, "status": "user_error", "lines": ["PLANTED-SECRET"], "canaries": "intact"}\n'
                      "PLANTED-SECRET\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / name).symlink_to(secret)
    with pytest.raises(Exception) as e:
        _verdict(scratch, 128 + 11, False, SandboxLimits.for_bytes(1 << 30))
    assert "PLANTED-SECRET" not in str(e.value), e.value
    fifo = tmp_path / "fifo-scratch"
    fifo.mkdir()
    os.mkfifo(fifo / name)  # would block an open for reading
    with pytest.raises(SandboxError):
        _verdict(fifo, 128 + 11, False, SandboxLimits.for_bytes(1 << 30))


@needs_bwrap
def test_the_worker_puts_nothing_on_the_hosts_disk_but_its_own_files():
    limits = SandboxLimits(memory_bytes=4 << 30, address_space_bytes=12 << 30, tmp_bytes=16 << 20,
                           file_bytes=64 << 20)
    out = run_task("tests.sandbox.probes:fill_disk", {"tmp_files": 3, "mib_per_file": 8}, limits=limits)
    assert out["new_file"] == out["new_folder"] == "EROFS", out  # the scratch folder is read-only to it
    assert out["replace_result"] in ("EBUSY", "EROFS"), out  # its files are mount points
    assert out["fill_tmp"] == "ENOSPC", out  # TMPDIR is a tmpfs of tmp_bytes, gone after the run
    if launch.confinement()[2].startswith("a seccomp filter"):
        assert out["memfd"] == "EPERM", out  # memory no rlimit counts


def test_the_scratch_folder_lies_in_a_folder_only_the_caller_may_enter(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(launch, "remove_tree", lambda p: seen.append((p, os.stat(p).st_mode)))
    monkeypatch.setattr(launch, "find_bwrap", lambda: "/bin/true")  # nothing runs: the layout is the point
    try:
        with pytest.raises(Exception):
            run_task("replay", {})
        (base, mode), = seen
        assert mode & 0o777 == 0o700 and (base / "scratch").is_dir()
    finally:
        for base, _ in seen:
            shutil.rmtree(base, ignore_errors=True)


def test_a_tree_too_deep_for_rmtree_is_removed_all_the_same(tmp_path):
    base = tmp_path / "deep"
    fd = os.open(tmp_path, os.O_RDONLY)
    os.mkdir("deep", dir_fd=fd)
    for _ in range(1200):  # deeper than Python's recursion limit
        nxt = os.open("deep" if _ == 0 else "d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
        os.mkdir("d", dir_fd=fd)
    os.close(fd)
    launch.remove_tree(base)
    assert not base.exists()


def test_pythonpath_entries_that_would_bind_the_callers_files_are_left_out(monkeypatch, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "relative/dir", "/", str(Path.home()), str(code)]))
    assert launch.code_paths() == [str(code)]
