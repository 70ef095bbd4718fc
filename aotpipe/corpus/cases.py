"""`aotpipe ops TREE --cases OUT`: per-op cases mined from a corpus.

A case is one op called on one set of arguments: each tensor's layout (shape, stride, storage
offset, dtype, device) and every other argument's value. Mining reads graph.json records only,
as `aotpipe ops` does: every call_function node of every graph under TREE falls in exactly one
case, so the cases' counts add up to the tree's calls (forward and backward ops alike).

Each case that can stand alone is then written as an artefact of one inference graph: the op
on the values its first node took when that node's graph ran on its saved inputs (inputs
stored whole, their layouts and aliasing kept; outputs recorded), with the manifest's `case`
record (op, count, the first nodes, each input's value range), signed as `aotpipe run` signs,
so that `aotpipe bench OUT` benches it like any other artefact and weighs it by its count.
Each model's graphs run once, in a worker process as bench runs them: a graph that crashes
costs only its own cases. Python-level calls (getitem, size arithmetic) and collectives
cannot stand alone: they are counted, listed, and not written.

OUT/cases.jsonl lists every case, one JSON object per line, in the plain form a per-op
harness reads: op, args (a tensor as {"tensor": {shape, stride, storage_offset, dtype,
device, range}}), kwargs, count, nodes, and the artefact (or why there is none).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotpipe.corpus.opcov import PYTHON_NAMESPACES, PYTHON_OPS
from aotpipe.errors import AotpipeError, printable
from aotpipe.format import records
from aotpipe.pipeline.executors.base import Failure, Resources, Task
from aotpipe.pipeline.executors.process import ProcessExecutor
from aotpipe.pipeline.tree import ModelView, iter_tree, missing_manifest, tree_model_folders

CASES_JSONL = "cases.jsonl"
MAX_LINKS = 16  # corpus nodes named per case (the count covers them all)
CASE_TIMEOUT_S = 600.0  # per model: its graphs run once and its cases are written
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "_dtensor")
PYTHON_LEVEL = "a Python-level call (every backend handles it itself): counted, not written"
COLLECTIVE = "a collective: it runs with its world's ranks (bench the rank's graphs): counted, not written"
UNDESCRIBED = "an argument whose value graph.json does not describe (a tuple, an unknown node): counted, not written"
LAYOUT_KEYS = ("shape", "stride", "storage_offset", "dtype", "device")
REF_TAGS = ("tensor", "value", "undescribed")  # what a node argument becomes in a case (_canonical)


@dataclass
class Case:
    """One op on one set of arguments, and the corpus nodes that call it so."""

    op: str
    args: list[Any]  # as cases.jsonl writes them: a tensor as {"tensor": its layout}
    kwargs: dict[str, Any]
    count: int = 0
    nodes: list[str] = field(default_factory=list)  # "<artefact> <graph> <node>", the first MAX_LINKS
    first: tuple[str, str, str] = ("", "", "")  # (model folder, graph key, node) whose values it takes
    first_rank: bool = False  # that node is a distributed rank's (its graph needs the world to run)
    why_not: str | None = None  # why it is not written as an artefact (decided from the records)
    name: str = ""  # its artefact's folder name under OUT
    artefact: str | None = None  # the folder written
    problem: str | None = None  # why writing it failed
    refs: list[str] = field(default_factory=list)  # the first node's node arguments, in argument order
    ranges: dict[str, records.ValueRange | None] | None = None  # by node argument, from the first node's run

    def to_json(self) -> dict[str, Any]:
        """The case's cases.jsonl line: each tensor argument with its recorded value range."""
        args: Any = self.args
        kwargs: Any = self.kwargs
        if self.ranges is not None:
            names = iter(self.refs)
            args = _with_ranges(self.args, names, self.ranges)
            kwargs = {k: _with_ranges(v, names, self.ranges) for k, v in self.kwargs.items()}
        return {"case": self.name, "op": self.op, "args": args, "kwargs": kwargs, "count": self.count,
                "nodes": self.nodes, "artefact": self.artefact, "why_not": self.why_not or self.problem}


def _with_ranges(a: Any, names: Any, ranges: dict[str, records.ValueRange | None]) -> Any:
    """`a` with each tensor's range added to its spec: `names` gives, in the order _canonical
    walks the arguments, the node each node argument was."""
    if isinstance(a, dict) and len(a) == 1 and next(iter(a)) in REF_TAGS:
        name = next(names, None)
        if "tensor" not in a:
            return a
        r = ranges.get(name) if name is not None else None
        return {"tensor": {**a["tensor"], "range": None if r is None else r.model_dump()}}
    if isinstance(a, list):
        return [_with_ranges(x, names, ranges) for x in a]
    return a


