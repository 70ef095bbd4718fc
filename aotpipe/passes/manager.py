"""The pass manager: runs a chain in order, lints and recompiles after each pass, and
checks each pass against the graph before it on the same inputs.

A pass that raises, leaves an invalid graph, or changes the results beyond float noise
(:func:`aotpipe.runtime.accuracy.compare` against the graph before it) stops the chain with a
:class:`PassError` naming the pass, the passes that ran before it, and (for changed
results) the first node whose value departs.

A run of aotpipe applies the chain without running it (``check_each=False``) and checks
the final graph against the eager model with the others; only when that fails is the
chain replayed pass by pass to name the pass at fault (:func:`diagnose_chain`).

There (:func:`apply_passes`), an optional pass (``PassInfo.optional``: every optimisation)
that raises or leaves an invalid graph is left out, with the passes after it that need it:
the chain goes on from the graph before it, the graph it makes is named by the passes that
ran, and the failure is recorded (``SkippedPass``, with its traceback for ``-v``) instead
of failing the model. A required pass's failure still fails the model; the captured graphs
are written either way.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from aotpipe.errors import exception_line
from aotpipe.format.ir import CapturedGraph, DerivedGraph, GraphOutput, TensorMeta
from aotpipe.format.records import PassChainRun, PassRecord, SkippedPass, Summary, TimedPassRecord, updated
from aotpipe.format.symbolic import dense_strides
from aotpipe.passes import PASSES, chain_order_problems, options_to_json
from aotpipe.passes.base import GraphUnderPass, PassError, fill_vals
from aotpipe.runtime import accuracy
from aotpipe.runtime.execution import run_graph, run_with_summaries
from aotpipe.spec import PassStep


def _step(step: PassStep, nodes_before: int, nodes_after: int, modified: bool, seconds: float,
          max_abs_error: float | None, stats: dict[str, Any]) -> TimedPassRecord:
    """What one pass did (run.json's record; the manifest's is the same less the time).
    max_abs_error: against the graph before it; None when not run (checked at the end)."""
    return TimedPassRecord(name=step.name, options=options_to_json(step.options), nodes_before=nodes_before,
                         nodes_after=nodes_after, modified=modified, max_abs_error=max_abs_error, stats=stats,
                         seconds=round(seconds, 4))


def untimed(step: TimedPassRecord) -> PassRecord:
    """The manifest's record of a pass as it ran: deterministic, so without its time."""
    return PassRecord(**{k: v for k, v in step if k != "seconds"})


def first_diverging_node(before: GraphUnderPass, after: GraphUnderPass) -> str | None:
    """The first node of `after` that also exists in `before` and whose value differs."""
    _, old = run_with_summaries(before.gm, before.values, accuracy.summary)
    _, new = run_with_summaries(after.gm, after.values, accuracy.summary)
    for name in [n.name for n in after.gm.graph.nodes]:
        a, b = new.get(name), old.get(name)
        if isinstance(a, Summary) and isinstance(b, Summary) and a.shape == b.shape:
            # strides left out: a layout pass may change them on purpose
            why = accuracy.summary_departs(a, b, rtol=1e-4, layout=("dtype", "shape"))
            if why:
                node = next(n for n in after.gm.graph.nodes if n.name == name)
                return f"{name} ({getattr(node.target, '__name__', node.target)}): {why}"
    return None


def _compare(expected: list[Any], actual: list[Any]) -> tuple[float, list[str]]:
    worst, problems = 0.0, []
    if len(expected) != len(actual):
        return float("inf"), [f"{len(actual)} outputs, {len(expected)} before"]
    for i, (e, a) in enumerate(zip(expected, actual)):
        if any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in (a, e)):  # no data: layout only
            if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and (e.shape != a.shape or e.dtype != a.dtype):
                problems.append(f"output {i}: {a.dtype}{list(a.shape)}, was {e.dtype}{list(e.shape)}")
            continue
        a = a.cpu() if isinstance(a, torch.Tensor) else a
        e = e.cpu() if isinstance(e, torch.Tensor) else e
        c = accuracy.compare(a, e, what=f"output {i}")
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.shape == e.shape:
            worst = max(worst, accuracy.max_abs_error(a, e))
        if not c.passed:
            problems.append(c.line())
    return worst, problems


