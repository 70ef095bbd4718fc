"""Static shards of a pipeline: which models shard i of n runs, decided without talking.

Every shard computes the same partition on its own machine, so the partition reads only
what every machine has alike: the pipeline's models (names, sources, inputs, configs) and,
when given, one timings file that all shards read (``--shard-times FILE``: a run.json,
typically the merged run.json of the last run, on a shared path or committed beside the
pipeline). It never reads a shard's own output folder: that differs from machine to machine
(one shard's earlier run timed some models, another's none), and two shards that disagree
on the partition would run some models twice and others never.

The balance: each model's cost is its time in the timings file where it has one (a model
that ran, not one kept as up to date), else :func:`estimate`, a stable guess from the spec
scaled to seconds by the models that have both. Models are dealt longest first to the
shard with the least cost so far (ties: the lower shard index; equal costs: pipeline
order), the classic longest-processing-time rule, which is within 4/3 of the best balance.

No torch here, no runner: a leaf the runner, the CLI and merge all read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from aotpipe.errors import AotpipeError
from aotpipe.format.records import load_run

if TYPE_CHECKING:
    from aotpipe.format.records import RunRecord
    from aotpipe.spec import ModelSpec


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`I/N` with 1 <= I <= N -> Shard; anything else is a user error saying what would do."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise AotpipeError(f"--shard {text!r}: expected I/N, e.g. --shard 1/4 (shard 1 of 4)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise AotpipeError(f"--shard {text!r}: the shard index must be between 1 and the shard count "
                           f"(got {i} of {n}); e.g. --shard 1/{max(n, 1)}")
    return Shard(i, n)


def read_run_json(path: Path) -> "RunRecord":
    """A run.json as its record (records.load_run: raises ArtifactError or OSError)."""
    return load_run(path)


def previous_times(path: Path) -> dict[str, float]:
    """Each model's total_seconds in the run.json at `path`, for models that ran (not kept as up
    to date, with a time); empty when the file is missing or malformed."""
    try:
        last = read_run_json(path)
    except (OSError, AotpipeError):
        return {}
    return {m.name: m.total_seconds for m in last.models if m.has_measurement() and m.total_seconds}


_DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "layers", "depth", "encoder_layers", "decoder_layers")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "hidden", "channels", "embed_dim")


def estimate(spec: "ModelSpec") -> float:
    """A stable guess of a model's capture cost (no unit) from its spec alone: the example
    inputs' elements, times its depth and width where its args or config name them, times the
    graphs it asks for. Only the order matters; it is the same on every machine."""
    elements = sum(math.prod(i.shape) if i.shape else 1 for i in spec.inputs)
    fields = {**(spec.config or {}), **spec.args}

    def first(keys: tuple[str, ...], default: float) -> float:
        for k in keys:
            v = fields.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return float(v)
        return default

    depth = sum(first((k,), 0) for k in ("encoder_layers", "decoder_layers")) or first(_DEPTH_KEYS, 2)
    width = first(_WIDTH_KEYS, 64)
    graphs = max(1, len(spec.graphs))
    return graphs * depth * math.sqrt(width) * math.log2(2 + elements)


def costs(specs: list["ModelSpec"], times: dict[str, float]) -> list[float]:
    """Each spec's cost in seconds: its time in `times`, else its estimate scaled by the median
    ratio of time to estimate over the specs that have both (1 s per unit when none has)."""
    guesses = [estimate(s) for s in specs]
    ratios = sorted(times[s.name] / g for s, g in zip(specs, guesses) if s.name in times and g > 0)
    scale = ratios[len(ratios) // 2] if ratios else 1.0
    return [times[s.name] if s.name in times else g * scale for s, g in zip(specs, guesses)]


def partition(names: list[str], cost: list[float], count: int) -> list[list[int]]:
    """Indices of `names` per shard (count lists, each in pipeline order): longest first to the
    least-loaded shard. Deterministic: a function of the arguments only."""
    load = [0.0] * count
    shards: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(names)), key=lambda i: (-cost[i], i)):
        s = min(range(count), key=lambda s: (load[s], s))
        shards[s].append(i)
        load[s] += cost[i]
    return [sorted(s) for s in shards]


def shard_models(specs: list["ModelSpec"], shard: Shard, times_file: Optional[Path] = None) -> list["ModelSpec"]:
    """The specs shard `shard` runs (pipeline order). A `times_file` that cannot be read is a
    user error: silently balancing without it would still be deterministic, but not what was asked."""
    times: dict[str, float] = {}
    if times_file is not None:
        try:
            read_run_json(Path(times_file))
        except (OSError, AotpipeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
            raise AotpipeError(f"--shard-times {times_file}: cannot read it as a run.json ({why}); give the "
                               "run.json of an earlier run, or leave the option out") from None
        times = previous_times(Path(times_file))
    parts = partition([s.name for s in specs], costs(specs, times), shard.count)
    return [specs[i] for i in parts[shard.index - 1]]
