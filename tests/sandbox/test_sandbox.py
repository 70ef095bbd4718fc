"""The sandboxed worker: untrusted graphs run there, and what goes wrong there stays there.

Each spawn of the worker imports torch (a few seconds), so tests share spawns where they can.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import SandboxError, SandboxUnavailable
from aotpipe.trust.sandbox.launch import SandboxLimits, run_task

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (.ci/run installs it)")


@pytest.fixture(autouse=True)
def sandboxed(monkeypatch):
    """The suite replays in-process (conftest); these tests are about the sandbox."""
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)


def _hostile(src: Path, dst: Path) -> Path:
    """A copy of the mlp artefact whose inference graph reads 4 TB past a weight's storage:
    its first permute becomes a _reshape_alias with a stride of 2**40."""
    shutil.copytree(src, dst)
    path = dst / "mlp_inference_0" / "graph.json"
    graph = json.loads(path.read_text())
    node = next(n for n in graph["nodes"] if n["name"] == "permute")
    node["target"] = "aten._reshape_alias.default"
    node["args"] = [{"node": "p_layers_0_weight"}, [32, 64], [1, 2 ** 40]]
    path.write_text(json.dumps(graph))
    return dst


@needs_bwrap
def test_a_graph_that_segfaults_ends_as_one_line_and_exit_1(quickstart_run, tmp_path):
    root, _ = quickstart_run
    bad = _hostile(root / "mlp", tmp_path / "mlp")
    r = CliRunner().invoke(main, ["replay", str(bad), "--graph", "inference"])
    # This process (the caller) is still here to assert; the output is the one line.
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    if r.exit_code == 2:  # once the loader refuses the op outright: also one line, before any kernel
        assert len(lines) == 1 and "_reshape_alias" in lines[0], r.output
        return
    assert r.exit_code == 1, r.output
    assert lines == ["error: the graph crashed the sandbox: SIGSEGV in node addmm (aten.addmm.default) "
                     "of graph inference"], r.output


@needs_bwrap
def test_a_crashing_kernel_is_named_by_its_node(quickstart_run):
    root, _ = quickstart_run
    args = {"path": str(root / "mlp"), "graphs": ["inference"]}
    with pytest.raises(SandboxError) as e:
        run_task("tests.sandbox.probes:replay_with_crashing_relu", args, read_paths=[root])
    assert str(e.value) == "the graph crashed the sandbox: SIGSEGV in node relu (aten.relu.default) of graph inference"
    assert e.value.exit_code == 1 and e.value.kind == "crashed"


@needs_bwrap
def test_canary_tensors_report_a_write_outside_the_graphs_tensors():
    with pytest.raises(SandboxError) as e:
        run_task("tests.sandbox.probes:corrupt_canary", {"which": 2, "element": 5})
    assert str(e.value).startswith("the graph corrupted memory outside its tensors (1 of 5 canary tensors "
                                   "changed, first the one allocated before any graph was built, 8192 bytes;")
    assert e.value.exit_code == 1 and e.value.kind == "corrupted"


@pytest.fixture(scope="module")
def escape_attempt(tmp_path_factory):
    """One worker that tries to write outside its scratch folder, to connect to a listening
    port of this machine, and to allocate past its memory limit (limits for --max-bytes 100M)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    os.environ.pop("AOTPIPE_NO_SANDBOX", None)
    folder = tmp_path_factory.mktemp("outside")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    limits = SandboxLimits.for_bytes(100 << 20)
    targets = [str(folder / "escaped.txt"), "/escaped-from-the-sandbox.txt"]
    try:
        out = run_task("tests.sandbox.probes:escape",
                       {"write": targets, "port": listener.getsockname()[1], "allocate": 3 << 30},
                       limits=limits, read_paths=[folder])
        # the same connection from here works: the port was open all along
        with socket.create_connection(listener.getsockname(), timeout=5):
            pass
    finally:
        listener.close()
    return out, targets, limits


def test_the_worker_cannot_write_outside_its_scratch_folder(escape_attempt):
    out, targets, _ = escape_attempt
    assert out["write_0"] == "EROFS" and out["write_1"] == "EROFS", out
    assert not any(os.path.exists(t) for t in targets)
    assert out["scratch_write"] == "written"


def test_the_worker_has_no_network(escape_attempt):
    out, _, _ = escape_attempt
    assert out["connect"] in ("EAFNOSUPPORT", "ECONNREFUSED"), out  # no such socket (seccomp), or no route


def test_the_memory_limit_is_set_before_torch_and_enforced(escape_attempt):
    import torch

    out, _, limits = escape_attempt
    assert out["RLIMIT_DATA"] == limits.memory_bytes == (1 << 30) + 3 * (100 << 20)
    assert out["RLIMIT_AS"] == limits.address_space_bytes and out["RLIMIT_CPU"] == limits.cpu_seconds
    assert "can't allocate memory" in out["allocate"], out
    assert torch.empty(3 << 30, dtype=torch.uint8).numel() == 3 << 30  # here, the same allocation is fine


