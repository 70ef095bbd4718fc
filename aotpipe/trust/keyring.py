"""Trust by provenance: the user's own signing key and the keys they trust.

`aotpipe run` signs what it writes with the user's own Ed25519 key, made on first use in
the user's config folder (``$AOTPIPE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/aotpipe``, else
``~/.config/aotpipe``; the folder 0700, the key 0600). An artefact signed by that key, or by
a public key the user added with ``aotpipe trust add``, and unchanged since, is one they
trust: replay, bench, diff and export-pt2 run its graphs in their own process. Anything
else (unsigned, signed by a stranger, edited after signing) runs in the sandbox, or is
refused where there is no sandboxed form. The private key never enters a sandbox: the
worker's root holds no config folder and its environment is built from nothing.

Layout of the config folder::

    signing-key.pem        the user's Ed25519 private key (PKCS#8 PEM)
    trusted/<name>.pem     public keys the user trusts (SubjectPublicKeyInfo PEM)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format import limits, records
from aotpipe.format.records import SIGNATURE
from aotpipe.trust.signing import SigningKey, absolute_key_spec, check_signature, load_key, split_key_spec
from aotpipe.trust.verify import verify_artifact

OWN_KEY = "signing-key.pem"
TRUSTED = "trusted"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def config_dir() -> Path:
    """The user's aotpipe config folder (not made here)."""
    given = os.environ.get("AOTPIPE_CONFIG_DIR")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "aotpipe"


def _private_folder(path: Path) -> None:
    """`path` made owner-only, or, if it is there already, checked to be no one else's to write."""
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        os.chmod(path, 0o700)  # whatever the umask
        return
    _yours_alone(path, "the folder for your signing key")


def _yours_alone(path: Path, what: str) -> None:
    """An AotpipeError unless `path`, which trust rests on, is the user's and no one else may write it:
    whoever could would make their key trusted."""
    info = path.stat()
    if info.st_mode & 0o022 or info.st_uid != os.geteuid():
        raise AotpipeError(f"{path}: {what} is writable by others or not yours (mode {info.st_mode & 0o777:o}); "
                           f"chmod go-w {path}, or point AOTPIPE_CONFIG_DIR elsewhere")


def own_key(create: bool = True) -> Optional[Path]:
    """The user's signing key file, made (Ed25519, owner-only) if `create` and there is none."""
    path = config_dir() / OWN_KEY
    if path.exists() or not create:
        return path if path.exists() else None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    _private_folder(path.parent)
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    tmp = path.with_name(f".{OWN_KEY}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # never replaces a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path


def public_pem(spec: str | Path) -> bytes:
    """The public key of the Ed25519 key `spec` names, as PEM."""
    key = _ed25519(spec)
    from cryptography.hazmat.primitives import serialization

    return key.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _ed25519(spec: str | Path) -> SigningKey:
    """The Ed25519 key `spec` names (``FILE`` is read as ``ed25519:FILE``); an HMAC secret is refused."""
    algorithm, path = split_key_spec(spec)
    if algorithm == "hmac-sha256":
        raise AotpipeError(f"{spec}: an HMAC secret cannot be trusted this way (whoever verifies with it can also "
                           "sign); trust a colleague's Ed25519 public key, or pass --key hmac:FILE each time")
    return load_key(f"ed25519:{path}")


def trusted_keys() -> list[Path]:
    """Every key file the user trusts: their own, then those added with `aotpipe trust add`.
    An AotpipeError if others may write the config folder, the trusted folder or a key in them."""
    keys = []
    if config_dir().exists():
        _yours_alone(config_dir(), "the folder of the keys you trust")
    own = own_key(create=False)
    if own is not None:
        keys.append(own)
    folder = config_dir() / TRUSTED
    if folder.is_dir():
        _yours_alone(folder, "the folder of the keys you trust")
        keys += sorted(p for p in folder.iterdir() if p.suffix == ".pem" and p.is_file())
    for key in keys:
        _yours_alone(key, "a key you trust")
    return keys


def add_trusted(spec: str | Path, name: Optional[str] = None) -> Path:
    """Trust the Ed25519 key `spec` names (its public half is stored); returns the file written."""
    key = _ed25519(spec)
    name = name or key.key_id
    if not _NAME.fullmatch(name):
        raise AotpipeError(f"--name {name!r}: a name is letters, digits, '.', '_' or '-' (at most 64), e.g. alice")
    folder = config_dir() / TRUSTED
    _private_folder(config_dir())
    folder.mkdir(exist_ok=True, mode=0o700)
    path = folder / f"{name}.pem"
    if path.exists() and path.read_bytes() != public_pem(spec):
        raise AotpipeError(f"{path}: a key named {name} is trusted already; remove it first (aotpipe trust remove "
                           f"{name}) or give another --name")
    path.write_bytes(public_pem(spec))
    os.chmod(path, 0o644)  # whatever the umask: a key others may write would not be trusted
    return path


def remove_trusted(name: str) -> Path:
    path = config_dir() / TRUSTED / f"{name}.pem"
    if not _NAME.fullmatch(name) or not path.exists():
        names = ", ".join(p.stem for p in trusted_keys()[1 if own_key(create=False) else 0:]) or "none"
        raise AotpipeError(f"no trusted key named {name!r} (trusted: {names}; aotpipe trust list)")
    path.unlink()
    return path


def key_id(path: Path) -> str:
    return load_key(f"ed25519:{path}").key_id


def signed_key_id(folder: Path) -> Optional[str]:
    """The key id signature.json names, or None where there is no readable signature."""
    path = folder / SIGNATURE
    if not os.path.lexists(path):
        return None
    try:
        return records.parse(records.Signature, limits.read_json(path, folder), path).key_id
    except ArtifactError:
        return None


def provenance_problems(folder: Path) -> list[str]:
    """Why the artefact in model folder `folder` is not one the user trusts; [] if it is signed
    by a key they trust and every file is still the one its signed manifest lists."""

    signed_by = signed_key_id(folder)
    if signed_by is None:
        return [f"{folder}: not signed (made elsewhere, or before aotpipe signed what it writes); "
                "aotpipe trust add its maker's public key, or aotpipe sign it yourself"]
    keys = [k for k in trusted_keys() if key_id(k) == signed_by]
    if not keys:
        return [f"{folder}: signed by key {signed_by}, which you do not trust (aotpipe trust list; "
                "aotpipe trust add KEY to trust it)"]
    problems = check_signature(folder, f"ed25519:{keys[0]}")
    return problems or verify_artifact(folder, load_graphs=False)


def signing_key_spec(key: str | Path | None = None) -> str:
    """The key to sign with: `key`, else the user's own (made on first use: what they make, they
    trust); checked usable for signing, a user error before any work; as an absolute spec
    (workers may run from another folder)."""
    spec = str(key) if key is not None else str(own_key())
    load_key(spec, for_signing=True)
    return absolute_key_spec(spec)
