"""Determinism, incremental runs, tamper detection (`aotpipe verify`) and bad output folders."""

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from aotpipe.cli import main
from tests.conftest import PIPELINES, REPO

SMALL = textwrap.dedent("""
    version: 1
    name: small
    models:
      - {name: a, source: aotpipe.zoo:mlp, args: {in_features: 8, hidden: 8}, inputs: [{shape: [2, 8]}]}
      - {name: b, source: aotpipe.zoo:running_norm, args: {features: 4}, inputs: [{shape: [2, 4]}]}
""")


def _hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in ("run.json", "report.md", "report.html")}


def _run(args, **kw):
    # In this process: some tests patch aotpipe's own functions, which worker processes would not see.
    return CliRunner().invoke(main, ["run", *map(str, args), "--no-progress", "--executor", "local"], **kw)


# --- determinism -------------------------------------------------------------------------


def test_two_runs_in_two_processes_are_byte_identical(quickstart_run, tmp_path):
    root, _ = quickstart_run
    other = tmp_path / "other"
    # like with like: the session's run is unsigned (conftest); signed runs differ only in
    # signature.json, deterministic for one key (Ed25519), below
    r = subprocess.run([sys.executable, "-m", "aotpipe.cli", "run", str(PIPELINES / "quickstart.yaml"), "-o", str(other),
                        "--no-progress", "--no-sign"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = _hashes(root), _hashes(other / "quickstart")
    assert len(a) > 60 and a == b
    from aotpipe.trust.keyring import own_key
    from aotpipe.trust.verify import sign_artifact

    for tree in (root, other / "quickstart"):
        shutil.copytree(tree / "mlp", tmp_path / "signed" / str(len(list((tmp_path).glob("signed/*")))))
    first, second = sorted((tmp_path / "signed").iterdir())
    for folder in (first, second):
        sign_artifact(folder, str(own_key()))
    assert (first / "signature.json").read_bytes() == (second / "signature.json").read_bytes()


def test_artefacts_hold_no_absolute_paths_hostnames_or_times(quickstart_run):
    import platform

    root, _ = quickstart_run
    host = platform.node()
    for p in root.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".py") and p.name not in ("run.json",):
            text = p.read_text()
            assert str(root) not in text and str(REPO) not in text and "/tmp/" not in text, p
            # as a word: the recorded CPU flags hold "vme", which a host named "vm" is not in
            assert not host or not re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", text), p


def test_torch_messages_quoting_the_model_file_keep_no_absolute_path(tmp_path):
    """sign_branch falls back from export to dynamo; torch's message and the graph break
    quote the model's file ("... at /abs/checkout/aotpipe/models/zoo.py:199"). Manifest, run.json
    and report.md name it by import name, so two checkouts write the same manifest."""
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent("""
        version: 1
        name: branchy
        models:
          - {name: sb, source: aotpipe.zoo:sign_branch, inputs: [{shape: [4, 16]}]}
    """))
    assert _run([p, "-o", tmp_path / "out"]).exit_code == 0
    root = tmp_path / "out" / "branchy"
    manifest = json.loads((root / "sb" / "manifest.json").read_text())
    assert "aotpipe/models/zoo.py:" in manifest["capture"]["fallback"], manifest["capture"]["fallback"]
    assert any("aotpipe/models/zoo.py:" in n for n in manifest["capture"]["notes"])
    for f in (root / "sb" / "manifest.json", root / "run.json", root / "report.md"):
        text = f.read_text()
        assert str(REPO) not in text and str(tmp_path) not in text, f


def test_absolute_py_paths_in_messages_are_named_by_import_name():
    from aotpipe.format.source_files import name_files_in

    text = f"guard Eq(u0, 1) at {REPO}/aotpipe/models/zoo.py:199 (`if x.sum() > 0:`); see /nowhere/x/y/net.py, line 3"
    assert name_files_in(text) == "guard Eq(u0, 1) at aotpipe/models/zoo.py:199 (`if x.sum() > 0:`); see net.py, line 3"
    assert name_files_in("aotpipe/models/zoo.py:1 and a/b.pyc and u0/2") == "aotpipe/models/zoo.py:1 and a/b.pyc and u0/2"


# --- incremental runs --------------------------------------------------------------------


