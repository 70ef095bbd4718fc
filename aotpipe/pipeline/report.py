"""run.json (for machines) and report.md (for people) of one pipeline run.

run.json is a :class:`~aotpipe.format.records.RunRecord`; read one with
:func:`~aotpipe.format.records.load_run` (re-exported here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from aotpipe.artifact.fsio import OutputError, describe_os_error, write_atomic
from aotpipe.artifact.manifest import dump_json, versions
from aotpipe.format.records import (
    RUN_FORMAT_VERSION,
    RUN_JSON,
    CheckTotals,
    ExecutorRecord,
    ModelRun,
    RunRecord,
    RunSummary,
    SettledTotals,
    load_run,
)
from aotpipe.format.vocabulary import ModelStatus

if TYPE_CHECKING:
    from aotpipe.pipeline.results import RunResult
    from aotpipe.spec import Pipeline

REPORT_MD = "report.md"


def run_record(run: "RunResult", pipeline: "Pipeline") -> RunRecord:
    """run.json's record of a run: every entry it lists (those kept from earlier runs too)."""
    models = run.entries()
    record = RunRecord(
        format_version=RUN_FORMAT_VERSION,
        pipeline=pipeline.name,
        versions=versions(),
        seconds=round(run.seconds, 3),
        executor=ExecutorRecord(kind=run.executor, workers=run.workers,
                                **({"recycled": list(run.recycled)} if run.recycled else {})),
        # A shard's and a merged run's records: absent (not null) from a plain run's run.json.
        **({"shard": run.shard} if run.shard is not None else {}),
        **({"merge": run.merge} if run.merge is not None else {}),
        ok=run.tree_ok,
        **({"allow_partial": True} if run.allow_partial else {}),
        run=run.stamp,
        **({"dropped": list(run.dropped)} if run.dropped else {}),
        summary=RunSummary(
            models=len(models),
            ok=sum(m.status == ModelStatus.OK for m in models),
            up_to_date=sum(m.skipped for m in models),
            failed=sum(m.status == ModelStatus.FAILED for m in models),
            partial=sum(m.status == ModelStatus.PARTIAL for m in models),
            graphs=sum(len(m.graphs) for m in models),
            bytes=sum(m.bytes for m in models),
            checks=settled_totals(models),  # how the checks were settled, over every model
        ),
        models=models,
    )
    record.summary.kept = sum(record.kept(m) for m in models)
    return record


def human_size(n: float) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _replay_cell(m: ModelRun) -> str:
    if m.verification is None:
        return "-"
    graphs = m.verification.graphs
    if all(s in ("match", "recorded") for s in graphs.values()):
        # "chain" (export) and "chain_<i>" (a dynamo subgraph's) are forward-backward checks, not graphs
        chains = sum(1 for k in graphs if k == "chain" or k.startswith("chain_"))
        if not chains:
            return f"all {len(graphs)} recorded"
        return f"{len(graphs) - chains} graphs recorded, {'chain' if chains == 1 else f'{chains} chains'} match"
    return ", ".join(f"{k} {s}" for k, s in graphs.items() if s not in ("match", "recorded")) or "ran"


SETTLED = (("exact", "exact"), ("floor", "floor"), ("fp64", "fp64"))


def settled_text(c: Optional[CheckTotals | SettledTotals]) -> str:
    """How a model's (or a run's) checks were settled, briefly: "5 exact, 60 floor, 5 fp64";
    empty for checks recorded before the counts were (format version 2)."""
    if c is None or c.fp64 is None:
        return ""
    text = f"{c.exact or 0} exact, {c.floor or 0} floor, {c.fp64 or 0} fp64"
    return text + (f" ({c.within_noise} within eager's noise)" if c.within_noise else "")


def settled_totals(models: list[ModelRun]) -> Optional[SettledTotals]:
    """The settled counts (records.CheckTotals) summed over `models`' checks; None where no
    model's checks recorded them."""
    with_counts = [m.checks for m in models if m.checks is not None and m.checks.fp64 is not None]
    if not with_counts:
        return None
    return SettledTotals(**{k: sum(getattr(c, k) or 0 for c in with_counts) for k in SettledTotals.model_fields})


def _checks_cell(m: ModelRun) -> str:
    c = m.checks
    if c is None:
        return "-"
    text = f"{c.passed}/{c.run} passed"
    if settled_text(c):
        text += f" ({settled_text(c)})"
    if c.failed:
        text += f", **{c.failed} failed**"
    if c.skipped:
        text += f", **{c.skipped} skipped**"
    if c.indirect:
        text += f" (+{c.indirect} through other graphs)"
    return text


