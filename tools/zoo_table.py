"""A zoo run's results as a table: architecture, mode used, status, graphs, checks, reason.

    python tools/zoo_table.py artifacts/hf-zoo [--failures-only]       # print the table
    python tools/zoo_table.py artifacts/hf-zoo --save docs/data/hf-zoo.json
    python tools/gen_docs.py                                           # docs/generated/hf-zoo.md

Reads run.json and each model's manifest (the capture mode it used: auto falls back to
dynamo where export fails). `--save` keeps the rows as data, from which tools/gen_docs.py
renders docs/generated/hf-zoo.md (a zoo run's folder is GBs and is not committed; its rows are).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path
from typing import Any


def cause(error: str) -> str:
    """A failure's class: its stage and error, with numbers, shapes and names taken out."""
    text = re.sub(r"\(.*?\)|\[.*?\]|'[^']*'|\"[^\"]*\"|\d[\d.e+-]*", "…", error)
    return text[:110]


def read_run(root: Path) -> dict[str, Any]:
    """run.json of a pipeline's output folder (the one place this tool reads it)."""
    return json.loads((root / "run.json").read_text())


def rows_from_run(root: Path) -> dict[str, Any]:
    """The zoo table's data: one row per model of the run in ROOT, and the run's totals."""
    run = read_run(root)
    rows = []
    for m in run["models"]:
        mode = "-"
        manifest = root / m["name"] / "manifest.json"
        if manifest.is_file():
            mode = json.loads(manifest.read_text())["capture"].get("mode", "-")
        c = m.get("checks") or {}
        rows.append({
            "name": m["name"], "mode": mode, "status": m["status"], "graphs": len(m["graphs"]),
            "passed": c.get("passed") if c else None, "skipped": c.get("skipped") if c else None,
            "reason": "" if m["status"] == "ok" else f"{m['stage']}: {(m['error'] or '')[:140]}",
        })
    return {"pipeline": root.name, "seconds": round(run["seconds"]), "executor": run.get("executor", {}),
            "note": f"aotpipe run of pipeline {root.name}, executor {json.dumps(run.get('executor', {}))}; rows "
                    f"saved by: python tools/zoo_table.py {root.as_posix()} --save docs/data/hf-zoo.json",
            "models": rows}


def dump(data: dict[str, Any]) -> str:
    """The rows as JSON, one model per line (so a re-run's diff shows which models changed)."""
    head = {k: v for k, v in data.items() if k != "models"}
    rows = ",\n".join("  " + json.dumps(m, ensure_ascii=False) for m in data["models"])
    return json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ',\n "models": [\n' + rows + "\n ]\n}\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, Any], failures_only: bool = False) -> str:
    """The table in Markdown, after a summary computed from the rows themselves."""
    models = data["models"]
    ok = [m for m in models if m["status"] == "ok"]
    modes = collections.Counter(m["mode"] for m in ok)
    passed = sum(m["passed"] or 0 for m in ok)
    skipped = sum(m["skipped"] or 0 for m in ok)
    lines = [
        f"**{len(ok)}/{len(models)} ok ({len(ok) / max(1, len(models)):.1%})**; of the ok ones "
        + ", ".join(f"{n} captured with {mode}" for mode, n in sorted(modes.items(), key=lambda kv: -kv[1]))
        + f". Checks of the ok models: {passed:,} passed, {skipped:,} skipped. "
        f"The run took {data['seconds']:,} s.",
        "",
        "Failures by class (numbers, shapes and names taken out):",
        "",
        "| models | stage: error |",
        "|---:|---|",
    ]
    groups = collections.Counter(cause(m["reason"]) for m in models if m["status"] != "ok")
    lines += [f"| {n} | {_escape(c)} |" for c, n in groups.most_common()]
    lines += ["", "| architecture | mode used | status | graphs | checks passed / skipped | reason |",
              "|---|---|---|---:|---:|---|"]
    for m in models:
        if failures_only and m["status"] == "ok":
            continue
        checks = "-" if m["passed"] is None else f"{m['passed']} / {m['skipped']}"
        lines.append(f"| {m['name']} | {m['mode']} | {m['status']} | {m['graphs']} | {checks} | {_escape(m['reason'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="the pipeline's output folder (holds run.json)")
    ap.add_argument("--failures-only", action="store_true")
    ap.add_argument("--save", type=Path, help="write the rows as JSON here (docs/data/hf-zoo.json for the docs)")
    a = ap.parse_args()
    data = rows_from_run(a.root)
    if a.save:
        a.save.write_text(dump(data), encoding="utf-8")
    print(render(data, a.failures_only), end="")


if __name__ == "__main__":
    main()
