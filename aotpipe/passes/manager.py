"""The pass manager: runs a chain in order, lints and recompiles after each pass, and
checks each pass against the graph before it on the same inputs.

A pass that raises, leaves an invalid graph, or changes the results beyond the per-dtype
tolerance stops the chain with a :class:`PassError` naming the pass, the passes that ran
before it, and (for changed results) the first node whose value departs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.passes import PASSES, PassStep, step_to_json
from aotpipe.passes.base import GraphUnderPass, PassError
from aotpipe.tensors import close, max_abs_error, stats, stats_depart


@dataclass
class StepRecord:
    """What one pass did: for the manifest and the report."""

    name: str
    options: dict[str, Any]
    nodes_before: int
    nodes_after: int
    modified: bool
    seconds: float
    max_abs_error: float
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self, *, timings: bool = True) -> dict[str, Any]:
        d = {
            "name": self.name,
            "options": self.options,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "modified": self.modified,
            "max_abs_error": self.max_abs_error,
            "stats": self.stats,
        }
        if timings:
            d["seconds"] = round(self.seconds, 4)
        return d


def _run(gm: torch.fx.GraphModule, values: list[Any]) -> list[Any]:
    from aotpipe.replay import run_graph

    return run_graph(gm, values)


class _Record(torch.fx.Interpreter):
    """Keeps a snapshot (statistics) of each node's value as it is computed: a later
    in-place op may overwrite the tensor itself."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        r = super().run_node(n)
        if isinstance(r, torch.Tensor) and r.device.type != "meta":
            self.values[n.name] = stats(r)
        return r


def _node_values(gm: torch.fx.GraphModule, values: list[Any]) -> tuple[list[str], dict[str, Any]]:
    from aotpipe.capture.values import RNG_SEED

    rec = _Record(gm)
    torch.manual_seed(RNG_SEED)
    with torch.no_grad():
        rec.run(*values)
    return [n.name for n in gm.graph.nodes], rec.values


def first_diverging_node(before: GraphUnderPass, after: GraphUnderPass) -> Optional[str]:
    """The first node of `after` that also exists in `before` and whose value differs."""
    _, old = _node_values(before.gm, before.values)
    order, new = _node_values(after.gm, after.values)
    for name in order:
        if name in old and name in new and old[name]["shape"] == new[name]["shape"]:
            a, b = dict(new[name]), dict(old[name])
            a["stride"] = b["stride"]  # a layout pass may change strides on purpose
            why = stats_depart(a, b, rtol=1e-4)
            if why:
                node = next(n for n in after.gm.graph.nodes if n.name == name)
                return f"{name} ({getattr(node.target, '__name__', node.target)}): {why}"
    return None


def _compare(expected: list[Any], actual: list[Any], meta_only: bool) -> tuple[float, list[str]]:
    worst, problems = 0.0, []
    if len(expected) != len(actual):
        return float("inf"), [f"{len(actual)} outputs, {len(expected)} before"]
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            if e.shape != a.shape or e.dtype != a.dtype:
                problems.append(f"output {i}: {a.dtype}{list(a.shape)}, was {e.dtype}{list(e.shape)}")
                worst = float("inf")
                continue
            if meta_only or a.device.type == "meta":
                continue
            err = max_abs_error(a.cpu(), e.cpu())
            worst = max(worst, err)
            if not close(a.cpu(), e.cpu()):
                problems.append(f"output {i}: max abs error {err:.3g}")
        elif (e is None) != (a is None):
            problems.append(f"output {i}: {type(a).__name__}, was {type(e).__name__}")
    return worst, problems


def run_chain(graph: GraphUnderPass, steps: list[PassStep]) -> tuple[GraphUnderPass, list[StepRecord]]:
    """Apply `steps` in order, verifying each; returns the final graph and what each step did."""
    records: list[StepRecord] = []
    current = graph
    reference = _run(current.gm, current.values)
    for i, step in enumerate(steps):
        info = PASSES[step.name]
        ran = ", ".join(s.name for s in steps[:i]) or "none"
        where = f"pass {step.name!r} (passes before it: {ran})"
        if current.kind not in info.kinds:
            raise PassError(f"{where} cannot take a {current.kind} graph; it accepts {', '.join(sorted(info.kinds))}")
        before = current
        work = current.copy()
        nodes_before = len(work.gm.graph.nodes)
        t0 = time.perf_counter()
        try:
            result = info.fn(work, step.options)
            result.graph.gm.graph.lint()
            result.graph.gm.recompile()
        except PassError:
            raise
        except Exception as e:
            raise PassError(f"{where} failed: {e.__class__.__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
        seconds = time.perf_counter() - t0
        after = result.graph
        try:
            outputs = _run(after.gm, after.values)
        except Exception as e:
            raise PassError(f"{where} left a graph that does not run: {e.__class__.__name__}: {e}") from e
        worst, problems = _compare(reference, outputs, meta_only=False)
        if problems:
            node = first_diverging_node(before, after)
            raise PassError(f"{where} changed the results: {'; '.join(problems[:3])}"
                            + (f"; first diverging node: {node}" if node else ""))
        records.append(StepRecord(step.name, step_to_json(step)["options"], nodes_before,
                                  len(after.gm.graph.nodes), result.modified, seconds, worst, result.stats))
        current, reference = after, outputs
    return current, records


def chain_name(steps: list[PassStep]) -> str:
    """The folder suffix of a transformed graph: its passes joined by '+'."""
    return "+".join(s.name for s in steps)
