"""The checks of a train_step graph: one step, and three chained, against eager steps.

Eager is the model stepped by its torch optimizer from the same warm start
(models.train_step.StepReference), each value compared under the float64 rule of
:mod:`aotpipe.runtime.accuracy` (the float64 reference runs the same optimizer on the model,
its inputs and its state in float64):

- the first step: the loss, every parameter's update (its new value less its value at the
  start: a fault in the update would hide in the new value's noise floor), every buffer the step changes,
  every optimizer state entry, and every gradient (before clipping); each gradient also
  against the backward graph's gradient of the same parameter, where the artefact has one
  (the step's gradients are the joint's: they must agree with the backward's as eager's do);
- three chained steps (the graph fed its own outputs: replay.steps): the loss of the last
  step, the parameters, buffers and state after it.

A failed check names the value ("new value of fc.weight", "state fc.weight:exp_avg_sq
after 3 steps"). The three-step outputs' digests go into the manifest's verification
("steps"), which ``aotpipe replay --steps 3`` compares bit for bit.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from typing import Any

import torch

from aotpipe.artifact.load import GraphArtifact, build_inputs
from aotpipe.checks.checked import CheckedGraph
from aotpipe.format.records import InputsRecord, VerificationEntry
from aotpipe.models.train_step import LoweredOps, StepReference, StepRun, StepStart, split_state_target
from aotpipe.replay.run import expand_outputs
from aotpipe.replay.steps import CHECKED_STEPS, run_steps
from aotpipe.runtime import accuracy
from aotpipe.runtime.execution import run_graph


def _pick(run: StepRun, role: str, target: str | None, start: StepStart | None = None) -> Any:
    """The eager value an output of `role` and `target` is compared with: a parameter's
    update (new value less the start's) where `start` is given."""
    t = str(target)
    if role == "user":
        return run.losses[-1]
    if role == "param":
        new = run.params.get(t)
        return new - start.params[t].to(new.dtype) if start is not None and new is not None else new
    if role == "mutation":
        return run.buffers.get(t)
    if role == "state":
        param, key = split_state_target(t)
        return run.state.get(param, {}).get(key)
    if role == "grad":
        return run.grads.get(t)
    return None


def _what(role: str, target: str | None, after: str) -> str:
    noun = {"user": "loss", "param": f"update of {target}", "mutation": f"new value of buffer {target}",
            "state": f"state {target}", "grad": f"gradient of {target}"}.get(role, f"output {target}")
    return noun + after


class _Compare:
    def __init__(self, gc: CheckedGraph, reference: StepReference, inputs: list[Any], record: Any):
        self.gc, self.reference = gc, reference
        # a parameter's value at the start: its update (new less this) is what is compared, since
        # one step moves a parameter by a small fraction of itself (lr), and a fault in the update
        # (a weight decay left out) would hide in the noise floor of the new value
        self.start = {str(r.target): v for r, v in zip(record.inputs, inputs, strict=False) if r.role == "param"}

    def values(self, outs: list[Any], record: Any, steps: int, eager: StepRun) -> None:
        after = "" if steps == 1 else f" after {steps} steps"
        for i, (o, r) in enumerate(zip(outs, record.outputs, strict=False)):
            if steps > 1 and r.role == "grad":
                continue  # the first step's are checked; chained, they are that step's business
            if r.role == "param" and isinstance(o, torch.Tensor) and str(r.target) in self.start:
                o = o - self.start[str(r.target)]
            expected = _pick(eager, r.role, r.target, self.reference.start)
            ref = self._ref(steps, r.role, r.target)
            self.one(o, expected, ref, _what(r.role, r.target, after), i if steps == 1 and r.role != "param" else -1,
                     steps, r.role, r.target)

    def _ref(self, steps: int, role: str, target: str | None, nudged: int = 0) -> Callable[[], Any]:
        def get() -> Any:
            run = self.reference.run(steps, fp64=not nudged, nudged=nudged)
            return _pick(run, role, target, self.reference.start) if run is not None else None
        return get

    def one(self, actual: Any, expected: Any, ref: Callable[[], Any], what: str, index: int,
            steps: int = 1, role: str = "", target: str | None = None) -> None:
        if expected is None and actual is not None:
            self.gc.checks.append(accuracy.Check(what, False, "none", detail="eager has no such value"))
            return
        samples = [self._ref(steps, role, target, k) for k in range(1, accuracy.NOISE_SAMPLES)] if role else []
        # mixed precision: its own rule, the multiplier of the dtype the forward computes in
        amp = self.reference.spec.autocast
        c = accuracy.compare(actual, expected, ref, what=what, samples=samples,
                             computed_in=getattr(torch, amp) if amp is not None else None)
        if c.eager_error is not None and index >= 0:
            self.gc.eager_errors[index] = c.eager_error
        self.gc.checks.append(c)


def backward_at_step(forward: GraphArtifact | None, backward: GraphArtifact | None, record: InputsRecord,
                     inputs: list[Any]) -> dict[str, torch.Tensor]:
    """The gradients the forward and backward graphs give at a step's inputs (its parameters,
    buffers and batch), by parameter; none where the artefact lacks either graph."""
    if forward is None or backward is None:
        return {}
    by = {(r.role, r.target): v for r, v in zip(record.inputs, inputs, strict=False)}
    wanted = [(r.role, r.target) for r in forward.record.inputs]
    if any(w not in by for w in wanted):
        return {}
    fw_out = expand_outputs(forward.record, run_graph(forward.module, [by[w] for w in wanted]))
    bw_in = build_inputs(backward.record.inputs, [None] * len(backward.record.storages), fw_out)
    bw_out = expand_outputs(backward.record, run_graph(backward.module, bw_in))
    return {str(r.target): o for r, o in zip(backward.record.outputs, bw_out, strict=False)
            if r.role == "grad" and isinstance(o, torch.Tensor)}


def _computes_in(graph: collections.Counter[str], reference: StepReference) -> accuracy.Check:
    """Mixed precision's structural check: the step computes in the autocast dtype where eager's
    forward under autocast does (`graph`: the step's ops that did, as its chained steps ran).
    The value checks cannot tell: a step that lost its casts is float32 throughout, nearer the
    float64 reference than eager's, and would pass them."""
    amp = str(reference.spec.autocast)
    eager = reference.lowered()

    def said(seen: collections.Counter[str]) -> str:
        return f"{sum(seen.values())} ({', '.join(sorted(seen)[:6])})" if seen else "none"

    ok = bool(graph) == bool(eager)
    return accuracy.Check(f"computes in {amp} (autocast)", ok, "exact", detail=None if ok else
                          f"ops computed in {amp}: the graph's {said(graph)}, eager's forward under autocast "
                          f"{said(eager)}")


def check_train_step(ga: GraphArtifact, inputs: list[Any], outs: list[Any], reference: StepReference | None,
                     training: tuple[GraphArtifact | None, GraphArtifact | None],
                     verify: bool, rates: list[float] | None = None) -> tuple[CheckedGraph, VerificationEntry]:
    """The checks of train_step graph `ga`, which gave `outs` on `inputs`; and the manifest's
    verification entry of its chained steps (their outputs' digests). `training`: the
    artefact's forward and backward graphs (None where it has none). `rates`: each chained
    step's learning rate, for a step that takes one (replay.steps.schedule_rates)."""
    gc = CheckedGraph()
    record = ga.record
    amp = reference.spec.autocast if reference is not None else None
    with LoweredOps(getattr(torch, amp)) if amp is not None else contextlib.nullcontext() as lowered:
        chained = run_steps(ga.module, record, inputs, CHECKED_STEPS, rates=rates)
    digests = [accuracy.digest(o) if isinstance(o, torch.Tensor) else None for o in chained]
    entry = VerificationEntry(status="recorded", compared=CHECKED_STEPS, digests=digests)
    if not verify:
        gc.skipped += ["verify: false"] * len(record.outputs)
        return gc, entry
    if reference is None:
        gc.skipped += ["no eager model"] * len(record.outputs)
        return gc, entry
    compare = _Compare(gc, reference, inputs, record)
    one = reference.run(1)
    if one is None:
        gc.skipped += [f"the eager step failed: {reference.errors.get((1, False))}"] * len(record.outputs)
        return gc, entry
    compare.values(outs, record, 1, one)
    # Under autocast the step's gradients are mixed precision's, the backward graph's float32's:
    # no comparison of the two (the capture's note says so); each is held to its own eager above.
    mixed = amp is not None
    backward_grads = backward_at_step(*training, record, inputs) if not mixed else {}
    for o, r in zip(outs, record.outputs, strict=False):
        if r.role == "grad" and str(r.target) in backward_grads:
            compare.one(o, backward_grads[str(r.target)], compare._ref(1, "grad", r.target),
                        f"gradient of {r.target} against the backward graph's", -1)
    if lowered is not None:
        gc.checks.append(_computes_in(lowered.seen, reference))
    three = reference.run(CHECKED_STEPS)
    if three is None:
        gc.skipped.append(f"{CHECKED_STEPS} eager steps failed: {reference.errors.get((CHECKED_STEPS, False))}")
    else:
        compare.values(chained, record, CHECKED_STEPS, three)
    return gc, entry
