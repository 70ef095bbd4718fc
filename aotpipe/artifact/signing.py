"""Signatures: that an artefact is the one a key holder made (`aotpipe sign`, `verify --key`).

`aotpipe verify` alone catches corruption: every file against the sha256 the manifest
lists, and the manifest against its own checksum. It cannot catch forgery: whoever can
edit the files can recompute all of those. A signature over manifest.json's bytes, made
with a key the forger does not have, covers every file, since the manifest lists each
one's sha256. It is kept in ``signature.json`` beside manifest.json (not listed in it).

Key files, told apart by their content:
- Ed25519 (the ``cryptography`` package): a PEM private key signs; the matching PEM
  public key (or the private key) verifies. Whoever verifies needs no secret.
- HMAC-SHA256 (the standard library): any other file is a shared secret of at least 32
  bytes; the same file signs and verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from aotpipe.artifact import limits, records
from aotpipe.artifact.manifest import dump_json
from aotpipe.artifact.records import MANIFEST, SIGNATURE
from aotpipe.errors import AotpipeError, ArtifactError

SIGNATURE_VERSION = 1
# What is signed: this context, then manifest.json's bytes (a signature made for another
# purpose with the same key cannot pass for one of these).
_CONTEXT = b"aotpipe artefact signature v1\n"
_MIN_SECRET = 32
_MAX_KEY_FILE = 64 << 10


@dataclass(frozen=True)
class SigningKey:
    """A loaded key: its algorithm, a short id that tells keys apart, and what it can do."""

    algorithm: str  # "ed25519" or "hmac-sha256"
    key_id: str
    sign: Optional[Callable[[bytes], bytes]]  # None for a public key
    verify: Callable[[bytes, bytes], bool]
    path: Path


def load_key(path: str | Path, *, for_signing: bool = False) -> SigningKey:
    """The key in `path`; an AotpipeError (a user error, exit 2) if it is not a usable key."""
    p = Path(path)
    try:
        data = limits.read_bounded(p, limit=_MAX_KEY_FILE, limit_name="max_record_bytes")
    except OSError as e:
        raise AotpipeError(f"{p}: cannot read the key file ({e.strerror or e})") from None
    if data.lstrip().startswith(b"-----BEGIN"):
        return _ed25519_key(p, data, for_signing)
    if len(data) < _MIN_SECRET:
        raise AotpipeError(f"{p}: an HMAC secret must be at least {_MIN_SECRET} bytes (it has {len(data)}); "
                           "make one with: head -c 32 /dev/urandom > KEYFILE")
    key_id = hmac.new(data, b"aotpipe key id", hashlib.sha256).hexdigest()[:16]

    def sign(message: bytes) -> bytes:
        return hmac.new(data, message, hashlib.sha256).digest()

    def verify(signature: bytes, message: bytes) -> bool:
        return hmac.compare_digest(signature, sign(message))

    return SigningKey("hmac-sha256", key_id, sign, verify, p)


def _ed25519_key(p: Path, data: bytes, for_signing: bool) -> SigningKey:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise AotpipeError(f"{p}: an Ed25519 key needs the cryptography package: "
                           "pip install cryptography -c constraints.txt") from None
    private = None
    try:
        if b"PRIVATE KEY" in data:
            private = serialization.load_pem_private_key(data, password=None)
            public = private.public_key()
        else:
            public = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise AotpipeError(f"{p}: not a usable PEM key ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
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

    return SigningKey("ed25519", key_id, private.sign if private is not None else None, verify, p)


def _manifest_bytes(folder: Path) -> bytes:
    return limits.read_bytes(folder / MANIFEST, limit=limits.current().max_record_bytes,
                             limit_name="max_record_bytes", root=folder)


def sign_artifact(folder: str | Path, key_path: str | Path) -> Path:
    """Sign one model folder: write signature.json beside its manifest; returns its path.

    The folder must verify first (files, checksum, safe load, module.py): a signature
    vouches for what is there, so a damaged artefact is not signed.
    """
    from aotpipe.artifact.fsio import write_atomic
    from aotpipe.artifact.verify import verify_artifact

    folder = Path(folder)
    key = load_key(key_path, for_signing=True)
    problems = verify_artifact(folder)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ArtifactError(f"{folder}: not signed, it does not verify: {problems[0]}{more}")
    path = folder / SIGNATURE
    write_atomic(path, signature_record(_manifest_bytes(folder), key))
    return path


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


def signer(key_path: str | Path) -> Callable[[Path], None]:
    """What `aotpipe run --key` does to each folder it writes (before it is renamed into
    place): sign its manifest. The key is loaded now, so a bad key fails before any work."""
    key = load_key(key_path, for_signing=True)

    def sign(folder: Path) -> None:
        from aotpipe.artifact.fsio import write_durable

        write_durable(Path(folder) / SIGNATURE, signature_record(_manifest_bytes(Path(folder)), key))

    return sign


def check_signature(folder: str | Path, key_path: str | Path) -> list[str]:
    """Problems with the signature of one model folder under the key in `key_path`; [] if it
    is good. Only the signature is checked: that the files match the manifest is
    verify_artifact's job, and both are needed (`aotpipe verify --key` does both)."""
    folder = Path(folder)
    key = load_key(key_path)
    spath = folder / SIGNATURE
    if not os.path.lexists(spath):
        return [f"{spath}: missing (the artefact is not signed; aotpipe sign it)"]
    try:
        record: Any = limits.read_json(spath, folder)
        manifest = _manifest_bytes(folder)
    except ArtifactError as e:
        return [str(e)]
    try:
        sig = records.parse(records.Signature, record, spath)
    except ArtifactError as e:
        return [f"{e} (not a signature record of version {SIGNATURE_VERSION})"]
    if sig.algorithm != key.algorithm:
        return [f"{spath}: signed with {sig.algorithm}, but {key.path} is an {key.algorithm} key"]
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
