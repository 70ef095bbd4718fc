"""Two model artefacts compared from their records: nothing is run and torch is not imported.

Every record is read through its pydantic class (aotpipe.format.records), within the
format's limits. Graph nodes are compared after name normalisation: a node is its op, its
target, and its arguments with every reference to another node replaced by that node's
dtype[shape]; the two sequences are aligned with difflib, and what does not align is named
at its node (name, module path, source line), as A has it and as B has it.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from aotpipe.corpus.diff.model import Diff
from aotpipe.format import records
from aotpipe.format.records import GraphRecord, InputRecord, InputsRecord, Manifest, NodeRecord, OutputRecord

# At most this many node hunks (and list entries) are named per graph; the rest are counted.
MAX_HUNKS = 8


@dataclass
class Side:
    """One artefact as read for diffing: its manifest, and its graphs' records on demand."""

    path: Path
    manifest: Manifest
    _graphs: dict[str, Optional[GraphRecord]] = field(default_factory=dict)
    _inputs: dict[str, Optional[InputsRecord]] = field(default_factory=dict)

    def graph(self, key: str) -> Optional[GraphRecord]:
        if key not in self._graphs:
            entry = self.manifest.graphs[key]
            path = self.path / entry.folder / records.GRAPH_JSON
            self._graphs[key] = records.read(GraphRecord, path, self.path)[1] if path.exists() else None
        return self._graphs[key]

    def inputs(self, key: str) -> Optional[InputsRecord]:
        if key not in self._inputs:
            entry = self.manifest.graphs[key]
            path = self.path / entry.folder / records.INPUTS_JSON
            self._inputs[key] = records.read(InputsRecord, path, self.path)[1] if path.exists() else None
        return self._inputs[key]


def read_side(path: Path) -> Side:
    """An artefact folder (holding manifest.json) read for diffing; ArtifactError if it is not one."""
    _, manifest = records.read(Manifest, path / records.MANIFEST, path)
    return Side(path, manifest)


def short(digest: Optional[str]) -> str:
    return "(not stored)" if digest is None else digest[:12]


def shown(value: Any, limit: int = 80) -> str:
    """A value in one bounded line (JSON where it is data)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {dotted.path: leaf}; lists are leaves (compared whole)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def compare_fields(diff: Diff, section: str, where: str, a: dict[str, Any], b: dict[str, Any],
                   prefix: str = "") -> None:
    """One finding per dotted field whose value differs (or is only on one side)."""
    fa, fb = flatten(a, prefix), flatten(b, prefix)
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "(absent)"), fb.get(key, "(absent)")
        if va != vb:
            diff.add(section, where, f"{key} {shown(va)} -> {shown(vb)}", field=key, a=va, b=vb)


def compare_artifacts(a: Side, b: Side, diff: Diff, model: str = "") -> list[tuple[str, dict[str, str]]]:
    """Add every difference between artefacts `a` and `b` to `diff` (`model` prefixes where
    each is, in a tree); returns the graphs both have with the alignment of their nodes
    (A's node name -> B's, where the normalised sequences match), for the values comparison."""
    at = (lambda where: f"{model}/{where}" if where else model) if model else (lambda where: where)
    ma, mb = a.manifest, b.manifest
    compare_fields(diff, "environment", at(""), ma.versions.model_dump(), mb.versions.model_dump(), "versions")
    compare_fields(diff, "environment", at(""),
                   ma.environment.model_dump() if ma.environment else {},
                   mb.environment.model_dump() if mb.environment else {}, "environment")
    compare_fields(diff, "options", at(""), _capture_options(ma), _capture_options(mb))
    compare_fields(diff, "options", at(""), _model_options(ma), _model_options(mb), "model")
    only_a = [k for k in ma.graphs if k not in mb.graphs]
    only_b = [k for k in mb.graphs if k not in ma.graphs]
    for k in only_a:
        diff.add("graphs", at(k), "only in A", graph=k, side="a")
    for k in only_b:
        diff.add("graphs", at(k), "only in B", graph=k, side="b")
    _compare_passes(diff, at, ma, mb)
    _compare_checks(diff, at, ma, mb)
    aligned = []
    for key in [k for k in ma.graphs if k in mb.graphs]:
        _compare_signature(diff, at(key), a.inputs(key), b.inputs(key))
        ga, gb = a.graph(key), b.graph(key)
        if ga is None or gb is None:
            continue
        _compare_ops(diff, at(key), ga, gb)
        aligned.append((key, _compare_nodes(diff, at(key), ga, gb)))
    _compare_weights(diff, at, a, b)
    return aligned


def _capture_options(m: Manifest) -> dict[str, Any]:
    out: dict[str, Any] = {"capture.mode": m.capture.mode, "capture.options": m.capture.options}
    if m.capture.fallback is not None:
        out["capture.fallback"] = m.capture.fallback
    out["save_values"] = m.save_values
    return out


def _model_options(m: Manifest) -> dict[str, Any]:
    """The model's spec as it ran, but its name (a tree pairs models by name; two artefacts
    compared directly may be named apart) and its pass chain (the copy older manifests keep
    there; the chains are compared as they ran, from the graph entries)."""
    spec = m.model.model_dump()
    spec.pop("name", None)
    spec.pop("passes", None)
    return spec


# ---------------------------------------------------------------------------------------
# signatures


def _layout(x: InputRecord | OutputRecord) -> str:
    """dtype[shape] (and stride where it is not the contiguous one) of an input or output;
    an input scalar's type, else "none"."""
    if x.dtype is None or x.shape is None:
        kind = getattr(x, "type", None)  # an OutputRecord has none
        return kind if isinstance(kind, str) and kind != "tensor" else "none"
    text = f"{x.dtype}{list(x.shape)}"
    if x.stride is not None and list(x.stride) != _contiguous(list(x.shape)):
        text += f" stride {list(x.stride)}"
    return text


