"""Signatures: that an artefact is the one a key holder made (`aotpipe sign`, `verify --key`).

`aotpipe verify` alone catches corruption: every file against the sha256 the manifest
lists, and the manifest against its own checksum. It cannot catch forgery: whoever can
edit the files can recompute all of those. A signature over manifest.json's bytes, made
with a key the forger does not have, covers every file, since the manifest lists each
one's sha256. It is kept in ``signature.json`` beside manifest.json (not listed in it).

A key is given as ``ed25519:FILE``, ``hmac:FILE`` or ``FILE``; each file is parsed strictly:
- Ed25519 (the ``cryptography`` package): a private key signs; its public key (or the
  private key) verifies, so whoever verifies needs no secret. Read as PEM (wherever the
  block sits in the file: after comments, after a "Bag Attributes" block), DER
  (SubjectPublicKeyInfo or PKCS#8), OpenSSH (``ssh-ed25519 AAAA...`` or an OpenSSH private
  key); with ``ed25519:`` also a raw 32-byte public key, in binary, base64 or hex.
- HMAC-SHA256 (the standard library): a shared secret of more than 32 bytes, whitespace at
  its ends not counted; the same file signs and verifies. A file that holds a PEM block
  anywhere, or parses as any key encoding above (also as hex or base64 text, wrapped or
  not, whole or one line of it), the fixed first bytes of an Ed25519 DER key anywhere in it
  (raw, base64 or hex: a key damaged by a copy and paste), a JSON Web Key, a minisign or
  signify public key, or exactly 32 bytes (raw with whitespace around them, hex or base64: the size of a raw
  Ed25519 public key) is never taken as a secret: whoever has a public key could forge
  with it.
signature.json names the algorithm, and a signature is only checked with a key of that
algorithm.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from aotpipe.artifact.fsio import write_durable
from aotpipe.artifact.manifest import dump_json
from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format import limits, records
from aotpipe.format.records import MANIFEST, SIGNATURE

try:
    from cryptography.exceptions import UnsupportedAlgorithm
except ImportError:  # pragma: no cover (a declared dependency)
    UnsupportedAlgorithm = ValueError  # type: ignore[misc,assignment]

SIGNATURE_VERSION = 1
# What is signed: this context, then manifest.json's bytes (a signature made for another
# purpose with the same key cannot pass for one of these).
_CONTEXT = b"aotpipe artefact signature v1\n"
_MIN_SECRET = 33  # more than a raw Ed25519 public key's 32 bytes
_MAX_KEY_FILE = 64 << 10


@dataclass(frozen=True)
class SigningKey:
    """A loaded key: its algorithm, a short id that tells keys apart, and what it can do."""

    algorithm: str  # "ed25519" or "hmac-sha256"
    key_id: str
    sign: Optional[Callable[[bytes], bytes]]  # None for a public key
    verify: Callable[[bytes, bytes], bool]
    path: Path
    public: Any = None  # Ed25519: the public key object (what `aotpipe trust add` stores)


ALGORITHMS = {"ed25519": "ed25519", "hmac": "hmac-sha256"}  # a key spec's prefix -> algorithm


def split_key_spec(spec: str | Path) -> tuple[Optional[str], Path]:
    """(the algorithm a key spec names, or None, the key file): ``ed25519:FILE``,
    ``hmac:FILE`` or ``FILE`` (a file whose name starts with one of those prefixes: ./FILE)."""
    text = str(spec)
    prefix, sep, rest = text.partition(":")
    if sep and prefix in ALGORITHMS:
        if not rest:
            raise AotpipeError(f"--key {text}: no key file after {prefix}: (--key {prefix}:FILE)")
        return ALGORITHMS[prefix], Path(rest)
    return None, Path(text)


def absolute_key_spec(spec: str | Path) -> str:
    """`spec` with its file made absolute, its algorithm prefix kept."""
    algorithm, p = split_key_spec(spec)
    prefix = next((k + ":" for k, v in ALGORITHMS.items() if v == algorithm), "")
    return prefix + str(p.resolve())


def load_key(spec: str | Path, *, for_signing: bool = False) -> SigningKey:
    """The key `spec` names (``ed25519:FILE``, ``hmac:FILE`` or ``FILE``); an AotpipeError (a
    user error, exit 2) if it is not a usable key of that kind."""
    algorithm, p = split_key_spec(spec)
    try:
        data = limits.read_bounded(p, limit=_MAX_KEY_FILE, limit_name="max_record_bytes")
    except OSError as e:
        raise AotpipeError(f"{p}: cannot read the key file ({e.strerror or e})") from None
    public_kind = _public_key_encoding(data)
    if algorithm == "ed25519" or (algorithm is None and public_kind is not None):
        return _ed25519_key(p, data, for_signing, raw_ok=algorithm == "ed25519")
    if public_kind is not None:
        raise AotpipeError(f"{p}: holds {public_kind}, not an HMAC secret (a public key is no secret: whoever "
                           f"has it could sign); give it as ed25519:{p}, or make a secret: {_MAKE_SECRET}")
    raw = _as_32(data)
    if raw is not None:
        raise AotpipeError(f"{p}: {raw[0]}, the size of a raw Ed25519 public key, so not taken as an HMAC secret; "
                           f"for that public key say ed25519:{p}; for a secret: {_MAKE_SECRET}")
    inner = len(data.strip(_BLANK))
    if inner < _MIN_SECRET:
        raise AotpipeError(f"{p}: an HMAC secret must be at least {_MIN_SECRET} bytes, not counting whitespace at "
                           f"its ends (it has {inner}); make one with: {_MAKE_SECRET}")
    return _hmac_key(p, data)


_MAKE_SECRET = "head -c 64 /dev/urandom > secret.key"
# What an editor, `echo` or a copy and paste leaves around a key: never part of a secret.
_BLANK = b" \t\r\n\v\f\0"


def _public_key_encoding(data: bytes) -> Optional[str]:
    """What key encoding `data` is, in words ("a PEM block", "a DER public key", ...), or None.
    Anything here is never an HMAC secret."""
    if b"-----BEGIN" in data:
        return "a PEM block"
    if b"ssh-" in data or b"ecdsa-sha2-" in data or b"sk-ssh-" in data:
        return "an OpenSSH key"
    if _is_jwk(data):
        return "a JSON Web Key"
    from cryptography.hazmat.primitives import serialization

    for how, blob in [("", data)] + _decodings(data):
        suffix = f" ({how})" if how else ""
        if b"ssh-" in blob:  # an OpenSSH key's base64 blob without its "ssh-ed25519 " label
            return "an OpenSSH key" + suffix
        if len(blob) == 42 and blob.startswith(b"Ed"):  # algorithm, key number, the 32-byte key
            return "a minisign or signify public key" + suffix
        for what, parse in (("a DER public key", lambda b: serialization.load_der_public_key(b)),
                            ("a DER private key", lambda b: serialization.load_der_private_key(b, password=None))):
            try:
                parse(blob)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                continue
            return what + suffix
    return _ed25519_der_marker(data)


# The fixed first bytes of an Ed25519 key in DER (SubjectPublicKeyInfo, PKCS#8), and how they
# read in base64 and hex: found anywhere in a file, damaged or with text around it (a stray
# character from a copy and paste, quotes, a comment on the same line), they say that the file
# holds that key, though no parser reads it whole.
_DER_PUBLIC = bytes.fromhex("302a300506032b6570032100")
_DER_PRIVATE = bytes.fromhex("302e020100300506032b657004220420")
_DER_MARKERS = [(what, marker) for what, der in (("a DER public key", _DER_PUBLIC), ("a DER private key", _DER_PRIVATE))
                for marker in (der, base64.b64encode(der)[:len(der) * 4 // 3], der.hex().encode())]


def _ed25519_der_marker(data: bytes) -> str | None:
    """"a DER public key (its first bytes, ...)" when `data` holds an Ed25519 DER key's fixed
    first bytes, raw, in base64 or in hex (any case, whitespace and ':' aside), else None."""
    squeezed = b"".join(data.split())
    hexed = squeezed.replace(b":", b"").lower()
    for what, marker in _DER_MARKERS:
        if marker in squeezed or marker in hexed:
            return f"{what} (its first bytes, with other bytes around them)"
    return None


def _is_jwk(data: bytes) -> bool:
    """Whether `data` is a JSON object with a JSON Web Key's "kty" (an OKP key's "x" is the raw public key)."""
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return isinstance(value, dict) and "kty" in value


def _decodings(data: bytes) -> list[tuple[str, bytes]]:
    """Every reading of `data` as text that encodes bytes, as (how, the bytes): hex (any case, with
    ':' between bytes or not) and base64 (standard or URL-safe, padded or not), of the whole text
    with every whitespace removed (wrapped lines, as `xxd -p` or `base64` write them) and of each
    line alone (a key under a comment line). Binary data has none."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return []
    pieces = ["".join(text.split())] + [line.strip() for line in text.splitlines()]
    out = []
    for piece in dict.fromkeys(p for p in pieces if p):
        digits = piece.replace(":", "")
        if len(digits) % 2 == 0 and set(digits) <= _HEX:
            out.append(("hex", bytes.fromhex(digits)))
        unpadded = piece.rstrip("=")
        for alt in (None, b"-_"):
            try:
                out.append(("base64", base64.b64decode(unpadded + "=" * (-len(unpadded) % 4), altchars=alt,
                                                       validate=True)))
            except ValueError:
                continue
    return out


