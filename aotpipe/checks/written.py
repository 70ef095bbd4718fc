"""Checks of a just-written artefact: every graph run once, from its files, and compared.

Each graph is loaded back through the safe loader and run once on its saved inputs (or the
in-memory ones with save_inputs: false), under deterministic kernels and a seeded generator.
That one run gives the reference outputs later replays must reproduce bit for bit (their
digests and summaries), a sampled per-node trace (to name the first diverging node of a
later mismatch), and the values every check compares:

- each output against the eager model under the fp64-reference rule of :mod:`aotpipe.runtime.accuracy`:
  user outputs, the loss, gradients (None against a gradient fails), mutated buffers, and
  buffers eager mutates that the graph does not return;
- the backward is fed the forward's outputs, so the forward's saved activations are checked
  through the gradients they produce; the joint graph must equal forward then backward bit
  for bit (the chain), which checks its outputs against eager too;
- a graph made by passes is checked against eager like the raw one;
- a dynamo capture's graphs are checked subgraph by subgraph: each against its own dynamo
  graph run eagerly (float32, float64 on demand; the model's outputs and gradients are no
  one subgraph's), and each subgraph's forward, backward and joint as a chain ("chain",
  "chain_<i>" in the manifest's verification).

Nothing is skipped silently: every check that cannot run is counted with its reason.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import torch
import torch.fx

from aotpipe.artifact.graph_json import target_name
from aotpipe.artifact.load import GraphArtifact, build_inputs, load
from aotpipe.artifact.prepack import stored_graph
from aotpipe.artifact.writer import CheckOutcome, GraphOutcome, OutputReference
from aotpipe.checks.checked import CheckedGraph
from aotpipe.checks.train_step import check_train_step
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format import limits
from aotpipe.format.graph_keys import graph_key, key_order, parse_graph_key
from aotpipe.format.ir import TensorMeta
from aotpipe.format.records import CheckTotals, InputsRecord, Summary, TupleSummary, VerificationEntry
from aotpipe.format.vocabulary import TRAINING_KINDS, GraphKind
from aotpipe.models.eager import EagerReference, EagerRun, SubgraphReference
from aotpipe.models.train_step import StepReference
from aotpipe.replay.run import chain_key, chain_problems, expand_outputs
from aotpipe.replay.steps import CHECKED_STEPS, STEPS_KEY, schedule_rates
from aotpipe.runtime import accuracy, evidence
from aotpipe.runtime.accuracy import Check
from aotpipe.runtime.determinism import RunLog
from aotpipe.runtime.execution import run_graph, run_with_summaries
from aotpipe.runtime.tensors import value_range
from aotpipe.spec.modes import LOSSES

TRAINING = TRAINING_KINDS
# What graphs are checked against: the eager model, or a dynamo subgraph's own graph run
# eagerly (eager.SubgraphReference); both give EagerRuns by mode.
Reference = Union[EagerReference, SubgraphReference]


@dataclass
class ModelChecks:
    """Everything the checks found for one model, for the run's result."""

    outcome: CheckOutcome
    problems: list[str] = field(default_factory=list)  # failures: the model fails
    graphs: dict[str, CheckedGraph] = field(default_factory=dict)
    pass_failures: list[str] = field(default_factory=list)  # derived graphs dropped
    seconds: float = 0.0

    def finish(self, start: float) -> ModelChecks:
        """Totals of every graph's checks into the manifest's `checks`, and the time taken."""
        records = [gc.record() for gc in self.graphs.values()]
        self.outcome.checks = CheckTotals(**{k: sum(getattr(r, k) or 0 for r in records) for k in CheckTotals.model_fields})
        self.seconds = time.perf_counter() - start
        return self


def _mode(kind: str) -> str:
    return "inference" if kind.split(".")[0] == "inference" else "training"


