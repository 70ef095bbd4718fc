"""Bench a distributed rank's graphs: their collectives replaced by recorded results, or executed.

A rank's graph (capture/distributed.py) calls collectives (all-gather, reduce-scatter,
all-reduce) on process groups its peer ranks must join, so it does not run alone. ``bench
--collectives`` says how it runs:

- ``recorded`` (the default): the rank's world runs once before the bench, one local process
  per rank over gloo (as the capture's check runs it), on the inputs the bench uses, and the
  result of every collective is kept. The graph benched is the rank's with each collective and
  its wait replaced by an input (role ``collective``) fed that result: backend and eager then
  run the rank's own computation alone, checked and timed as any graph is. The collectives'
  time is not counted.
- ``gloo``: every rank of the world runs the bench of its copy of the graph together, one local
  process per rank over gloo, in step (graph.Peers): the collectives are executed, and the
  benched rank's times, taken by the wall clock, include their time on this machine's
  loopback, the ranks sharing its cores.

Either way every rank's folder must lie beside the one benched (``<name>.rank<r>``).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from aotpipe.artifact.load import load
from aotpipe.artifact.ops import COLLECTIVES, op_name
from aotpipe.artifact.prepack import stored_graph
from aotpipe.checks.distributed import (
    RANK_SECONDS,
    exit_rank,
    joined,
    rank_record,
    remap_groups,
    sibling_ranks,
    spawn_world,
)
from aotpipe.corpus.bench.graph import (
    GraphResult,
    GraphTask,
    Peers,
    Prepared,
    bench_graph,
    copy_inputs,
    graph_inputs,
    loaded,
    result_from_failure,
)
from aotpipe.errors import exception_line
from aotpipe.format.records import DistributedRecord
from aotpipe.runtime.devices import DENSE_GRAPH
from aotpipe.runtime.execution import run_graph

RECORDED, GLOO = "recorded", "gloo"
MODES = (RECORDED, GLOO)
# The role of an input that stands for a collective's result in a graph benched `recorded`.
COLLECTIVE_ROLE = "collective"
_WAIT = "_c10d_functional.wait_tensor.default"
WHO = "a bench of a rank's graphs"  # what needs every rank beside the one benched (their errors' fixes)


@dataclass(frozen=True)
class RankGraphTask:
    """What a worker needs to bench one graph of a distributed rank (picklable)."""

    task: GraphTask  # the graph, backend and timing options, as for any graph
    mode: str  # RECORDED | GLOO
    recorded: str = ""  # RECORDED: the file of its world's run (record_worlds)
    error: str = ""  # RECORDED: why its world's run gave none

    def __call__(self) -> GraphResult:
        return bench_rank_graph(self)


def collective_values(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(collective, the node whose value is its result) of every collective of `graph`, in order:
    the result is its wait_tensor's where it has one (the value is complete only after it)."""
    out = []
    for n in graph.nodes:
        name = op_name(n.target) if n.op == "call_function" else None
        if name in COLLECTIVES and name != _WAIT:
            waits = [u for u in n.users if op_name(u.target) == _WAIT]
            out.append((n, waits[0] if len(waits) == 1 else n))
    return out


