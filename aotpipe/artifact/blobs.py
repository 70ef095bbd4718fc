"""Content-addressed tensor storage: ``blobs/<sha256>.safetensors``, one tensor per file.

A tensor used by several graphs (a weight shared by the inference, forward and joint
graphs) is stored once: its file name is the sha256 of the file's bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from aotpipe.format.records import BLOB_DIR
from aotpipe.errors import ArtifactError
from aotpipe.format import limits
from aotpipe.artifact import fsio

_KEY = "tensor"


def encode(t: torch.Tensor) -> tuple[str, bytes]:
    """(sha256, safetensors bytes) of one tensor, stored contiguous."""
    data = st_save({_KEY: t.detach().to("cpu").contiguous()})
    return hashlib.sha256(data).hexdigest(), data


class BlobStore:
    """Writes and reads the blobs of one model folder."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.dir = self.root / BLOB_DIR
        self._checked: dict[str, bytes] = {}  # digest -> bytes already read and hash-checked

    def put(self, t: torch.Tensor) -> str:
        digest, data = encode(t)
        path = self.dir / f"{digest}.safetensors"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fsio.write_durable(path, data)
        return digest

    def has(self, digest: str) -> bool:
        return (self.dir / f"{digest}.safetensors").is_file()

    def get(self, digest: str) -> torch.Tensor:
        """The tensor of blob `digest`, a fresh one each call (callers may write into it).

        Its bytes are read and checked against the digest once per store: graphs share
        weights, and re-hashing them for every graph was a tenth of a real-size check."""
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ArtifactError(f"bad blob name {digest!r}")
        path = self.dir / f"{digest}.safetensors"
        data = self._checked.get(digest)
        if data is None:
            data = self._checked[digest] = self._read_checked(digest, path)
        try:
            return st_load(data)[_KEY]
        except Exception as e:
            raise ArtifactError(f"{path}: not a valid safetensors file ({e})") from None

    def check_bytes(self, digests: list[str], where: Path, what: str) -> None:
        """Refuse, before reading any, blobs that need more than the byte limits in all
        (each distinct blob counted once, by its size on disk)."""
        import os

        parts = []
        for digest in dict.fromkeys(digests):
            path = self.dir / f"{digest}.safetensors"
            try:
                size = os.lstat(path).st_size
            except OSError:
                continue  # reading it says what is wrong
            parts.append((f"blob {str(digest)[:12]}", size))
        if parts:
            limits.check_total_bytes(parts, where, what)

    def _read_checked(self, digest: str, path: Path) -> bytes:
        lim = limits.current()
        # one tensor and its safetensors header; a link, device or FIFO is refused unread
        data = limits.read_bytes(path, limit=lim.tensor_bytes + (1 << 20),
                                 limit_name="max_tensor_bytes" if lim.max_tensor_bytes else "max_bytes", root=self.root)
        if hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactError(f"{path}: contents do not match its hash (the file was changed)")
        return data