_HEX = frozenset("0123456789abcdefABCDEF")


def _as_32(data: bytes) -> Optional[tuple[str, bytes]]:
    """(how, the 32 bytes) if `data` holds exactly 32 bytes: raw (whitespace around them aside:
    the newline an editor or `echo` adds is not part of them), or written as hex or base64 (see
    :func:`_decodings`); else None. The size of a raw Ed25519 public key."""
    if len(data) == 32:
        return "32 raw bytes", data
    if len(data) > 32 and not data[32:].strip(_BLANK):  # the key's own last bytes may be whitespace: only what follows is cut
        return "32 raw bytes and whitespace", data[:32]
    if len(data.strip(_BLANK)) == 32:
        return "32 raw bytes and whitespace", data.strip(_BLANK)
    for how, blob in _decodings(data):
        if len(blob) == 32:
            return f"{how} of 32 bytes", blob
    return None


def _hmac_key(p: Path, data: bytes) -> SigningKey:
    key_id = hmac.new(data, b"aotpipe key id", hashlib.sha256).hexdigest()[:16]

    def sign(message: bytes) -> bytes:
        return hmac.new(data, message, hashlib.sha256).digest()

    def verify(signature: bytes, message: bytes) -> bool:
        return hmac.compare_digest(signature, sign(message))

    return SigningKey("hmac-sha256", key_id, sign, verify, p)