def recording_module(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    """(a copy of `gm` that also returns every collective's result after its own outputs, how
    many it adds)."""
    graph = copy.deepcopy(stored_graph(gm))
    values = [v for _, v in collective_values(graph)]
    out = graph.output_node()
    outs = out.args[0]
    flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    out.args = ((*flat, *values),)
    return _module(gm, graph), len(values)


def without_collectives(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[str]]:
    """(a copy of `gm` whose every collective, with its wait, is an input after its own inputs,
    the collectives' node names in the order of those inputs)."""
    graph = copy.deepcopy(stored_graph(gm))
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    names = []
    for collective, value in collective_values(graph):
        with graph.inserting_after(last):
            last = graph.placeholder(f"{collective.name}_result")
        last.meta = dict(value.meta)
        value.replace_all_uses_with(last)
        if value is not collective:
            graph.erase_node(value)
        if not collective.users:
            graph.erase_node(collective)
        names.append(collective.name)
    return _module(gm, graph), names


def _module(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A module of `graph` over `gm`'s constants, loaded and checked as `gm` is (its meta: the
    precheck runs it on fake tensors first, afresh for the new code)."""
    graph.lint()
    out = torch.fx.GraphModule(gm, graph)
    out.meta.update({k: v for k, v in gm.meta.items() if k != DENSE_GRAPH})
    return out


# ---------------------------------------------------------------------------------------
# recorded: the world's run, once before the bench


def record_worlds(tasks: Sequence[RankGraphTask], out_dir: Path, trust_ops: tuple[str, ...]) -> list[RankGraphTask]:
    """`tasks` with what their worlds' runs recorded: each world whose graphs are benched
    RECORDED run once (every rank over gloo), each graph's inputs and collective results
    written under `out_dir`; a world whose run failed gives its tasks the error instead."""
    worlds: dict[Path, list[int]] = {}
    found: dict[int, tuple[dict[int, Path], DistributedRecord]] = {}
    for i, rt in enumerate(tasks):
        if rt.mode != RECORDED:
            continue
        folders, rec = sibling_ranks(Path(rt.task.artifact), WHO)
        worlds.setdefault(folders[0].resolve(), []).append(i)
        found[i] = (folders, rec)
    out = list(tasks)
    for w, members in enumerate(worlds.values()):
        folders, rec = found[members[0]]
        graphs = sorted({(tasks[i].task.graph, tasks[i].task.inputs) for i in members})
        where = out_dir / f"world{w}"
        where.mkdir(parents=True)
        spec = json.dumps(asdict(RecordSpec(graphs, tasks[members[0]].task.seed, list(trust_ops))))
        try:
            spawn_world(__name__, functools.partial(_record_argv, folders, rec.world_size, where, spec),
                        rec.world_size, RANK_SECONDS * rec.world_size)
        except RuntimeError as e:
            for i in members:
                out[i] = replace(tasks[i], error=f"its world's run over gloo, which records its collectives' "
                                                 f"results, failed: {e}")
            continue
        for i in members:
            rank = _rank_of(tasks[i], folders)
            out[i] = replace(tasks[i], recorded=str(_record_file(where, rank, tasks[i].task.graph)))
    return out


def _record_argv(folders: dict[int, Path], world: int, where: Path, spec: str, rank: int) -> list[str]:
    return ["record", str(folders[rank]), str(rank), str(world), str(where), spec]


def _rank_of(rt: RankGraphTask, folders: dict[int, Path]) -> int:
    me = Path(rt.task.artifact).resolve()
    return next(r for r, f in folders.items() if f.resolve() == me)


def _record_file(where: Path, rank: int, graph: str) -> Path:
    return where / f"rank{rank}-{graph}.pt"


@dataclass(frozen=True)
class RecordSpec:
    """What a world's recording run records (passed to each rank's process as JSON)."""

    graphs: list[tuple[str, str]]  # (graph key, its inputs: saved | random)
    seed: int
    trust_ops: list[str]


def _record_main(folder: Path, rank: int, world: int, where: Path, spec: RecordSpec) -> None:
    """A rank's process of a world's recording run: each graph asked for run on the inputs the
    bench will use; its inputs and its collectives' results written, in that order."""
    art = load(folder, trust_ops=tuple(spec.trust_ops))
    rec = rank_record(art, folder, rank, world)
    with joined(rec, rank) as live:
        for ga in art.graphs.values():
            if isinstance(ga.module, torch.fx.GraphModule):
                remap_groups(ga.module, rec.groups, live)
        for key, inputs in spec.graphs:
            ga = art.graphs[key]
            args = graph_inputs(ga, inputs, spec.seed)
            assert isinstance(ga.module, torch.fx.GraphModule)  # loaded without trust_code: from graph.json
            module, n = recording_module(ga.module)
            outs = run_graph(module, copy_inputs(args))
            torch.save([args, outs[len(outs) - n:]], _record_file(where, rank, key))
        dist.barrier()


