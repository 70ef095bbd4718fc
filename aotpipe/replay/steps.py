"""Chained training steps: a train_step graph run again on what its last run gave.

A train_step graph takes parameters, buffers and optimizer state and gives their new
values (inputs.json's roles: an input param/buffer/state is fed by the output of role
param/mutation/state with the same target); the batch and constants stay as they are. A
scheduled step's learning rate (role lr) is fed the schedule's value for each step
(models.train_step.lr_schedule, from the optimizer the manifest records).
Each run is seeded as every graph run is, as each eager step of the checks is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from aotpipe.artifact.load import Artifact
from aotpipe.errors import ArtifactError
from aotpipe.format.records import InputsRecord
from aotpipe.models.train_step import lr_schedule
from aotpipe.replay.eager import artifact_optimizer
from aotpipe.replay.inputs import get_inputs
from aotpipe.replay.run import expand_outputs, recorded_threads, replay_environment
from aotpipe.runtime import accuracy
from aotpipe.runtime.determinism import intra_op_threads
from aotpipe.runtime.execution import run_graph

# What the checks chain at capture, and what `replay --steps` compares bit for bit; the
# manifest's verification entry that holds their outputs' digests.
CHECKED_STEPS = 3
STEPS_KEY = "steps"
# An input fed by the output of this role, same target.
_FED_BY = {"param": "param", "buffer": "mutation", "state": "state"}


def next_step_inputs(record: InputsRecord, inputs: list[Any], outputs: list[Any]) -> list[Any]:
    """The inputs of the step after one that took `inputs` and gave `outputs` (expanded:
    replay.run.expand_outputs): one value per input and per output record, or a ValueError."""
    new: dict[tuple[str, str | None], Any] = {(r.role, r.target): o for r, o in zip(record.outputs, outputs, strict=True)
                                              if r.role in _FED_BY.values()}
    return [new.get((_FED_BY[r.role], r.target), v) if r.role in _FED_BY else v
            for r, v in zip(record.inputs, inputs, strict=True)]


def fed_inputs(record: InputsRecord) -> int:
    """How many of the step's inputs its outputs feed (the rest are the batch and constants)."""
    outs = {(r.role, r.target) for r in record.outputs}
    return sum(r.role in _FED_BY and (_FED_BY[r.role], r.target) in outs for r in record.inputs)


def with_lr(record: InputsRecord, inputs: list[Any], rate: float) -> list[Any]:
    """`inputs` with each learning-rate input (role lr) set to `rate`, in its own dtype."""
    return [torch.tensor(rate, dtype=v.dtype) if r.role == "lr" and isinstance(v, torch.Tensor) else v
            for r, v in zip(record.inputs, inputs, strict=True)]


def takes_lr(record: InputsRecord) -> bool:
    """Whether the step takes its learning rate as an input (a scheduler's, per step)."""
    return any(r.role == "lr" for r in record.inputs)


def schedule_rates(art: Artifact, record: InputsRecord, steps: int) -> list[float] | None:
    """The learning rate of each of `steps` chained steps of `art`'s train_step from its
    captured state, where the step takes one (role lr): the schedule of the optimizer the
    manifest records, from the step after its warm-up. None where the step takes none, or for
    one step of an artefact that records no scheduler (its saved rate is the step's)."""
    if not takes_lr(record):
        return None
    spec = artifact_optimizer(art)
    if spec is None or spec.scheduler is None:
        if steps == 1:
            return None
        raise ArtifactError(f"{art.path}: the train_step takes its learning rate per step (role lr), and the "
                            "manifest records no scheduler to compute the next steps' from; run one step "
                            "(--steps 1), or capture it again with optimizer: {..., scheduler: ...}")
    rates = lr_schedule(spec, spec.warmup_steps + steps) or []
    return rates[spec.warmup_steps:]


