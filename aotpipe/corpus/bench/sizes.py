"""`aotpipe bench --sizes`: a shape-polymorphic artefact's graphs benched at sizes of its dimensions.

``--sizes batch=1,7,16`` names one dimension (the manifest's `dims`) and its sizes; given for
several dimensions (``--sizes batch=2,8 --sizes seq=16,33``), their lists are zipped into
points, so they must be of one length; a dynamic dimension not given stays at its example.
Every point must lie in each dimension's recorded range (the range the graphs were captured
for, and the size checks held), and the artefact must have a dynamic dimension at all.

In the worker, each graph is compiled once, ``torch.compile(dynamic=True)`` with the dimensions
that are static in the artefact marked static (:func:`torch._dynamo.mark_static`), so that the
graph is as symbolic as it was captured: its size inputs too, which dynamo would otherwise
specialise on first sight; and without duck shaping, which gives sizes equal at the first point
one symbol (seq 8 and 4 * batch 2 at batch=2 seq=8), and so recompiles at the first point where
they differ. dynamo still specialises a size of 0 or 1, as it always does. It is
then run at every point in the order given: at each point, random inputs of the graph at those
sizes (the layouts in inputs.json evaluated in the symbols), the loaded graph run eagerly on
them as the reference, and the backend's outputs checked and timed against it as a bench does
(graph.py); and how many graphs dynamo compiled on the point's first call (:func:`compiled_graphs`):
1 at the first point, 0 at a later one unless a guard on the sizes failed and it recompiled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo
import torch.fx
import torch.fx.experimental._config as shape_config
from torch._dynamo.utils import counters

from aotpipe.corpus.bench.backends import Backend, compile_graph
from aotpipe.corpus.bench.graph import (
    GraphResult,
    GraphTask,
    check_first,
    compile_failure,
    copy_inputs,
    failure_line,
    loaded,
    result_from_failure,
    time_graph,
)
from aotpipe.errors import AotpipeError, ArtifactError, exception_line
from aotpipe.format.limits import check_record_bytes
from aotpipe.format.records import DimRecord, InputsRecord, Manifest
from aotpipe.format.symbolic import records_at, symbols_in
from aotpipe.replay.inputs import _random_inputs
from aotpipe.replay.run import expand_outputs
from aotpipe.runtime.execution import run_graph

Point = dict[str, int]  # dimension -> size


def parse_sizes(options: Sequence[str]) -> list[Point]:
    """--sizes NAME=v1,v2,... (repeatable, one per dimension): the size points, the lists zipped.

    A malformed option, a dimension given twice, or lists of different lengths is the user's
    error, in one line naming the option and the fix."""
    lists: dict[str, list[int]] = {}
    for opt in options:
        name, eq, values = opt.partition("=")
        name = name.strip()
        if not eq or not name or not values.strip():
            raise AotpipeError(f"--sizes {opt!r}: write NAME=SIZE,SIZE,... (a dimension of the artefact's dims, "
                               "e.g. --sizes batch=1,7,16)")
        if name in lists:
            raise AotpipeError(f"--sizes {name}: given twice; give each dimension once, its sizes comma-separated")
        try:
            sizes = [int(v) for v in values.split(",")]
        except ValueError:
            raise AotpipeError(f"--sizes {opt!r}: {values!r} is not a comma-separated list of whole numbers") from None
        if any(v < 0 for v in sizes):
            raise AotpipeError(f"--sizes {opt!r}: a size is a whole number of 0 or more")
        lists[name] = sizes
    lengths = {len(v) for v in lists.values()}
    if len(lengths) > 1:
        given = ", ".join(f"{k} {len(v)}" for k, v in lists.items())
        raise AotpipeError(f"--sizes: the dimensions' lists are zipped into points, so they must be of one length "
                           f"(given: {given}); give each dimension one size per point")
    n = lengths.pop() if lengths else 0
    return [{k: v[i] for k, v in lists.items()} for i in range(n)]


def _range_text(d: DimRecord) -> str:
    return f"{d.min}..{d.max}" if d.max is not None else f"{d.min} and up"


def artefact_points(manifest: Manifest, label: str, points: Sequence[Point]) -> tuple[list[Point], list[str]]:
    """(`points` as one artefact takes them, the dimensions they name that it has not).

    Each point completed with every dynamic dimension of the manifest, at the point's size or
    else its example; a dimension the artefact has not is left out of its points (another
    artefact of the bench may have it: plan refuses a name none has), and points that are then
    the same as an earlier one benched once (a point given twice is benched twice: the second
    time shows whether it recompiled). A user error (one line) for an artefact without a dynamic dimension,
    a dimension it captured static, or a size outside a dimension's recorded range."""
    dims = manifest.dims.dims if manifest.dims is not None else {}
    dynamic = {k: d for k, d in dims.items() if d.status == "dynamic" and d.symbol is not None}
    if not dynamic:
        raise AotpipeError(f"{label}: --sizes needs a shape-polymorphic artefact, and this one has no dynamic "
                           "dimension (captured at static sizes); bench it without --sizes, or capture it again "
                           "with dims: in the pipeline")
    out: list[Point] = []
    missing: list[str] = []
    for point in points:
        for name, size in point.items():
            d = dims.get(name)
            if d is None:
                if name not in missing:
                    missing.append(name)
                continue
            if name not in dynamic:
                raise AotpipeError(f"--sizes {name}: {label} captured {name} at the static size {d.example} "
                                   f"({d.reason or 'specialised'}); leave it out of --sizes")
            if size < d.min or (d.max is not None and size > d.max):
                raise AotpipeError(f"--sizes {name}={size}: outside {label}'s recorded range for {name}, "
                                   f"{_range_text(d)}; bench sizes in that range (the graphs hold only there)")
        full = {k: point.get(k, d.example) for k, d in dynamic.items()}
        if full not in out or set(point) <= set(dims):  # a point the user repeats is benched again
            out.append(full)
    return out, missing