@dataclass
class Mined:
    """A tree's cases, its calls (call_function nodes, as `aotpipe ops` counts them), and the
    records that could not be read."""

    cases: list[Case]
    calls: int
    models: int
    graphs: int
    problems: list[str]


def is_python_level(op: str) -> bool:
    return op.split(".", 1)[0] in PYTHON_NAMESPACES or op in PYTHON_OPS


def _spec(src: records.NodeRecord | None) -> dict[str, Any] | None:
    """A node argument as a case holds it: a tensor's layout, a size's value; None where the
    record does not describe it."""
    if src is None:
        return None
    val = src.val
    if isinstance(val, dict) and all(k in val for k in ("shape", "stride", "dtype")):
        # a layout a pass recorded has no device
        return {"tensor": {k: val[k] for k in LAYOUT_KEYS if k in val}}
    if isinstance(val, (int, float)) and not isinstance(val, bool):
        return {"value": val}
    return None


def _canonical(a: Any, by_name: dict[str, records.NodeRecord], refs: list[str], missing: list[str]) -> Any:
    """An argument as a case's key and cases.jsonl hold it; each node argument's name appended
    to `refs` (in walking order), and to `missing` where its record does not describe it."""
    if isinstance(a, records.NodeRef):
        refs.append(a.node)
        spec = _spec(by_name.get(a.node))
        if spec is None:
            missing.append(a.node)
            return {"undescribed": None}
        return spec
    if isinstance(a, list):
        return [_canonical(x, by_name, refs, missing) for x in a]
    if isinstance(a, records.Record):  # a tagged argument (dtype, device, tuple, ...): its JSON form
        return a.model_dump(mode="json", exclude_none=True)
    return a


def mine(root: Path) -> Mined:
    """Every case of the graphs under `root`, most-called op first, read from records only."""
    root = Path(root)
    folders, incomplete = tree_model_folders(root)
    problems = [missing_manifest(f) for f in incomplete]
    cases: dict[str, Case] = {}
    calls = graphs = 0

    def take(v: ModelView) -> None:
        nonlocal calls, graphs
        if v.problem:
            problems.append(v.problem)
        rank = v.manifest is not None and v.manifest.distributed is not None
        for g in v.graphs:
            if g.problem:
                problems.append(g.problem)
                continue
            graphs += 1
            by_name = {n.name: n for n in g.nodes or []}
            for n in g.nodes or []:
                if n.op != "call_function":
                    continue
                calls += 1
                op = n.target or "?"
                refs: list[str] = []
                missing: list[str] = []
                args = _canonical(list(n.args or []), by_name, refs, missing)
                kwargs = {k: _canonical(x, by_name, refs, missing) for k, x in sorted((n.kwargs or {}).items())}
                key = json.dumps([op, args, kwargs], sort_keys=True)
                c = cases.get(key)
                if c is None:
                    c = cases[key] = Case(op, args, kwargs, why_not=(
                        PYTHON_LEVEL if is_python_level(op) else
                        COLLECTIVE if op.split(".", 1)[0] in COLLECTIVE_NAMESPACES else
                        UNDESCRIBED if missing else None))
                c.count += 1
                if len(c.nodes) < MAX_LINKS:
                    c.nodes.append(f"{v.folder.relative_to(root) if v.folder != root else v.folder.name} "
                                   f"{g.key} {n.name}")
                if c.count == 1 or (c.first_rank and not rank):  # a rank's graph runs only with its world
                    c.first, c.first_rank, c.refs = (str(v.folder), g.key, n.name), rank, refs

    for view in iter_tree(root, folders=folders):
        take(view)
        del view  # one model's nodes at a time
    ordered = sorted(cases.values(), key=lambda c: (c.op, -c.count, json.dumps(c.args, sort_keys=True)))
    seen: dict[str, int] = {}
    for c in ordered:
        seen[c.op] = seen.get(c.op, 0) + 1
        c.name = f"{_file_safe(c.op)}-{seen[c.op]}"
    return Mined(ordered, calls, len(folders), graphs, problems)


def _file_safe(op: str) -> str:
    out = "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in op).strip("._")
    return out or "op"


# ---------------------------------------------------------------------------------------
# Writing the cases (in worker processes)