class _Checker:
    def __init__(self, eager: Reference | None, verify: bool, has_loss: bool = True):
        self.eager = eager
        self.verify = verify
        # Export's training graphs differentiate a loss (modes.LOSSES: their forward's user output);
        # dynamo's differentiate every output of a subgraph (one tangent each).
        self.has_loss = has_loss

    def _run(self, mode: str) -> tuple[EagerRun | None, str | None]:
        run = self.eager.run(mode) if self.eager is not None else None
        why = None if run is not None else (
            "no eager model" if self.eager is None else f"the eager model failed: {self.eager.errors.get((mode, False))}")
        return run, why

    def _ref(self, mode: str, pick: Callable[[EagerRun], Any]) -> Callable[[], Any]:
        def get() -> Any:
            run = self.eager.run(mode, fp64=True) if self.eager is not None else None
            return pick(run) if run is not None else None
        return get

    def _nudged(self, mode: str, pick: Callable[[EagerRun], Any]) -> list[Callable[[], Any]]:
        """Further samples of eager float32's noise (accuracy.compare's `samples`), run on demand."""
        def get(k: int) -> Any:
            run = self.eager.run(mode, nudged=k) if self.eager is not None else None
            return pick(run) if run is not None else None
        return [functools.partial(get, k) for k in range(1, accuracy.NOISE_SAMPLES)]

    def _compare(self, gc: CheckedGraph, mode: str, actual: Any, expected: Any, pick: Callable[[EagerRun], Any],
                 what: str, index: int) -> None:
        c = accuracy.compare(actual, expected, self._ref(mode, pick), what=what,
                             samples=self._nudged(mode, pick))
        if c.eager_error is not None:
            gc.eager_errors[index] = c.eager_error
        if not c.passed and c.method == "floor" and self.eager is not None and self.eager.run(mode, True) is None:
            gc.skipped.append(f"{what}: over the float32 noise floor and no float64 reference "
                              f"({self.eager.errors.get((mode, True))})")
            return
        gc.checks.append(c)

    def check_outputs(self, ga: GraphArtifact, outs: list[Any], chained: bool = False) -> CheckedGraph:
        """Every output of one graph against eager. A joint graph with forward and backward
        beside it (`chained`) is checked through the chain instead: it must equal them bit
        for bit, and they are checked against eager."""
        gc = CheckedGraph()
        recs = ga.record.outputs
        if not self.verify:
            gc.skipped += ["verify: false"] * len(recs)
            return gc
        if ga.kind == "joint" and chained:
            gc.indirect += len(recs)
            return gc
        mode = _mode(ga.kind)
        run, why = self._run(mode)
        if run is None:
            gc.skipped += [why] * len(recs)
            return gc
        user = [(i, o) for i, (o, r) in enumerate(zip(outs, recs, strict=False)) if r.role == "user"]
        if ga.kind in (GraphKind.FORWARD, GraphKind.JOINT) and self.has_loss:
            self._compare(gc, mode, user[0][1] if user else None, run.loss, lambda r: r.loss, "loss",
                          user[0][0] if user else -1)
        elif ga.kind != "backward":
            tensors = [(i, o) for i, o in user if isinstance(o, torch.Tensor)]
            if len(tensors) != len(run.outputs):
                gc.checks.append(Check("user outputs", False, "exact", detail=(
                    f"the graph has {len(tensors)} tensor outputs, the eager model {len(run.outputs)}")))
            for j, ((i, o), e) in enumerate(zip(tensors, run.outputs, strict=False)):
                self._compare(gc, mode, o, e, lambda r, j=j: r.outputs[j], f"output {j}", i)
        returned = set()
        # A user input's mutation names its placeholder; eager knows the input by its name.
        placeholder_user = {i.name: i.target for i in ga.record.inputs if i.role == "user"}
        for index, (o, r) in enumerate(zip(outs, recs, strict=False)):
            target = r.target
            if r.role == "mutation":
                target = target if target in run.state else placeholder_user.get(target, target)
                returned.add(target)
                if target not in run.state:
                    gc.checks.append(Check(f"new value of {target}", False, "exact",
                                           detail="the eager model has no such buffer"))
                else:
                    self._compare(gc, mode, o, run.state[target], lambda rr, t=target: rr.state.get(t),
                                  f"new value of {target}", index)
            elif r.role in ("grad", "none") and ga.kind in (GraphKind.BACKWARD, GraphKind.JOINT):
                if target in run.grads:
                    self._compare(gc, mode, o, run.grads[target], lambda rr, t=target: rr.grads.get(t),
                                  f"gradient of {target}", index)
                elif o is not None:
                    gc.skipped.append(f"gradient of input {target}: the eager input does not require grad")
            elif r.role == "saved":
                gc.indirect += 1
        for b in run.mutated if ga.kind != "backward" else []:  # the forward returns the training's mutations
            if b not in returned:
                gc.checks.append(Check(f"new value of {b}", False, "exact",
                                       detail="the eager model changes this buffer; the graph does not return it"))
        return gc