def symbol_sizes(manifest: Manifest, point: Point) -> dict[str, int]:
    """A point (dimension -> size) as the graphs' symbols' sizes (symbol -> size)."""
    dims = manifest.dims.dims if manifest.dims is not None else {}
    out: dict[str, int] = {}
    for k, v in point.items():
        symbol = dims[k].symbol if k in dims else None
        if symbol is not None:
            out[symbol] = v
    return out


def is_symbolic(record: InputsRecord) -> bool:
    """Whether a graph's inputs are sized in symbols (a graph without any runs at one size only)."""
    return any(any(symbols_in(s) for s in (r.sym_shape or [])) or (r.sym_value is not None and symbols_in(r.sym_value))
               for r in record.inputs)


def inputs_at(ga: Any, sizes: dict[str, int], seed: int) -> list[Any]:
    """Random inputs of a loaded graph at `sizes` (symbol -> size), drawn as --inputs random
    draws them at the example (replay.inputs: the same generator, ranges and aliasing), flat.

    The records at the sizes are format.symbolic's, as get_inputs(sizes=) takes them; the
    graph's loaded record is used rather than its files read again."""
    where = str(ga.folder.name)
    storages, inputs = records_at(ga.record.storages, ga.record.inputs, sizes, where)
    check_record_bytes(storages, inputs, ga.folder / "inputs.json")
    forward = ga.upstream.record if ga.upstream is not None else None
    try:
        return _random_inputs(storages, inputs, seed, None, forward)
    except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
        raise ArtifactError(f"{where}: cannot make inputs at {sizes} ({exception_line(e)})") from None


def symbolic_dims(record: InputsRecord) -> list[list[int]]:
    """Per input, the dimensions whose size is in the symbols (dynamo is told the others are static)."""
    return [[d for d, s in enumerate(r.sym_shape or []) if symbols_in(s)] for r in record.inputs]


# dynamo's counter group (torch._dynamo.utils.counters, a dict of Counters: not a record)
_DYNAMO_STATS = "stats"


def compiled_graphs() -> int:
    """How many graphs dynamo has handed to a backend in this process so far: its counter
    ``counters["stats"]["unique_graphs"]`` (one per compile: the first, and each recompile after
    a guard failed). A point's compiles are the counter's rise over its first call."""
    return int(counters[_DYNAMO_STATS]["unique_graphs"])