@needs_bwrap
def test_cpu_wall_and_memory_limits_stop_the_worker_in_one_line():
    # spin never returns: on a fast machine the worker starts in less than a second of CPU.
    with pytest.raises(SandboxError) as cpu:
        run_task("tests.sandbox.probes:spin", {}, limits=SandboxLimits.for_bytes(100 << 20, cpu_seconds=1))
    assert str(cpu.value).startswith("the graph used up the sandbox's CPU time limit of 1 s while "), cpu.value
    assert cpu.value.kind == "cpu_time"
    with pytest.raises(SandboxError) as wall:
        run_task("tests.sandbox.probes:spin", {}, limits=SandboxLimits.for_bytes(100 << 20, wall_seconds=0.5))
    assert str(wall.value).startswith("the graph ran past the sandbox's time limit of 0.5 s while "), wall.value
    assert wall.value.kind == "wall_time"
    with pytest.raises(SandboxError) as memory:
        run_task("tests.sandbox.probes:exhaust_memory", {"bytes": 3 << 30}, limits=SandboxLimits.for_bytes(100 << 20))
    assert str(memory.value) == ("the graph ran out of the sandbox's memory (1.4 GB of data; --max-bytes raises it) "
                                 "while allocating too much")
    assert memory.value.kind == "memory"