def run_chain(graph: GraphUnderPass, steps: list[PassStep], *,
              check_each: bool = True) -> tuple[GraphUnderPass, list[TimedPassRecord]]:
    """Apply `steps` in order; returns the final graph and what each step did.

    With `check_each`, each pass is run and compared with the graph before it (a
    PassError names the first that changes the results); without, passes are only linted.
    """
    order = chain_order_problems([s.name for s in steps])
    if order:
        raise PassError(order[0][1])
    records: list[TimedPassRecord] = []
    current = graph
    reference = run_graph(current.gm, current.values) if check_each else None
    for i, step in enumerate(steps):
        where = _where(step, steps[:i])
        before = current
        work = current.copy() if check_each else current  # the graph before it is kept only to compare
        nodes_before = len(work.gm.graph.nodes)
        t0 = time.perf_counter()
        result = _apply(work, step, where)
        seconds = time.perf_counter() - t0
        after = result.graph
        if not check_each:
            records.append(_step(step, nodes_before, len(after.gm.graph.nodes), result.modified, seconds, None,
                                 result.stats))
            current = after
            continue
        try:
            outputs = run_graph(after.gm, after.values)
        except Exception as e:
            raise PassError(f"{where} left a graph that does not run: {exception_line(e)}") from e
        worst, problems = _compare(reference, outputs)
        if problems:
            node = first_diverging_node(before, after)
            raise PassError(f"{where} changed the results: {'; '.join(problems[:3])}"
                            + (f"; first diverging node: {node}" if node else ""))
        records.append(_step(step, nodes_before, len(after.gm.graph.nodes), result.modified, seconds, worst,
                             result.stats))
        current, reference = after, outputs
    return current, records


def _where(step: PassStep, ran: list[PassStep]) -> str:
    return f"pass {step.name!r} (passes before it: {', '.join(s.name for s in ran) or 'none'})"


def _apply(work: GraphUnderPass, step: PassStep, where: str) -> Any:
    """`step` applied to `work`, linted and recompiled: its PassResult; a PassError naming it
    (`where`) if it cannot take the graph, raises, or leaves an invalid graph."""
    info = PASSES[step.name]
    if work.kind not in info.kinds:
        raise PassError(f"{where} cannot take a {work.kind} graph; it accepts {', '.join(sorted(info.kinds))}")
    try:
        result = info.function(work, step.options)
        result.graph.gm.graph.lint()
        fill_vals(result.graph.gm)  # the nodes it made described in graph.json as captured ones are
        result.graph.gm.recompile()
    except PassError:
        raise
    except Exception as e:
        raise PassError(f"{where} failed: {exception_line(e)}") from e
    return result


@dataclass
class LeftOut:
    """An optional pass that failed in :func:`run_chain_leaving_out`: its record, its traceback."""

    record: SkippedPass
    traceback: str


def run_chain_leaving_out(graph: GraphUnderPass, steps: list[PassStep], key: str
                          ) -> tuple[GraphUnderPass, list[TimedPassRecord], list[PassStep], list[LeftOut]]:
    """Apply `steps` in order, unchecked (as a run does), leaving out each optional pass that
    fails, and the later passes that need it: (final graph, records of the passes that ran,
    those passes, what was left out). A required pass's failure raises its PassError.

    Each pass works on a copy, so one that fails half-way leaves nothing of its work behind.
    `key` names the graph in the records of what was left out.
    """
    order = chain_order_problems([s.name for s in steps])
    if order:
        raise PassError(order[0][1])
    records: list[TimedPassRecord] = []
    ran: list[PassStep] = []
    left: list[tuple[SkippedPass, str]] = []
    dropped: dict[str, list[str]] = {}  # a failed pass -> the later passes left out with it
    current = graph
    for step in steps:
        info = PASSES[step.name]
        cause = next((c for c in dropped if c in info.needs), None)
        if cause is not None:  # it needs a pass that failed: left out with it
            dropped[cause].append(step.name)
            dropped[step.name] = dropped[cause]
            continue
        work = current.copy()
        nodes_before = len(work.gm.graph.nodes)
        t0 = time.perf_counter()
        try:
            result = _apply(work, step, _where(step, ran))
        except PassError as e:
            if not info.optional:
                raise
            dropped[step.name] = []
            left.append((SkippedPass(graph=key, name=step.name, error=str(e)),
                         "".join(traceback.format_exception(e.__cause__ or e))))
            continue
        records.append(_step(step, nodes_before, len(result.graph.gm.graph.nodes), result.modified,
                             time.perf_counter() - t0, None, result.stats))
        ran.append(step)
        current = result.graph
    chain = chain_name(ran) or None
    out = [LeftOut(updated(r, left_out=list(dropped[r.name]), chain=chain), tb) for r, tb in left]
    return current, records, ran, out


def chain_name(steps: list[PassStep]) -> str:
    """The folder suffix of a transformed graph: its passes joined by '+'."""
    return "+".join(s.name for s in steps)