def _contiguous(shape: list[int]) -> list[int]:
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= max(s, 1)
    return list(reversed(out))


def _signature_rows(rec: InputsRecord) -> tuple[list[str], list[str]]:
    ins = [f"input {i.index} {i.role} {i.target or i.name}: {_layout(i)}" for i in rec.inputs]
    outs = [f"output {o.index} {o.role}{' ' + o.target if o.target else ''}: {_layout(o)}" for o in rec.outputs]
    return ins, outs


def _compare_signature(diff: Diff, where: str, a: Optional[InputsRecord], b: Optional[InputsRecord]) -> None:
    if a is None or b is None:
        if (a is None) != (b is None):
            diff.add("signature", where, f"inputs.json only in {'A' if b is None else 'B'}")
        return
    (ia, oa), (ib, ob) = _signature_rows(a), _signature_rows(b)
    for rows_a, rows_b in ((ia, ib), (oa, ob)):
        _list_diff(diff, "signature", where, rows_a, rows_b)


def _list_diff(diff: Diff, section: str, where: str, rows_a: list[str], rows_b: list[str]) -> None:
    """A finding per hunk where two lists of lines differ (difflib's alignment)."""
    hunks = [op for op in difflib.SequenceMatcher(None, rows_a, rows_b, autojunk=False).get_opcodes()
             if op[0] != "equal"]
    for tag, i1, i2, j1, j2 in hunks[:MAX_HUNKS]:
        gone, new = rows_a[i1:i2], rows_b[j1:j2]
        if tag == "replace" and len(gone) == len(new):
            for x, y in zip(gone, new):
                same_entry = x.split(": ")[0] == y.split(": ")[0]  # the same input or output, another layout
                diff.add(section, where, f"{x} -> {y.split(': ', 1)[-1] if same_entry else y}", a=x, b=y)
        else:
            for x in gone:
                diff.add(section, where, f"only in A: {x}", a=x)
            for y in new:
                diff.add(section, where, f"only in B: {y}", b=y)
    if len(hunks) > MAX_HUNKS:
        diff.add(section, where, f"and {len(hunks) - MAX_HUNKS} more changed stretches")


# ---------------------------------------------------------------------------------------
# ops and nodes


def op_histogram(g: GraphRecord) -> Counter:
    """How many call_function nodes call each op."""
    return Counter(n.target for n in g.nodes if n.op == "call_function" and n.target)


def _compare_ops(diff: Diff, where: str, a: GraphRecord, b: GraphRecord) -> None:
    ha, hb = op_histogram(a), op_histogram(b)
    for op in sorted(set(ha) | set(hb)):
        if ha[op] != hb[op]:
            diff.add("ops", where, f"{op} {ha[op]} -> {hb[op]} ({hb[op] - ha[op]:+d})", op=op, a=ha[op], b=hb[op])


