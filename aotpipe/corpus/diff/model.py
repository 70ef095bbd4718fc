"""What a diff finds: one line per difference, grouped by section, as text or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

# The sections a finding belongs to, in the order they print.
SECTIONS = (
    "models", "status", "environment", "options", "graphs", "signature", "ops", "nodes", "weights",
    "passes", "checks", "breaks", "values", "time", "bytes",
)


class ValuesComparison(BaseModel):
    """How one graph's values compare between A and B (diff.values.compare_values): "same",
    "diverged" at an aligned pair of nodes (and why), or "skipped" (and why). Sent back by a
    sandboxed worker too, so validated when read."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["same", "diverged", "skipped"]
    compared: Optional[int] = None  # aligned nodes compared
    a_node: Optional[str] = None
    b_node: Optional[str] = None
    why: Optional[str] = None  # "diverged": how
    reason: Optional[str] = None  # "skipped": why


@dataclass
class Finding:
    """One difference: its section, where (a graph key, a model, or "" for the whole), one
    line saying what changed, and the same as data for --json."""

    section: str
    where: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "where": self.where, "text": self.text, **self.data}


@dataclass
class Diff:
    """The comparison of A and B: kind "artifact" or "tree", the differences, and notes
    (what was not compared, and why: they do not make A and B differ)."""

    kind: str
    a: str
    b: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Per graph key: the first diverging node of the values comparison (None: none diverged).
    first_divergence: dict[str, Optional[str]] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not self.findings

    def add(self, section: str, where: str, text: str, **data: Any) -> None:
        self.findings.append(Finding(section, where, text, data))

    def sections(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in sorted(self.findings, key=lambda f: SECTIONS.index(f.section) if f.section in SECTIONS else 99):
            out.setdefault(f.section, []).append(f)
        return out

    def lines(self) -> list[str]:
        """The diff as text: a header, one line per finding under its section, the notes."""
        out = [f"A: {self.a}", f"B: {self.b}"]
        for section, found in self.sections().items():
            out.append(f"{section}:")
            for f in found:
                out.append(f"  {f.where + ': ' if f.where else ''}{f.text}")
        if self.first_divergence:
            diverged = sorted(k for k, v in self.first_divergence.items() if v)
            n = len(self.first_divergence)
            out.append(f"values: {n} graph{'' if n == 1 else 's'} run on the same inputs, node by node: "
                       + (f"{len(diverged)} diverged ({', '.join(diverged)})" if diverged
                          else "no aligned node diverged"))
        for note in self.notes:
            out.append(f"note: {note}")
        n = len(self.findings)
        what = "artefacts" if self.kind == "artifact" else "trees"
        out.append(f"same {what}" if self.same else f"{n} difference{'s' if n != 1 else ''}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "a": self.a, "b": self.b, "same": self.same,
            "differences": [f.to_json() for f in self.findings],
            "first_divergence": self.first_divergence,
            "notes": self.notes,
        }
