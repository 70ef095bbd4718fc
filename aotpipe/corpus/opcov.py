"""`aotpipe ops`: every op the graphs of a tree call, with counts, the models and graph kinds
that call it and its distinct input signatures; with a supported set, the coverage per model
and the first unsupported op of each graph.

Read from graph.json records only: no graph is built or run, no code imported (a hostile tree
can be listed). Only --backend imports torch, to read the backend's own tables.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from aotpipe.errors import AotpipeError, printable
from aotpipe.format.graph_keys import parse_graph_key
from aotpipe.format.records import CollectiveTotal, collectives_text
from aotpipe.pipeline.tree import ModelView, iter_tree, missing_manifest, node_signature, tree_model_folders

MAX_SIGNATURES = 8  # distinct input signatures kept per op
MAX_COUNTED = 4096  # distinct ones counted beyond those (memory stays bounded on a hostile tree)
# Python-level call targets (operator.getitem, int arithmetic on sizes): every backend handles
# them itself.
PYTHON_NAMESPACES = ("operator", "math")
PYTHON_OPS = ("torch.sym_max", "torch.sym_min", "torch.sym_not", "torch.sym_ite", "torch.sym_float", "torch.sym_int")  # as ops.SIZE_ARITHMETIC
# Namespaces whose op names are looked up in torch.ops for --backend (built into torch: a
# lookup imports nothing); a library's ops (trusted_ops) count as not covered.
TORCH_NAMESPACES = ("aten", "prims", "rngprims", "mkldnn", "mkl", "onednn")


@dataclass
class OpRow:
    op: str
    count: int = 0
    models: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)
    signatures: list[str] = field(default_factory=list)
    more_signatures: int = 0
    supported: Optional[bool] = None
    how: Optional[str] = None  # how the backend covers it (--backend)

    _extra: set[str] = field(default_factory=set, repr=False)  # distinct ones past the first few

    def add_signature(self, sig: str) -> None:
        if sig in self.signatures:
            return
        if len(self.signatures) < MAX_SIGNATURES:
            self.signatures.append(sig)
        elif len(self._extra) < MAX_COUNTED and sig not in self._extra:
            self._extra.add(sig)
            self.more_signatures = len(self._extra)


@dataclass
class GraphCoverage:
    model: str
    graph: str
    ops: int  # calls
    supported: int  # calls of supported ops
    first_unsupported: Optional[tuple[str, str]] = None  # (node name, op)
    problem: Optional[str] = None


@dataclass
class RankCollectives:
    """A distributed rank's collectives (its manifest's `distributed` record): those of one
    training step and of one inference call, by op."""

    model: str
    rank: int
    world: int
    strategy: str
    step: dict[str, CollectiveTotal]
    inference: dict[str, CollectiveTotal]

    def to_json(self) -> dict[str, Any]:
        def ops(d: dict[str, CollectiveTotal]) -> dict[str, Any]:
            return {op: t._asdict() for op, t in sorted(d.items())}
        return {"model": self.model, "rank": self.rank, "world": self.world, "strategy": self.strategy,
                "step": ops(self.step), "inference": ops(self.inference)}


@dataclass
class OpsTable:
    ops: list[OpRow]
    graphs: list[GraphCoverage]
    models: int
    problems: list[str]
    supported_by: Optional[str] = None
    collectives: list[RankCollectives] = field(default_factory=list)  # one per distributed rank

    def per_model(self) -> list["ModelCoverage"]:
        """Coverage per model: calls of supported ops over calls, and distinct ops."""
        by_model: dict[str, ModelCoverage] = {}
        for g in self.graphs:
            m = by_model.setdefault(g.model, ModelCoverage(g.model))
            m.calls += g.ops
            m.supported_calls += g.supported
            m.graphs += 1
            m.graphs_fully_supported += g.first_unsupported is None and g.problem is None
        for op in self.ops:
            for name in op.models:
                m = by_model.get(name)
                if m is not None:
                    m.distinct = (m.distinct or 0) + 1
                    m.distinct_supported = (m.distinct_supported or 0) + bool(op.supported)
        return list(by_model.values())


@dataclass
class ModelCoverage:
    """One model's op coverage: calls of supported ops over all calls, graphs whose every op
    is supported, and distinct ops (None: no op of its graphs was listed)."""

    model: str
    calls: int = 0
    supported_calls: int = 0
    graphs_fully_supported: int = 0
    graphs: int = 0
    distinct: Optional[int] = None
    distinct_supported: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None or k not in ("distinct",
                                                                                             "distinct_supported")}


def base_kind(key: str) -> str:
    """inference, forward, backward or joint: the kind of any graph key (a later subgraph's,
    one made by passes)."""
    parsed = parse_graph_key(key)
    return key if parsed is None else parsed.kind


def op_table(root: Path, supported: Optional[Callable[[str], Optional[str]]] = None,
             supported_by: Optional[str] = None) -> OpsTable:
    """The ops of every graph under `root`; `supported(op)` gives how an op is covered, or
    None where it is not (no supported set: coverage is not computed)."""
    root = Path(root)
    folders, incomplete = tree_model_folders(root)
    rows: dict[str, OpRow] = {}
    graphs: list[GraphCoverage] = []
    # a model folder without its manifest: named (ops exits 2), as verify fails it; its graphs are not listed
    problems: list[str] = [missing_manifest(f) for f in incomplete]
    verdicts: dict[str, Optional[str]] = {}

    def how(op: str) -> Optional[str]:
        if op not in verdicts:
            verdicts[op] = supported(op) if supported is not None else None
        return verdicts[op]

    ranks: list[RankCollectives] = []

    def count(v: ModelView) -> None:
        if v.problem:
            problems.append(v.problem)
        d = v.manifest.distributed if v.manifest is not None else None
        if d is not None:
            ranks.append(RankCollectives(v.folder.name, d.rank, d.world_size, d.strategy, d.per_step(),
                                         d.per_inference()))
        for g in v.graphs:
            cov = GraphCoverage(v.name, g.key, 0, 0, problem=g.problem)
            graphs.append(cov)
            if g.problem:
                problems.append(g.problem)
                continue
            by_name = {n.name: n for n in g.nodes or []}
            for n in g.nodes or []:
                if n.op != "call_function":
                    continue
                op = n.target or "?"
                row = rows.setdefault(op, OpRow(op))
                row.count += 1
                row.models.add(v.name)
                row.kinds.add(base_kind(g.key))
                row.add_signature(node_signature(n, by_name))
                cov.ops += 1
                if supported is not None:
                    if how(op) is not None:
                        cov.supported += 1
                    elif cov.first_unsupported is None:
                        cov.first_unsupported = (n.name, op)

    # One model's graph.json nodes at a time: only the rows, with a few signatures each, are
    # kept (a zoo's nodes held at once took 7 GB).
    for view in iter_tree(root, folders=folders):
        count(view)
        del view  # before the next model is read
    for op, row in rows.items():
        if supported is not None:
            row.how = how(op)
            row.supported = row.how is not None
    ordered = sorted(rows.values(), key=lambda r: (-r.count, r.op))
    return OpsTable(ordered, graphs, len(folders), problems, supported_by, ranks)


# ---------------------------------------------------------------------------------------
# Supported sets


def _python_op(op: str) -> bool:
    return op.split(".", 1)[0] in PYTHON_NAMESPACES or op in PYTHON_OPS


def supported_from_file(path: Path) -> Callable[[str], Optional[str]]:
    """A supported set from a text file: one op per line, `#` starts a comment. A line names
    an overload (aten.addmm.default), every overload of an op (aten.addmm) or a whole
    namespace (aten.*)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AotpipeError(f"{path}: cannot read the supported set ({e.__class__.__name__}: "
                           f"{getattr(e, 'strerror', None) or e}); give a text file of op names, one per line") from None
    exact: set[str] = set()
    packets: set[str] = set()
    namespaces: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        parts = name.split(".")
        namespace = len(parts) == 2 and parts[1] == "*"  # `*` only as ns.* (aten.*.default once read as aten.*)
        if not (namespace or all(p.isidentifier() for p in parts)) or len(parts) > 3 or len(parts) < 2:
            raise AotpipeError(f"{path}:{lineno}: {name[:80]!r} is not an op name; write ns.op.overload "
                               "(aten.addmm.default), ns.op (every overload) or ns.* (a namespace)")
        if namespace:
            namespaces.add(parts[0])
        elif len(parts) == 2:
            packets.add(name)
        else:
            exact.add(name)

    def supported(op: str) -> Optional[str]:
        if op in exact:
            return "listed"
        if op.rsplit(".", 1)[0] in packets:
            return "listed (every overload)"
        if op.split(".", 1)[0] in namespaces:
            return "listed (namespace)"
        if _python_op(op):
            return "python"
        return None

    return supported