def _val_layout(val: records.RawJson) -> str:
    """A node's recorded value (graph.json's free-JSON val) in brief."""
    if isinstance(val, dict) and "dtype" in val and "shape" in val:
        return f"{val['dtype']}{val['shape']}"
    if isinstance(val, list):
        return "(" + ", ".join(_val_layout(v) for v in val) + ")"
    if isinstance(val, dict) and "symbolic" in val:
        return "sym"
    return "?" if val is not None else "none"


def _normalise(arg: Any, layouts: dict[str, str]) -> Any:
    """An argument with node references replaced by the referenced node's dtype[shape]."""
    if isinstance(arg, records.NodeRef):
        return f"%{layouts.get(arg.node, '?')}"
    if isinstance(arg, records.Record):  # a tagged argument: {tag: its normalised value}, as in graph.json
        return {k: _normalise(getattr(arg, k), layouts) for k in type(arg).model_fields}
    if isinstance(arg, dict):  # keyword arguments
        return {k: _normalise(v, layouts) for k, v in sorted(arg.items())}
    if isinstance(arg, list):
        return [_normalise(x, layouts) for x in arg]
    return arg


def node_keys(g: GraphRecord) -> tuple[list[NodeRecord], list[str]]:
    """The nodes that compute something (get_attr, call_function, output) and, for each, its
    name-free key: op, target, normalised arguments, its own dtype[shape]."""
    layouts = {n.name: _val_layout(n.val) for n in g.nodes}
    nodes, keys = [], []
    for n in g.nodes:
        if n.op == "placeholder":
            continue
        args = json.dumps([_normalise(n.args, layouts), _normalise(n.kwargs, layouts)], sort_keys=True)
        target = n.target if n.op != "get_attr" else ""  # a constant's attribute name is a name too
        shape = [n.shape, n.stride] if n.op == "get_attr" else None
        nodes.append(n)
        keys.append(json.dumps([n.op, target, args, layouts[n.name], shape]))
    return nodes, keys


def describe_node(n: NodeRecord) -> str:
    """A node as the user finds it: name, op, and where it came from."""
    what = n.target if n.op == "call_function" else n.op
    text = f"{n.name} ({what})"
    o = n.origin
    if o is not None:
        parts = []
        if o.module is not None:
            parts.append(f"module {o.module or '(the model)'}" + (f" {o.module_class.rsplit('.', 1)[-1]}"
                                                                  if o.module_class else ""))
        if o.source:
            parts.append(o.source)
        if parts:
            text += f" [{', '.join(parts)}]"
    return text


def _compare_nodes(diff: Diff, where: str, a: GraphRecord, b: GraphRecord) -> dict[str, str]:
    na, ka = node_keys(a)
    nb, kb = node_keys(b)
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    aligned: dict[str, str] = {}
    hunks = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            aligned.update((na[i1 + k].name, nb[j1 + k].name) for k in range(i2 - i1))
        else:
            hunks.append((tag, i1, i2, j1, j2))
    for tag, i1, i2, j1, j2 in hunks[:MAX_HUNKS]:
        gone, new = na[i1:i2], nb[j1:j2]
        if tag == "replace" and len(gone) == len(new):
            for x, y in zip(gone, new):
                aligned[x.name] = y.name  # a node changed in place: its value is compared too
                diff.add("nodes", where, f"A {describe_node(x)} is B {describe_node(y)}"
                         + _how_they_differ(x, y, a, b), a=x.name, b=y.name, a_target=x.target, b_target=y.target)
        else:
            text = []
            if gone:
                text.append(f"A has {len(gone)} node{'s' if len(gone) != 1 else ''} from {describe_node(gone[0])}")
            if new:
                text.append(f"B has {len(new)} node{'s' if len(new) != 1 else ''} from {describe_node(new[0])}")
            anchor = f" (after A {na[i1 - 1].name}, B {nb[j1 - 1].name})" if i1 and j1 else " (at the start)"
            diff.add("nodes", where, " where ".join(text) + anchor,
                     a=[n.name for n in gone], b=[n.name for n in new])
    if len(hunks) > MAX_HUNKS:
        diff.add("nodes", where, f"and {len(hunks) - MAX_HUNKS} more changed stretches of nodes")
    return aligned


