"""Run a backend over every graph of every artefact under some folders.

Each graph is one task of the process executor (aotpipe/pipeline/executors/process.py): a worker
process loads the artefact, compiles the graph, checks and times it; a backend that
segfaults costs only its graph (status crashed), one that hangs is killed at the per-graph
time limit (status timeout), and a fresh worker takes the next graph.

Trust: a bench runs the graphs in worker processes of this user, not in the replay sandbox.
It runs only artefacts signed by a key the user trusts (their own, which ``aotpipe run`` signs
with, or one added with ``aotpipe trust add``) or by the key given, and unchanged since; or any
when the user says they are trusted (``--no-sandbox``, ``AOTPIPE_NO_SANDBOX=1``): the rule of
``aotpipe replay`` without its sandbox fallback.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotpipe.artifact.load import load
from aotpipe.checks.distributed import sibling_ranks
from aotpipe.corpus.bench.backends import parse_backend
from aotpipe.corpus.bench.graph import GraphResult, GraphTask, artefact_label, result_from_failure
from aotpipe.corpus.bench.ranks import MODES, RECORDED, WHO, RankGraphTask, record_worlds
from aotpipe.corpus.bench.scores import OpScore, Score, op_scores, scores
from aotpipe.corpus.bench.sizes import Point, SizedGraphTask, artefact_points, is_symbolic, symbol_sizes
from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format import records
from aotpipe.format.folders import is_model_folder, model_folder
from aotpipe.format.vocabulary import GRAPH_KINDS
from aotpipe.pipeline.executors.base import Failure, Resources, Task
from aotpipe.pipeline.executors.process import ProcessExecutor
from aotpipe.trust.sandbox.decide import decide_sandbox
from aotpipe.trust.verify import find_artifacts

KINDS = GRAPH_KINDS
DEFAULT_TIMEOUT_S = 600.0
# The worker's intra-op threads unless told: one, so that a timing does not depend on how
# busy the machine's other cores are (with several, every parallel region waits for its
# slowest thread, and a descheduled one stalls it); with one thread the CPU-time clock
# (graph.CLOCKS) times it as an idle machine would run it.
DEFAULT_THREADS = 1


@dataclass
class Bench:
    """A finished bench: per-graph results, scores, notes and the wall time."""

    backend: str
    results: list[GraphResult]
    scores: dict[str, Score]
    wall_s: float
    notes: list[str] = field(default_factory=list)
    sizes: list[Point] | None = None  # --sizes: the points asked for (one result per graph and point)

    @property
    def overhead_share(self) -> float | None:
        """The share of the workers' task time spent outside the backend's compile and run."""
        total = sum(r.wall_s for r in self.results)
        inside = sum(r.in_backend_s for r in self.results)
        return (total - inside) / total if total > 0 else None

    @property
    def op_scores(self) -> list[OpScore]:
        """Per op, over the per-op cases benched (aotpipe ops --cases), weighted by their calls;
        empty where none was."""
        return op_scores(self.results)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "wall_s": self.wall_s, "overhead_share": self.overhead_share,
                "notes": self.notes, "graphs": [r.to_json() for r in self.results],
                "scores": {k: s.to_json() for k, s in self.scores.items()}, "sizes": self.sizes,
                **({"ops": [o.to_json() for o in ops]} if (ops := self.op_scores) else {})}


def parse_kinds(text: str | None) -> set[str] | None:
    """--graphs: comma-separated kinds; None for all."""
    if not text:
        return None
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    bad = sorted(kinds - set(KINDS))
    if bad:
        raise AotpipeError(f"--graphs {text!r}: {', '.join(bad)} is not a graph kind; use {', '.join(KINDS)}")
    return kinds


def find_models(paths: Sequence[Path]) -> list[tuple[Path, str]]:
    """(model folder, label) of every artefact under `paths`; none is the user's error.

    A label is the model folder relative to its PATH (the pipeline's output folder when PATH is
    a model folder); if two PATHs give the same label, every label is prefixed with its PATH's
    folder name."""
    per_root: list[tuple[str, list[tuple[Path, str]]]] = []
    for p in paths:
        if not Path(p).exists():
            raise AotpipeError(f"{p}: no such file or folder")
        root = Path(p)
        root = model_folder(root)
        models, _ = find_artifacts(root)
        if not models:
            raise AotpipeError(f"{p}: no artefact under it (no manifest.json); capture one with aotpipe run")
        base = root.parent if is_model_folder(root) else root
        per_root.append((base.name, [(m, artefact_label(m, base)) for m in models]))
    labels = [label for _, found in per_root for _, label in found]
    if len(set(labels)) < len(labels):
        # Two PATHs hold artefacts of the same name: each is named by its PATH's folder too.
        return [(m, f"{name}/{label}") for name, found in per_root for m, label in found]
    return [entry for _, found in per_root for entry in found]


BENCHED = "benched (a bench runs graphs in worker processes, not the sandbox)"


def check_trust(models: Sequence[tuple[Path, str]], key: str | None, trusted: bool, refused: str = BENCHED) -> None:
    """Refuse (a user error) artefacts that are neither trusted by the user (signed by their
    own key or one they added) nor signed by `key`: a bench runs graphs in worker processes,
    not the sandbox. `refused`: what is not done with them, and why, for the message."""
    decision = decide_sandbox([m for m, _ in models], key=key, no_sandbox=trusted)
    if not decision.in_process:
        labels = dict(models)
        bad = [f"{labels[m]}: {why}" for m, why in decision.untrusted]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        who = key if key is not None else "a key you trust"
        raise AotpipeError(f"not signed by {who}, so not {refused}: {bad[0]}{more}; aotpipe trust add its maker's "
                           "key, or pass --no-sandbox if you otherwise trust them")


BenchTask = GraphTask | SizedGraphTask | RankGraphTask


def parse_collectives(text: str | None) -> str | None:
    """--collectives: how a distributed rank's collectives run (ranks.py); None: not given."""
    if text is not None and text not in MODES:
        raise AotpipeError(f"--collectives {text!r}: use {' or '.join(MODES)} (replaced by the results a run of the "
                           "world recorded, or executed over gloo with the world's ranks)")
    return text