def write_cases(mined: Mined, out: Path, *, key: str | None, trust_ops: tuple[str, ...] = (),
                workers: int | None = None, threads: int | None = 1,
                on_done: Callable[[int, int], None] | None = None) -> None:
    """Write every case that can stand alone under `out` (a new or empty folder), each model's in
    a worker; fill in each case's artefact or problem and ranges; write cases.jsonl."""
    # torch: only writing the cases runs graphs (mining alone stays light, as aotpipe ops is)
    from aotpipe.corpus.case_writer import CaseSpec, CaseTask

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AotpipeError(f"--cases {out}: not an empty folder; give a new one (cases are written whole, and "
                           "nothing already there is replaced)")
    out.mkdir(parents=True, exist_ok=True)
    by_model: dict[str, list[int]] = {}
    for i, c in enumerate(mined.cases):
        if c.why_not is None:
            by_model.setdefault(c.first[0], []).append(i)
    tasks = [CaseTask(folder, Path(folder).name, tuple(
        CaseSpec(i, mined.cases[i].first[1], mined.cases[i].first[2], mined.cases[i].name, mined.cases[i].op,
                 mined.cases[i].count, tuple(mined.cases[i].nodes)) for i in idx), str(out.resolve()), key,
        tuple(trust_ops)) for folder, idx in by_model.items()]

    finished = 0

    def done(t: int, outcome: Any) -> None:
        nonlocal finished
        finished += 1
        if isinstance(outcome, Failure):
            for s in tasks[t].specs:
                mined.cases[s.index].problem = f"{tasks[t].label}: its graphs did not run: {outcome.reason}"
        else:
            for w in outcome:
                c = mined.cases[w.index]
                c.artefact, c.problem, c.ranges = w.artefact, w.problem, w.ranges
        if on_done is not None:
            on_done(finished, len(tasks))

    n = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    ProcessExecutor(workers=n, timeout_s=CASE_TIMEOUT_S, threads=threads, cwd=Path.cwd()).run(
        [Task(f"cases of {t.label}", t, Resources(timeout_s=CASE_TIMEOUT_S)) for t in tasks],
        on_start=lambda i: None, on_done=done)
    lines = [json.dumps(c.to_json(), sort_keys=True, allow_nan=False) for c in mined.cases]
    (out / CASES_JSONL).write_text("".join(line + "\n" for line in lines))


def summary_lines(mined: Mined, out: Path | None) -> list[str]:
    """What ops --cases says: the cases, the calls they stand for, what was written and not."""
    ops = len({c.op for c in mined.cases})
    covered = sum(c.count for c in mined.cases)
    lines = [f"{len(mined.cases)} cases of {ops} ops stand for {covered} calls (the tree's: {mined.calls}) in "
             f"{mined.graphs} graphs of {mined.models} models"]
    written = [c for c in mined.cases if c.artefact]
    failed = [c for c in mined.cases if c.problem]
    not_written: dict[str, int] = {}
    for c in mined.cases:
        if c.why_not:
            not_written[c.why_not.split(":")[0]] = not_written.get(c.why_not.split(":")[0], 0) + 1
    if out is not None:
        lines.append(f"written: {len(written)} case artefacts under {out} (aotpipe bench {out} --backend B benches "
                     f"them, weighted by their counts); every case in {out / CASES_JSONL}")
    for why, k in sorted(not_written.items()):
        lines.append(f"not written: {k} case(s), {why}")
    for c in failed[:20]:
        lines.append(f"failed: {c.name} ({c.count} calls, first {c.nodes[0] if c.nodes else '?'}): "
                     f"{printable(c.problem or '')}")
    if len(failed) > 20:
        lines.append(f"failed: {len(failed) - 20} more (each named in {CASES_JSONL})")
    for p in mined.problems:
        lines.append(f"error: {p}")
    return lines


def summary_json(mined: Mined, out: Path | None) -> dict[str, Any]:
    return {"cases": len(mined.cases), "ops": len({c.op for c in mined.cases}),
            "calls": mined.calls, "covered_calls": sum(c.count for c in mined.cases),
            "graphs": mined.graphs, "models": mined.models,
            "written": sum(1 for c in mined.cases if c.artefact),
            "failed": [{"case": c.name, "problem": c.problem} for c in mined.cases if c.problem],
            "not_written": sum(1 for c in mined.cases if c.why_not),
            "jsonl": None if out is None else str(out / CASES_JSONL), "problems": mined.problems}
