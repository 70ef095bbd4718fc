"""run.json (for machines) and report.md (for people) of one pipeline run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotpipe.artifact.manifest import dump_json, versions

if TYPE_CHECKING:
    from aotpipe.spec import Pipeline
    from aotpipe.results import RunResult

RUN_JSON = "run.json"
REPORT_MD = "report.md"


def run_record(run: "RunResult", pipeline: "Pipeline") -> dict:
    return {
        "format_version": 1,
        "pipeline": pipeline.name,
        "versions": versions(),
        "seconds": round(run.seconds, 3),
        "executor": {"kind": run.executor, "workers": run.workers},
        "ok": run.ok,
        "summary": {
            "models": len(run.models),
            "ok": sum(m.status == "ok" for m in run.models),
            "up_to_date": sum(m.skipped for m in run.models),
            "failed": sum(m.status != "ok" for m in run.models),
            "graphs": sum(len(m.graphs) for m in run.models),
            "bytes": sum(m.bytes for m in run.models),
            "checks": settled_totals(run.models) or None,  # how the checks were settled, over every model
        },
        "models": [m.to_json() for m in run.models],
    }


def human_size(n: float) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _replay_cell(m) -> str:
    if not m.verification:
        return "-"
    graphs = m.verification["graphs"]
    if all(s in ("match", "recorded") for s in graphs.values()):
        # "chain" (export) and "chain_<i>" (a dynamo subgraph's) are forward-backward checks, not graphs
        chains = sum(1 for k in graphs if k == "chain" or k.startswith("chain_"))
        if not chains:
            return f"all {len(graphs)} recorded"
        return f"{len(graphs) - chains} graphs recorded, {'chain' if chains == 1 else f'{chains} chains'} match"
    return ", ".join(f"{k} {s}" for k, s in graphs.items() if s not in ("match", "recorded")) or "ran"


SETTLED = (("exact", "exact"), ("floor", "floor"), ("fp64", "fp64"))


def settled_text(c: dict) -> str:
    """How a model's (or a run's) checks were settled, briefly: "5 exact, 60 floor, 5 fp64";
    empty for checks recorded before the counts were (format version 2)."""
    if c.get("fp64") is None:
        return ""
    text = ", ".join(f"{c.get(key) or 0} {word}" for key, word in SETTLED)
    return text + (f" ({c['within_noise']} within eager's noise)" if c.get("within_noise") else "")


def settled_totals(models: list) -> dict:
    """The settled counts (records.CheckTotals) summed over `models`' checks."""
    keys = ("run", "skipped", *(k for k, _ in SETTLED), "within_noise")
    with_counts = [m.checks for m in models if m.checks and m.checks.get("fp64") is not None]
    return {k: sum(c.get(k) or 0 for c in with_counts) for k in keys} if with_counts else {}


def _checks_cell(m) -> str:
    c = m.checks
    if not c:
        return "-"
    text = f"{c.get('passed', 0)}/{c.get('run', 0)} passed"
    if settled_text(c):
        text += f" ({settled_text(c)})"
    if c.get("failed"):
        text += f", **{c['failed']} failed**"
    if c.get("skipped"):
        text += f", **{c['skipped']} skipped**"
    if c.get("indirect"):
        text += f" (+{c['indirect']} through other graphs)"
    return text


def _worst_ratio(m) -> str:
    ratios = [e["worst_ratio"] for e in m.eager.values() if e and e.get("worst_ratio") is not None]
    return f"{max(ratios):.2g}" if ratios else "-"


def status_text(m) -> str:
    """ok, up to date, or failed; says so when some checks were skipped."""
    if m.status != "ok":
        return f"**{m.status}** ({m.stage})"
    text = "up to date" if m.skipped else "ok"
    skipped = (m.checks or {}).get("skipped")
    return f"{text}, {skipped} checks skipped" if skipped else text


