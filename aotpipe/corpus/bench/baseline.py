"""Expected results of a bench, as a CSV file: the regression gate.

One row per graph: ``artifact,graph,status`` (a header row first; columns after these three
are ignored, so a ``--csv`` file serves as a baseline too). Against a baseline, a graph that
passed and now does not is a regression (the bench exits 1); one that failed and now passes
is an improvement; a change from one failure to another is listed. A graph that passed and is
no longer benched is a regression too (deleting a failing artefact must not pass the gate),
unless the user names it removed on purpose (``--removed MODEL`` or ``--removed MODEL/GRAPH``,
as the baseline's artifact and graph columns give them); each such name must name a graph of
the baseline that is gone, so that a stale or misspelt one is not left to excuse a later loss.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from aotpipe.corpus.bench.graph import STATUSES, GraphResult
from aotpipe.errors import AotpipeError

COLUMNS = ("artifact", "graph", "status")


def write_baseline(path: Path, results: Sequence[GraphResult]) -> None:
    """Write `results` as a baseline (sorted, so that two benches' files diff line by line)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in sorted(results, key=lambda r: (r.artifact, r.graph)):
        w.writerow([r.artifact, r.graph, r.status])
    try:
        Path(path).write_text(buf.getvalue())
    except OSError as e:
        raise AotpipeError(f"--write-baseline {path}: cannot write it ({e.strerror or e})") from None


def read_baseline(path: Path) -> dict[tuple[str, str], str]:
    """{(artifact, graph): status} of a baseline file; a malformed one is the user's error,
    naming its line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise AotpipeError(f"--baseline {path}: cannot read it ({e.strerror or e})") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0][:3]] != list(COLUMNS):
        raise AotpipeError(f"{path}:1: a baseline's first line is the header {','.join(COLUMNS)}; "
                           "write one with aotpipe bench ... --write-baseline FILE")
    out: dict[tuple[str, str], str] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) < 3:
            raise AotpipeError(f"{path}:{n}: {len(row)} columns; a row is artifact,graph,status")
        status = row[2].strip()
        if status not in STATUSES:
            raise AotpipeError(f"{path}:{n}: status {status!r} is not one of {', '.join(STATUSES)}")
        out[(row[0], row[1])] = status
    return out


@dataclass
class Comparison:
    """How a bench's results differ from a baseline."""

    regressions: list[str] = field(default_factory=list)  # passed, now fail: exit 1
    improvements: list[str] = field(default_factory=list)  # failed, now pass
    changed: list[str] = field(default_factory=list)  # one failure to another
    new: list[str] = field(default_factory=list)  # benched, not in the baseline
    missing: list[str] = field(default_factory=list)  # in the baseline, not benched (nor removed)
    # passed in the baseline, no longer benched: a regression (deleting a failing artefact
    # must not pass the gate) unless the user says they were removed on purpose
    vanished: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # in the baseline, gone, named by --removed

    @property
    def ok(self) -> bool:
        return not self.regressions and not self.vanished


def _names(removal: str, key: tuple[str, str]) -> bool:
    """Whether a --removed MODEL or MODEL/GRAPH names the baseline row `key` (artifact, graph)."""
    return removal in (key[0], f"{key[0]}/{key[1]}")


def check_removed(baseline: dict[tuple[str, str], str], removed: Sequence[str], path: object) -> None:
    """Refuse (a user error) a --removed that names no row of the baseline at `path`."""
    for x in removed:
        if not any(_names(x, key) for key in baseline):
            raise AotpipeError(f"--removed {x}: no graph of the baseline {path} has that name; name one as "
                               "MODEL or MODEL/GRAPH, as its artifact and graph columns give them")


def compare(results: Sequence[GraphResult], baseline: dict[tuple[str, str], str], *,
            benched_kinds: Optional[Callable[[str], bool]] = None, removed: Sequence[str] = ()) -> Comparison:
    """How `results` differ from `baseline`. `benched_kinds(graph)`: whether this bench would
    have benched a graph of that key at all (--graphs, an inference-only backend): one it
    left out on purpose is neither missing nor a regression. `removed`: --removed's names
    (MODEL or MODEL/GRAPH) of graphs gone on purpose, listed, not counted; one that names
    only graphs still benched is the user's error."""
    c = Comparison()
    seen = set()
    for r in sorted(results, key=lambda r: (r.artifact, r.graph)):
        key = (r.artifact, r.graph)
        seen.add(key)
        was = baseline.get(key)
        name = f"{r.artifact} {r.graph}"
        if was is None:
            c.new.append(f"{name}: {r.status}")
        elif was == "pass" and r.status != "pass":
            c.regressions.append(f"{name}: pass -> {r.status} ({r.reason})")
        elif was != "pass" and r.status == "pass":
            c.improvements.append(f"{name}: {was} -> pass")
        elif was != r.status:
            c.changed.append(f"{name}: {was} -> {r.status}")
    used = set()
    for (a, g), was in sorted(baseline.items()):
        if (a, g) in seen or (benched_kinds is not None and not benched_kinds(g)):
            continue
        why = [x for x in removed if _names(x, (a, g))]
        if why:
            used.update(why)
            c.removed.append(f"{a} {g}: {was} -> removed (--removed {why[0]})")
            continue
        c.missing.append(f"{a} {g}: {was}")
        if was == "pass":
            c.vanished.append(f"{a} {g}: pass -> not benched (gone; --removed {a}/{g} if removed on purpose)")
    for x in removed:
        if x not in used:
            raise AotpipeError(f"--removed {x}: every graph of the baseline it names is still benched; "
                               "drop it (or bench without the graphs it names)")
    return c
