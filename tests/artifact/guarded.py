"""Tensors whose storage sits against inaccessible memory, so that a kernel that reads or
writes past it faults, or shows that it did.

:func:`place` copies a tensor's storage into a fresh anonymous mapping and gives a tensor of
the same sizes, strides and offset over exactly those bytes (``torch.frombuffer``: the
storage is the bytes, no more). Around them lie pages with no access at all (``PROT_NONE``,
64 MiB on each side, reserved address space only): a read or write there is a SIGSEGV.

- ``"end"``: the storage ends at the guard, so any access past its last byte faults;
- ``"start"``: the storage begins at the guard, so any access before its first byte faults;
- ``"padded"``: 64 KiB of a chosen byte on each side, then the guards: an access just
  outside lands in the padding, where a changed byte shows a write, and two runs with
  different padding that give different results show a read (torch's vectorised kernels
  may not fault on what they read but never use).

Hand-written because nothing torch or the standard library offers puts a tensor's storage
against a guard page: ``mmap`` objects cannot ``mprotect`` part of a mapping, so libc's
``mmap``/``mprotect``/``munmap`` are called through ctypes (Linux, x86-64 and arm64 layouts).
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass

import torch

PAGE = mmap.PAGESIZE
GUARD_BYTES = 64 << 20  # a read as far past as flash attention's 256 KB faults too
PAD_BYTES = 64 << 10
_MAP_NORESERVE = 0x4000  # Linux: the guards reserve address space, never memory
_PROT_NONE = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value


@dataclass
class Placement:
    """One mapping holding a storage between guards; `release` unmaps it (after every
    tensor over it is gone: a later access would fault)."""

    base: int
    total: int
    start: int  # the storage's first byte
    nbytes: int
    data: int  # the accessible region: [data, data + data_bytes)
    data_bytes: int
    fill: int

    def padding_intact(self) -> bool:
        """Whether every accessible byte outside the storage still holds the fill."""
        whole = torch.frombuffer((ctypes.c_char * self.data_bytes).from_address(self.data), dtype=torch.uint8)
        head, tail = self.start - self.data, self.start - self.data + self.nbytes
        return not bool((whole[:head] != self.fill).any() or (whole[tail:] != self.fill).any())

    def release(self) -> None:
        if self.total:
            _libc.munmap(self.base, self.total)
            self.total = 0


def _round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def place(t: torch.Tensor, where: str, fill: int = 0) -> tuple[torch.Tensor, Placement]:
    """`t` (sizes, strides, offset, dtype and the bytes of its storage) over a storage of the
    same bytes placed by `where` ("end", "start" or "padded"; see the module), the rest of
    the accessible pages filled with the byte `fill`."""
    storage = t.untyped_storage()
    n = storage.nbytes()
    pad = PAD_BYTES if where == "padded" else 0
    data_bytes = _round_up(pad + max(n, 1) + pad)
    total = GUARD_BYTES + data_bytes + GUARD_BYTES
    base = _libc.mmap(None, total, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if base in (None, _FAILED):
        raise OSError(ctypes.get_errno(), "mmap failed")
    data = base + GUARD_BYTES
    if _libc.mprotect(data, data_bytes, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
        _libc.munmap(base, total)
        raise OSError(ctypes.get_errno(), "mprotect failed")
    ctypes.memset(data, fill, data_bytes)
    start = {"end": data + data_bytes - n, "start": data, "padded": data + pad}[where]
    placement = Placement(base, total, start, n, data, data_bytes, fill)
    if n == 0:  # frombuffer takes no empty buffer: a storage of no bytes has nothing to guard
        return torch.empty(0, dtype=t.dtype).as_strided(t.shape, t.stride(), t.storage_offset()), placement
    raw = torch.frombuffer((ctypes.c_char * n).from_address(start), dtype=torch.uint8)
    raw.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset()), placement