def _rank_note(label: str, rec: Any, mode: str, threads: int | None) -> str:
    """What a bench of a rank's graphs does with its collectives, said once per artefact."""
    count, graphs = len(rec.collectives), len({c.graph for c in rec.collectives})
    world = f"a world of {rec.world_size} ranks ({rec.strategy})"
    if mode == RECORDED:
        return (f"{label}: a rank of {world}: its collectives ({count} in {graphs} graphs) replaced by the results a "
                "run of the world over gloo recorded, so their time is not counted (--collectives gloo executes them)")
    return (f"{label}: a rank of {world}: benched in step with the other ranks, one local process each over gloo "
            f"({threads or 1} thread(s) each, on this machine's {os.cpu_count()} cores), timed by the wall clock: its "
            f"collectives ({count} in {graphs} graphs) executed and their time counted")


def plan(models: Sequence[tuple[Path, str]], backend: str, kinds: set[str] | None, inputs: str, seed: int,
         rounds: int, trust_ops: tuple[str, ...], clock: str = "auto", threads: int | None = 1,
         sizes: Sequence[Point] = (), collectives: str | None = None
         ) -> tuple[list[BenchTask], list[str], list[str]]:
    """(one task per graph, each graph's kind, notes about graphs left out).

    A distributed rank's graph is benched with its collectives as `collectives` says
    (ranks.MODES; default recorded); given for artefacts none of which is a rank, it is the
    user's error.

    With `sizes` (--sizes' points), each task benches its graph at every point, on random
    inputs; an artefact without a dynamic dimension, or a point outside one's range, is the
    user's error (sizes.artefact_points), and a graph sized in no symbol is left out, noted."""
    b = parse_backend(backend)
    tasks: list[BenchTask] = []
    task_kinds: list[str] = []
    notes: list[str] = []
    skipped_kinds: dict[str, int] = {}
    static: list[str] = []
    lacking: list[tuple[str, list[str], list[str]]] = []  # (artefact, --sizes names it has not, its dims)
    for folder, label in models:
        try:
            art = load(folder, trust_ops=trust_ops)
        except ArtifactError as e:
            raise AotpipeError(f"{label}: {e}") from None
        points, missing = artefact_points(art.manifest, label, sizes) if sizes else ([], [])
        rank = art.manifest.distributed
        if rank is not None:
            try:
                sibling_ranks(folder, WHO)  # its whole world is beside it, now, as the user's error
            except ArtifactError as e:
                raise AotpipeError(f"{label}: {e}") from None
            notes.append(_rank_note(label, rank, collectives or RECORDED, threads))
        if missing:
            has = sorted(art.manifest.dims.dims) if art.manifest.dims is not None else []
            lacking.append((label, missing, has))
        for key, ga in art.graphs.items():
            if kinds is not None and ga.kind not in kinds:
                continue
            if b.inference_only and ga.kind != "inference":
                skipped_kinds[ga.kind] = skipped_kinds.get(ga.kind, 0) + 1
                continue
            if points:
                if not is_symbolic(ga.record):
                    static.append(f"{label} {key}")
                    continue
                task = GraphTask(str(folder), label, key, backend, "random", seed, rounds, trust_ops, clock, threads)
                tasks.append(SizedGraphTask(task, tuple(tuple(p.items()) for p in points),
                                            tuple(tuple(symbol_sizes(art.manifest, p).items()) for p in points)))
            else:
                mode = inputs if ga.has_saved_values else "random"
                task = GraphTask(str(folder), label, key, backend, mode, seed, rounds, trust_ops, clock, threads)
                tasks.append(task if rank is None else RankGraphTask(task, collectives or RECORDED))
            task_kinds.append(ga.kind)
    if collectives is not None and not any(isinstance(t, RankGraphTask) for t in tasks):
        raise AotpipeError(f"--collectives {collectives}: none of the graphs benched is a distributed rank's (their "
                           "artefacts have no distributed record); drop --collectives")
    if skipped_kinds:
        notes.append(f"{backend} takes inference graphs only; left out: " +
                     ", ".join(f"{n} {k}" for k, n in sorted(skipped_kinds.items())))
    named = {name for p in sizes for name in p}
    for name in sorted(named):
        if models and sum(name in miss for _, miss, _ in lacking) == len(models):
            label, _, has = next(x for x in lacking if name in x[1])
            more = " (nor has any other artefact benched)" if len(models) > 1 else ""
            raise AotpipeError(f"--sizes {name}: {label} has no dimension {name!r}{more}; its dimensions are "
                               f"{', '.join(has) or 'none'}")
    for label, miss, _ in lacking:
        notes.append(f"--sizes: {label} has no dimension {', '.join(miss)}: benched at the sizes of the others")
    if sizes:
        notes.append("--sizes: each graph compiled once, at its first point, then run at the others in the order "
                     "given, on random inputs (--seed); the scores count a graph once per point")
    if static:
        notes.append(f"--sizes: left out {len(static)} graph(s) sized in no symbol (they run at one size only): "
                     + ", ".join(static))
    return tasks, task_kinds, notes


