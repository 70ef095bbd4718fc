"""Trust decisions at their edges: key encodings read or refused (and named) exactly, key files
parsed strictly, the raw forms only with ``ed25519:``, a signature's record and its messages,
and what verify passes on (trust_ops) or reports (a walk over its limit, a loader's bug).

Fast: key files written here and a small artefact copied from tests/data, no pipeline run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format import limits
from aotpipe.format.limits import Breach
from aotpipe.trust.signing import (
    SigningKey,
    check_signature,
    load_key,
    manifest_bytes,
    signature_record,
    split_key_spec,
)
from aotpipe.trust.verify import verify_artifact, verify_tree

DATA = Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp"
PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([3]) * 32)
PUBLIC = PRIVATE.public_key()
RAW = PUBLIC.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
KEY_ID = hashlib.sha256(RAW).hexdigest()[:16]
SPKI_DER = PUBLIC.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
PKCS8_DER = PRIVATE.private_bytes(ser.Encoding.DER, ser.PrivateFormat.PKCS8, ser.NoEncryption())


@pytest.fixture()
def art(tmp_path):
    dst = tmp_path / "lib" / "mlp"
    shutil.copytree(DATA, dst)
    return dst


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _refused_as(path: Path) -> str:
    with pytest.raises(AotpipeError) as e:
        load_key(f"hmac:{path}")
    return str(e.value)


# ---------------------------------------------------------------------------------------
# Key files: what each encoding is named, what is read, what is a secret

@pytest.mark.parametrize("data,what", [
    (SPKI_DER, "a DER public key"),                                   # binary: no "(how)" after it
    (PKCS8_DER, "a DER private key"),
    (base64.b64encode(PKCS8_DER) + b"\n", "a DER private key (base64)"),
])
def test_der_keys_are_named_public_or_private_and_how_they_are_written(tmp_path, data, what):
    f = _write(tmp_path / "k.der", data)
    assert f"{f}: holds {what}, not an HMAC secret (a public key is no secret" in _refused_as(f)


def test_a_minisign_key_whose_base64_ends_in_x_is_no_secret(tmp_path):
    # seed 6's public key: its last byte's low six bits are 23, so the minisign line ends in 'X'
    raw = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([6]) * 32).public_key().public_bytes(
        ser.Encoding.Raw, ser.PublicFormat.Raw)
    line = base64.b64encode(b"Ed" + bytes(range(8)) + raw)
    assert line.endswith(b"X") and b"=" not in line
    f = _write(tmp_path / "minisign.pub", b"untrusted comment: minisign public key 0001020304050607\n" + line + b"\n")
    assert f"{f}: holds a minisign or signify public key (base64), not an HMAC secret" in _refused_as(f)


@pytest.mark.parametrize("data", [
    b"Ed" + bytes(range(100, 162)),                      # starts like a minisign key, 64 bytes
    bytes(range(1, 43)),                                  # 42 bytes, a minisign key's size, not starting "Ed"
])
def test_a_secret_is_taken_for_a_minisign_key_only_with_both_its_size_and_its_start(tmp_path, data):
    f = _write(tmp_path / "secret.key", data)
    key = load_key(f, for_signing=True)
    assert key.algorithm == "hmac-sha256" and key.sign is not None


def test_a_json_web_key_naming_an_openssh_key_is_named_by_the_openssh_key(tmp_path):
    data = json.dumps({"kty": "OKP", "crv": "Ed25519", "comment": "ssh-ed25519 of the same key"}).encode()
    f = _write(tmp_path / "k.json", data)
    assert f"{f}: holds an OpenSSH key, not an HMAC secret" in _refused_as(f)


@pytest.mark.parametrize("data", [
    SPKI_DER,                                                            # DER, binary
    PUBLIC.public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b" me@host\n",  # OpenSSH
    base64.b64encode(SPKI_DER) + b"\n",                                  # DER as one base64 line
], ids=["der", "openssh", "der-base64"])
def test_each_public_key_encoding_is_read_without_a_prefix_and_verifies(art, tmp_path, data):
    f = _write(tmp_path / "pub.key", data)
    key = load_key(f)
    assert key.algorithm == "ed25519" and key.key_id == KEY_ID and key.sign is None
    priv = _write(tmp_path / "key.der", PKCS8_DER)
    (art / "signature.json").write_bytes(signature_record(manifest_bytes(art), load_key(priv, for_signing=True)))
    assert check_signature(art, f) == []


def test_a_key_file_is_parsed_strictly_a_stray_character_in_base64_der_is_not_read_around(tmp_path):
    text = base64.b64encode(SPKI_DER)
    f = _write(tmp_path / "pub.key", text[:20] + b"*" + text[20:] + b"\n")
    with pytest.raises(AotpipeError, match="not an Ed25519 key in any encoding aotpipe reads"):
        load_key(f"ed25519:{f}")
    ok = _write(tmp_path / "ok.key", text + b"\n")
    assert load_key(f"ed25519:{ok}").key_id == KEY_ID


def test_raw_32_bytes_are_read_as_a_public_key_only_with_the_ed25519_prefix(tmp_path):
    # a PEM frame around a raw key's base64 (no DER inside): named a PEM block, so no secret;
    # without ed25519: it is no key aotpipe reads, with it the raw key it holds
    f = _write(tmp_path / "pub.pem", b"-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(RAW)
               + b"\n-----END PUBLIC KEY-----\n")
    with pytest.raises(AotpipeError, match=r"not an Ed25519 key in any encoding aotpipe reads \(PEM, DER, OpenSSH\);"):
        load_key(f)
    assert load_key(f"ed25519:{f}").key_id == KEY_ID


def test_a_key_file_whose_name_holds_a_colon_after_the_prefix(tmp_path):
    assert split_key_spec("ed25519:keys:2024.pem") == ("ed25519", Path("keys:2024.pem"))
    assert split_key_spec("hmac:a:b") == ("hmac-sha256", Path("a:b"))


# ---------------------------------------------------------------------------------------
# Signatures: the record and what the user reads

def _signed(art: Path, tmp_path: Path) -> tuple[Path, dict]:
    priv = _write(tmp_path / "key.der", PKCS8_DER)
    (art / "signature.json").write_bytes(signature_record(manifest_bytes(art), load_key(priv, for_signing=True)))
    pub = _write(tmp_path / "pub.der", SPKI_DER)
    return pub, json.loads((art / "signature.json").read_text())


def test_a_signature_with_a_stray_character_is_not_base64_though_the_rest_is_good(art, tmp_path):
    pub, rec = _signed(art, tmp_path)
    rec["signature"] = rec["signature"][:10] + "*" + rec["signature"][10:]
    (art / "signature.json").write_text(json.dumps(rec))
    assert check_signature(art, pub) == [f"{art / 'signature.json'}: the signature is not base64"]


def test_another_keys_id_is_shown_cut_to_16_characters(art, tmp_path):
    pub, rec = _signed(art, tmp_path)
    rec["key_id"] = "0123456789abcdef" + "z" * 100
    rec["signature"] = base64.b64encode(b"\1" * 64).decode()
    (art / "signature.json").write_text(json.dumps(rec))
    assert check_signature(art, pub) == [
        f"{art / 'signature.json'}: signed with another key (key id 0123456789abcdef; {pub} is {KEY_ID}): the "
        "artefact is not the one the key holder signed"]


def test_a_manifest_changed_after_signing_is_the_whole_message(art, tmp_path):
    pub, rec = _signed(art, tmp_path)
    rec["manifest_sha256"] = "0" * 64
    rec["signature"] = base64.b64encode(b"\1" * 64).decode()
    (art / "signature.json").write_text(json.dumps(rec))
    assert check_signature(art, pub) == [
        f"{art / 'signature.json'}: manifest.json was changed after it was signed: the artefact is not the one the "
        "key holder signed"]


def test_a_signature_of_another_algorithm_is_the_whole_message(art, tmp_path):
    pub, rec = _signed(art, tmp_path)
    secret = _write(tmp_path / "secret.key", bytes(range(64)))
    assert check_signature(art, secret) == [
        f"{art / 'signature.json'}: signed with ed25519, but {secret} is an hmac-sha256 key (a signature is checked "
        "only with a key of the algorithm it names)"]


def test_a_signature_record_of_another_shape_names_its_file_first(art, tmp_path):
    pub, rec = _signed(art, tmp_path)
    rec["format_version"] = 99
    (art / "signature.json").write_text(json.dumps(rec))
    (problem,) = check_signature(art, pub)
    assert problem.startswith(f"{art / 'signature.json'}: field format_version") and \
        problem.endswith("(not a signature record of version 1)"), problem


def test_a_signature_record_the_format_does_not_allow_is_refused_before_writing_naming_it():
    key = SigningKey("rsa-pss", "0" * 16, lambda m: b"\0" * 64, lambda s, m: False, Path("k"))
    with pytest.raises(ArtifactError, match=r"^signature\.json: field algorithm"):
        signature_record(b"{}", key)


# ---------------------------------------------------------------------------------------
# verify: what it passes on and what it reports

def test_verify_passes_trust_ops_to_the_loader_from_the_tree_down(art, monkeypatch):
    seen = []

    def load(folder, **kw):
        seen.append(kw.get("trust_ops"))
        raise ArtifactError(f"{folder}: stopped here")

    monkeypatch.setattr("aotpipe.artifact.load.load", load)
    assert verify_artifact(art, trust_ops=("mylib",)) == [f"{art}: stopped here"]
    assert verify_tree(art.parent, trust_ops=("mylib", "other")) == {art: [f"{art}: stopped here"]}
    assert seen == [("mylib",), ("mylib", "other")]


def test_a_bug_in_the_loader_is_one_problem_naming_the_exception(art, monkeypatch):
    def load(folder, **kw):
        raise KeyError("boom")

    monkeypatch.setattr("aotpipe.artifact.load.load", load)
    assert verify_artifact(art) == [f"{art}: failed to load (KeyError: 'boom')"]


def test_a_folder_over_the_walk_limit_is_a_breach_problem(art):
    with limits.override(max_walk_entries=2):
        problems = verify_artifact(art, load_graphs=False)
    assert problems and all(isinstance(p, Breach) for p in problems), problems
    assert "AOTPIPE_MAX_WALK_ENTRIES" in problems[-1] and problems[-1].startswith(str(art)), problems


def test_the_openssh_markers_are_lower_case_so_a_passphrase_naming_them_is_a_secret(tmp_path):
    f = _write(tmp_path / "secret.key", b"SK-SSH-ED25519 and ECDSA-SHA2-NISTP256 are only words of this passphrase")
    assert load_key(f, for_signing=True).algorithm == "hmac-sha256"