def run_steps(module: torch.nn.Module, record: InputsRecord, inputs: list[Any], steps: int,
              each: Callable[[int, list[Any]], None] | None = None, rates: list[float] | None = None) -> list[Any]:
    """`steps` chained runs of the step graph from `inputs`; the last run's outputs
    (expanded). `each(i, outputs)` is told each step's outputs. `rates`: the learning rate
    of each step, fed to a step that takes one (None: the inputs' own, every step)."""
    if record.kind != "train_step":
        raise ArtifactError(f"chained steps run a train_step graph, not a {record.kind} graph")
    if steps < 1:
        raise ArtifactError(f"--steps takes 1 or more, not {steps}")
    if rates is not None and len(rates) < steps:
        raise ArtifactError(f"{steps} steps need {steps} learning rates, given {len(rates)}")
    outs: list[Any] = []
    for i in range(steps):
        if rates is not None:
            inputs = with_lr(record, inputs, rates[i])
        outs = expand_outputs(record, run_graph(module, inputs))
        if each is not None:
            each(i, outs)
        inputs = next_step_inputs(record, inputs, outs)
    return outs


@dataclass
class StepsReplay:
    """``aotpipe replay --steps N``: N chained steps of an artefact's train_step graph.

    `status`: "match" (the outputs after the last step equal, bit for bit, those the capture
    recorded after as many steps), "mismatch" (they differ where they must not), or "ran"
    (nothing to compare with: another step count than the capture chained, random inputs, or
    another machine, whose bits may differ; `why` says which)."""

    status: str
    steps: int
    losses: list[float] = field(default_factory=list)  # each step's loss
    compared: int = 0  # outputs compared with the recorded digests
    differing: list[str] = field(default_factory=list)  # those that differ: role and target
    why: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "mismatch" and all(math.isfinite(x) for x in self.losses)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def replay_steps(art: Artifact, steps: int, *, inputs: str = "saved", seed: int = 0,
                 threads: int | None = None) -> StepsReplay:
    """`steps` chained runs of `art`'s train_step graph from its saved (or random) inputs,
    at the recorded thread count unless `threads`; compared with the capture's recorded
    outputs after as many steps, where it chained as many (checks/train_step.py)."""
    key = next((k for k, g in art.graphs.items() if g.kind == "train_step"), None)
    if key is None:
        raise ArtifactError(f"{art.path}: --steps runs a train_step graph, and this artefact has none (it has "
                            f"{', '.join(art.graphs)}); capture one with graphs: [..., train_step] and optimizer:")
    ga = art.graphs[key]
    saved = inputs == "saved" and ga.has_saved_values
    values = ga.saved_inputs() if saved else list(get_inputs(ga.input_file, seed=seed))
    recorded = next((v for k, v in (art.manifest.verification or {}).items() if k == STEPS_KEY), None)
    losses: list[float] = []

    def each(_: int, outs: list[Any]) -> None:
        loss = outs[0]  # a train_step's first output is its loss (capture/train_step.py)
        losses.append(float(loss) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else math.nan)

    with intra_op_threads(threads if threads is not None else recorded_threads(art)):
        differs, _ = replay_environment(art, None)
        outs = run_steps(ga.module, ga.record, values, steps, each, rates=schedule_rates(art, ga.record, steps))
    if recorded is None or recorded.digests is None:
        return StepsReplay("ran", steps, losses, why="the capture recorded no chained steps")
    if recorded.compared != steps:
        return StepsReplay("ran", steps, losses, why=f"the capture chained {recorded.compared} steps, not {steps}")
    if not saved:
        return StepsReplay("ran", steps, losses, why="random inputs: nothing recorded to compare with")
    if len(recorded.digests) != len(outs):
        return StepsReplay("ran", steps, losses, why=f"the capture recorded {len(recorded.digests)} digests for "
                                                     f"{len(outs)} outputs: nothing to pair them with")
    labels = [f"{r.role} {r.target}" for r in ga.record.outputs]
    pairs = [(label, want, accuracy.digest(o) if isinstance(o, torch.Tensor) else None)
             for label, want, o in zip(labels, recorded.digests, outs, strict=True) if want is not None]
    differing = [label for label, want, got in pairs if want != got]
    if differing and differs:
        return StepsReplay("ran", steps, losses, len(pairs), differing,
                           why=f"bits may differ here ({'; '.join(differs)}): the capture's are for its own machine")
    return StepsReplay("mismatch" if differing else "match", steps, losses, len(pairs), differing)