def test_unchanged_models_are_kept_changed_ones_redone(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    out = tmp_path / "out"
    assert _run([p, "-o", out]).exit_code == 0
    before = _hashes(out / "small")
    r = _run([p, "-o", out, "--json"])
    run = json.loads(r.output)
    assert [m["skipped"] for m in run["models"]] == [True, True]
    assert _hashes(out / "small") == before
    # change one model's args: only that model is redone
    p.write_text(SMALL.replace("hidden: 8", "hidden: 6"))
    run = json.loads(_run([p, "-o", out, "--json"]).output)
    assert {m["name"]: m["skipped"] for m in run["models"]} == {"a": False, "b": True}
    # --force redoes everything
    run = json.loads(_run([p, "-o", out, "--json", "--force"]).output)
    assert [m["skipped"] for m in run["models"]] == [False, False]


def test_report_and_cli_say_up_to_date(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    out = tmp_path / "out"
    _run([p, "-o", out])
    r = _run([p, "-o", out])
    assert "kept    a" in r.output and "up to date" in r.output
    assert "| a | up to date |" in (out / "small" / "report.md").read_text()


def test_changed_source_file_redoes_its_models(tmp_path):
    (tmp_path / "mine.py").write_text("import torch\ndef lin():\n    return torch.nn.Linear(3, 2)\n")
    p = tmp_path / "p.yaml"
    p.write_text(SMALL + "  - {name: c, source: mine:lin, inputs: [{shape: [1, 3]}]}\n")
    out = tmp_path / "out"
    assert _run([p, "-o", out]).exit_code == 0
    (tmp_path / "mine.py").write_text("import torch\ndef lin():\n    return torch.nn.Linear(3, 2)  # edited\n")
    run = json.loads(_run([p, "-o", out, "--json"]).output)
    assert {m["name"]: m["skipped"] for m in run["models"]} == {"a": True, "b": True, "c": False}


def test_tampered_or_incomplete_artefact_is_redone(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    out = tmp_path / "out"
    _run([p, "-o", out])
    (out / "small" / "a" / "a_inference_0" / "module.py").write_text("# edited\n")
    shutil.rmtree(out / "small" / "b" / "b_joint_0")
    run = json.loads(_run([p, "-o", out, "--json"]).output)
    assert [m["skipped"] for m in run["models"]] == [False, False]
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0, r.output


# --- aotpipe verify ----------------------------------------------------------------------


def _mutations(path: Path):
    data = path.read_bytes()
    n = len(data)
    for pos in sorted({0, n // 3, n // 2, n - 1}):
        flipped = bytearray(data)
        flipped[pos] ^= 0x20 if 0x41 <= flipped[pos] < 0x7F else 0x01
        yield f"flip byte {pos}", bytes(flipped)
    yield "truncate to half", data[: n // 2]
    yield "truncate to 0", b""
    yield "delete", None


def test_verify_catches_every_flipped_byte_truncation_and_deletion(quickstart_run, tmp_path):
    root, _ = quickstart_run
    model = tmp_path / "running_norm"
    shutil.copytree(root / "running_norm", model)
    assert CliRunner().invoke(main, ["verify", str(model)]).exit_code == 0
    kinds = {
        "manifest": model / "manifest.json",
        "graph.json": model / "running_norm_forward_0" / "graph.json",
        "module.py": model / "running_norm_forward_0" / "module.py",
        ".input": model / "running_norm_joint_0" / "running_norm_joint_0.input",
        "inputs.json": model / "running_norm_backward_0" / "inputs.json",
        "trace.json": model / "running_norm_inference_0" / "trace.json",
        "blob": sorted((model / "blobs").iterdir())[0],
    }
    tried = 0
    for kind, path in kinds.items():
        original = path.read_bytes()
        for what, data in _mutations(path):
            if data is None:
                path.unlink()
            else:
                path.write_bytes(data)
            r = CliRunner().invoke(main, ["verify", str(model)])
            assert r.exit_code == 1, (kind, what)
            assert path.name in r.output, (kind, what, r.output)
            path.write_bytes(original)
            tried += 1
    assert tried == 7 * 7
    (model / "running_norm_forward_0" / "extra.txt").write_text("hi")
    r = CliRunner().invoke(main, ["verify", str(model)])
    assert r.exit_code == 1 and "extra.txt: not listed in the manifest" in r.output


def test_verify_reports_a_folder_without_manifest_as_incomplete(quickstart_run, tmp_path):
    root, _ = quickstart_run
    shutil.copytree(root / "mlp", tmp_path / "q" / "mlp")
    (tmp_path / "q" / "mlp" / "manifest.json").unlink()
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "q")])
    assert r.exit_code == 1 and "incomplete artefact" in r.output


# --- bad conditions ----------------------------------------------------------------------


def test_disk_full_fails_clearly_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    import aotpipe.artifact.fsio as fsio
    import aotpipe.artifact.writer as writer

    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    out = tmp_path / "out"
    assert _run([p, "-o", out]).exit_code == 0
    before = _hashes(out / "small")
    written = [0]
    real = fsio.write_durable

    def full_after_some_bytes(path, data):
        written[0] += len(data)
        if written[0] > 20_000:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(fsio, "write_durable", full_after_some_bytes)
    monkeypatch.setattr(writer, "_write", full_after_some_bytes)
    r = _run([p, "-o", out, "--force"])
    assert r.exit_code == 1
    assert "no space left on the device" in r.output and "Traceback" not in r.output
    assert _hashes(out / "small") == before  # the earlier artefacts are intact
    assert not [q for q in (out / "small").iterdir() if q.name.startswith(".")]


def test_read_only_output_folder_is_a_clear_error(tmp_path, monkeypatch):
    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:
        # root writes through permission bits: make the folder refuse writes the way a
        # read-only mount would.
        real_mkdir = Path.mkdir

        def mkdir(self, *a, **k):
            if str(self).startswith(str(ro)):
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            return real_mkdir(self, *a, **k)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    r = _run([p, "-o", ro])
    assert r.exit_code == 2
    assert "cannot write" in r.output and str(ro) in r.output and "--output" in r.output
    assert "Traceback" not in r.output
    ro.chmod(0o755)
    assert list(ro.iterdir()) == []


def test_paths_with_spaces_and_non_ascii_names(tmp_path):
    d = tmp_path / "my pipelines" / "ünïcødé 模型"
    d.mkdir(parents=True)
    p = d / "pipe line.yaml"
    p.write_text(SMALL)
    out = d / "out put"
    r = _run([p, "-o", out])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0 and "2/2 artefacts ok" in r.output
    r = CliRunner().invoke(main, ["replay", str(out / "small" / "a")])
    assert r.exit_code == 0


def test_unrelated_files_in_the_output_folder_are_left_alone(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(SMALL)
    out = tmp_path / "out"
    (out / "small" / "notes").mkdir(parents=True)
    (out / "small" / "notes" / "todo.txt").write_text("mine")
    (out / "small" / "README").write_text("mine too")
    assert _run([p, "-o", out]).exit_code == 0
    assert _run([p, "-o", out, "--force"]).exit_code == 0
    assert (out / "small" / "notes" / "todo.txt").read_text() == "mine"
    assert (out / "small" / "README").read_text() == "mine too"
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0, r.output