def report_markdown(run: "RunResult", pipeline: "Pipeline") -> str:
    rec = run_record(run, pipeline)
    s = rec["summary"]
    v = rec["versions"]
    lines = [
        f"# aotpipe run: {pipeline.name}",
        "",
        f"{s['ok']} of {s['models']} models ok, {s['graphs']} graphs, {human_size(s['bytes'])} on disk, "
        f"{run.seconds:.1f} s (torch {v['torch']}, python {v['python']}, aotpipe {v['aotpipe']})"
        + (f"; {s['up_to_date']} up to date and kept." if s["up_to_date"] else "."),
        "",
        "| model | status | graphs (nodes) | replay | checks vs eager | worst error / eager's | capture s "
        "| passes s | checks s | write s | size |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in run.models:
        graphs = ", ".join(f"{g.kind} ({g.nodes})" for g in m.graphs) or "-"
        lines.append(
            f"| {m.name} | {status_text(m)} | {graphs} | {_replay_cell(m)} | {_checks_cell(m)} | {_worst_ratio(m)} "
            f"| {m.capture_seconds:.2f} | {m.passes_seconds:.2f} | {m.checks_seconds:.2f} | {m.write_seconds:.2f} "
            f"| {human_size(m.bytes)} |"
        )
    failed = [m for m in run.models if m.status != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
        for m in failed:
            lines.append(f"- **{m.name}** ({m.stage}): {m.error}")
    skipped = [(m.name, r) for m in run.models for r in (m.checks or {}).get("skipped_reasons", [])]
    if skipped:
        lines += ["", "## Skipped checks", ""] + [f"- {name}: {r}" for name, r in skipped]
    lines += ["", "Replay: each graph is run once from its written files (deterministic kernels, seeded "
              "generator); its outputs' digests are the reference later replays must match bit for bit. The "
              "chain: forward then backward must equal the joint graph bit for bit. Checks vs eager: every "
              "output (user outputs, loss, gradients, mutated buffers) against the eager model, torch's "
              "accuracy-runner rule: RMS error against eager in float64 at most 2x eager float32's own "
              "(more for tiny tensors), plus a floor of 1e-5 of the tensor's RMS; \"worst error / eager's\" "
              "is the largest such ratio where the float64 reference was needed."]
    totals = settled_totals(run.models)
    if totals:
        lines += ["", f"Checks settled: {totals['run']} run: {totals['exact']} exactly (integers, shapes, None), "
                  f"{totals['floor']} within the float-noise floor of eager float32, {totals['fp64']} by the float64 "
                  f"rule ({totals['within_noise']} of them values zero in exact arithmetic, held to eager's own "
                  f"noise); {totals['skipped']} skipped" + (" (reasons above)." if totals["skipped"] else ".")]
    with_passes = [m for m in run.models if m.passes]
    if with_passes:
        lines += ["", "## Passes", "",
                  "The chain's result is checked against the eager model like every graph; only when it fails "
                  "is each pass run and compared with the graph before it, to name the pass at fault.", "",
                  "| model | graph | pass | nodes before | nodes after | max abs error | what it did | s |",
                  "|---|---|---|---:|---:|---:|---|---:|"]
        for m in with_passes:
            for key, rec in m.passes.items():
                for step in rec["steps"]:
                    did = ", ".join(f"{k} {v}" for k, v in step["stats"].items() if v) or "nothing"
                    lines.append(f"| {m.name} | {key.split('.')[0]} | {step['name']} | {step['nodes_before']} "
                                 f"| {step['nodes_after']} | {'-' if step['max_abs_error'] is None else format(step['max_abs_error'], '.2g')} "
                                 f"| {did} | {step['seconds']:.3f} |")
    if run.cleaned:
        lines += ["", "## Cleaned up", ""] + [f"- {c}" for c in run.cleaned]
    noted = [m for m in run.models if m.notes]
    if noted:
        lines += ["", "## Notes", ""]
        for m in noted:
            for n in m.notes:
                lines.append(f"- {m.name}: {n}")
    return "\n".join(lines) + "\n"


def write_reports(run: "RunResult", pipeline: "Pipeline") -> None:
    """Write run.json and report.md, each replaced atomically."""
    from aotpipe.artifact.fsio import OutputError, describe_os_error, write_atomic

    for name, data in ((RUN_JSON, dump_json(run_record(run, pipeline))),
                       (REPORT_MD, report_markdown(run, pipeline).encode("utf-8"))):
        try:
            write_atomic(run.output / name, data)
        except OSError as e:
            raise OutputError(describe_os_error(e, run.output / name)) from None
