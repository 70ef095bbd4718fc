"""run.json (for machines) and report.md (for people) of one pipeline run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotpipe.artifact.manifest import dump_json, versions

if TYPE_CHECKING:
    from aotpipe.config import Pipeline
    from aotpipe.runner import RunResult

RUN_JSON = "run.json"
REPORT_MD = "report.md"


def run_record(run: "RunResult", pipeline: "Pipeline") -> dict:
    return {
        "format_version": 1,
        "pipeline": pipeline.name,
        "versions": versions(),
        "seconds": round(run.seconds, 3),
        "ok": run.ok,
        "summary": {
            "models": len(run.models),
            "ok": sum(m.status == "ok" for m in run.models),
            "up_to_date": sum(m.skipped for m in run.models),
            "failed": sum(m.status != "ok" for m in run.models),
            "graphs": sum(len(m.graphs) for m in run.models),
            "bytes": sum(m.bytes for m in run.models),
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
    if all(s == "match" for s in graphs.values()):
        return f"all {len(graphs)} match" if "chain" not in graphs else f"{len(graphs) - 1} graphs + chain match"
    return ", ".join(f"{k} {s}" for k, s in graphs.items() if s != "match") or "ran"


def _eager_cell(m) -> str:
    if not m.eager:
        return "-"
    parts = []
    for kind, e in m.eager.items():
        if "skipped" in e:
            parts.append(f"{kind} n/a (RNG)")
        else:
            err = e["max_abs_error"]
            mark = "" if e["within_tolerance"] else " **over tolerance**"
            parts.append(f"{kind} {err if isinstance(err, str) else format(err, '.2g')}{mark}")
    return ", ".join(parts)


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
        "| model | status | graphs (nodes) | replay | max abs error vs eager | capture s | reference s "
        "| write s | verify s | size |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in run.models:
        graphs = ", ".join(f"{g.kind} ({g.nodes})" for g in m.graphs) or "-"
        status = ("up to date" if m.skipped else m.status) if m.status == "ok" else f"**{m.status}** ({m.stage})"
        lines.append(
            f"| {m.name} | {status} | {graphs} | {_replay_cell(m)} | {_eager_cell(m)} | {m.capture_seconds:.2f} "
            f"| {m.values_seconds:.2f} | {m.write_seconds:.2f} | {m.verify_seconds:.2f} | {human_size(m.bytes)} |"
        )
    failed = [m for m in run.models if m.status != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
        for m in failed:
            lines.append(f"- **{m.name}** ({m.stage}): {m.error}")
    lines += ["", "Replay: each graph rerun on its saved inputs right after writing and compared bit for bit "
              "with the outputs recorded at capture; the chain feeds the forward's saved activations to the "
              "backward and compares gradients with the joint graph's. Eager: the graph's outputs against the "
              "eager model's on the same inputs (float32 tolerance rtol=atol=1e-4; training graphs that draw "
              "random numbers are not compared)."]
    with_passes = [m for m in run.models if m.passes]
    if with_passes:
        lines += ["", "## Passes", "",
                  "Each pass is checked against the graph before it on the saved inputs (float32 tolerance "
                  "rtol=atol=1e-4).", "",
                  "| model | graph | pass | nodes before | nodes after | max abs error | what it did | s |",
                  "|---|---|---|---:|---:|---:|---|---:|"]
        for m in with_passes:
            for key, rec in m.passes.items():
                for step in rec["steps"]:
                    did = ", ".join(f"{k} {v}" for k, v in step["stats"].items() if v) or "nothing"
                    lines.append(f"| {m.name} | {key.split('.')[0]} | {step['name']} | {step['nodes_before']} "
                                 f"| {step['nodes_after']} | {step['max_abs_error']:.2g} | {did} | {step['seconds']:.3f} |")
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