def _outcome_outputs(outs: list[Any], record: InputsRecord, spread: list[float | None] | None,
                     recorded: bool, eager_errors: dict[int, float]) -> list[OutputReference]:
    out = []
    hashed = [i for i, (o, rec) in enumerate(zip(outs, record.outputs, strict=False))
              if recorded and rec.same_as is None and isinstance(o, torch.Tensor)]
    digests = dict(zip(hashed, accuracy.digests([outs[i] for i in hashed]), strict=True))
    for i, (o, rec) in enumerate(zip(outs, record.outputs, strict=False)):
        if rec.same_as is None and recorded and _scalar(o):
            out.append(OutputReference(value=o))  # a size or flag the graph computed: compared exactly at replay
        elif rec.same_as is not None or not isinstance(o, torch.Tensor):
            out.append(OutputReference())
        elif not recorded:
            out.append(OutputReference(layout=TensorMeta.of(o).layout()))
        else:
            values, fields = evidence.record(o, eager_errors.get(i))
            out.append(OutputReference(
                digest=digests[i], summary=accuracy.sampled_summary(o),
                spread=spread[i] if spread else None, layout=TensorMeta.of(o).layout(), evidence=fields,
                evidence_values=values, range=_int_range(o)))
    return out


def _int_range(t: torch.Tensor) -> list[int] | None:
    """[low, high) of an integer tensor's values (None for floats, bools, empty tensors)."""
    r = value_range(t)
    return None if r is None else list(r)


def _scalar(o: Any) -> bool:
    """A Python int, bool or finite float output (JSON holds no NaN or inf)."""
    return isinstance(o, (bool, int)) or (isinstance(o, float) and math.isfinite(o))


def _output_keys(record: InputsRecord) -> list[tuple[str, Any]]:
    """What each output is, the same in a subgraph's forward, backward and joint: the n-th
    user output, the gradient of a target, the new value of a target."""
    keys, users = [], 0
    for r in record.outputs:
        if r.role == "user":
            keys.append(("user", users))
            users += 1
        else:
            keys.append((r.role, r.target))
    return keys


def graph_did_not_run(result: ModelChecks, key: str, ga: Any, what: str, e: BaseException) -> None:
    """Record that graph `key` could not be run back (`what`: how it was run): a problem line
    and an error verification with no output references."""
    msg = exception_line(e)
    result.problems.append(f"{key} graph: {what}: {msg}")
    result.outcome.graphs[key] = GraphOutcome([OutputReference() for _ in ga.record.outputs],
                                              verification=VerificationEntry(status="error", error=msg))


def check_written(
    folder: Path,
    *,
    memory_inputs: dict[str, list[Any]],
    codes: dict[str, list[str]],
    eager: Reference | None | dict[int, Reference],
    verify: bool = True,
    diagnose: Callable[[str, list[str]], str] | None = None,
    trust_ops: Sequence[str] = (),
    own_capture: bool = False,
    steps: StepReference | None = None,
) -> ModelChecks:
    """Run every graph of the written `folder` once; its reference records and check results.

    `memory_inputs` are each graph's inputs as bound at capture (used where none were
    saved); `codes` each graph's :func:`graph_structure` at capture (the loaded graph must
    rebuild it exactly). `eager` is the reference the graphs are checked against: the eager
    model, or for a dynamo capture one per subgraph index (capture.dynamo.subgraph_references:
    each subgraph's own dynamo graph). `diagnose(key, problems)`, for a derived graph that
    fails, names the pass at fault. Derived graphs that fail are dropped from the artefact.
    Each subgraph's forward, backward and joint are checked as a chain. `trust_ops`: the
    pipeline's trusted library op namespaces (their ops are loaded back too). `own_capture`:
    this process's capture wrote the folder, so no graph is refused for its ops (ops.OWN_CAPTURE).
    `steps`: a train_step graph's eager reference (its checks: checks/train_step.py).
    """
    # The byte limits guard a loader against hostile artefacts. This one was just written
    # from the model, which ran with these tensors already. A replay of it later may need
    # --max-bytes.
    with limits.unbounded_bytes():
        return _check_written(folder, memory_inputs=memory_inputs, codes=codes, eager=eager, verify=verify,
                              diagnose=diagnose, trust_ops=trust_ops, own_capture=own_capture, steps=steps)


