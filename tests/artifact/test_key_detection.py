"""A public key never acts as a secret, whatever its encoding (the audit's bug and its class).

The audit found a raw 32-byte Ed25519 public key file ending in a newline taken as a 33-byte
HMAC secret: `aotpipe sign --key pub.key` signed, `verify --key pub.key` exited 0, and
`replay --key pub.key` ran the forgery in process. Whoever holds the public key could forge.
The same held for every other way a public key is saved that the loader did not read as one:
two newlines, a tab, a leading newline, a NUL, hex wrapped as `xxd -p` writes it or with ':'
between bytes, an OpenSSH key's base64 without its label, a JSON Web Key, a minisign key.

Fast: each test reads key files and a small artefact copied from tests/data (no pipeline run).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from aotpipe.cli import main
from aotpipe.errors import AotpipeError
from aotpipe.trust.signing import _hmac_key, check_signature, load_key, signature_record

DATA = Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp"

PRIVATE = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(100, 132)))
PUBLIC = PRIVATE.public_key()
RAW = PUBLIC.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
KEY_ID = hashlib.sha256(RAW).hexdigest()[:16]
HEX = RAW.hex()
OPENSSH = PUBLIC.public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)

# Each: (the file's bytes, whether `ed25519:FILE` reads it as the public key)
RAW_WITH_BLANKS = {
    "raw and a newline": RAW + b"\n",
    "raw and CRLF": RAW + b"\r\n",
    "raw and two newlines": RAW + b"\n\n",
    "raw, a space and a newline": RAW + b" \n",
    "raw and a tab": RAW + b"\t",
    "raw and a NUL": RAW + b"\0",
    "a newline and raw": b"\n" + RAW,
    "raw between spaces": b"  " + RAW + b"  \n",
}
TEXT_FORMS = {
    "hex as xxd -p wraps it": (HEX[:60] + "\n" + HEX[60:] + "\n").encode(),
    "hex with colons, upper case": ":".join(HEX[i:i + 2] for i in range(0, 64, 2)).upper().encode() + b"\n",
    "hex with spaces": " ".join(HEX[i:i + 2] for i in range(0, 64, 2)).encode(),
    "base64 and two newlines": base64.b64encode(RAW) + b"\n\n",
    "base64 between blanks": b"  " + base64.b64encode(RAW) + b"\r\n",
    "base64 under a comment line": b"# release key\n" + base64.b64encode(RAW) + b"\n",
}
LABELLED_FORMS = {  # refused as what they are, not merely for their size
    "an OpenSSH key's base64 without its label": (OPENSSH.split()[1] + b"\n", "an OpenSSH key (base64)"),
    "a JSON Web Key": (json.dumps({"kty": "OKP", "crv": "Ed25519",
                                   "x": base64.urlsafe_b64encode(RAW).rstrip(b"=").decode()}).encode(),
                       "a JSON Web Key"),
    "a minisign public key": (b"untrusted comment: minisign public key 0102030405060708\n"
                              + base64.b64encode(b"Ed" + bytes(range(8)) + RAW) + b"\n",
                              "a minisign or signify public key (base64)"),
    "DER wrapped as base64 lines": (base64.encodebytes(PUBLIC.public_bytes(ser.Encoding.DER,
                                                                           ser.PublicFormat.SubjectPublicKeyInfo)),
                                    "a DER public key (base64)"),
}
ALL_FORMS = {**RAW_WITH_BLANKS, **TEXT_FORMS, **{k: v for k, (v, _) in LABELLED_FORMS.items()}}
# From the command line, one of each kind (the function-level tests above cover every form)
CLI_FORMS = ["raw and a newline", "raw and two newlines", "hex as xxd -p wraps it", "a JSON Web Key",
             "DER wrapped as base64 lines"]


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _one_error(r, needle):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


@pytest.fixture()
def artefact(tmp_path):
    """A small artefact that verifies (format 2's mlp), in a folder of its own."""
    dst = tmp_path / "lib" / "mlp"
    shutil.copytree(DATA, dst)
    return dst


class _Stop:
    """What the sandbox stand-in returns: stops `replay` at its first look at the outcome."""

    def __getattr__(self, name):
        raise AotpipeError("the sandbox stand-in ran")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(ALL_FORMS))
@pytest.mark.parametrize("prefix", ["", "hmac:"])
def test_a_public_key_in_any_encoding_never_loads_as_an_hmac_secret(tmp_path, case, prefix):
    pub = _write(tmp_path / "pub.key", ALL_FORMS[case])
    try:
        key = load_key(f"{prefix}{pub}")
    except AotpipeError as e:  # refused, naming the file: as no secret, or as no Ed25519 key aotpipe reads
        assert str(pub) in str(e) and ("HMAC secret" in str(e) or "not an Ed25519 key" in str(e)), e
    else:  # or read as the public key it is
        assert prefix == "" and key.algorithm == "ed25519" and key.key_id == KEY_ID and key.sign is None