def _ed25519_key(p: Path, data: bytes, for_signing: bool, raw_ok: bool) -> SigningKey:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise AotpipeError(f"{p}: an Ed25519 key needs the cryptography package: "
                           "pip install cryptography -c constraints.txt") from None
    private, public = _parse_key(data, raw_ok)
    if public is None:
        raise AotpipeError(f"{p}: not an Ed25519 key in any encoding aotpipe reads (PEM, DER, OpenSSH"
                           + (", raw 32 bytes" if raw_ok else "") + "); make one with: "
                           "openssl genpkey -algorithm ed25519 -out key.pem")
    if not isinstance(public, ed25519.Ed25519PublicKey):
        raise AotpipeError(f"{p}: a {type(public).__name__.removeprefix('_')} key; aotpipe signs with Ed25519 keys "
                           "(openssl genpkey -algorithm ed25519 -out key.pem)")
    if for_signing and private is None:
        raise AotpipeError(f"{p}: a public key verifies but cannot sign; sign with the private key")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_id = hashlib.sha256(raw).hexdigest()[:16]

    def verify(signature: bytes, message: bytes) -> bool:
        try:
            public.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    return SigningKey("ed25519", key_id, private.sign if private is not None else None, verify, p, public)


def _parse_key(data: bytes, raw_ok: bool) -> tuple[Any, Any]:
    """(private key or None, public key or None) from `data` in the first encoding that parses."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    private_parsers = [lambda d: serialization.load_pem_private_key(d, password=None),
                       lambda d: serialization.load_der_private_key(d, password=None),
                       lambda d: serialization.load_ssh_private_key(d, password=None)]
    public_parsers = [serialization.load_pem_public_key, serialization.load_der_public_key,
                      serialization.load_ssh_public_key]
    candidates = [data]
    try:
        candidates.append(base64.b64decode(data.strip(), validate=True))  # DER without its PEM lines
    except ValueError:
        pass
    for blob in candidates:
        for parse in private_parsers:
            try:
                private = parse(blob)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                continue
            return private, private.public_key()
        for parse in public_parsers:
            try:
                return None, parse(blob)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                continue
    raw = _as_32(data) if raw_ok else None
    if raw is not None:
        return None, ed25519.Ed25519PublicKey.from_public_bytes(raw[1])
    return None, None


def manifest_bytes(folder: Path) -> bytes:
    return limits.read_bytes(folder / MANIFEST, limit=limits.current().max_record_bytes,
                             limit_name="max_record_bytes", root=folder)


def signature_record(manifest: bytes, key: SigningKey) -> bytes:
    """signature.json's bytes: a signature of `manifest` (manifest.json's bytes) with `key`."""
    if key.sign is None:
        raise AotpipeError(f"{key.path}: a public key cannot sign; give the Ed25519 private key")
    record = {
        "format_version": SIGNATURE_VERSION,
        "algorithm": key.algorithm,
        "key_id": key.key_id,
        "signed_file": MANIFEST,
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "signature": base64.b64encode(key.sign(_CONTEXT + manifest)).decode("ascii"),
    }
    return dump_json(records.check_written(records.Signature, record, SIGNATURE))


def signer(key_spec: str | Path) -> Callable[[Path], None]:
    """What `aotpipe run --key` does to each folder it writes (before it is renamed into
    place): sign its manifest. The key is loaded now, so a bad key fails before any work."""
    key = load_key(key_spec, for_signing=True)

    def sign(folder: Path) -> None:
        write_durable(Path(folder) / SIGNATURE, signature_record(manifest_bytes(Path(folder)), key))

    return sign


def check_signature(folder: str | Path, key_spec: str | Path) -> list[str]:
    """Problems with the signature of one model folder under the key `key_spec` names; [] if it
    is good. Only the signature is checked: that the files match the manifest is
    verify_artifact's job, and both are needed (`aotpipe verify --key` does both)."""
    folder = Path(folder)
    key = load_key(key_spec)
    spath = folder / SIGNATURE
    if not os.path.lexists(spath):
        return [f"{spath}: missing (the artefact is not signed; aotpipe sign it)"]
    try:
        record: Any = limits.read_json(spath, folder)
        manifest = manifest_bytes(folder)
    except ArtifactError as e:
        return [str(e)]
    try:
        sig = records.parse(records.Signature, record, spath)
    except ArtifactError as e:
        return [f"{e} (not a signature record of version {SIGNATURE_VERSION})"]
    if sig.algorithm != key.algorithm:
        return [f"{spath}: signed with {sig.algorithm}, but {key.path} is an {key.algorithm} key (a signature "
                "is checked only with a key of the algorithm it names)"]
    try:
        signature = base64.b64decode(sig.signature, validate=True)
    except ValueError:
        return [f"{spath}: the signature is not base64"]
    if key.verify(signature, _CONTEXT + manifest):
        return []
    if sig.key_id != key.key_id:
        why = f"signed with another key (key id {sig.key_id[:16]}; {key.path} is {key.key_id})"
    elif sig.manifest_sha256 != hashlib.sha256(manifest).hexdigest():
        why = "manifest.json was changed after it was signed"
    else:
        why = "the signature does not match manifest.json"
    return [f"{spath}: {why}: the artefact is not the one the key holder signed"]
