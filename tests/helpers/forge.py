"""What a forger does after editing an artefact: make its hashes fit again.

verify's sha256 and checksum checks catch corruption, not forgery (docs/security.md): whoever
can edit the files can recompute them. Tests of the content checks behind them (the
restricted unpickler, the op allow-list, the limits) reseal an edited artefact first, so
that only those checks stand between a payload and its execution.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from aotpipe.artifact.manifest import file_sha256, seal

MANIFEST, SIGNATURE = "manifest.json", "signature.json"


def reseal(model: Path, *, digests: bool = True, max_bytes: int = 16 << 20) -> bool:
    """Recompute the sha256 of every regular file under `model` in the manifest's file list
    (files it did not list are added), then the manifest's checksum; with `digests` false,
    only the checksum. False when the manifest itself cannot be resealed (not a regular
    file, not JSON, not an object): a forger could not seal it either."""
    model = Path(model)
    mpath = model / MANIFEST
    try:
        st = os.lstat(mpath)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return False
        m = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError, OSError, RecursionError):
        return False
    if not isinstance(m, dict):
        return False
    files = m.get("files")
    if digests and isinstance(files, dict):
        names = set(k for k in files if isinstance(k, str))
        for p in model.rglob("*"):
            rel = p.relative_to(model).as_posix()
            if rel not in (MANIFEST, SIGNATURE):
                names.add(rel)
        for rel in sorted(names):
            p = model / rel
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size <= max_bytes:
                files[rel] = file_sha256(p)
    try:
        data = seal(m)
    except (ValueError, TypeError, RecursionError):
        return False
    mpath.unlink()
    mpath.write_bytes(data)
    return True


def hmac_forgery(model: Path, secret: bytes) -> None:
    """Sign `model` as a forger holding only a public key would: an HMAC-SHA256 signature
    keyed with the public key's bytes (in whatever encoding the verifier keeps it), written
    where and how aotpipe writes signatures. A verifier must never call it ok."""
    from aotpipe.trust.signing import _hmac_key, manifest_bytes, signature_record

    model = Path(model)
    record = signature_record(manifest_bytes(model), _hmac_key(model / "public-key-as-secret", secret))
    (model / SIGNATURE).unlink(missing_ok=True)
    (model / SIGNATURE).write_bytes(record)