@pytest.mark.parametrize("case", sorted(LABELLED_FORMS))
def test_a_labelled_public_key_encoding_is_named_when_refused_as_a_secret(tmp_path, case):
    data, what = LABELLED_FORMS[case]
    pub = _write(tmp_path / "pub.key", data)
    with pytest.raises(AotpipeError, match="not an HMAC secret") as e:
        load_key(f"hmac:{pub}")
    assert f"holds {what}," in str(e.value) and f"ed25519:{pub}" in str(e.value)


# (not "raw between spaces": this key's first byte is a vertical tab, so the blanks before it hide
# where it starts; it is refused as a secret all the same, being 31 bytes besides its blanks)
@pytest.mark.parametrize("case", ["raw and a newline", "raw and two newlines", "raw and a NUL",
                                  "hex as xxd -p wraps it", "hex with colons, upper case",
                                  "base64 under a comment line"])
def test_ed25519_prefix_reads_the_public_key_those_forms_hold(tmp_path, case):
    pub = _write(tmp_path / "pub.key", ALL_FORMS[case])
    key = load_key(f"ed25519:{pub}")
    assert key.algorithm == "ed25519" and key.key_id == KEY_ID and key.sign is None


def test_a_raw_key_whose_last_byte_is_a_newline_keeps_it_before_the_newline_after_it(tmp_path):
    # seed 147's public key ends in 0x0a: the newline after it is cut, its own is kept
    raw = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([147]) * 32).public_key().public_bytes(
        ser.Encoding.Raw, ser.PublicFormat.Raw)
    assert raw.endswith(b"\n")
    pub = _write(tmp_path / "pub.key", raw + b"\n")
    assert load_key(f"ed25519:{pub}").key_id == hashlib.sha256(raw).hexdigest()[:16]
    with pytest.raises(AotpipeError, match="32 raw bytes and whitespace, the size of a raw Ed25519 public key"):
        load_key(pub)


@pytest.mark.parametrize("case", CLI_FORMS)
def test_sign_with_a_public_key_file_is_refused_from_the_command_line(artefact, tmp_path, case):
    pub = _write(tmp_path / "pub.key", ALL_FORMS[case])
    r = cli("sign", artefact, "--key", pub)
    _one_error(r, "HMAC secret" if case not in LABELLED_FORMS else str(pub))
    assert "HMAC secret" in r.output or "not an Ed25519 key in any encoding" in r.output or "cannot sign" in r.output
    assert not (artefact / "signature.json").exists()


@pytest.mark.parametrize("case", CLI_FORMS)
def test_a_forgery_made_with_the_public_key_file_as_secret_never_verifies_or_replays_in_process(
        artefact, tmp_path, monkeypatch, case):
    data = ALL_FORMS[case]
    pub = _write(tmp_path / "pub.key", data)
    # The forger: anyone with the public key file, its bytes used as an HMAC secret.
    forged = signature_record((artefact / "manifest.json").read_bytes(), _hmac_key(pub, data))
    (artefact / "signature.json").write_bytes(forged)
    r = cli("verify", artefact, "--key", pub)
    if r.exit_code == 1:  # read as the Ed25519 public key it is: the HMAC signature is not checked with it
        assert "signed with hmac-sha256, but" in r.output and "is an ed25519 key" in r.output, r.output
    else:
        _one_error(r, str(pub))
    _one_error(cli("verify", artefact, "--key", f"hmac:{pub}"), "HMAC secret")
    ran = []
    monkeypatch.setattr("aotpipe.cli.replay_outcome", lambda *a, **k: ran.append("in process"))
    monkeypatch.setattr("aotpipe.cli.replay_sandboxed", lambda *a, **k: ran.append("sandbox") or _Stop())
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)
    r = cli("replay", artefact, "--key", pub)
    assert "in process" not in ran and r.exit_code != 0, (ran, r.output)


def test_the_forgery_as_the_audit_made_it_verified_before_the_fix(artefact, tmp_path):
    """The audit's exact case, at the function level: 32 raw bytes and a newline."""
    data = RAW + b"\n"
    pub = _write(tmp_path / "pub.key", data)
    (artefact / "signature.json").write_bytes(
        signature_record((artefact / "manifest.json").read_bytes(), _hmac_key(pub, data)))
    with pytest.raises(AotpipeError, match="32 raw bytes and whitespace, the size of a raw Ed25519 public key"):
        check_signature(artefact, pub)
    (problem,) = check_signature(artefact, f"ed25519:{pub}")
    assert "signed with hmac-sha256, but" in problem and "is an ed25519 key" in problem