def _recorded(ga: Any, path: str) -> Prepared:
    """The rank's graph with its collectives as inputs, on the inputs its world's run used and
    the results it recorded."""
    module, names = without_collectives(ga.module)
    inputs, values = torch.load(path, weights_only=True)
    if len(values) != len(names):
        raise RuntimeError(f"{path}: {len(values)} collective results recorded for {len(names)} collectives")
    roles = [r.role for r in ga.record.inputs] + [COLLECTIVE_ROLE] * len(names)
    return Prepared(module, list(inputs) + list(values), roles)


def bench_rank_graph(rt: RankGraphTask) -> GraphResult:
    """Bench one graph of a rank (in a worker process): RECORDED here, GLOO with its world."""
    if rt.mode == GLOO:
        res = _bench_world(rt)
    elif rt.error:
        kind = loaded(rt.task.artifact, rt.task.trust_ops).graphs[rt.task.graph].kind
        res = result_from_failure(rt.task, kind, rt.error, None)
        res.status = "runtime_error"
    else:
        res = bench_graph(rt.task, prepare=lambda ga: _recorded(ga, rt.recorded))
    res.collectives = rt.mode
    return res


# ---------------------------------------------------------------------------------------
# gloo: every rank benched in step


def _bench_world(rt: RankGraphTask) -> GraphResult:
    task = rt.task
    folders, rec = sibling_ranks(Path(task.artifact), WHO)
    rank = _rank_of(rt, folders)
    # Collectives wait on the other ranks: the CPU-time clock would not count that wait.
    stepped = replace(task, clock="wall" if task.clock == "auto" else task.clock)
    with tempfile.TemporaryDirectory(prefix="aotpipe-bench-ranks-") as tmp:
        def argv(r: int) -> list[str]:
            spec = {**asdict(replace(stepped, artifact=str(folders[r]))), "trust_ops": list(task.trust_ops)}
            return ["bench", str(folders[r]), str(r), str(rec.world_size), str(Path(tmp) / f"rank{r}.json"),
                    json.dumps(spec)]

        try:
            spawn_world(__name__, argv, rec.world_size, RANK_SECONDS * rec.world_size, threads=task.threads or 1)
        except RuntimeError as e:
            kind = loaded(task.artifact, task.trust_ops).graphs[task.graph].kind
            res = result_from_failure(task, kind, f"its world's ranks, run in step over gloo: {exception_line(e)}",
                                      None)
            res.status = "timeout" if "did not finish" in str(e) else "runtime_error"
            return res
        data = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
    res = GraphResult(**data)
    res.artifact, res.path = task.label, task.artifact
    return res


def _bench_main(folder: Path, rank: int, world: int, out: Path, task: GraphTask) -> None:
    """A rank's process of a bench run in step: its copy of the graph benched, its result written."""
    art = loaded(task.artifact, task.trust_ops)
    rec = rank_record(art, folder, rank, world)
    with joined(rec, rank) as live:
        agree = dist.new_group(backend="gloo")  # apart from the graph's own groups

        def most(value: int) -> int:
            t = torch.tensor([value], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=agree)
            return int(t.item())

        def prepare(ga: Any) -> Prepared:
            remap_groups(ga.module, rec.groups, live)
            return Prepared(ga.module, graph_inputs(ga, task.inputs, task.seed), [r.role for r in ga.record.inputs])

        res = bench_graph(task, prepare=prepare, peers=Peers(most))
        out.write_text(json.dumps(asdict(res)))
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    what, folder, rank, world, out, spec = argv if argv is not None else sys.argv[1:]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if what == "record":
        _record_main(Path(folder), int(rank), int(world), Path(out), RecordSpec(**json.loads(spec)))
    else:
        task = GraphTask(**json.loads(spec))
        _bench_main(Path(folder), int(rank), int(world), Path(out), replace(task, trust_ops=tuple(task.trust_ops)))
    return 0


if __name__ == "__main__":
    exit_rank(main())
