"""Authenticity: `aotpipe sign` and `verify --key` (HMAC-SHA256, Ed25519), and module.py
checked against graph.json.

Unsigned `verify` catches corruption, not forgery: the forgery below (relu -> neg in
graph.json and module.py, reference outputs re-recorded, every sha256 and the manifest's
checksum recomputed) verifies and replays as "match" without a key; only the signature
catches it.
"""

import hashlib
import json
import shutil

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

import aotpipe
from aotpipe.artifact.blobs import BlobStore
from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import replay, run_graph
from aotpipe.runtime import accuracy
from aotpipe.trust.signing import check_signature
from aotpipe.trust.verify import sign_artifact, verify_artifact


@pytest.fixture()
def keys(tmp_path):
    """{hmac, private, public, other_public}: key files."""
    out = {"hmac": tmp_path / "secret.key"}
    out["hmac"].write_bytes(bytes(range(32)) * 2)
    for name in ("", "other_"):
        k = ed25519.Ed25519PrivateKey.generate()
        priv = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())
        pub = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        (tmp_path / f"{name}key.pem").write_bytes(priv)
        (tmp_path / f"{name}key.pub.pem").write_bytes(pub)
        out[f"{name}private"], out[f"{name}public"] = tmp_path / f"{name}key.pem", tmp_path / f"{name}key.pub.pem"
    return out


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _reseal(folder):
    """What a forger does after editing: every file's sha256 and the manifest checksum recomputed."""
    m = json.loads((folder / "manifest.json").read_text())
    m["files"] = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("manifest.json",
                                                                                      "signature.json")}
    (folder / "manifest.json").write_bytes(seal(m))


def _relu_to_neg(folder, *, module_py=True, rerecord=True):
    g = folder / "mlp_inference_0"
    data = json.loads((g / "graph.json").read_text())
    for n in data["nodes"]:
        if n.get("target") == "aten.relu.default":
            n["target"] = "aten.neg.default"
    (g / "graph.json").write_text(json.dumps(data))
    if module_py:
        text = (g / "module.py").read_text()
        (g / "module.py").write_text(text.replace("torch.ops.aten.relu.default", "torch.ops.aten.neg.default"))
    if rerecord:
        ga = aotpipe.load(folder).graphs["inference"]
        outs = run_graph(ga.module, ga.saved_inputs())
        rec = json.loads((g / "inputs.json").read_text())
        for out, r in zip(outs, rec["outputs"]):
            if r["blob"] is not None:
                r["blob"] = BlobStore(folder).put(out)
            if r.get("digest") is not None:  # format 2 records digests
                r["digest"], r["summary"] = accuracy.digest(out), accuracy.sampled_summary(out).model_dump()
        (g / "inputs.json").write_text(json.dumps(rec))
    _reseal(folder)


@pytest.mark.parametrize("signer,checker", [("hmac", "hmac"), ("private", "public"), ("private", "private")])
def test_signed_artefact_verifies_with_its_key(mlp_copy, keys, signer, checker):
    r = run("sign", mlp_copy.parent, "--key", keys[signer])
    assert r.exit_code == 0 and "signed  " in r.output, r.output
    assert (mlp_copy / "signature.json").is_file()
    assert check_signature(mlp_copy, keys[checker]) == []
    r = run("verify", mlp_copy.parent, "--key", keys[checker])
    assert r.exit_code == 0 and "1/1 artefacts ok" in r.output, r.output
    r = run("verify", mlp_copy.parent)  # signature.json is not an unlisted file
    assert r.exit_code == 0, r.output


def test_the_forgery_verifies_without_a_key_but_not_with_one(mlp_copy, keys):
    sign_artifact(mlp_copy, keys["private"])
    _relu_to_neg(mlp_copy)
    # Without a key, verify checks consistency: a careful forger is consistent.
    assert verify_artifact(mlp_copy) == []
    assert run("verify", mlp_copy).exit_code == 0
    (res,) = replay(mlp_copy, graphs=["inference"])
    assert res.status == "match"
    assert any(n.target.__name__ == "neg.default" for n in aotpipe.load(mlp_copy).graphs["inference"].module.graph.nodes
               if n.op == "call_function")
    # With the key it fails, one line naming signature.json.
    problems = check_signature(mlp_copy, keys["public"])
    assert len(problems) == 1 and "manifest.json was changed after it was signed" in problems[0]
    r = run("verify", mlp_copy, "--key", keys["public"])
    assert r.exit_code == 1 and "signature.json: manifest.json was changed after it was signed" in r.output


def test_re_signing_with_another_key_is_caught(mlp_copy, keys):
    sign_artifact(mlp_copy, keys["private"])
    _relu_to_neg(mlp_copy)
    sign_artifact(mlp_copy, keys["other_private"])  # the forger signs with a key of their own
    (problem,) = check_signature(mlp_copy, keys["public"])
    assert "signed with another key" in problem
    sign_artifact(mlp_copy, keys["hmac"])
    (problem,) = check_signature(mlp_copy, keys["public"])
    assert "signed with hmac-sha256, but" in problem


def test_graph_json_edited_with_module_py_left_is_caught_without_a_key(mlp_copy):
    _relu_to_neg(mlp_copy, module_py=False)
    problems = verify_artifact(mlp_copy)
    assert len(problems) == 1
    assert "mlp_inference_0/module.py:" in problems[0] and "module.py does not match graph.json" in problems[0]
    assert "aten.relu.default" in problems[0] and "aten.neg.default" in problems[0]
    r = run("verify", mlp_copy)
    assert r.exit_code == 1 and "module.py does not match graph.json" in r.output