@pytest.mark.parametrize("name,data", [
    ("64 random bytes", bytes(range(7, 71))),
    ("33 bytes", bytes(range(1, 34))),
    ("base64 of 48 bytes", base64.b64encode(bytes(range(48))) + b"\n"),
    ("hex of 64 bytes", bytes(range(64)).hex().encode() + b"\n"),
    ("33 bytes inside blanks", b"\n" + bytes(range(1, 34)) + b"\n"),
])
def test_real_secrets_still_sign_and_verify(artefact, tmp_path, name, data):
    secret = _write(tmp_path / "secret.key", data)
    key = load_key(secret, for_signing=True)
    assert key.algorithm == "hmac-sha256" and key.sign is not None
    (artefact / "signature.json").write_bytes(signature_record((artefact / "manifest.json").read_bytes(), key))
    assert check_signature(artefact, secret) == []
    assert check_signature(artefact, f"hmac:{secret}") == []


@pytest.mark.parametrize("data,inner", [
    (bytes(range(1, 33)), None),            # 32: a raw public key's size
    (bytes(range(1, 32)), 31),              # 31: too short
    (b"\n" + bytes(range(1, 33)), None),    # 32 inside a newline: the public key's size still
    (b"\n\n" + bytes(range(1, 32)) + b"\n", 31),  # 31 inside blanks, 34 in all
    (b"password" * 3, 24),
])
def test_a_secret_needs_more_than_32_bytes_besides_whitespace_at_its_ends(tmp_path, data, inner):
    f = _write(tmp_path / "s.key", data)
    with pytest.raises(AotpipeError) as e:
        load_key(f"hmac:{f}")
    if inner is None:
        assert "the size of a raw Ed25519 public key" in str(e.value)
    else:
        assert (f"an HMAC secret must be at least 33 bytes, not counting whitespace at its ends (it has {inner})"
                in str(e.value)), e.value
        assert "head -c 64 /dev/urandom > secret.key" in str(e.value)


# A second key, seed 4: its hex holds all 16 digits, its base64url both '-' and '_', its
# first byte is no whitespace (so blanks before it are cut cleanly)
RAW4 = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([4]) * 32).public_key().public_bytes(
    ser.Encoding.Raw, ser.PublicFormat.Raw)
ID4 = hashlib.sha256(RAW4).hexdigest()[:16]


@pytest.mark.parametrize("data,how", [
    ("".join(c.upper() if i % 2 else c for i, c in enumerate(RAW4.hex())).encode(), "hex of 32 bytes"),
    (base64.urlsafe_b64encode(RAW4) + b"\n", "base64 of 32 bytes"),
    (base64.urlsafe_b64encode(RAW4).rstrip(b"="), "base64 of 32 bytes"),
    (base64.b64encode(RAW4) + b"=\n", "base64 of 32 bytes"),  # one '=' too many
    (RAW4, "32 raw bytes, the size"),
    (b"\n" + RAW4, "32 raw bytes and whitespace, the size"),
    (b"\0" + RAW4 + b" ", "32 raw bytes and whitespace, the size"),
])
def test_each_form_of_32_bytes_is_named_and_read_with_ed25519_prefix(tmp_path, data, how):
    f = _write(tmp_path / "pub.key", data)
    with pytest.raises(AotpipeError, match="the size of a raw Ed25519 public key, so not taken as an HMAC secret") as e:
        load_key(f)
    assert f"{f}: {how}" in str(e.value) and f"say ed25519:{f};" in str(e.value), e.value
    assert load_key(f"ed25519:{f}").key_id == ID4


def test_a_json_secret_without_kty_is_a_secret_and_a_list_naming_kty_is_no_jwk(tmp_path):
    f = _write(tmp_path / "s.key", json.dumps({"secret": base64.b64encode(bytes(range(48))).decode()}).encode())
    assert load_key(f).algorithm == "hmac-sha256"
    f = _write(tmp_path / "l.key", json.dumps(["kty", base64.b64encode(bytes(range(48))).decode()]).encode())
    assert load_key(f).algorithm == "hmac-sha256"


def test_a_passphrase_with_punctuation_is_a_secret_not_base64(tmp_path):
    # 43 letters of the base64 alphabet among punctuation: 32 bytes only if the punctuation were dropped
    phrase = b"correct, horse! battery; staple? tr0ub4dor & three. xkcd"
    assert sum(chr(c).isalnum() for c in phrase) == 43
    f = _write(tmp_path / "s.key", phrase)
    assert load_key(f).algorithm == "hmac-sha256"