@dataclass(frozen=True)
class SizedGraphTask:
    """What a worker needs to bench one graph at every size point (picklable)."""

    task: GraphTask  # the graph, backend and timing options, as a bench without --sizes
    points: tuple[tuple[tuple[str, int], ...], ...]  # each point's (dimension, size), in order
    symbols: tuple[tuple[tuple[str, int], ...], ...]  # the same points by symbol

    def __call__(self) -> list[GraphResult]:
        return bench_graph_at_sizes(self)

    def failed(self, kind: str, reason: str, detail: str | None) -> list[GraphResult]:
        """The results of a graph whose worker did not return (timed out or died): every point's."""
        out = []
        for index, point in enumerate(self.points):
            r = result_from_failure(self.task, kind, reason, detail)
            r.sizes, r.point, r.inputs = dict(point), index, "random"
            out.append(r)
        return out


def bench_graph_at_sizes(st: SizedGraphTask) -> list[GraphResult]:
    """Compile one graph once with its symbolic dimensions dynamic, then check and time it at
    every point (runs in a worker process): one result per point."""
    task = st.task
    start = time.perf_counter()
    art = loaded(task.artifact, task.trust_ops)
    ga = art.graphs[task.graph]
    backend = Backend(task.backend)
    marks = symbolic_dims(ga.record)
    roles = [r.role for r in ga.record.inputs]
    results: list[GraphResult] = []
    compiled: tuple[Any, list[int]] | None = None
    bound: list[tuple[int, Any]] = []  # inductor-freezing: the inputs it bound as constants, at the first point
    ran = False  # a call of the compiled graph has returned: it compiled at least once
    broken: GraphResult | None = None  # it failed to compile before it ever ran: later points say so
    for index, (point, by_symbol) in enumerate(zip(st.points, st.symbols, strict=True)):
        t_point = time.perf_counter()
        res = GraphResult(task.label, task.graph, ga.kind, "skipped", path=task.artifact, inputs="random",
                          seed=task.seed, sizes=dict(point), point=index)
        results.append(res)
        if broken is not None:
            res.status, res.reason = broken.status, f"not run: the compile failed at the first point ({broken.reason})"
            continue
        try:
            module = ga.module
            assert isinstance(module, torch.fx.GraphModule)  # rebuilt from graph.json: no trust_code
            res.nodes = len(module.graph.nodes)
            drawn = inputs_at(ga, dict(by_symbol), task.seed)
            if compiled is not None:  # the constants inductor-freezing bound stand for these
                for i, v in bound:
                    drawn[i] = v
            expected = expand_outputs(ga.record, run_graph(module, copy_inputs(drawn)))
        except Exception as e:
            res.reason = f"the loaded graph does not run eagerly at these sizes: {exception_line(e)}"
            res.wall_s = time.perf_counter() - t_point
            continue
        args = copy_inputs(drawn)
        before = compiled_graphs()
        t0 = time.perf_counter()
        try:
            if compiled is None:
                compiled = compile_graph(backend, module, args, roles, backend.resolve(), dynamic=True)
                bound = [(i, drawn[i]) for i in range(len(drawn)) if i not in set(compiled[1])]
            fn, free = compiled
            # The artefact's static dimensions marked static (dynamic=True makes every one symbolic),
            # on each point's tensors: dynamo reads a tensor's marks when it compiles for it.
            for i in free if backend.name != "eager" else ():
                if isinstance(args[i], torch.Tensor):
                    for d in range(args[i].dim()):
                        if d not in marks[i]:
                            torch._dynamo.mark_static(args[i], d)
            with shape_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]  # install_config_module's
                first = fn([args[i] for i in free])
        except Exception as e:
            res.compile_s = res.in_backend_s = time.perf_counter() - t0
            res.compiles = compiled_graphs() - before if backend.name != "eager" else None
            res.status = compile_failure(backend, e)
            res.reason = failure_line(e)
            res.wall_s = time.perf_counter() - t_point
            if res.status == "compile_error" and not ran:
                broken = res
            continue
        ran = True
        res.compile_s = res.in_backend_s = time.perf_counter() - t0
        res.compiles = compiled_graphs() - before if backend.name != "eager" else None
        if check_first(res, ga, module, fn, free, args, drawn, expected, first, roles):
            del expected, first
            time_graph(res, task, module, fn, free, args, drawn)
        res.wall_s = time.perf_counter() - t_point
    if results:
        results[0].wall_s += max(0.0, time.perf_counter() - start - sum(r.wall_s for r in results))
    return results