def bench(paths: Sequence[Path], backend: str, *, kinds: set[str] | None = None, inputs: str = "saved",
          seed: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, rounds: int = 10, key: str | None = None,
          trusted: bool = False, trust_ops: tuple[str, ...] = (), threads: int | None = DEFAULT_THREADS, clock: str = "auto",
          on_result: Callable[[GraphResult], None] | None = None,
          on_plan: Callable[[int], None] | None = None, sizes: Sequence[Point] = (),
          collectives: str | None = None) -> Bench:
    """Bench `backend` over every graph (of `kinds`) of every artefact under `paths`.

    `threads`: the worker's intra-op threads (None: torch's default); `clock`: graph.CLOCKS,
    or "auto" (cpu with one thread, wall with more); `sizes`: --sizes' points (sizes.py), each
    graph benched at every one of them, compiled once; `collectives`: how a distributed rank's
    graphs run theirs (ranks.MODES). `on_result` is called once per graph (with its first
    point's result under --sizes)."""
    b = parse_backend(backend)
    b.resolve()  # a user backend that does not import is the user's error, now, once
    models = find_models(paths)
    check_trust(models, key, trusted)
    tasks, task_kinds, notes = plan(models, backend, kinds, inputs, seed, rounds, trust_ops, clock, threads, sizes,
                                    collectives)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aotpipe-bench-") as tmp:
        ranked = [i for i, t in enumerate(tasks) if isinstance(t, RankGraphTask)]
        if ranked:
            done_ranked = record_worlds([tasks[i] for i in ranked], Path(tmp), trust_ops)  # type: ignore[misc]
            for i, t in zip(ranked, done_ranked, strict=True):
                tasks[i] = t
        cases = {folder: m.case for folder in {t.task.artifact if isinstance(t, (SizedGraphTask, RankGraphTask))
                                               else t.artifact for t in tasks}
                 if (m := records.read(records.Manifest, Path(folder) / records.MANIFEST)[1]).case is not None}
        done = _run(tasks, task_kinds, notes, backend, timeout_s, threads, on_result, on_plan, sizes, start)
    for r in done.results:
        case = cases.get(r.path)
        if case is not None:
            r.case_op, r.case_calls = case.op, case.count
    return done


