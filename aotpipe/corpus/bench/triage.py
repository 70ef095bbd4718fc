"""Failing graphs grouped into unique bugs: bench --minimize's table, and `aotpipe triage`.

Forty failing graphs across a zoo are often three bugs. Each failing graph gets a signature:

- a value outside the bound that --locate (--minimize) traced to a node: the node's op and its
  arguments' kinds (a tensor's dtype, "scalar" for a number; shapes, even ranks, vary from model
  to model where the bug does not);
- one not located, or a graph that crashed, timed out, did not compile or run: its status and
  its reason with what varies from graph to graph taken out (numbers, addresses, quoted names,
  paths).

Graphs with one signature are one bug: one row each, with how many graphs and models it hits,
the first one seen, and its smallest repro (a minimised one first, else a located prefix).
Read from the bench's results alone (`bench --json`'s output, or the bench just run): nothing
is run.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aotpipe.corpus.bench.graph import GraphResult
from aotpipe.corpus.bench.locate import Located
from aotpipe.corpus.bench.minimize import Minimized
from aotpipe.errors import AotpipeError

BUG_STATUSES = ("fail_accuracy", "compile_error", "runtime_error", "timeout", "crashed")
_SHAPE = re.compile(r"^([a-z0-9_]+)\[(.*)\]$")
GRAPHS, LOCATED = "graphs", "located"  # bench --json's lists


@dataclass
class Bug:
    """One unique bug: the graphs and models whose failure has its signature."""
    signature: str
    status: str
    graphs: list[str] = field(default_factory=list)  # "<artefact> <graph>", in the bench's order
    models: list[str] = field(default_factory=list)
    repro: str | None = None  # the smallest repro among its graphs'
    repro_nodes: int | None = None  # its nodes (None: a located prefix, its size unknown here)

    @property
    def first(self) -> str:
        return self.graphs[0]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "first": self.first}


def _kind(shape: str) -> str:
    """The kind of a value as locate describes it: a tensor's dtype (float32[4, 8] -> float32), a
    number's "scalar", anything else its type's name."""
    m = _SHAPE.match(shape)
    if m is not None:
        return m.group(1)
    return "scalar" if re.fullmatch(r"-?[\d.]+(e[+-]?\d+)?|True|False|-?inf|nan", shape) else shape


def normalised(reason: str) -> str:
    """A failure's reason with what differs between graphs of one bug taken out."""
    text = reason.splitlines()[0] if reason else ""
    text = re.sub(r"(/[^\s:'\"]+)+", "<path>", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "<name>", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "<addr>", text)
    text = re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", text)
    return text.strip()


def signature(graph: GraphResult, located: Located | None) -> str:
    """The bug a failing graph's result (and its located culprit) stands for."""
    if graph.status == "fail_accuracy" and located is not None and located.found:
        kinds = ", ".join(_kind(s) for s in located.input_shapes)
        return f"fail_accuracy at {located.op}({kinds})"
    if graph.status == "fail_accuracy":
        return "fail_accuracy, not located" + (f": {normalised(located.reason)}" if located is not None else "")
    return f"{graph.status}: {normalised(graph.reason)}"


def _model(artifact: str) -> str:
    return artifact.rsplit(".rank", 1)[0] if re.search(r"\.rank\d+$", artifact) else artifact


def triage(results: list[GraphResult], located: list[Located]) -> list[Bug]:
    """The unique bugs of a bench's results (and what --locate or --minimize found), most graphs first."""
    by_graph = {(loc.artifact, loc.graph): loc for loc in located}
    bugs: dict[str, Bug] = {}
    for g in results:
        if g.status not in BUG_STATUSES:
            continue
        loc = by_graph.get((g.artifact, g.graph))
        sig = signature(g, loc)
        bug = bugs.setdefault(sig, Bug(sig, g.status))
        bug.graphs.append(f"{g.artifact} {g.graph}")
        if _model(g.artifact) not in bug.models:
            bug.models.append(_model(g.artifact))
        m = loc.minimized if loc is not None else None
        if m is not None and m.repro is not None and m.nodes is not None and \
                (bug.repro_nodes is None or m.nodes < bug.repro_nodes):
            bug.repro, bug.repro_nodes = m.repro, m.nodes
        elif loc is not None and loc.repro and bug.repro is None:
            bug.repro = loc.repro
    return sorted(bugs.values(), key=lambda b: (-len(b.graphs), b.signature))


def _fields(cls: Any, data: Any) -> dict[str, Any]:
    """What of `data` (a JSON object) names a field of the dataclass `cls`."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names} if isinstance(data, dict) else {}


def read(path: Path) -> tuple[list[GraphResult], list[Located]]:
    """A bench's results as `bench --json` printed them: its graphs and what was located."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AotpipeError(f"{path}: not a bench's results ({type(e).__name__}: {e}); write one with aotpipe bench "
                           "... --json > FILE") from None
    fix = "write one with aotpipe bench ... --json > FILE"
    if not isinstance(data, dict) or not isinstance(data.get(GRAPHS), list):
        raise AotpipeError(f"{path}: not a bench's results (no '{GRAPHS}' list); {fix}")
    try:
        results = [GraphResult(**_fields(GraphResult, g)) for g in data[GRAPHS]]
        located = []
        for raw in data.get(LOCATED) or []:
            loc = Located(**_fields(Located, raw))
            if isinstance(loc.minimized, dict):
                loc.minimized = Minimized(**_fields(Minimized, loc.minimized))
            located.append(loc)
    except TypeError as e:
        raise AotpipeError(f"{path}: a result lacks a field ({e}); {fix}") from None
    return results, located


def lines(bugs: list[Bug]) -> list[str]:
    """The bugs as a person reads them: one block each."""
    failing = sum(len(b.graphs) for b in bugs)
    out = [f"{len(bugs)} unique bug(s) among {failing} failing graph(s)"]
    for i, b in enumerate(bugs, 1):
        repro = b.repro if b.repro is not None else "none written (bench --minimize writes one for a value outside " \
                                                    "the bound)"
        size = f" ({b.repro_nodes} node(s))" if b.repro_nodes is not None else ""
        out += [f"bug {i}: {b.signature}",
                f"    {len(b.graphs)} graph(s) of {len(b.models)} model(s); first seen: {b.first}",
                f"    smallest repro{size}: {repro}"]
    return out
