"""One decision for every command that runs an artefact's graphs: in this process, or in the sandbox.

replay, bench, diff and export-pt2 run graphs in this process only with --no-sandbox, or when
EVERY artefact they run is signed by --key (or, without one, by a key the user trusts) and
unchanged since. The audit found `diff --key` with only one side signed could run the unsigned
side's graphs in process with no test failing: each command is pinned here from the command
line with both sides signed, one, none, with and without --no-sandbox. What runs the graphs is
replaced by a stand-in that says where it was called, so no graph runs and no sandbox starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from aotpipe.cli import main
from aotpipe.errors import AotpipeError
from aotpipe.format.folders import model_folder
from aotpipe.trust import keyring
from aotpipe.trust.sandbox.decide import SandboxDecision, decide_sandbox, trust_problems
from aotpipe.trust.signing import load_key, manifest_bytes, signature_record

DATA = Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp"
SIDES = ["both", "only A", "only B", "none"]


@pytest.fixture(autouse=True)
def nothing_said(monkeypatch, tmp_path):
    """No $AOTPIPE_NO_SANDBOX (the suite sets it), and a config folder of the test's own."""
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(tmp_path / "config"))


def _key_pair(folder: Path, name: str, seed: int) -> tuple[Path, Path]:
    k = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    public.write_bytes(k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture()
def keys(tmp_path):
    """{"private", "public", "other_private", "other_public"}: two Ed25519 key pairs."""
    folder = tmp_path / "keys"
    folder.mkdir()
    (priv, pub), (opriv, opub) = _key_pair(folder, "mine", 1), _key_pair(folder, "other", 2)
    return {"private": priv, "public": pub, "other_private": opriv, "other_public": opub}


def _artefact(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name / "mlp"
    shutil.copytree(DATA, dst)
    return dst


def _sign(folder: Path, private: Path) -> Path:
    (folder / "signature.json").write_bytes(signature_record(manifest_bytes(folder),
                                                             load_key(private, for_signing=True)))
    return folder


@pytest.fixture()
def pair(tmp_path, keys):
    """(A, B): two copies of one artefact, signed as a case says."""
    def make(which: str) -> tuple[Path, Path]:
        a, b = _artefact(tmp_path, "a"), _artefact(tmp_path, "b")
        if which in ("both", "only A"):
            _sign(a, keys["private"])
        if which in ("both", "only B"):
            _sign(b, keys["private"])
        return a, b
    return make


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


class Ran(AotpipeError):
    """What a stand-in raises: the command reached the code that runs graphs, here."""


@pytest.fixture()
def where(monkeypatch):
    """Stand-ins for what runs graphs: each records where it ran ("in process", "sandbox") and stops."""
    ran: list[str] = []

    def stand_in(label):
        def call(*args, **kwargs):
            ran.append(label)
            raise Ran(f"stand-in: {label}")
        return call

    monkeypatch.setattr("aotpipe.cli.replay_outcome", stand_in("in process"))
    monkeypatch.setattr("aotpipe.cli.replay_sandboxed", stand_in("sandbox"))
    monkeypatch.setattr("aotpipe.corpus.diff.values.compare_values", stand_in("in process"))
    monkeypatch.setattr("aotpipe.corpus.diff.values.compare_values_sandboxed", stand_in("sandbox"))
    monkeypatch.setattr("aotpipe.corpus.bench.run.plan", stand_in("in process"))
    monkeypatch.setattr("aotpipe.corpus.pt2_program.export_pt2", stand_in("in process"))
    return ran


# ---------------------------------------------------------------------------------------
# The decision itself

def test_no_sandbox_decides_without_reading_the_key_or_the_artefacts(tmp_path):
    d = decide_sandbox([tmp_path / "nowhere"], key=str(tmp_path / "no-such.key"), no_sandbox=True)
    assert d == SandboxDecision(True) and d.untrusted == () and d.why is None


@pytest.mark.parametrize("which", SIDES)
def test_every_artefact_must_be_trusted_to_run_in_process(pair, keys, which):
    a, b = pair(which)
    d = decide_sandbox([a, b], key=str(keys["public"]), no_sandbox=False)
    assert d.in_process is (which == "both")
    untrusted = [p for p, _ in d.untrusted]
    assert untrusted == [p for p, signed in ((a, "A"), (b, "B")) if which not in ("both", f"only {signed}")]
    if untrusted:
        assert d.why == d.untrusted[0][1] and "signature.json: missing" in d.why
    else:
        assert d.why is None


def test_a_bad_key_file_is_the_users_error_unless_no_sandbox(pair, tmp_path):
    a, _ = pair("none")
    short = tmp_path / "short.key"
    short.write_bytes(b"password")
    with pytest.raises(AotpipeError, match="an HMAC secret must be at least 33 bytes"):
        decide_sandbox([a], key=str(short), no_sandbox=False)
    assert decide_sandbox([a], key=str(short), no_sandbox=True).in_process


def test_a_graph_folder_is_judged_by_its_model_folder(pair, keys):
    a, _ = pair("only A")
    graph = a / "mlp_inference_0"
    assert model_folder(graph) == a and model_folder(a) == a
    assert trust_problems(graph, str(keys["public"])) == []
    (graph / "graph.json").write_bytes((graph / "graph.json").read_bytes() + b" ")
    (problem,) = trust_problems(graph, str(keys["public"]))
    assert problem.startswith(str(graph / "graph.json")) and "sha256 differs from the manifest" in problem


def test_a_folder_with_both_graph_json_and_manifest_json_is_its_own_model_folder(tmp_path):
    (tmp_path / "graph.json").write_text("{}")
    (tmp_path / "manifest.json").write_text("{}")
    assert model_folder(tmp_path) == tmp_path
    assert model_folder(tmp_path / "elsewhere") == tmp_path / "elsewhere"


# ---------------------------------------------------------------------------------------
# replay

@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("no_sandbox", [False, True])
def test_replay_runs_in_process_only_if_signed_by_key_or_no_sandbox(tmp_path, keys, where, signed, no_sandbox):
    a = _artefact(tmp_path, "a")
    if signed:
        _sign(a, keys["private"])
    r = cli("replay", a, "--key", keys["public"], *(["--no-sandbox"] if no_sandbox else []))
    expected = "in process" if signed or no_sandbox else "sandbox"
    assert where == [expected], r.output
    assert f"stand-in: {expected}" in r.output
    noted = f"note: not signed by {keys['public']}, so replayed in the sandbox: {a / 'signature.json'}: missing"
    assert (noted in r.output) is (expected == "sandbox"), r.output


def test_replay_of_an_artefact_signed_by_another_key_goes_to_the_sandbox(tmp_path, keys, where):
    a = _sign(_artefact(tmp_path, "a"), keys["other_private"])
    r = cli("replay", a, "--key", keys["public"])
    assert where == ["sandbox"] and "signed with another key" in r.output, r.output


def test_no_sandbox_from_the_environment_counts_as_the_flag(tmp_path, keys, where, monkeypatch):
    a = _artefact(tmp_path, "a")
    monkeypatch.setenv("AOTPIPE_NO_SANDBOX", "1")
    cli("replay", a)
    assert where == ["in process"]


def test_replay_without_key_trusts_the_users_own_key_and_says_nothing(tmp_path, where):
    a = _sign(_artefact(tmp_path, "a"), keyring.own_key())
    r = cli("replay", a)
    assert where == ["in process"], r.output
    b = _artefact(tmp_path, "b")
    r = cli("replay", b)
    assert where == ["in process", "sandbox"] and "note:" not in r.output, r.output


# ---------------------------------------------------------------------------------------
# diff: both sides, or the sandbox

@pytest.mark.parametrize("which", SIDES)
@pytest.mark.parametrize("no_sandbox", [False, True])
def test_diff_runs_in_process_only_if_both_sides_are_signed_or_no_sandbox(pair, keys, where, which, no_sandbox):
    a, b = pair(which)
    r = cli("diff", a, b, "--key", keys["public"], *(["--no-sandbox"] if no_sandbox else []))
    expected = "in process" if which == "both" or no_sandbox else "sandbox"
    assert where == [expected], r.output
    assert f"values not compared: stand-in: {expected}" in r.output, r.output
    unsigned = a if which in ("only B", "none") else b
    noted = f"not both signed by {keys['public']}, so their graphs ran in the sandbox: {unsigned / 'signature.json'}"
    assert (noted in r.output) is (expected == "sandbox"), r.output


def test_diff_with_one_side_edited_after_signing_goes_to_the_sandbox(pair, keys, where):
    a, b = pair("both")
    (b / "stray.txt").write_text("added after signing")
    r = cli("diff", a, b, "--key", keys["public"])
    assert where == ["sandbox"] and f"{b / 'stray.txt'}: not listed in the manifest" in r.output, r.output


# ---------------------------------------------------------------------------------------
# bench: no sandboxed form, so an untrusted artefact is refused

@pytest.mark.parametrize("which", SIDES)
@pytest.mark.parametrize("no_sandbox", [False, True])
def test_bench_runs_only_if_every_artefact_is_signed_or_no_sandbox(pair, keys, where, which, no_sandbox):
    a, b = pair(which)
    r = cli("bench", a.parent, b.parent, "--backend", "eager", "--no-progress", "--key", keys["public"],
            *(["--no-sandbox"] if no_sandbox else []))
    if which == "both" or no_sandbox:
        assert where == ["in process"] and r.exit_code == 2 and "stand-in: in process" in r.output, r.output
        return
    assert where == [] and r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: not signed by {keys['public']}, so not benched"), r.output
    unsigned = [label for label, signed in (("a/mlp", "A"), ("b/mlp", "B")) if which not in ("both", f"only {signed}")]
    assert f"sandbox): {unsigned[0]}: " in lines[0], r.output
    assert (" (and 1 more);" in lines[0]) is (len(unsigned) == 2), r.output


def test_bench_without_key_names_a_key_you_trust(pair, where):
    a, _ = pair("none")
    r = cli("bench", a, "--backend", "eager", "--no-progress")
    assert where == [] and "error: not signed by a key you trust, so not benched" in r.output, r.output


# ---------------------------------------------------------------------------------------
# export-pt2: no sandboxed form either

@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("no_sandbox", [False, True])
def test_export_pt2_runs_only_if_signed_by_key_or_no_sandbox(tmp_path, keys, where, signed, no_sandbox):
    a = _artefact(tmp_path, "a")
    if signed:
        _sign(a, keys["private"])
    r = cli("export-pt2", a, "-o", tmp_path / "out.pt2", "--key", keys["public"],
            *(["--no-sandbox"] if no_sandbox else []))
    assert r.exit_code == 2, r.output
    if signed or no_sandbox:
        assert where == ["in process"] and "stand-in: in process" in r.output, r.output
    else:
        assert where == [], r.output
        assert (f"error: not exported (export-pt2 runs the graph in this process, and the artefact is not signed by "
                f"{keys['public']}): {a / 'signature.json'}: missing") in r.output, r.output
        assert r.output.rstrip().endswith("; or --no-sandbox if you otherwise trust it"), r.output


def test_export_pt2_without_key_names_a_key_you_trust(tmp_path, where):
    a = _artefact(tmp_path, "a")
    r = cli("export-pt2", a, "-o", tmp_path / "out.pt2")
    assert where == [] and "the artefact is not signed by a key you trust): " in r.output, r.output