def _worst_ratio(m: ModelRun) -> str:
    ratios = [e.worst_ratio for e in m.eager.values() if e.worst_ratio is not None]
    return f"{max(ratios):.2g}" if ratios else "-"


def status_text(m: ModelRun, kept: bool = False) -> str:
    """ok, partial, up to date, or failed, with ", kept" where the entry is from an earlier run
    (`kept`) not found up to date by the run that wrote it (--only left it as it was); says so
    when some checks were skipped."""
    also = ", kept" if kept and not m.skipped else ""
    if m.status == ModelStatus.FAILED:
        return f"**{m.status}** ({m.stage}){also}"
    text = "up to date" if m.skipped else f"ok{also}"
    if m.status == ModelStatus.PARTIAL:
        text = "**partial**" + (" (up to date)" if m.skipped else also)
    skipped = m.checks.skipped if m.checks is not None else 0
    return f"{text}, {skipped} checks skipped" if skipped else text


def seconds_cell(m: ModelRun, seconds: float) -> str:
    """A time of `m`, or "-" where the entry holds no measurement (an artefact kept as up to
    date that no finished run had timed, in any run.json version)."""
    return f"{seconds:.2f}" if m.has_measurement() else "-"


def kept_lines(rec: RunRecord) -> list[str]:
    """One line per earlier run whose entries `rec` kept, naming them, and one for entries
    kept with no measurement."""
    runs: dict[str, tuple[str, list[str]]] = {}
    untimed = []
    for m in rec.models:
        if not rec.kept(m):
            continue
        if m.measured_in is None:
            untimed.append(m.name)
        else:
            runs.setdefault(m.measured_in.id, (m.measured_in.started, []))[1].append(m.name)
    lines = [f"- run {rid} (started {started}): {', '.join(names)}" for rid, (started, names) in
             sorted(runs.items(), key=lambda kv: kv[1][0])]
    if untimed:
        lines.append(f"- no measurement (kept as up to date; the run that wrote the artefact did not finish, or "
                     f"timed another artefact): {', '.join(untimed)}; `--force` measures them again")
    return lines