BACKENDS = {
    "inductor": "ops torch._inductor lowers (torch._inductor.lowering.lowerings, its explicit fallbacks among "
                "them) or decomposes (torch._inductor.decomposition.decompositions), and in-place ops whose "
                "functional form it does (functionalization runs first); others reach inductor only through its "
                "implicit fallback",
    "core_aten": "ops tagged torch.Tag.core (the core ATen opset that export backends take), and prims",
}


def _resolve(op: str) -> Any:
    """The torch OpOverload a built-in op name names, or None (looked up, never called)."""
    import torch  # torch: kept off the torch-free path (opcov reads graph.json without torch)

    parts = op.split(".")
    if len(parts) != 3 or parts[0] not in TORCH_NAMESPACES or not all(p.isidentifier() for p in parts):
        return None
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, parts[2])
    except (AttributeError, RuntimeError):
        return None


def supported_by_backend(name: str) -> Callable[[str], Optional[str]]:
    """A backend's supported set, from its own tables (BACKENDS says which)."""
    if name not in BACKENDS:
        raise AotpipeError(f"--backend {name[:60]!r} is not known; use one of: {', '.join(BACKENDS)} "
                           "(or --supported FILE)")
    if name == "inductor":
        # torch: kept off the torch-free path (opcov reads graph.json without torch)
        from torch._inductor import decomposition, lowering

        lowered = lowering.lowerings
        fallbacks = getattr(lowering, "fallbacks", set())
        decomposed = decomposition.decompositions

        def table(o: Any) -> Optional[str]:
            if o in fallbacks:
                return "fallback kernel"
            if o in lowered or o.overloadpacket in lowered:
                return "lowered"
            if o in decomposed:
                return "decomposed"
            return None

        def inductor(op: str) -> Optional[str]:
            if _python_op(op):
                return "python"
            o = _resolve(op)
            if o is None:
                return None
            how = table(o)
            if how is None and o.overloadpacket.__name__.endswith("_"):
                # torch.compile functionalizes a graph before inductor lowers it: an in-place
                # op (tanh_) reaches inductor as its functional form (tanh).
                ns, name, overload = op.split(".")
                functional = _resolve(f"{ns}.{name[:-1]}.{overload}")
                if functional is not None and table(functional) is not None:
                    how = f"functionalized: {table(functional)}"
            return how

        return inductor

    import torch  # torch: kept off the torch-free path (opcov reads graph.json without torch)

    def core_aten(op: str) -> Optional[str]:
        if _python_op(op):
            return "python"
        o = _resolve(op)
        if o is None:
            return None
        if op.split(".", 1)[0] in ("prims", "rngprims"):
            return "prims"
        return "core" if torch.Tag.core in o.tags else None

    return core_aten