def _how_they_differ(x: NodeRecord, y: NodeRecord, a: GraphRecord, b: GraphRecord) -> str:
    if x.op != y.op or x.target != y.target:
        return ""
    if _val_layout(x.val) != _val_layout(y.val):
        return f": gives {_val_layout(x.val)} -> {_val_layout(y.val)}"
    la = {n.name: _val_layout(n.val) for n in a.nodes}
    lb = {n.name: _val_layout(n.val) for n in b.nodes}
    return f": arguments {shown(_normalise(x.args, la), 60)} -> {shown(_normalise(y.args, lb), 60)}"


# ---------------------------------------------------------------------------------------
# weights, passes, checks


def weight_digests(side: Side, keys: Iterable[str]) -> dict[str, Optional[str]]:
    """Per parameter, buffer and constant (by name), the blob of its storage; per constant of
    a graph made by passes (by graph key and target), its blob; over the graphs `keys`."""
    out: dict[str, Optional[str]] = {}
    for key in keys:
        rec = side.inputs(key)
        if rec is not None:
            for i in rec.inputs:
                if i.role in ("param", "buffer", "constant") and i.target:
                    known = i.storage is not None and i.storage < len(rec.storages)
                    storage = rec.storages[i.storage] if known else None
                    out.setdefault(f"{i.role} {i.target}", storage.blob if storage is not None else None)
        g = side.graph(key)
        if g is not None:
            for n in g.nodes:
                if n.op == "get_attr":
                    out[f"{key} constant {n.target}"] = n.blob
    return out


def _compare_weights(diff: Diff, at: Any, a: Side, b: Side) -> None:
    # Over the graphs both have: a graph only one has is a finding of its own (section graphs).
    common = [k for k in a.manifest.graphs if k in b.manifest.graphs]
    wa, wb = weight_digests(a, common), weight_digests(b, common)
    changed = [k for k in wa if k in wb and wa[k] != wb[k]]
    for k in changed:
        diff.add("weights", at(""), f"{k}: {short(wa[k])} -> {short(wb[k])}", name=k, a=wa[k], b=wb[k])
    for k in wa:
        if k not in wb:
            diff.add("weights", at(""), f"{k}: only in A ({short(wa[k])})", name=k, a=wa[k])
    for k in wb:
        if k not in wa:
            diff.add("weights", at(""), f"{k}: only in B ({short(wb[k])})", name=k, b=wb[k])


def _chain(steps: Iterable[Any]) -> str:
    return "+".join(s.name for s in steps) or "(none)"


def _compare_passes(diff: Diff, at: Any, ma: Manifest, mb: Manifest) -> None:
    ca, cb = ma.pass_chains(), mb.pass_chains()
    for key in sorted(set(ca) | set(cb)):
        sa, sb = ca.get(key), cb.get(key)
        if sa is None or sb is None:
            diff.add("passes", at(key), f"pass log only in {'A' if sb is None else 'B'}: "
                     f"{_chain(sa if sb is None else sb)}")
            continue
        if _chain(sa) != _chain(sb):
            diff.add("passes", at(key), f"chain {_chain(sa)} -> {_chain(sb)}", a=_chain(sa), b=_chain(sb))
            continue
        for x, y in zip(sa, sb):
            fields = lambda s: {"options": s.options, "nodes_before": s.nodes_before,  # noqa: E731
                                "nodes_after": s.nodes_after, "modified": s.modified, "stats": s.stats}
            compare_fields(diff, "passes", at(key), fields(x), fields(y), x.name)
    if ma.pass_failures != mb.pass_failures:
        diff.add("passes", at(""), f"failures {shown(ma.pass_failures)} -> {shown(mb.pass_failures)}")


def _compare_checks(diff: Diff, at: Any, ma: Manifest, mb: Manifest) -> None:
    ca = ma.checks.model_dump() if ma.checks else {}
    cb = mb.checks.model_dump() if mb.checks else {}
    compare_fields(diff, "checks", at(""), ca, cb, "checks")
    va = {k: v.status for k, v in (ma.verification or {}).items()}
    vb = {k: v.status for k, v in (mb.verification or {}).items()}
    compare_fields(diff, "checks", at(""), va, vb, "verification")