def report_markdown(run: "RunResult", pipeline: "Pipeline") -> str:
    rec = run_record(run, pipeline)
    s = rec.summary
    v = rec.versions
    lines = [
        f"# aotpipe run: {pipeline.name}",
        "",
        f"{s.ok} of {s.models} models ok" + (f", {s.partial} partial" if s.partial else "") + f", {s.graphs} graphs, {human_size(s.bytes)} on disk, "
        f"{run.seconds:.1f} s (torch {v.torch}, python {v.python}, aotpipe {v.aotpipe})"
        + (f"; {s.kept} kept from earlier runs (below)." if s.kept else "."),
        "",
        "| model | status | graphs (nodes) | replay | checks vs eager | worst error / eager's | capture s "
        "| passes s | checks s | write s | size |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rec.models:
        graphs = ", ".join(f"{g.kind} ({g.nodes})" for g in m.graphs) or "-"
        times = " | ".join(seconds_cell(m, t) for t in (m.capture_seconds, m.passes_seconds, m.checks_seconds,
                                                         m.write_seconds))
        lines.append(
            f"| {m.name} | {status_text(m, rec.kept(m))} | {graphs} | {_replay_cell(m)} | {_checks_cell(m)} "
            f"| {_worst_ratio(m)} | {times} | {human_size(m.bytes)} |"
        )
    kept = kept_lines(rec)
    if kept:
        lines += ["", "## Kept from earlier runs", "",
                  "Not redone by this run (up to date, or not selected by `--only`): their entries, times "
                  "included, are those of the run that measured them.", ""] + kept
    if rec.dropped or run.previous:
        lines += ["", "## No longer listed", ""] + [f"- {d.name}: {d.reason}" for d in rec.dropped or []] + (
            [f"- {run.previous}"] if run.previous else [])
    failed = [m for m in rec.models if m.status == ModelStatus.FAILED]
    if failed:
        lines += ["", "## Failures", ""]
        for m in failed:
            lines.append(f"- **{m.name}** ({m.stage}): {m.error}")
    partial = [m for m in rec.models if m.status == ModelStatus.PARTIAL]
    if partial:
        lines += ["", "## Partial captures", "",
                  "Part of these models ran outside their graphs (dynamo's graph breaks): the graphs are written and "
                  "checked one by one, but together they do not compute the model"
                  + (" (`run --allow-partial`: they do not fail the run)." if run.allow_partial
                     else "; the run exits 1 (`run --allow-partial` accepts them)."), ""]
        for m in partial:
            for line in m.outside_graphs or ["(what ran outside is not recorded)"]:
                lines.append(f"- **{m.name}**: {line}")
    skipped = [(m.name, r) for m in rec.models for r in (m.checks.skipped_reasons if m.checks is not None else [])]
    if skipped:
        lines += ["", "## Skipped checks", ""] + [f"- {name}: {r}" for name, r in skipped]
    lines += ["", "Replay: each graph is run once from its written files (deterministic kernels, seeded "
              "generator); its outputs' digests are the reference later replays must match bit for bit. The "
              "chain: forward then backward must equal the joint graph bit for bit. Checks vs eager: every "
              "output (user outputs, loss, gradients, mutated buffers) against the eager model, torch's "
              "accuracy-runner rule: RMS error against eager in float64 at most 2x eager float32's own "
              "(more for tiny tensors), plus a floor of 1e-5 of the tensor's RMS; \"worst error / eager's\" "
              "is the largest such ratio where the float64 reference was needed."]
    totals = s.checks
    if totals is not None:
        lines += ["", f"Checks settled: {totals.run} run: {totals.exact} exactly (integers, shapes, None), "
                  f"{totals.floor} within the float-noise floor of eager float32, {totals.fp64} by the float64 "
                  f"rule ({totals.within_noise} of them values zero in exact arithmetic, held to eager's own "
                  f"noise); {totals.skipped} skipped" + (" (reasons above)." if totals.skipped else ".")]
    with_passes = [m for m in rec.models if m.passes]
    if with_passes:
        lines += ["", "## Passes", "",
                  "The chain's result is checked against the eager model like every graph; only when it fails "
                  "is each pass run and compared with the graph before it, to name the pass at fault.", "",
                  "| model | graph | pass | nodes before | nodes after | max abs error | what it did | s |",
                  "|---|---|---|---:|---:|---:|---|---:|"]
        for m in with_passes:
            for key, chain in m.passes.items():
                for step in chain.steps:
                    did = ", ".join(f"{k} {v}" for k, v in step.stats.items() if v) or "nothing"
                    lines.append(f"| {m.name} | {key.split('.')[0]} | {step.name} | {step.nodes_before} "
                                 f"| {step.nodes_after} | {'-' if step.max_abs_error is None else format(step.max_abs_error, '.2g')} "
                                 f"| {did} | {step.seconds:.3f} |")
    if run.cleaned:
        lines += ["", "## Cleaned up", ""] + [f"- {c}" for c in run.cleaned]
    if run.shard is not None:
        lines += ["", "## Shard", "", f"Shard {run.shard.index} of {run.shard.count}: {len(run.models)} of the "
                  f"{len(run.shard.selection)} models; `aotpipe merge` combines the shards."]
    if run.merge is not None:
        lines += ["", "## Merged shards", ""] + [
            f"- {s.shard or 'unsharded run'}: {s.models} model(s) from {s.folder}" for s in run.merge.shards]
        if run.merge.missing:
            lines.append(f"- **missing** (in no shard): {', '.join(run.merge.missing)}")
        for d in run.merge.duplicated:
            lines.append(f"- **duplicated** {d.name}: in {', '.join(d.folders)} (the first kept)")
    if run.recycled:
        lines += ["", "## Recycled workers", ""] + [
            f"- worker {r.pid} replaced after {r.after} ({r.models} model(s)): {r.reason}"
            for r in run.recycled]
    noted = [m for m in rec.models if m.notes]
    if noted:
        lines += ["", "## Notes", ""]
        for m in noted:
            for n in m.notes:
                lines.append(f"- {m.name}: {n}")
    return "\n".join(lines) + "\n"


def dump_run(record: RunRecord) -> str:
    """run.json's text: the fields set (a shard's or a merged run's records only where they
    apply), in dump_json's deterministic form."""
    return dump_json(record.model_dump(mode="json", exclude_unset=True)).decode("utf-8")


def write_reports(run: "RunResult", pipeline: "Pipeline") -> None:
    """Write run.json and report.md, each replaced atomically."""
    for name, data in ((RUN_JSON, dump_run(run_record(run, pipeline)).encode("utf-8")),
                       (REPORT_MD, report_markdown(run, pipeline).encode("utf-8"))):
        try:
            write_atomic(run.output / name, data)
        except OSError as e:
            raise OutputError(describe_os_error(e, run.output / name)) from None


__all__ = ["RUN_JSON", "REPORT_MD", "dump_run", "kept_lines", "load_run", "run_record", "report_markdown", "write_reports",
           "seconds_cell", "settled_text", "status_text"]