def _run(tasks: list[BenchTask], task_kinds: list[str], notes: list[str], backend: str, timeout_s: float,
         threads: int | None, on_result: Callable[[GraphResult], None] | None,
         on_plan: Callable[[int], None] | None, sizes: Sequence[Point], start: float) -> Bench:
    """Every task run in a worker, one after another; the finished bench (its wall time from `start`)."""
    if on_plan is not None:
        on_plan(len(tasks))
    results: list[list[GraphResult]] = [[] for _ in tasks]

    def done(i: int, outcome: Any) -> None:
        task = tasks[i]
        if isinstance(outcome, Failure):
            if isinstance(task, SizedGraphTask):
                rs = task.failed(task_kinds[i], outcome.reason, outcome.detail)
            elif isinstance(task, RankGraphTask):
                rs = [result_from_failure(task.task, task_kinds[i], outcome.reason, outcome.detail)]
                rs[0].collectives = task.mode
            else:
                rs = [result_from_failure(task, task_kinds[i], outcome.reason, outcome.detail)]
            if outcome.reason.startswith("the task raised"):
                for r in rs:
                    r.status = "runtime_error"
        else:
            rs = outcome if isinstance(outcome, list) else [outcome]
        results[i] = rs
        if on_result is not None and rs:
            on_result(rs[0])

    ex = ProcessExecutor(workers=1, timeout_s=timeout_s, threads=threads, cwd=Path.cwd())
    ex.run([Task(task_name(t), t, Resources(timeout_s=timeout_s)) for t in tasks],
           on_start=lambda i: None, on_done=done)
    final = [r for rs in results for r in rs]
    return Bench(backend, final, scores(final), time.perf_counter() - start, notes,
                 [dict(p) for p in sizes] if sizes else None)


def task_name(t: BenchTask) -> str:
    """How the executor names a task: the artefact and graph."""
    g = t.task if isinstance(t, (SizedGraphTask, RankGraphTask)) else t
    return f"{g.label} {g.graph}"
