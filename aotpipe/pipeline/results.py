"""What a run produced: per model and per pipeline, and summaries of a written manifest.

A leaf module: no torch, no runner. The job (aotpipe/pipeline/job.py), the up-to-date check
(aotpipe/pipeline/incremental.py), the executors, the runner and the reports all speak these types,
and data flows one way: runner -> executors -> job -> results.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ConfigDict, Field

from aotpipe.format import records
from aotpipe.format.graph_keys import key_order, parse_graph_key
from aotpipe.format.records import (
    CheckSummary,
    DimsRecord,
    DroppedModel,
    EagerCell,
    GraphChecks,
    GraphSummary,
    Manifest,
    MergeRecord,
    ModelRun,
    RecycledWorker,
    RunStamp,
    ShardRecord,
    VerificationSummary,
)
from aotpipe.format.vocabulary import ModelStatus

# One graph a model's run wrote: run.json's record (kept by this name for its callers).
GraphResult = GraphSummary


class ModelResult(ModelRun):
    """What happened to one model; `status` is ok, partial (written and checked, part of the
    model outside its graphs) or failed. run.json's record of it
    (records.ModelRun), plus the traceback of a failure, kept for -v and never written."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    traceback: str | None = Field(default=None, exclude=True)
    sizes: str | None = Field(default=None, exclude=True)  # a shape-polymorphic capture's dims, briefly (sizes_text)

    def to_record(self) -> ModelRun:
        """run.json's record of this model (without the traceback)."""
        return ModelRun.model_validate(self.model_dump())


def new_stamp() -> RunStamp:
    """A stamp for a run starting now: an id no other run shares (the time and a random
    suffix), and the time, UTC."""
    now = datetime.now(timezone.utc)
    return RunStamp(id=f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}", started=f"{now:%Y-%m-%dT%H:%M:%SZ}")


@dataclass
class RunResult:
    """A run: `models` are those this command selected (run, or kept as up to date), and
    decide its exit code; run.json lists `listed` (those, and the entries of the run.json
    before that this run left as they were), or `models` alone where it is None."""

    pipeline: str
    output: Path
    models: list[ModelResult]
    seconds: float
    cleaned: list[str] = field(default_factory=list)
    executor: str = "local"
    workers: int = 1
    shard: ShardRecord | None = None  # with --shard
    recycled: list[RecycledWorker] = field(default_factory=list)  # workers the process executor replaced
    merge: MergeRecord | None = None  # written by `aotpipe merge`
    allow_partial: bool = False  # `run --allow-partial`: a partial model does not make the run fail
    stamp: RunStamp = field(default_factory=new_stamp)  # this run (run.json's "run")
    listed: list[ModelRun] | None = None  # every entry run.json lists, in pipeline order
    dropped: list[DroppedModel] = field(default_factory=list)  # entries of the run.json before, not listed now
    previous: str | None = None  # why the run.json before could not be read (nothing was kept from it)

    def _ok(self, models: list[ModelRun] | list[ModelResult]) -> bool:
        gaps = self.merge is not None and bool(self.merge.missing or self.merge.duplicated)
        good = (ModelStatus.OK, ModelStatus.PARTIAL) if self.allow_partial else (ModelStatus.OK,)
        return all(m.status in good for m in models) and not gaps

    @property
    def ok(self) -> bool:
        """Every model this command selected ok (or partial, where allowed), and, merged, none
        missing or run twice: the exit code."""
        return self._ok(self.models)

    def entries(self) -> list[ModelRun]:
        """run.json's entries: this run's models, and those kept from the run.json before."""
        return list(self.listed) if self.listed is not None else [m.to_record() for m in self.models]

    @property
    def tree_ok(self) -> bool:
        """run.json's "ok": every entry it lists ok (those kept from earlier runs too)."""
        return self._ok(self.entries())


def eager_cell(checks: GraphChecks | None) -> EagerCell | None:
    """A graph's checks in brief: counts, the worst error as a multiple of eager's own."""
    if checks is None:
        return None
    ratios = [c.ratio for c in checks.items if c.ratio is not None]
    return EagerCell(run=checks.run, passed=checks.passed, failed=checks.failed, skipped=checks.skipped,
                     indirect=checks.indirect, worst_ratio=max(ratios) if ratios else None,
                     exact=checks.exact, floor=checks.floor, fp64=checks.fp64, within_noise=checks.within_noise,
                     skipped_reasons=list(checks.skipped_reasons))


def eager_cells(manifest: Manifest) -> dict[str, EagerCell]:
    """Every checked graph's checks in brief, by key."""
    return {k: cell for k, g in manifest.graphs.items() if (cell := eager_cell(g.checks)) is not None}


def sizes_text(dims: DimsRecord) -> str:
    """A shape-polymorphic capture's dimensions and size checks in brief: "batch 1..16, seq 8..64
    dynamic; checked at min, max, random: 93/93"."""
    dynamic = [f"{k} {d.min}..{d.max if d.max is not None else 'inf'}" for k, d in dims.dims.items()
               if d.status == "dynamic"]
    fixed = [f"{k} {d.reason}" for k, d in dims.dims.items() if d.status != "dynamic"]
    text = ", ".join(dynamic) + (" dynamic" if dynamic else "")
    text += ("; " if text and fixed else "") + "; ".join(fixed)
    if dims.checked:
        run = sum(c.checks.run for c in dims.checked if c.checks is not None)
        passed = sum(c.checks.passed for c in dims.checked if c.checks is not None)
        problems = sum(len(c.problems) for c in dims.checked)
        text += (f"; checked at {', '.join(c.point for c in dims.checked)}: {passed}/{run}"
                 + (f", {problems} PROBLEM(S)" if problems else ""))
    return text