def test_a_changed_constant_blob_reference_is_caught_without_a_key(quickstart_run, tmp_path):
    root, _ = quickstart_run
    folder = tmp_path / "small_cnn"
    shutil.copytree(root / "small_cnn", folder)
    gj = next(folder.glob("small_cnn_inference_0.*")) / "graph.json"
    data = json.loads(gj.read_text())
    a, b = [n for n in data["nodes"] if n["op"] == "get_attr"][:2]
    if (a["shape"], a["stride"]) != (b["shape"], b["stride"]):
        a["shape"], a["stride"], b["shape"], b["stride"] = b["shape"], b["stride"], a["shape"], a["stride"]
    a["blob"], b["blob"] = b["blob"], a["blob"]  # two constants swapped
    gj.write_text(json.dumps(data))
    _reseal(folder)
    problems = verify_artifact(folder)
    assert len(problems) == 1 and "constants" in problems[0] and "differ from graph.json" in problems[0]


def test_damaged_artefact_is_not_signed(mlp_copy, keys):
    (mlp_copy / "mlp_forward_0" / "module.py").write_text("# edited\n")
    with pytest.raises(ArtifactError, match="not signed, it does not verify"):
        sign_artifact(mlp_copy, keys["hmac"])
    r = run("sign", mlp_copy, "--key", keys["hmac"])
    assert r.exit_code == 1 and "FAILED" in r.output and not (mlp_copy / "signature.json").exists()


def test_unsigned_artefact_fails_verify_with_a_key(mlp_copy, keys):
    r = run("verify", mlp_copy, "--key", keys["hmac"])
    assert r.exit_code == 1 and "signature.json: missing (the artefact is not signed" in r.output


@pytest.mark.parametrize("case", ["public key signs", "short secret", "rsa key"])
def test_unusable_key_files_are_one_line_exit_2(mlp_copy, keys, tmp_path, case):
    if case == "public key signs":
        args = ["sign", mlp_copy, "--key", keys["public"]]
        needle = "a public key verifies but cannot sign"
    elif case == "short secret":
        (tmp_path / "short").write_bytes(b"password")
        args = ["verify", mlp_copy, "--key", tmp_path / "short"]
        needle = "an HMAC secret must be at least 33 bytes"
    else:
        from cryptography.hazmat.primitives.asymmetric import rsa

        k = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        (tmp_path / "rsa.pem").write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
        args = ["sign", mlp_copy, "--key", tmp_path / "rsa.pem"]
        needle = "aotpipe signs with Ed25519 keys"
    r = run(*args)
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert needle in r.output


# ---------------------------------------------------------------------------------------
# Signing at run time: `aotpipe run --key` (or AOTPIPE_SIGNING_KEY)

RUN_PIPELINE = """\
version: 1
name: s
defaults: {graphs: [inference], passes: []}
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 4, hidden: 8, depth: 1}
    inputs: [{shape: [2, 4]}]
"""


@pytest.fixture()
def signed_run(tmp_path, keys):
    p = tmp_path / "p.yaml"
    p.write_text(RUN_PIPELINE)
    out = tmp_path / "out"

    def go(key=None, env=None):
        args = ["run", str(p), "-o", str(out), "--no-progress"] + (["--key", str(key)] if key else ["--no-sign"])
        r = CliRunner().invoke(main, args, env=env or {})
        return r, out / "s" / "mlp"

    return go


def test_run_with_a_key_signs_what_it_writes_and_keeps_it_next_time(signed_run, keys):
    r, folder = signed_run(keys["private"])
    assert r.exit_code == 0, r.output
    assert check_signature(folder, keys["public"]) == []
    assert verify_artifact(folder) == []  # signature.json is not an unlisted file
    r, _ = signed_run(keys["private"])
    assert r.exit_code == 0 and "kept" in r.output, r.output


def test_the_signing_key_can_come_from_the_environment(signed_run, keys):
    r, folder = signed_run(env={"AOTPIPE_SIGNING_KEY": str(keys["hmac"])})
    assert r.exit_code == 0, r.output
    assert check_signature(folder, keys["hmac"]) == []


def test_run_with_a_key_redoes_an_unsigned_or_otherwise_signed_artefact(signed_run, keys):
    r, folder = signed_run()  # no key: unsigned
    assert r.exit_code == 0 and not (folder / "signature.json").exists()
    r, _ = signed_run(keys["private"])
    assert "kept" not in r.output and check_signature(folder, keys["public"]) == []
    r, _ = signed_run(keys["other_private"])  # another key holder: not theirs, redone
    assert "kept" not in r.output and check_signature(folder, keys["other_public"]) == []


def test_run_with_a_key_redoes_a_forged_artefact_with_the_expected_fingerprint(signed_run, keys):
    r, folder = signed_run(keys["hmac"])
    assert r.exit_code == 0, r.output
    _relu_to_neg(folder)  # files and checksum made to fit, fingerprint kept: unsigned run keeps it
    assert verify_artifact(folder) == []
    r, _ = signed_run()
    assert "kept" in r.output, r.output  # without a key, nothing tells it from the real one
    r, _ = signed_run(keys["hmac"])
    assert r.exit_code == 0 and "kept" not in r.output, r.output
    assert check_signature(folder, keys["hmac"]) == []
    gj = json.loads((folder / "mlp_inference_0" / "graph.json").read_text())
    assert "aten.neg.default" not in {n.get("target") for n in gj["nodes"]}


@pytest.mark.parametrize("which", ["public", "missing", "short"])
def test_run_with_an_unusable_signing_key_is_one_line_exit_2_before_any_work(signed_run, keys, tmp_path, which):
    key = {"public": keys["public"], "missing": tmp_path / "nope.key", "short": tmp_path / "short.key"}[which]
    if which == "short":
        key.write_bytes(b"tooshort")
    r, folder = signed_run(key)
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), r.output
    assert not folder.exists()
