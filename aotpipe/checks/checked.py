"""What the checks of one graph found: its checks, what could not be checked, and eager's
measured noise per output (the manifest's graphs.<key>.checks). Shared by the checks of
written graphs (written.py), of a train_step (train_step.py) and at other sizes (sizes.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aotpipe.format.records import GraphChecks
from aotpipe.runtime import accuracy
from aotpipe.runtime.accuracy import Check


@dataclass
class CheckedGraph:
    """The checks of one graph and what could not be checked (its record: records.GraphChecks)."""

    checks: list[Check] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one reason per skipped check
    indirect: int = 0  # outputs checked through another graph (saved activations, the joint's)
    # Per output index: eager float32's RMS error against float64 where a check measured it
    # (the bound of the output's replay evidence; aotpipe.runtime.evidence).
    eager_errors: dict[int, float] = field(default_factory=dict)

    def record(self) -> GraphChecks:
        """The manifest's record of these checks (graphs.<key>.checks)."""
        reasons: dict[str, int] = {}
        for r in self.skipped:
            reasons[r] = reasons.get(r, 0) + 1
        return GraphChecks(
            run=len(self.checks),
            passed=sum(c.passed for c in self.checks),
            failed=sum(not c.passed for c in self.checks),
            skipped=len(self.skipped),
            **settled_counts(self.checks),
            skipped_reasons=[f"{n} x {r}" if n > 1 else r for r, n in reasons.items()],
            indirect=self.indirect,
            items=[c.item() for c in self.checks],
        )


def settled_counts(checks: Sequence[Check]) -> dict[str, int]:
    """How many `checks` were settled exactly, by the floor, by the float64 rule, and of the
    last how many within eager's own noise (records.CheckTotals)."""
    methods = [c.method for c in checks]
    return {"exact": sum(m in ("exact", "none") for m in methods), "floor": methods.count("floor"),
            "fp64": methods.count("fp64"),
            "within_noise": sum(accuracy.within_noise(c) for c in checks)}