def test_no_prefix_on_an_encoding_aotpipe_names_but_cannot_read_lists_no_raw_form(tmp_path):
    data, _ = LABELLED_FORMS["a JSON Web Key"]
    f = _write(tmp_path / "jwk.json", data)
    with pytest.raises(AotpipeError) as e:
        load_key(f)
    assert "not an Ed25519 key in any encoding aotpipe reads (PEM, DER, OpenSSH); make one with: openssl genpkey" \
        in str(e.value), e.value


def test_without_the_cryptography_package_an_ed25519_key_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cryptography.exceptions", None)  # as if it were not installed
    f = _write(tmp_path / "pub.key", RAW4)
    with pytest.raises(AotpipeError, match=r"pub\.key: an Ed25519 key needs the cryptography package: pip install "
                                           r"cryptography -c constraints\.txt$"):
        load_key(f"ed25519:{f}")


def test_each_key_format_is_named_when_refused_as_a_secret(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec

    ecdsa = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(ser.Encoding.OpenSSH,
                                                                              ser.PublicFormat.OpenSSH)
    pem = PUBLIC.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    for data, what in ((pem, "a PEM block"), (OPENSSH + b" me@host\n", "an OpenSSH key"),
                       (ecdsa + b"\n", "an OpenSSH key")):
        f = _write(tmp_path / "k", data)
        with pytest.raises(AotpipeError) as e:
            load_key(f"hmac:{f}")
        assert f"{f}: holds {what}, not an HMAC secret (a public key is no secret" in str(e.value), e.value
    with pytest.raises(AotpipeError, match=r"k: a \w+ key; aotpipe signs with Ed25519 keys "
                                           r"\(openssl genpkey -algorithm ed25519 -out key\.pem\)$"):
        load_key(f)


DER_PUBLIC = PUBLIC.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
DER_PRIVATE = PRIVATE.private_bytes(ser.Encoding.DER, ser.PrivateFormat.PKCS8, ser.NoEncryption())
DAMAGED = {
    "base64 DER and a stray dot": (base64.b64encode(DER_PUBLIC) + b".\n", "public"),
    "base64 DER in quotes": (b'"' + base64.b64encode(DER_PUBLIC) + b'"\n', "public"),
    "base64 DER after a label, a comment after it": (b"key = " + base64.b64encode(DER_PUBLIC) + b"  # mine\n",
                                                     "public"),
    "base64 DER with its last character lost": (base64.b64encode(DER_PUBLIC)[:-2] + b"\n", "public"),
    "hex DER, upper case with colons, and a stray !": (b":".join(b"%02X" % b for b in DER_PUBLIC) + b"!\n", "public"),
    "raw DER between other bytes": (b"x" + DER_PUBLIC + b"y" * 8, "public"),
    "base64 DER wrapped at 8 characters, a stray dot": (
        b"\n".join(base64.b64encode(DER_PUBLIC)[i:i + 8] for i in range(0, 60, 8)) + b".\n", "public"),
    "base64 PKCS#8 private DER and a stray dot": (base64.b64encode(DER_PRIVATE) + b".\n", "private"),
    "hex PKCS#8 private DER with a byte lost": (DER_PRIVATE[:-1].hex().encode() + b"\n", "private"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_an_ed25519_der_key_no_parser_reads_whole_is_still_never_an_hmac_secret(tmp_path, case):
    # a copy-and-paste that left a character behind must not turn a public key into a secret
    # that whoever has the public key can forge with
    data, kind = DAMAGED[case]
    pub = _write(tmp_path / "pub.key", data)
    for spec in (str(pub), f"hmac:{pub}"):
        with pytest.raises(AotpipeError) as e:
            load_key(spec)
        assert str(pub) in str(e.value)
    with pytest.raises(AotpipeError, match="not an HMAC secret") as e:
        load_key(f"hmac:{pub}")
    assert f"holds a DER {kind} key (its first bytes, with other bytes around them)," in str(e.value)


@pytest.mark.parametrize("cut", [1, 4])
def test_a_secret_holding_part_of_the_der_prefix_is_still_a_secret(tmp_path, cut):
    # the fixed first bytes whole, not a part of them, mark a key: the bound of the rule
    for der, n in ((DER_PUBLIC, 12), (DER_PRIVATE, 16)):
        # base64: the characters that n bytes alone decide (16 of 12 bytes, 21 of 16), less `cut`
        for text in (base64.b64encode(der[:n])[:n * 4 // 3 - cut], der[:n].hex().encode()[:-cut], der[:n][:-cut]):
            secret = _write(tmp_path / "s.key", b"a shared secret of enough bytes: " + text + b" and more")
            key = load_key(f"hmac:{secret}")
            assert key.algorithm == "hmac-sha256"
