"""Write one model's per-op cases (cases.py), in a worker process: each graph that holds a
case's first node runs once on its saved inputs (as bench and replay run it: seeded, its run
guard's checked forms); the values that node took, copied before it ran (an in-place op
overwrites them) with their layouts and aliasing kept, become the case's inputs."""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from aotpipe.artifact.load import load
from aotpipe.corpus.bench.graph import graph_inputs
from aotpipe.corpus.bench.locate import _safe, write_graph
from aotpipe.errors import exception_line
from aotpipe.format import records
from aotpipe.format.ir import GraphInput, TensorMeta
from aotpipe.runtime.determinism import run_reproducibly
from aotpipe.runtime.execution import runnable


@dataclass(frozen=True)
class CaseSpec:
    """What a worker needs to write one case (picklable)."""
    index: int
    graph: str
    node: str
    name: str
    op: str
    count: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class WrittenCase:
    index: int
    artefact: str | None
    problem: str | None
    ranges: dict[str, records.ValueRange | None] | None  # by the node argument's name in its graph


@dataclass(frozen=True)
class CaseTask:
    """One model's cases: its graphs run once each, then every case whose first node is in
    them written under `out_dir` (runs in a worker process)."""
    folder: str
    label: str
    specs: tuple[CaseSpec, ...]
    out_dir: str
    key: str | None
    trust_ops: tuple[str, ...] = ()
    verb: str = "ops --cases"
    graph: str = ""

    def __call__(self) -> list[WrittenCase]:
        return write_model_cases(self)


class _Taken(torch.fx.Interpreter):
    """One run of a graph keeping, for each node named, copies of its inputs' values (taken
    before it runs) and its own value."""

    def __init__(self, gm: torch.fx.GraphModule, wanted: set[str]):
        super().__init__(gm)
        self.wanted = wanted
        self.taken: dict[str, tuple[list[Any], Any]] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        ins = None
        if n.name in self.wanted:
            ins = copy.deepcopy([self.env[a] for a in n.all_input_nodes])  # one copy: aliasing kept
        v = super().run_node(n)
        if ins is not None:
            self.taken[n.name] = (ins, v)
        return v


def taken_values(gm: torch.fx.GraphModule, inputs: list[Any], wanted: set[str]) -> dict[str, tuple[list[Any], Any]]:
    """For each node of `wanted`: its inputs' values (in all_input_nodes order) and its value."""
    module = runnable(gm, inputs)
    if not isinstance(module, torch.fx.GraphModule):
        raise RuntimeError("the graph needs its trusted code to run (graph.json does not rebuild it)")
    interp = _Taken(module, wanted)

    def run() -> Any:
        with torch.no_grad():
            return interp.run(*inputs)

    run_reproducibly(run)
    return interp.taken


def one_node(gm: torch.fx.GraphModule, node: torch.fx.Node, value: Any) -> torch.fx.GraphModule:
    """A graph of `node` alone: each of its input nodes a placeholder (in all_input_nodes
    order), returning its value (a tuple's tensors, each by getitem)."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for a in node.all_input_nodes:
        p = g.placeholder(_safe(a.name))
        p.meta = dict(a.meta)
        env[a] = p
    new = g.node_copy(node, lambda a: env[a])
    if isinstance(value, (tuple, list)):
        outs = tuple(g.call_function(operator.getitem, (new, i)) for i, v in enumerate(value)
                     if isinstance(v, torch.Tensor))
    else:
        outs = (new,)
    g.output(outs)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def value_range(v: Any) -> records.ValueRange | None:
    """A tensor's finite values' range and how many are not finite; None for a non-tensor."""
    if not isinstance(v, torch.Tensor):
        return None
    x = v.detach()
    if x.is_complex() or x.numel() == 0 or x.is_quantized:
        return records.ValueRange()
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    nonfinite = 0
    if x.is_floating_point():
        finite = torch.isfinite(x)
        nonfinite = int(x.numel() - int(finite.sum()))
        x = x[finite]
        if x.numel() == 0:
            return records.ValueRange(nonfinite=nonfinite)
    return records.ValueRange(min=float(x.min()), max=float(x.max()), nonfinite=nonfinite)


def _input(name: str, v: Any, r: records.ValueRange | None) -> GraphInput:
    if not isinstance(v, torch.Tensor):
        return GraphInput(name, "user", name, None, type(v))
    integer = not v.dtype.is_floating_point and not v.dtype.is_complex and v.dtype != torch.bool
    span = (int(r.min), int(r.max) + 1) if integer and r is not None and r.min is not None and r.max is not None \
        else None  # random inputs (bench --inputs random) drawn where the recorded ones lay: indices stay valid
    return GraphInput(name, "user", name, TensorMeta.of(v), None, int_range=span)


def write_model_cases(task: CaseTask) -> list[WrittenCase]:
    """Every case of `task` written (or why not), its model's graphs run once each."""
    # signing: cryptography, only where a key is given
    from aotpipe.trust.signing import signer

    art = load(task.folder, trust_ops=task.trust_ops)
    sign = signer(task.key) if task.key is not None else None
    by_graph: dict[str, list[CaseSpec]] = {}
    for s in task.specs:
        by_graph.setdefault(s.graph, []).append(s)
    out: list[WrittenCase] = []
    for key, specs in by_graph.items():
        try:
            ga = art.graphs[key]
            gm = ga.module
            if not isinstance(gm, torch.fx.GraphModule):
                raise RuntimeError("the graph needs its trusted code to run (graph.json does not rebuild it)")
            taken = taken_values(gm, graph_inputs(ga, "saved", 0), {s.node for s in specs})
        except Exception as e:
            out += [WrittenCase(s.index, None, f"its graph {key} did not run: {exception_line(e)}", None)
                    for s in specs]
            continue
        nodes = {n.name: n for n in gm.graph.nodes}
        for s in specs:
            try:
                out.append(_write(task, s, gm, nodes[s.node], taken[s.node], sign))
            except Exception as e:
                out.append(WrittenCase(s.index, None, exception_line(e), None))
    return out


def _write(task: CaseTask, s: CaseSpec, gm: torch.fx.GraphModule, node: torch.fx.Node,
           taken: tuple[list[Any], Any], sign: Any) -> WrittenCase:
    args, value = taken
    cm = one_node(gm, node, value)
    ranges = [value_range(a) for a in args]
    names = [p.name for p in cm.graph.nodes if p.op == "placeholder"]
    g_inputs = [_input(n, a, r) for n, a, r in zip(names, args, ranges, strict=True)]
    case = records.CaseRecord(op=s.op, count=s.count, nodes=list(s.nodes), ranges=ranges)
    what = f"{s.op} on the arguments of {s.nodes[0] if s.nodes else s.node} (a case of {s.count} call(s))"
    folder = write_graph(cm, g_inputs, args, s.name, task, what, source=f"ops-case:{task.label}:{s.graph}:{s.node}",
                         case=case, sign=sign)
    return WrittenCase(s.index, folder.name, None, {a.name: r for a, r in zip(node.all_input_nodes, ranges, strict=True)})
