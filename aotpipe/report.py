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
            "failed": sum(m.status != "ok" for m in run.models),
            "graphs": sum(len(m.graphs) for m in run.models),
            "bytes": sum(m.bytes for m in run.models),
        },
        "models": [m.to_json() for m in run.models],
    }


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def report_markdown(run: "RunResult", pipeline: "Pipeline") -> str:
    rec = run_record(run, pipeline)
    s = rec["summary"]
    v = rec["versions"]
    lines = [
        f"# aotpipe run: {pipeline.name}",
        "",
        f"{s['ok']} of {s['models']} models captured, {s['graphs']} graphs, {_size(s['bytes'])} on disk, "
        f"{run.seconds:.1f} s (torch {v['torch']}, python {v['python']}, aotpipe {v['aotpipe']}).",
        "",
        "| model | status | graphs (nodes) | capture s | write s | size |",
        "|---|---|---|---:|---:|---:|",
    ]
    for m in run.models:
        graphs = ", ".join(f"{g.kind} ({g.nodes})" for g in m.graphs) or "-"
        status = m.status if m.status == "ok" else f"**{m.status}** ({m.stage})"
        lines.append(
            f"| {m.name} | {status} | {graphs} | {m.capture_seconds:.2f} | {m.write_seconds:.2f} | {_size(m.bytes)} |"
        )
    failed = [m for m in run.models if m.status != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
        for m in failed:
            lines.append(f"- **{m.name}** ({m.stage}): {m.error}")
    noted = [m for m in run.models if m.notes]
    if noted:
        lines += ["", "## Notes", ""]
        for m in noted:
            for n in m.notes:
                lines.append(f"- {m.name}: {n}")
    return "\n".join(lines) + "\n"


def write_reports(run: "RunResult", pipeline: "Pipeline") -> None:
    (run.output / RUN_JSON).write_bytes(dump_json(run_record(run, pipeline)))
    (run.output / REPORT_MD).write_text(report_markdown(run, pipeline), encoding="utf-8")