def diagnose_chain(graph: GraphUnderPass, steps: list[PassStep]) -> str:
    """Which pass of a chain whose result failed its checks is at fault, and where: the
    chain replayed with each pass compared against the graph before it."""
    try:
        run_chain(graph, steps, check_each=True)
    except PassError as e:
        return str(e)
    return "every pass is within float noise of the graph before it: the passes' errors add up"


@dataclass
class AppliedPasses:
    """What :func:`apply_passes` did to a model's graphs."""

    problems: list[str] = field(default_factory=list)  # required passes that failed (the model fails)
    runs: dict[str, PassChainRun] = field(default_factory=dict)  # what each chain did, by derived key
    diagnose: dict[str, Callable[[], str]] = field(default_factory=dict)  # by derived key: the pass at fault
    left_out: list[LeftOut] = field(default_factory=list)  # optional passes that failed, left out
    tracebacks: list[str] = field(default_factory=list)  # of the required passes that failed

    @property
    def skipped(self) -> list[SkippedPass]:
        return [lo.record for lo in self.left_out]


def _kept_symbolic(meta: TensorMeta | None, base: TensorMeta | None, symbols: dict[str, Any]) -> TensorMeta | None:
    """An output layout a pass recorded at the example's sizes, given back the symbolic shape of
    the base graph's output (the same sizes at the example) and the strides of that dense layout;
    left static where the pass's layout is not dense."""
    if meta is None or base is None or base.sym_shape is None or meta.sym_shape is not None \
            or meta.shape != base.shape:
        return meta
    example = {name: rec.example for name, rec in symbols.items()}
    strides = dense_strides(list(base.sym_shape), list(meta.stride), example)
    if strides is None:
        return meta
    return dataclasses.replace(meta, sym_shape=base.sym_shape, sym_stride=tuple(strides))


def apply_passes(spec: Any, captured: Any, inputs: dict[str, list[Any]]) -> AppliedPasses:
    """Apply the model's pass chain to each graph kind it selects; add the results to `captured`.

    `inputs` holds each graph's real inputs (freeze takes parameter values from them); the
    derived graphs' inputs are added to it. A required pass that fails adds a problem and
    no graph; an optional one is left out (:func:`run_chain_leaving_out`), and the graph is
    named by the passes that ran (none ran: no graph). Per derived key, a function names the
    pass at fault when the derived graph later fails its checks.
    """
    import copy

    steps = list(spec.passes)
    out = AppliedPasses()
    for key, g in list(captured.graphs.items()):
        kind = g.kind  # a dynamo capture's later subgraphs: key "inference_1", kind "inference"
        kind_steps = [s for s in steps if s is not None and kind in s.graphs]
        if not kind_steps or key not in inputs:
            continue
        start = GraphUnderPass(copy.deepcopy(g.gm), kind, list(g.inputs), list(g.outputs), list(inputs[key]))
        t0 = time.perf_counter()
        try:
            final, records, ran, left = run_chain_leaving_out(start, kind_steps, key)
        except PassError as e:
            out.problems.append(f"{key} graph: {e}")
            out.tracebacks.append("".join(traceback.format_exception(e)))
            continue
        out.left_out += left
        if not ran:
            continue  # every pass left out: the captured graph is all there is
        outputs = []
        out_node = next(n for n in final.gm.graph.nodes if n.op == "output")
        out_args = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        for go, arg in zip(final.outputs, out_args):
            val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            meta = TensorMeta.of(val) if isinstance(val, torch.Tensor) and val.device.type != "meta" else go.meta
            outputs.append(GraphOutput(go.index, go.role, go.target, _kept_symbolic(meta, go.meta, g.symbols)))
        # A shape-polymorphic graph's symbols carry over: the size checks run the derived graph at
        # other sizes too, so a pass that fixed a size shows there, named by the chain.
        derived = DerivedGraph(key, chain_name(ran), CapturedGraph(kind, final.gm, final.inputs, outputs,
                                                                   symbols=dict(g.symbols), guards=list(g.guards)),
                               [untimed(r) for r in records])
        captured.derived[derived.key] = derived
        inputs[derived.key] = final.values
        out.runs[derived.key] = PassChainRun(seconds=round(time.perf_counter() - t0, 4), steps=records)
        fresh = GraphUnderPass(copy.deepcopy(g.gm), kind, list(g.inputs), list(g.outputs), list(inputs[key]))
        out.diagnose[derived.key] = lambda fresh=fresh, ran=ran: diagnose_chain(fresh, ran)
    return out
