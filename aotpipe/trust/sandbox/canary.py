"""Canary tensors: known contents in the worker's heap, checked after the graphs ran.

A kernel given inconsistent arguments by a hostile graph may write past its own tensors
without crashing. The worker allocates canaries of several sizes (small ones share malloc's
arenas with small tensors, large ones get mappings of their own) before it builds any graph
and again beside each graph's inputs, and checks every one afterwards: a changed canary
means the graph wrote outside its tensors (the artefact fuzzer's oracle for silent corruption).
"""

from __future__ import annotations

from typing import Any

# elements of int64: 64 B, 512 B, 8 KiB, 128 KiB, 2 MiB
SIZES = (8, 64, 1024, 16384, 262144)
_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # a golden-ratio multiplier as a signed int64


def _pattern(n: int, salt: int) -> Any:
    import torch  # torch: after the worker's rlimits are set (sandbox/worker.py)

    # No two canaries alike, no run of equal or zero words (what a stray memset writes).
    return (torch.arange(n, dtype=torch.int64) + salt * 1_000_003 + 1) * _MIX


class Canaries:
    """Tensors of known contents; :meth:`check` names the ones that changed."""

    def __init__(self) -> None:
        self._tensors: list[tuple[str, Any]] = []

    def add(self, where: str) -> None:
        """Allocate a set of canaries now (`where` says when, for the report)."""
        for n in SIZES:
            self._tensors.append((f"{where}, {n * 8} bytes", _pattern(n, len(self._tensors))))

    def check(self) -> str:
        """"intact", or which canaries changed (one line)."""
        import torch  # torch: after the worker's rlimits are set (sandbox/worker.py)

        changed = [name for i, (name, t) in enumerate(self._tensors)
                   if not torch.equal(t, _pattern(t.numel(), i))]
        if not changed:
            return "intact"
        return f"{len(changed)} of {len(self._tensors)} canary tensors changed, first the one allocated {changed[0]}"
