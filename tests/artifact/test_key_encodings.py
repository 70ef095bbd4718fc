"""Keys say what they are: `--key ed25519:FILE`, `--key hmac:FILE`, or a strictly parsed FILE.

Whoever holds an Ed25519 public key must not be able to forge: a public key, in any
encoding, is never taken for an HMAC secret, and a signature is checked only with a key
of the algorithm signature.json names.
"""

import base64
import hashlib

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from aotpipe.cli import main
from aotpipe.errors import AotpipeError
from aotpipe.trust.signing import _hmac_key, check_signature, load_key, signature_record
from aotpipe.trust.verify import sign_artifact

PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = PRIVATE.public_key()
RAW = PUBLIC.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
PEM = PUBLIC.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
DER = PUBLIC.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)

# Every encoding of the public key a verifier may hold, and what it is called when refused
PUBLIC_ENCODINGS = {
    "pem": (PEM, "a PEM block"),
    "pem after a comment": (b"# the release key, 2026\n" + PEM, "a PEM block"),
    "pem after bag attributes": (b"Bag Attributes\n    friendlyName: release\n    localKeyID: 01 02 03\n" + PEM,
                                 "a PEM block"),
    "der": (DER, "a DER public key"),
    "der as base64": (base64.b64encode(DER) + b"\n", "a DER public key (base64)"),
    "openssh": (PUBLIC.public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b" release@host\n",
                "an OpenSSH key"),
    "raw 32 bytes": (RAW, "32 raw bytes, the size of a raw Ed25519 public key"),
    # the audit's bug: one byte more than a raw key, and it passed for a 33-byte HMAC secret
    "raw 32 bytes and a newline": (RAW + b"\n", "32 raw bytes and whitespace, the size of a raw Ed25519 public key"),
    "raw 32 bytes and CRLF": (RAW + b"\r\n", "32 raw bytes and whitespace"),
    "base64 of raw": (base64.b64encode(RAW) + b"\n", "base64 of 32 bytes, the size of a raw Ed25519 public key"),
    "base64url of raw, unpadded": (base64.urlsafe_b64encode(RAW).rstrip(b"="), "base64 of 32 bytes"),
    "hex of raw": (RAW.hex().encode() + b"\n", "hex of 32 bytes"),
}
RAW_FORMS = {"raw 32 bytes", "raw 32 bytes and a newline", "raw 32 bytes and CRLF", "base64 of raw",
             "base64url of raw, unpadded", "hex of raw"}


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _one_error(r, needle):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


@pytest.fixture()
def private_pem(tmp_path):
    p = tmp_path / "key.pem"
    p.write_bytes(PRIVATE.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    return p


@pytest.mark.parametrize("case", sorted(PUBLIC_ENCODINGS))
def test_a_public_key_in_any_encoding_is_never_an_hmac_secret(tmp_path, case):
    data, what = PUBLIC_ENCODINGS[case]
    f = tmp_path / "release.pub"
    f.write_bytes(data)
    with pytest.raises(AotpipeError, match="not an HMAC secret|not taken as an HMAC secret") as e:
        load_key(f"hmac:{f}")
    assert what in str(e.value) and f"ed25519:{f}" in str(e.value)
    if case in RAW_FORMS:  # ambiguous without a prefix: refused, saying how to name it
        with pytest.raises(AotpipeError, match="not taken as an HMAC secret"):
            load_key(f)
    else:  # parsed strictly: the Ed25519 public key it is
        key = load_key(f)
        assert key.algorithm == "ed25519" and key.sign is None
    key = load_key(f"ed25519:{f}")
    assert key.algorithm == "ed25519" and key.key_id == hashlib.sha256(RAW).hexdigest()[:16]


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(PUBLIC_ENCODINGS))
def test_a_forgery_signed_with_the_public_key_as_hmac_secret_is_refused(mlp_copy, private_pem, tmp_path, case):
    data, _ = PUBLIC_ENCODINGS[case]
    pub = _write(tmp_path / "release.pub", data)
    # The forger: anyone with the public key file, using its bytes as an HMAC secret.
    forged = signature_record((mlp_copy / "manifest.json").read_bytes(), _hmac_key(pub, data))
    (mlp_copy / "signature.json").write_bytes(forged)
    if case in RAW_FORMS:
        _one_error(cli("verify", mlp_copy, "--key", pub), "not taken as an HMAC secret")
        spec = f"ed25519:{pub}"
    else:
        spec = pub
    r = cli("verify", mlp_copy, "--key", spec)
    assert r.exit_code == 1 and "signed with hmac-sha256, but" in r.output and "is an ed25519 key" in r.output, \
        r.output
    _one_error(cli("verify", mlp_copy, "--key", f"hmac:{pub}"), "HMAC secret")