def _check_written(folder: Path, *, memory_inputs: dict[str, list[Any]], codes: dict[str, list[str]],
                   eager: Reference | None | dict[int, Reference], verify: bool,
                   diagnose: Callable[[str, list[str]], str] | None, trust_ops: Sequence[str],
                   own_capture: bool, steps: StepReference | None = None) -> ModelChecks:
    start = time.perf_counter()
    # recompute=True: a graph whose constants cannot be recomputed fails here, not later
    art = load(folder, trust_ops=trust_ops, own_capture=own_capture).build_all(recompute=True)
    result = ModelChecks(CheckOutcome())
    # Export's training graphs output the loss they differentiate (`loss:` sum or mean);
    # dynamo's have none (a tangent per output; their options say so).
    has_loss = art.manifest.capture.options.get("loss", "sum") in LOSSES
    per_subgraph = eager if isinstance(eager, dict) else {0: eager}
    checkers = {i: _Checker(per_subgraph.get(i), verify, has_loss) for i in art.subgraph_keys()}
    kinds_of = {i: set(keys) for i, keys in art.subgraph_keys().items()}
    outs_by_key: dict[str, list[Any]] = {}
    measured_by_sub: dict[int, dict[tuple[str, Any], float]] = {}
    # By subgraph: inference, the graphs passes made of it, forward, backward, joint.
    order = sorted(art.graphs, key=key_order)
    for key in order:
        ga = art.graphs[key]
        parsed = parse_graph_key(key)
        sub = parsed.subgraph if parsed is not None else 0
        rebuilt_differently = None
        if key in codes and isinstance(ga.module, torch.fx.GraphModule) and graph_structure(ga.module) != codes[key]:
            rebuilt_differently = (f"graph.json does not rebuild the captured graph exactly "
                                   f"({_first_difference(codes[key], graph_structure(ga.module))})")
            result.problems.append(f"{key} graph: {rebuilt_differently}")
        saved = ga.has_saved_values
        try:
            if key == graph_key("backward", sub):
                fw_out = outs_by_key.get(graph_key("forward", sub))
                inputs = ga.saved_inputs(forward_outputs=fw_out) if saved and fw_out is not None else \
                    _backward_inputs(ga, fw_out, memory_inputs.get(key))
            else:
                inputs = ga.saved_inputs() if saved else memory_inputs[key]
            log = RunLog()
            outs, trace = run_with_summaries(ga.module, inputs, accuracy.sampled_summary, log, skip=_is_view)
            outs = expand_outputs(ga.record, outs)
            spread = None
            if log.nondeterministic:  # measure the run-to-run spread, and keep these values
                again = expand_outputs(ga.record, run_graph(ga.module, inputs))
                spread = [accuracy.max_abs_error(a, b) if isinstance(a, torch.Tensor) else None
                          for a, b in zip(outs, again, strict=False)]
        except Exception as e:
            graph_did_not_run(result, key, ga, "the written graph does not run", e)
            continue
        outs_by_key[key] = outs
        checker = checkers.setdefault(sub, _Checker(per_subgraph.get(sub), verify, has_loss))
        if ga.kind == GraphKind.TRAIN_STEP:
            try:
                gc, result.outcome.verification[STEPS_KEY] = check_train_step(
                    ga, inputs, outs, steps, (art.graphs.get(graph_key(GraphKind.FORWARD, sub)),
                                              art.graphs.get(graph_key(GraphKind.BACKWARD, sub))), verify,
                    rates=schedule_rates(art, ga.record, CHECKED_STEPS))
            except Exception as e:
                graph_did_not_run(result, key, ga, f"{STEPS_KEY} chained from the written graph failed", e)
                continue
        else:
            gc = checker.check_outputs(ga, outs, chained=set(TRAINING) <= kinds_of.get(sub, set()))
        result.graphs[key] = gc
        failed = [c for c in gc.checks if not c.passed]
        status = "recorded" if saved else "shapes only"
        # A joint checked through the chain has its forward's and backward's measured errors.
        measured = measured_by_sub.setdefault(sub, {})
        keys = _output_keys(ga.record)
        if ga.kind in (GraphKind.FORWARD, GraphKind.BACKWARD) and (parsed is None or parsed.chain is None):
            measured.update({keys[i]: e for i, e in gc.eager_errors.items() if 0 <= i < len(keys)})
        errors = {i: measured[k] for i, k in enumerate(keys) if k in measured} if ga.kind == "joint" else {}
        errors.update({i: e for i, e in gc.eager_errors.items() if i >= 0})
        result.outcome.graphs[key] = GraphOutcome(
            _outcome_outputs(outs, ga.record, spread, saved, errors), outs if saved else None,
            trace_nodes(trace) if saved else None, gc.record(), list(log.nondeterministic),
            # a graph rebuilt differently is an error in the manifest too: the next run redoes
            # the model rather than keep it as up to date
            VerificationEntry(status="error" if rebuilt_differently else status, error=rebuilt_differently,
                              inputs="saved" if saved else "in memory (save_inputs: false)"))
        if failed and (parsed is None or parsed.chain is not None):
            lines = [c.line() for c in failed]
            why = diagnose(key, lines) if diagnose else ""
            result.pass_failures.append(f"{key} graph differs from the eager model: {'; '.join(lines[:3])}"
                                        + (f"; {why}" if why else ""))
            result.outcome.drop.append(key)
        elif failed:
            result.problems.append(f"{key} graph differs from the eager model: {len(failed)} check(s) failed, e.g. "
                                   + "; ".join(c.line() for c in failed[:2]))
    for sub, by_kind in art.subgraph_keys().items():
        if not all(by_kind.get(k) in outs_by_key for k in TRAINING):
            continue
        fw, bw, joint = (by_kind[k] for k in TRAINING)
        contract = art.graphs[fw].record.partition
        if contract is None:
            raise ArtifactError(f"{art.graphs[fw].folder}: the forward graph has no partition contract")
        problems, _, compared = chain_problems(contract, outs_by_key[fw], outs_by_key[bw],
                                               art.graphs[joint].record, outs_by_key[joint])
        name = chain_key(sub)
        result.outcome.verification[name] = VerificationEntry(status="mismatch" if problems else "match",
                                                              compared=compared, problems=problems)
        result.problems += [f"{name}: {p}" for p in problems[:3]]
    return result.finish(start)