# ---------------------------------------------------------------------------------------
# Output


def _sigs(r: OpRow) -> str:
    return "; ".join(f"({s})" for s in r.signatures) + (f"; +{r.more_signatures} more" if r.more_signatures else "")


def to_json(t: OpsTable) -> dict[str, Any]:
    out: dict[str, Any] = {
        "models": t.models,
        "supported_by": t.supported_by,
        "ops": [{"op": r.op, "count": r.count, "models": sorted(r.models), "graph_kinds": sorted(r.kinds),
                 "signatures": r.signatures, "more_signatures": r.more_signatures, "supported": r.supported,
                 "how": r.how} for r in t.ops],
        "problems": t.problems,
    }
    if t.collectives:
        out["collectives"] = [r.to_json() for r in t.collectives]
    if t.supported_by is not None:
        out["coverage"] = [m.to_json() for m in t.per_model()]
        out["graphs"] = [{"model": g.model, "graph": g.graph, "calls": g.ops, "supported_calls": g.supported,
                          "first_unsupported": None if g.first_unsupported is None else
                          {"node": g.first_unsupported[0], "op": g.first_unsupported[1]}, "problem": g.problem}
                         for g in t.graphs]
    return out


def to_csv(t: OpsTable) -> str:
    """The op table as CSV for a terminal or a file: every cell escaped as the text table's lines
    are (printable, names=True), so an op or model name from a graph.json holding an escape
    sequence or a newline cannot rewrite the terminal or add a row."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["op", "count", "models", "graph_kinds", "signatures", "supported", "how"])
    for r in t.ops:
        w.writerow([printable(str(cell), names=True) for cell in
                    (r.op, r.count, " ".join(sorted(r.models)), " ".join(sorted(r.kinds)), _sigs(r),
                     "" if r.supported is None else ("yes" if r.supported else "no"), r.how or "")])
    return buf.getvalue()


def collective_lines(ranks: list[RankCollectives]) -> list[str]:
    """The distributed ranks' collectives, one line per rank (none: no lines)."""
    if not ranks:
        return []
    width = max(24, *(len(r.model) for r in ranks))
    lines = ["", "Collectives per distributed rank: a training step's (forward then backward) and an inference "
             "call's, by kind; the bytes the rank sends for them in a ring algorithm (docs/distributed.md)", "",
             f"{'model':<{width}} {'world':<14} {'training step':<58} inference"]
    for r in ranks:
        lines.append(f"{r.model:<{width}} {f'{r.world} {r.strategy}':<14} {collectives_text(r.step):<58} "
                     f"{collectives_text(r.inference)}")
    return lines