def checks_summary(manifest: Manifest) -> CheckSummary | None:
    """The model's checks in brief: counts, and the reasons for every skipped one (None: the
    manifest records no checks)."""
    if manifest.checks is None:
        return None
    return CheckSummary(**dict(manifest.checks), skipped_reasons=[
        f"{key}: {r}" for key, g in manifest.graphs.items() for r in (g.checks.skipped_reasons if g.checks is not None else [])])


# Verification statuses that are not problems: recorded by the run after writing (v2),
# replayed bit for bit or ran without saved values (v1), shapes only (save_inputs: false).
VERIFIED = ("recorded", "shapes only", "match", "ran")


def written_manifest(path: Path) -> Manifest:
    """The manifest of a model folder, read within the limits and validated (an ArtifactError
    if it is not one)."""
    return records.read(Manifest, path / records.MANIFEST, path)[1]


def verification_summary(manifest: Manifest) -> VerificationSummary:
    problems = []
    statuses = {}
    for kind, r in (manifest.verification or {}).items():
        statuses[kind] = r.status
        if r.status not in VERIFIED:
            detail = r.error or "; ".join(str(x) for x in (r.mismatches or r.problems or []))
            if r.first_divergence:
                detail += f" (first divergence: {r.first_divergence})"
            problems.append(f"{kind} replay {r.status}: {detail}")
    return VerificationSummary(ok=not problems, graphs=statuses, problems=problems)


def failed_last_time(manifest: Manifest) -> bool:
    """Whether the run that wrote an artefact found a problem: a graph that did not run as
    recorded, a failed check, a failed pass chain, or a size check of a shape-polymorphic
    capture (such a model is redone, and ls says FAILED)."""
    return bool(verification_summary(manifest).problems or (manifest.checks is not None and manifest.checks.failed)
                or manifest.pass_failures or dims_problems(manifest))


def dims_problems(manifest: Manifest) -> list[str]:
    """What failed the size checks of a `dims:` capture (pipeline/job._check_sizes): a point
    where a graph did not run or differed, or a named dimension no graph kept symbolic."""
    dims = manifest.dims
    if dims is None:
        return []
    return [f"at {c.point} ({', '.join(f'{k}={v}' for k, v in c.sizes.items())}): {p}"
            for c in dims.checked for p in c.problems[:1]] + static_named_dims(dims)


def static_named_dims(dims: DimsRecord) -> list[str]:
    """A named dimension is a promise: one no graph keeps symbolic fails the model, once the
    sizes were checked. dims: auto records what specialised instead, and a capture at the example
    sizes (auto's fallback to dynamo: `budget_bytes` None, no size checked) says why in each reason."""
    if dims.auto_dims or dims.budget_bytes is None:
        return []
    return [f"dims: {name} is static in every graph" + (f" ({d.reason})" if d.reason else "")
            for name, d in dims.dims.items() if d.status != "dynamic"]


def why_failed(manifest: Manifest) -> str | None:
    """One line saying why the run that wrote an artefact failed it (see failed_last_time), or None."""
    problems = sorted(verification_summary(manifest).problems, key=lambda p: key_order(p.split(" ", 1)[0]))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0][:300] + more
    if manifest.checks is not None and manifest.checks.failed:
        return f"{manifest.checks.failed} check(s) failed"
    if manifest.pass_failures:
        return f"pass chain failed: {str(manifest.pass_failures[0])[:300]}"
    sized = dims_problems(manifest)
    if sized:
        return sized[0][:300] + (f" (and {len(sized) - 1} more)" if len(sized) > 1 else "")
    return None


def outside_graphs_lines(manifest: Manifest) -> list[str]:
    """What a partial capture ran outside its graphs, one line per compile (inference,
    training): the graph break that ended the graphs (dynamo's reason, file:line, the code)
    and the ops and values no graph holds. Empty: the graphs hold the whole model (or the
    artefact was written before aotpipe told)."""
    c = manifest.capture
    lines = []
    for o in c.outside_graphs or []:
        breaks = c.graph_breaks or []
        where = ""
        if breaks:
            b = breaks[0]
            where = f" after graph break {b.reason!r}" + (f" at {b.where}" if b.where else "") + (
                f" (`{b.code}`)" if b.code else "") + (f" and {len(breaks) - 1} more" if len(breaks) > 1 else "")
        lines.append(f"{o.compile}{where}: outside the graphs ran {o.text()}")
    return lines


def is_partial(manifest: Manifest) -> bool:
    """Whether the artefact's graphs leave part of the model out (capture.outside_graphs)."""
    return bool(manifest.capture.outside_graphs)


def graph_results(manifest: Manifest) -> list[GraphResult]:
    """The manifest's graphs in the order a run writes them: captured ones (by subgraph, then
    kind), then those made by passes."""
    graphs = manifest.graphs

    def order(key: str) -> tuple:
        parsed = parse_graph_key(key)
        return (parsed is None or parsed.chain is not None, key_order(key))

    return [GraphSummary(kind=k, folder=graphs[k].folder, nodes=graphs[k].nodes, inputs=graphs[k].inputs,
                         outputs=graphs[k].outputs) for k in sorted(graphs, key=order)]