def _backward_inputs(ga: GraphArtifact, fw_out: list[Any] | None, memory: list[Any] | None) -> list[Any]:
    if fw_out is None:
        raise RuntimeError("the backward graph needs the forward graph's outputs")
    return build_inputs(ga.record.inputs, [None] * len(ga.record.storages), fw_out) if all(
        r.source != "blob" or r.type != "tensor" for r in ga.record.inputs) else memory


def graph_structure(gm: torch.fx.GraphModule) -> list[str]:
    """One line per node: op, name, target, arguments, keyword arguments in name order. Of
    the graph as graph.json holds it, for a graph the loader packed (artifact/prepack.py)."""

    graph = stored_graph(gm)
    # Nodes by position, not name: FX renames a placeholder that would shadow a builtin.
    index = {n: f"%{i}" for i, n in enumerate(graph.nodes)}
    lines = []
    for n in graph.nodes:
        target = target_name(n.target) if n.op == "call_function" else (n.op if n.op == "placeholder" else str(n.target))
        args = torch.fx.node.map_arg(n.args, lambda x: index[x])
        kwargs = torch.fx.node.map_arg(dict(sorted(n.kwargs.items())), lambda x: index[x])
        lines.append(f"{index[n]} {n.op} {target} {args!r} {kwargs!r}")
    return lines


def _first_difference(expected: list[str], actual: list[str]) -> str:
    for a, b in zip(expected, actual, strict=False):
        if a != b:
            return f"node {b!r}, captured {a!r}"
    return f"{len(actual)} nodes, captured {len(expected)}"


def trace_nodes(summaries: dict[str, Any]) -> dict[str, Union[Summary, TupleSummary]]:
    """trace.json's nodes from a run's per-node summaries (execution.run_with_summaries: a
    tuple of them for a node whose value is a tuple)."""
    return {name: TupleSummary.model_construct(items=list(s)) if isinstance(s, tuple) else s
            for name, s in summaries.items()}


def _is_view(node: torch.fx.Node) -> bool:
    """A view's value is its input's: its sample would add nothing to the trace."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