def text_lines(t: OpsTable) -> list[str]:
    """The table as a person reads it (names as composed: the caller escapes each line)."""
    width = max([10] + [len(r.op) for r in t.ops[:500]])
    lines = [f"{len(t.ops)} ops, {sum(r.count for r in t.ops)} calls, in {len(t.graphs)} graphs of {t.models} models"
             + (f"; supported: {t.supported_by}" if t.supported_by else ""), ""]
    head = f"{'op':<{width}} {'calls':>6} {'models':>6}  {'graph kinds':<33}"
    if t.supported_by:
        head += f" {'supported':<16}"
    lines.append(head + " input signatures (dtype[rank])")
    for r in t.ops:
        line = f"{r.op:<{width}} {r.count:>6} {len(r.models):>6}  {','.join(sorted(r.kinds))[:33]:<33}"
        if t.supported_by:
            line += f" {(r.how or 'NO')[:16]:<16}"
        lines.append(line + " " + _sigs(r))
    lines += collective_lines(t.collectives)
    if t.supported_by:
        lines += ["", f"Coverage per model ({t.supported_by}):", ""]
        lines.append(f"{'model':<24} {'calls covered':>20} {'distinct ops':>13} {'graphs covered':>15}")
        for m in t.per_model():
            pct = 100.0 * m.supported_calls / m.calls if m.calls else 100.0
            calls = f"{m.supported_calls}/{m.calls} ({pct:.1f}%)"
            lines.append(f"{m.model[:24]:<24} {calls:>20} {str(m.distinct_supported or 0) + '/' + str(m.distinct or 0):>13} "
                         f"{str(m.graphs_fully_supported) + '/' + str(m.graphs):>15}")
        missing = [g for g in t.graphs if g.first_unsupported is not None]
        if missing:
            lines += ["", "First unsupported op of each graph:"]
            for g in missing:
                node, op = g.first_unsupported  # type: ignore[misc]
                lines.append(f"  {g.model}/{g.graph}: {op} (node {node})")
    for p in t.problems:
        lines.append(f"problem: {p}")
    return lines