@needs_bwrap
def test_quickstart_artefacts_replay_match_through_the_sandbox(quickstart_run, monkeypatch):
    root, _ = quickstart_run
    # As after any use of inductor in the caller: its cache folder is set in the environment,
    # somewhere the sandbox cannot write; the worker's own caches must go to its scratch.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_of_the_caller")
    r = CliRunner().invoke(main, ["replay", str(root / "mlp"), "--chain", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["sandboxed"] is True and out["ok"] is True
    assert [g["status"] for g in out["graphs"]] == ["match"] * 5
    assert out["chain"]["status"] == "match"


@needs_bwrap
def test_a_user_error_in_the_worker_is_one_line_exit_2(quickstart_run):
    root, _ = quickstart_run
    r = CliRunner().invoke(main, ["replay", str(root / "mlp"), "--graph", "sideways"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        f"error: {root / 'mlp'}: no sideways graph; it has inference, forward, backward, joint, "
        "inference.freeze+fold_conv_bn+channels_last+reinplace"]


def _no_bwrap_on_path(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))


def test_missing_bwrap_is_one_line_saying_how_to_install_it(quickstart_run, monkeypatch, tmp_path):
    root, _ = quickstart_run
    _no_bwrap_on_path(monkeypatch, tmp_path)
    r = CliRunner().invoke(main, ["replay", str(root / "mlp")])
    assert r.exit_code == 2
    assert r.output.splitlines() == [
        "error: untrusted graphs run only in a sandbox, and bubblewrap (bwrap) is not installed: "
        "apt-get install -y bubblewrap (Debian/Ubuntu; dnf install bubblewrap on Fedora); or, for an artefact "
        "you trust, sign it (aotpipe sign) and pass --key KEY, or pass --no-sandbox"]
    with pytest.raises(SandboxUnavailable):
        run_task("replay", {})


def test_an_artefact_signed_by_a_trusted_key_replays_in_process(mlp_copy, monkeypatch, tmp_path):
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_bytes(b"k" * 64)
    other.write_bytes(b"o" * 64)
    assert CliRunner().invoke(main, ["sign", str(mlp_copy), "--key", str(key)]).exit_code == 0
    # No bwrap here: a replay that reached for the sandbox would fail with the install message.
    _no_bwrap_on_path(monkeypatch, tmp_path)
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--key", str(key), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["sandboxed"] is False and [g["status"] for g in out["graphs"]] == ["match"] * 5
    # another key, or a file changed after signing: the sandbox (here: its absence, reported)
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--key", str(other)])
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr
    assert f"note: not signed by {other}, so replayed in the sandbox: " in r.stderr
    graph = mlp_copy / "mlp_inference_0" / "graph.json"
    graph.write_text(graph.read_text() + " ")
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--key", str(key)])
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr
    assert "graph.json: sha256 differs from the manifest" in r.stderr


def test_progress_marks_name_each_node_and_leave_the_results_alone(tmp_path):
    import torch
    import torch.fx

    from aotpipe.trust.sandbox.progress import Progress, instrument, read

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    gm = torch.fx.symbolic_trace(M())
    x = torch.randn(4)
    expected = gm(x)
    progress = Progress(tmp_path / "progress")
    marks: list[str] = []
    orig_write = progress.write
    progress.write = lambda data: (marks.append(data[4:].decode()), orig_write(data))[1]
    instrument(gm, "inference", progress)
    assert torch.equal(gm(x), expected)
    assert marks == ["in node relu (relu) of graph inference", "in node mul (mul) of graph inference",
                     "after the last node of graph inference"]
    assert read(tmp_path / "progress") == "after the last node of graph inference"


def _scratch(tmp_path: Path, result: object = None, progress: str = "") -> Path:
    """A scratch folder as a worker leaves it: result.json (if any) and the progress file."""
    from aotpipe.trust.sandbox.progress import Progress

    tmp_path.mkdir(parents=True, exist_ok=True)
    if result is not None:
        (tmp_path / "result.json").write_text(result if isinstance(result, str) else json.dumps(result))
    if progress:
        Progress(tmp_path / "progress").mark(progress)
    return tmp_path


def test_what_the_worker_says_is_stripped_of_control_characters(tmp_path):
    from aotpipe.errors import AotpipeError
    from aotpipe.trust.sandbox.launch import _verdict

    limits = SandboxLimits.for_bytes(1 << 30)
    hostile = {"protocol": 1, "status": "user_error", "lines": ["bad \x1b[2J\x1b[1;1Hverified\x07 name"],
               "canaries": "intact"}
    with pytest.raises(AotpipeError) as e:
        _verdict(_scratch(tmp_path / "a", hostile), 0, False, limits)
    assert str(e.value) == "bad [2J [1;1Hverified name"
    with pytest.raises(SandboxError) as crash:  # a node name from graph.json, with escapes
        _verdict(_scratch(tmp_path / "b", None, "in node x\x1b]0;pwned\x07 (aten.mm.default) of graph forward"),
                 128 + 11, False, limits)
    assert str(crash.value) == ("the graph crashed the sandbox: SIGSEGV in node x ]0;pwned (aten.mm.default) "
                                "of graph forward")


def test_a_result_that_is_not_the_protocol_is_no_result(tmp_path):
    from aotpipe.trust.sandbox.launch import _verdict

    limits = SandboxLimits.for_bytes(1 << 30)
    for i, bad in enumerate(["not json", json.dumps([1, 2]), json.dumps({"status": "ok", "value": 1}),
                             "[" * 100000]):
        with pytest.raises(SandboxError) as e:
            _verdict(_scratch(tmp_path / str(i), bad, "while loading the artefact"), 0, False, limits)
        assert str(e.value) == ("the sandboxed worker stopped without a result (exit 0) while loading the "
                                "artefact"), bad


def test_a_malformed_replay_result_is_a_sandbox_error():
    from aotpipe.trust.sandbox.replay import ReplayOutcome

    with pytest.raises(SandboxError) as e:
        ReplayOutcome.from_json({"artifact": "m", "graphs": [{"kind": "inference", "status": ["x"]}]},
                                sandboxed=True)
    assert str(e.value).startswith("the sandboxed worker sent back a malformed result (")
    assert e.value.kind == "malformed"


def test_a_sandbox_that_cannot_start_is_one_line(monkeypatch, tmp_path):
    """bwrap present but refused its namespaces (no unprivileged user namespaces, say)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SandboxUnavailable) as e:
        run_task("replay", {})
    assert str(e.value) == ("the sandbox did not start (bwrap: setting up uid map: Permission denied); or, for an "
                            "artefact you trust, sign it (aotpipe sign) and pass --key KEY, or pass --no-sandbox")
    assert e.value.exit_code == 2


def test_a_crash_line_carries_what_the_c_library_said(tmp_path):
    from aotpipe.trust.sandbox.launch import _verdict

    scratch = _scratch(tmp_path, None, "in node mm (aten.mm.default) of graph forward")
    (scratch / "worker.log").write_text("some warning\nfree(): invalid pointer\n")
    with pytest.raises(SandboxError) as e:
        _verdict(scratch, 128 + 6, False, SandboxLimits.for_bytes(1 << 30))
    assert str(e.value) == ("the graph crashed the sandbox: SIGABRT in node mm (aten.mm.default) of graph forward "
                            "(free(): invalid pointer)")


@needs_bwrap
def test_cache_folders_named_by_the_callers_environment_move_into_the_scratch_folder(quickstart_run, monkeypatch):
    # torch sets TORCHINDUCTOR_CACHE_DIR in its process's environment once it has compiled
    # anything (capture does): a folder under /tmp, read-only in the sandbox.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_caller")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/triton_caller")
    root, _ = quickstart_run
    r = CliRunner().invoke(main, ["replay", str(root / "mlp"), "--graph", "inference"])
    assert r.exit_code == 0 and "Read-only file system" not in r.output, r.output
    assert r.output.split()[:2] == ["inference", "match"], r.output


def test_an_answer_the_protocol_does_not_describe_is_no_answer(tmp_path):
    """result.json is read as a SandboxResult (sandbox/protocol.py): a key it does not name, a
    field of the wrong type or a status it does not know make it no result at all."""
    from aotpipe.trust.sandbox.launch import _verdict

    limits = SandboxLimits.for_bytes(1 << 30)
    good = {"protocol": 1, "status": "ok", "value": {"graphs": [1]}, "canaries": "intact"}
    assert _verdict(_scratch(tmp_path / "good", good), 0, False, limits) == {"graphs": [1]}
    for i, bad in enumerate([{**good, "shell": "echo planted"}, {**good, "during": ["in node x"]},
                             {**good, "status": "done"}, {**good, "lines": [1, 2]}]):
        with pytest.raises(SandboxError) as e:
            _verdict(_scratch(tmp_path / str(i), bad, "while loading the artefact"), 0, False, limits)
        assert str(e.value) == ("the sandboxed worker stopped without a result (exit 0) while loading the "
                                "artefact"), bad
