"""A zoo run's results as a README table: architecture, mode used, status, graphs, reason.

    python tools/zoo_table.py artifacts/hf-zoo [--failures-only]

Reads run.json and each model's manifest (the capture mode it used: auto falls back to
dynamo where export fails). Prints a summary line, the failures grouped by cause, and the
table in Markdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path


def cause(error: str) -> str:
    """A failure's class: its stage and error, with numbers, shapes and names taken out."""
    text = re.sub(r"\(.*?\)|\[.*?\]|'[^']*'|\"[^\"]*\"|\d[\d.e+-]*", "…", error)
    return text[:110]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="the pipeline's output folder (holds run.json)")
    ap.add_argument("--failures-only", action="store_true")
    a = ap.parse_args()
    run = json.loads((a.root / "run.json").read_text())
    models = run["models"]
    ok = [m for m in models if m["status"] == "ok"]
    print(f"{len(ok)}/{len(models)} ok ({len(ok) / max(1, len(models)):.0%}) in {run['seconds']:.0f} s, "
          f"executor {run.get('executor', {})}\n")
    groups = collections.Counter(f"{m['stage']}: {cause(m['error'] or '')}" for m in models if m["status"] != "ok")
    for c, n in groups.most_common():
        print(f"{n:4d}  {c}")
    skipped = sum(m.get("checks", {}).get("skipped", 0) for m in ok)
    passed = sum(m.get("checks", {}).get("passed", 0) for m in ok)
    print(f"\nchecks of the ok models: {passed} passed, {skipped} skipped (reasons in each manifest)")
    settled = {k: sum(m.get("checks", {}).get(k) or 0 for m in ok) for k in ("exact", "floor", "fp64", "within_noise")}
    print(f"settled: {settled['exact']} exactly, {settled['floor']} by the floor, {settled['fp64']} by the float64 rule "
          f"({settled['within_noise']} of them within eager's own noise)")
    print("\n| architecture | mode used | status | graphs | checks passed / skipped | reason |\n"
          "|---|---|---|---:|---:|---|")
    for m in models:
        if a.failures_only and m["status"] == "ok":
            continue
        mode = "-"
        manifest = a.root / m["name"] / "manifest.json"
        if manifest.is_file():
            mode = json.loads(manifest.read_text())["capture"].get("mode", "-")
        reason = "" if m["status"] == "ok" else f"{m['stage']}: {(m['error'] or '')[:140]}".replace("|", "\\|")
        c = m.get("checks") or {}
        checks = f"{c.get('passed', 0)} / {c.get('skipped', 0)}" if c else "-"
        print(f"| {m['name']} | {mode} | {m['status']} | {len(m['graphs'])} | {checks} | {reason} |")


if __name__ == "__main__":
    main()
