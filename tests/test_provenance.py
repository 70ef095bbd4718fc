"""Trust by provenance (issue 36): what `aotpipe run` writes is signed with the user's own key,
made on first use; artefacts signed by a key the user trusts replay, bench, diff and export in
process with no flag; a colleague's unsigned copy, a stranger's signature or an edit after
signing go to the sandbox (or are refused where there is no sandboxed form)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.trust import keyring


@pytest.fixture(autouse=True)
def no_sandbox_flag(monkeypatch):
    """Nothing said about trust: the decision is the signature's alone."""
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)


@pytest.fixture()
def no_bwrap(monkeypatch, tmp_path):
    """No bwrap on PATH: whatever reaches for the sandbox fails with its install message."""
    bin_dir = tmp_path / "nobin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """The quickstart as a user runs it: signed with their own key, made on first use."""
    out = tmp_path_factory.mktemp("signed")
    r = CliRunner().invoke(main, ["run", str(Path(__file__).parent.parent / "pipelines" / "quickstart.yaml"),
                                  "-o", str(out), "--no-progress", "--only", "mlp"])
    assert r.exit_code == 0, r.output
    return out / "quickstart", r


@pytest.fixture()
def mlp_copy(quickstart_run, tmp_path):
    dst = tmp_path / "lib" / "mlp"
    shutil.copytree(quickstart_run[0] / "mlp", dst)
    return dst


def _colleague_copy(src: Path, dst: Path) -> Path:
    """The same artefact as a colleague would hand it over: unsigned."""
    shutil.copytree(src, dst)
    (dst / "signature.json").unlink()
    return dst


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_run_signs_with_the_users_own_key_made_on_first_use_owner_only(quickstart_run):
    root, _ = quickstart_run
    own = keyring.own_key(create=False)
    assert own is not None and own.parent == Path(os.environ["AOTPIPE_CONFIG_DIR"])
    assert stat.S_IMODE(own.stat().st_mode) == 0o600 and stat.S_IMODE(own.parent.stat().st_mode) == 0o700
    for model in ("mlp",):
        assert keyring.signed_key_id(root / model) == keyring.key_id(own)
        assert keyring.provenance_problems(root / model) == []


def test_a_second_first_use_keeps_the_key_it_finds(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(tmp_path / "cfg"))
    first = keyring.own_key()
    data = first.read_bytes()
    assert keyring.own_key() == first and first.read_bytes() == data


def test_the_users_own_fresh_artefact_replays_in_process_with_no_flag(quickstart_run, no_bwrap):
    root, _ = quickstart_run
    r = _invoke("replay", str(root / "mlp"), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["sandboxed"] is False and out["ok"] is True


def test_a_colleagues_unsigned_copy_goes_to_the_sandbox(quickstart_run, tmp_path, no_bwrap):
    root, _ = quickstart_run
    copy = _colleague_copy(root / "mlp", tmp_path / "mlp")
    r = _invoke("replay", str(copy))
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr, r.output
    from aotpipe.trust.sandbox.decide import trust_problems

    assert trust_problems(copy) == [f"{copy}: not signed (made elsewhere, or before aotpipe signed what it "
                                    "writes); aotpipe trust add its maker's public key, or aotpipe sign it yourself"]


def test_an_artefact_edited_after_signing_goes_to_the_sandbox(mlp_copy, no_bwrap):
    graph = mlp_copy / "mlp_inference_0" / "graph.json"
    graph.write_text(graph.read_text() + " ")
    r = _invoke("replay", str(mlp_copy))
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr, r.output
    from aotpipe.trust.sandbox.decide import trust_problems

    assert any("graph.json: sha256 differs from the manifest" in p for p in trust_problems(mlp_copy))


def test_a_strangers_key_is_trusted_once_added_and_not_after_removal(quickstart_run, tmp_path, no_bwrap, monkeypatch):
    root, _ = quickstart_run
    # the colleague: their own config folder, their own key, their signature
    colleague_cfg = tmp_path / "colleague"
    mine = os.environ["AOTPIPE_CONFIG_DIR"]
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(colleague_cfg))
    copy = _colleague_copy(root / "mlp", tmp_path / "mlp")
    assert _invoke("sign", str(copy)).exit_code == 0
    pub = tmp_path / "colleague.pub"
    assert _invoke("trust", "key", "-o", str(pub)).exit_code == 0
    assert b"PRIVATE" not in pub.read_bytes()
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", mine)
    r = _invoke("replay", str(copy))
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr, r.output
    from aotpipe.trust.sandbox.decide import trust_problems

    assert "which you do not trust" in trust_problems(copy)[0]
    r = _invoke("trust", "add", str(pub), "--name", "colleague")
    assert r.exit_code == 0 and r.output.startswith("trusted colleague (key id "), r.output
    listed = _invoke("trust", "list").stdout
    assert "(your own)" in listed and "colleague" in listed
    r = _invoke("replay", str(copy), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["sandboxed"] is False, r.output
    assert _invoke("trust", "remove", "colleague").exit_code == 0
    r = _invoke("replay", str(copy))
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr, r.output
    assert "which you do not trust" in trust_problems(copy)[0]


def test_trust_refuses_what_is_no_key_to_trust(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(64))
    r = _invoke("trust", "add", f"hmac:{secret}")
    assert r.exit_code == 2 and "an HMAC secret cannot be trusted this way" in r.output, r.output
    r = _invoke("trust", "add", str(keyring.own_key()), "--name", "../escape")
    assert r.exit_code == 2 and "a name is letters, digits" in r.output, r.output
    assert not (Path(os.environ["AOTPIPE_CONFIG_DIR"]) / "escape.pem").exists()
    r = _invoke("trust", "remove", "nobody-added-this")
    assert r.exit_code == 2 and "no trusted key named 'nobody-added-this'" in r.output, r.output


def test_run_no_sign_writes_artefacts_that_go_to_the_sandbox(tmp_path, no_bwrap):
    out = tmp_path / "out"
    r = _invoke("run", str(Path(__file__).parent.parent / "pipelines" / "quickstart.yaml"), "-o", str(out),
                "--only", "mlp", "--no-progress", "--no-sign", "--executor", "local")
    assert r.exit_code == 0, r.output
    assert not (out / "quickstart" / "mlp" / "signature.json").exists()
    r = _invoke("replay", str(out / "quickstart" / "mlp"))
    assert r.exit_code == 2 and "bubblewrap (bwrap) is not installed" in r.stderr, r.output


def test_export_pt2_runs_on_ones_own_artefact_and_refuses_a_colleagues(quickstart_run, tmp_path):
    root, _ = quickstart_run
    r = _invoke("export-pt2", str(root / "mlp"), "-o", str(tmp_path / "mlp.pt2"))
    assert r.exit_code == 0 and (tmp_path / "mlp.pt2").exists(), r.output
    copy = _colleague_copy(root / "mlp", tmp_path / "copy")
    r = _invoke("export-pt2", str(copy), "-o", str(tmp_path / "copy.pt2"))
    assert r.exit_code == 2 and "and the artefact is not signed by a key you trust" in r.output, r.output
    assert not (tmp_path / "copy.pt2").exists()


def test_bench_runs_ones_own_artefacts_and_refuses_a_colleagues(quickstart_run, tmp_path):
    root, _ = quickstart_run
    r = _invoke("bench", str(root / "mlp"), "--backend", "eager", "--graphs", "inference", "--rounds", "2",
                "--no-progress", "--json")
    assert r.exit_code == 0, r.output
    copy = _colleague_copy(root / "mlp", tmp_path / "copy")
    r = _invoke("bench", str(copy), "--backend", "eager", "--no-progress")
    assert r.exit_code == 2 and "not signed by a key you trust, so not benched" in r.output, r.output


def test_a_key_folder_others_may_write_is_refused_before_a_key_goes_there(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(shared))
    r = _invoke("trust", "key")
    assert r.exit_code == 2 and "writable by others or not yours (mode 777); chmod go-w" in r.output, r.output
    assert not (shared / "signing-key.pem").exists()
    shared.chmod(0o755)  # just inside: others may read the folder, not write it
    assert _invoke("trust", "key").exit_code == 0 and (shared / "signing-key.pem").exists()
