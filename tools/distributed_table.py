"""A distributed pipeline's ranks as a table: per model and rank, its graphs, its collectives per
training step by kind, the bytes they move, and how the ranks' check went.

    aotpipe run pipelines/distributed.yaml                       # -> artifacts/distributed
    python tools/distributed_table.py artifacts/distributed --save docs/data/distributed.json
    python tools/gen_docs.py                                     # docs/generated/distributed.md

Reads run.json (each model's status, seconds) and each rank's manifest (its `distributed` record,
its graphs' node counts, `verification.ranks`, `checks`). A training step is the forward then
the backward graph: its collectives are theirs (the joint holds the same ones once more, the
inference graph its own), counted as `aotpipe ops` counts them (DistributedRecord.per_step): by
kind, the bytes their outputs hold on the rank, and the bytes it sends for them in a ring
algorithm. `--save` keeps the rows as data (the artefacts are not committed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aotpipe.format.records import DistributedRecord

OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
SHORT = {"all_gather_into_tensor": "all-gather", "reduce_scatter_tensor": "reduce-scatter", "all_reduce": "all-reduce"}


def _rank_row(folder: Path) -> dict[str, Any] | None:
    """One rank's row from its manifest; None for a folder that is not a distributed rank."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    d = manifest.get("distributed")
    if d is None:
        return None
    totals = DistributedRecord.model_validate(d).per_step()
    step = {op: t.calls for op, t in totals.items()}
    entry = (manifest.get("verification") or {}).get("ranks") or {}
    checks = manifest.get("checks") or {}
    return {
        "rank": d["rank"], "coords": d["coords"],
        "graphs": {k: g.get("nodes") for k, g in manifest["graphs"].items()},
        "step": {op: step.get(op, 0) for op in OPS}, "step_bytes": sum(t.bytes for t in totals.values()),
        "step_sent": sum(t.sent for t in totals.values()),
        "check": entry.get("status", "none"), "checks_run": checks.get("run", 0), "checks_failed": checks.get("failed", 0),
    }


def collect(root: Path) -> dict[str, Any]:
    """The rows of the output tree `root` (a pipeline's output folder, holding run.json)."""
    run = json.loads((root / "run.json").read_text(encoding="utf-8"))
    models = []
    for m in run["models"]:
        ranks, r = [], 0
        while (folder := root / f"{m['name']}.rank{r}").is_dir() and (folder / "manifest.json").is_file():
            row = _rank_row(folder)
            if row is None:
                break
            ranks.append(row)
            r += 1
        first = json.loads((root / f"{m['name']}.rank0" / "manifest.json").read_text(encoding="utf-8")) \
            if ranks else {}
        d = first.get("distributed", {})
        models.append({"name": m["name"], "status": m["status"], "error": m.get("error"),
                       "seconds": m.get("total_seconds"),
                       "strategy": d.get("strategy") and d["strategy"] + (" +sp" if d.get("sequence_parallel") else ""),
                       "world": d.get("world_size"), "mesh": d.get("mesh"), "mesh_dims": d.get("mesh_dims"),
                       "source": (first.get("model") or {}).get("source"), "ranks": ranks})
    return {"pipeline": run["pipeline"], "torch": run["versions"]["torch"], "models": models}


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:.1f} KiB"


def render(data: dict[str, Any]) -> str:
    """The page's tables: one row per model, then one per rank."""
    lines = ["| model | source | strategy | world | mesh | status | checks | seconds |", "|---|---|---|---|---|---|---|---|"]
    for m in data["models"]:
        mesh = " x ".join(f"{d}={n}" for d, n in zip(m["mesh_dims"] or [], m["mesh"] or [], strict=False))
        run = sum(r["checks_run"] for r in m["ranks"])
        failed = sum(r["checks_failed"] for r in m["ranks"])
        status = m["status"] if not m["error"] else f"{m['status']}: {m['error'][:120]}"
        seconds = f"{m['seconds']:.1f}" if m["seconds"] is not None else "-"
        lines.append(f"| {m['name']} | `{m['source']}` | {m['strategy'] or '-'} | {m['world'] or '-'} | {mesh or '-'} | "
                     f"{status} | {run - failed}/{run} | {seconds} |")
    if any(" +sp" in (m["strategy"] or "") for m in data["models"]):
        lines += ["", "+sp: with sequence parallelism ([distributed.md](../distributed.md#the-block))."]
    lines += ["", "Per rank: graph node counts, the collectives of one training step (forward then backward) by "
              "kind, the bytes their outputs hold on the rank, the bytes the rank sends for them in a ring algorithm, "
              "and the ranks' check ([distributed.md](../distributed.md#the-check)).", "",
              "| model | rank | coords | inference | forward | backward | joint | step: "
              + " | ".join(SHORT[o] for o in OPS) + " | step bytes | step sends | check |",
              "|---|---|---|---|---|---|---|" + "---|" * len(OPS) + "---|---|---|"]
    for m in data["models"]:
        for r in m["ranks"]:
            coords = ", ".join(f"{k}={v}" for k, v in r["coords"].items())
            nodes = " | ".join(str(r["graphs"].get(k, "-")) for k in ("inference", "forward", "backward", "joint"))
            ops = " | ".join(str(r["step"][o]) for o in OPS)
            lines.append(f"| {m['name']} | {r['rank']} | {coords} | {nodes} | {ops} | {_mib(r['step_bytes'])} | "
                         f"{_mib(r['step_sent'])} | "
                         f"{r['check']} ({r['checks_run'] - r['checks_failed']}/{r['checks_run']}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a distributed pipeline's output folder (holds run.json)")
    ap.add_argument("--save", type=Path, help="write the rows as JSON here (for tools/gen_docs.py)")
    args = ap.parse_args()
    data = collect(args.root)
    if args.save:
        args.save.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(render(data))


if __name__ == "__main__":
    main()