def test_signature_json_names_the_algorithm_and_a_mismatch_is_refused(mlp_copy, private_pem, tmp_path):
    secret = _write(tmp_path / "secret.key", bytes(range(64)))
    pub = _write(tmp_path / "key.pub.pem", PEM)
    sign_artifact(mlp_copy, f"ed25519:{private_pem}")
    assert '"algorithm": "ed25519"' in (mlp_copy / "signature.json").read_text()
    (problem,) = check_signature(mlp_copy, f"hmac:{secret}")
    assert "signed with ed25519, but" in problem and "is an hmac-sha256 key" in problem
    sign_artifact(mlp_copy, f"hmac:{secret}")
    assert '"algorithm": "hmac-sha256"' in (mlp_copy / "signature.json").read_text()
    (problem,) = check_signature(mlp_copy, pub)
    assert "signed with hmac-sha256, but" in problem and "is an ed25519 key" in problem


@pytest.mark.parametrize("verify_with", ["pem", "der", "openssh", "raw 32 bytes", "base64 of raw", "private"])
def test_ed25519_round_trips_through_every_public_encoding(mlp_copy, private_pem, tmp_path, verify_with):
    r = cli("sign", mlp_copy, "--key", f"ed25519:{private_pem}")
    assert r.exit_code == 0 and "(ed25519, key id" in r.output, r.output
    if verify_with == "private":
        spec = private_pem
    else:
        f = _write(tmp_path / "pub", PUBLIC_ENCODINGS[verify_with][0])
        spec = f"ed25519:{f}" if verify_with in RAW_FORMS else f
    r = cli("verify", mlp_copy, "--key", spec)
    assert r.exit_code == 0 and "1/1 artefacts ok" in r.output, r.output


def test_hmac_round_trip_with_and_without_the_prefix(mlp_copy, tmp_path):
    secret = _write(tmp_path / "secret.key", bytes(range(200, 248)))
    r = cli("sign", mlp_copy, "--key", f"hmac:{secret}")
    assert r.exit_code == 0 and "(hmac-sha256, key id" in r.output, r.output
    for spec in (f"hmac:{secret}", secret):
        r = cli("verify", mlp_copy, "--key", spec)
        assert r.exit_code == 0 and "1/1 artefacts ok" in r.output, r.output


@pytest.mark.parametrize("case", ["short secret", "raw public key signs", "ed25519 prefix on a secret",
                                  "no file after the prefix", "missing file"])
def test_unusable_keys_are_one_line_exit_2(mlp_copy, tmp_path, case):
    if case == "short secret":
        args, needle = ["verify", mlp_copy, "--key", f"hmac:{_write(tmp_path / 's', b'password' * 3)}"], \
            "an HMAC secret must be at least 33 bytes, not counting whitespace at its ends (it has 24)"
    elif case == "raw public key signs":
        args, needle = ["sign", mlp_copy, "--key", f"ed25519:{_write(tmp_path / 'raw', RAW)}"], \
            "a public key verifies but cannot sign"
    elif case == "ed25519 prefix on a secret":
        args, needle = ["verify", mlp_copy, "--key", f"ed25519:{_write(tmp_path / 's', bytes(range(64)))}"], \
            "not an Ed25519 key in any encoding aotpipe reads"
    elif case == "no file after the prefix":
        args, needle = ["verify", mlp_copy, "--key", "hmac:"], "no key file after hmac:"
    else:
        args, needle = ["sign", mlp_copy, "--key", f"hmac:{tmp_path / 'nope'}"], "cannot read the key file"
    _one_error(cli(*args), needle)
    assert not (mlp_copy / "signature.json").exists()


def test_run_signs_with_a_prefixed_key(tmp_path):
    secret = _write(tmp_path / "secret.key", bytes(range(64)))
    p = _write(tmp_path / "p.yaml", b"version: 1\nname: s\ndefaults: {graphs: [inference], passes: []}\n"
                                    b"models: [{name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 4, hidden: 8, "
                                    b"depth: 1}, inputs: [{shape: [2, 4]}]}]\n")
    r = cli("run", p, "-o", tmp_path / "out", "--no-progress", "--executor", "local", "--key", f"hmac:{secret}")
    assert r.exit_code == 0, r.output
    assert check_signature(tmp_path / "out" / "s" / "mlp", f"hmac:{secret}") == []


def test_a_33_byte_secret_is_a_secret_unless_its_last_byte_is_a_line_end(tmp_path):
    inside = _write(tmp_path / "inside.key", bytes(range(1, 34)))  # 33 bytes, the last no line end
    assert load_key(f"hmac:{inside}").algorithm == "hmac-sha256"
    outside = _write(tmp_path / "outside.key", bytes(range(1, 33)) + b"\n")  # 32 bytes and a newline
    with pytest.raises(AotpipeError, match="32 raw bytes and whitespace"):
        load_key(f"hmac:{outside}")
