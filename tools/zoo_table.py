"""A zoo run's results as a table: architecture, mode used, status, graphs, checks, reason.

    python tools/zoo_table.py artifacts/hf-zoo [--failures-only]       # print the table
    python tools/zoo_table.py artifacts/hf-zoo --save docs/data/hf-zoo.json
    python tools/zoo_table.py artifacts/hf-zoo-dynamic --save docs/data/hf-zoo-dynamic.json
    python tools/zoo_table.py out/rerun --rerun-of docs/data/hf-zoo-dynamic.json --save docs/data/hf-zoo-dynamic.json
    python tools/gen_docs.py                    # docs/generated/hf-zoo.md, hf-zoo-dynamic.md

Reads run.json and each model's manifest (the capture mode it used: auto falls back to
dynamo where export fails). `--save` keeps the rows as data, from which tools/gen_docs.py
renders docs/generated/hf-zoo.md (a zoo run's folder is GBs and is not committed; its rows are).

A run of a pipeline with dynamic dimensions (`dims:`, as tools/hf_zoo.py --dims writes) gets
more per row: each dimension's status (the manifest's `dims`), whether the model is *dynamic
ok* (ok, every dimension symbolic), and for the others the *specialisation class* of the
message that says why (:func:`specialisation_class`): the dims refusal that made auto fall
back to dynamo, or the model's error. Its page (hf-zoo-dynamic.md) sets the pass rate beside
the static zoo's rows.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import re
from pathlib import Path
from typing import Any


def cause(error: str) -> str:
    """A failure's class: its stage and error, with numbers, shapes and names taken out."""
    text = re.sub(r"\(.*?\)|\[.*?\]|'[^']*'|\"[^\"]*\"|\d[\d.e+-]*", "…", error)
    return text[:110]


# ---------------------------------------------------------------------------------------
# why a dimension did not stay dynamic: the classes, from the messages aotpipe writes
# (capture/dynamic.py's refusals, pipeline/job.py's size checks, auto's fallback to dynamo)

FIXED = "fixed to a constant by the model"
UNPROVEN = "a guard torch cannot prove, true on the whole range"
NARROWED = "range narrowed by a branch"
REFUSED = "refused otherwise by torch.export"
STATIC = "static in every graph"
DOES_NOT_RUN = "fails at a size: does not run"
ASSERTED = "fails at a size: a run-time assertion the capture kept"
DIFFERS = "fails at a size: differs from eager"
FELL_BACK = "export failed otherwise: fell back to dynamo (static)"
PARTIAL = "part of the model ran outside its graphs"
OTHER = "capture failed otherwise"
# In the order a message is tested against them: a dims refusal is the root cause even where
# what came after it (dynamo) failed too.
CLASSES = (ASSERTED, FIXED, UNPROVEN, NARROWED, REFUSED, STATIC, DOES_NOT_RUN, DIFFERS, FELL_BACK, PARTIAL, OTHER)

_REFUSAL = re.compile(r"dims: (\w+) \(((?:[^()]|\([^()]*\))*)\) cannot be dynamic(?: in \[(\d+), (\d+)\])?")
_ONLY_RUNS_FOR = re.compile(r"the model only runs for (.*?)(?: at \S+:\d+ \(`|; narrow|$)")
_SIZE_SOURCE = re.compile(r"\b[A-Za-z_]\w*\.size\(\d+\)")
_AT_POINT = re.compile(r"\bat (?:min|max|random) \([^)]*\): \S+ graph (does not run|differs from the eager model)")
_COMPARE = {ast.Lt: int.__lt__, ast.LtE: int.__le__, ast.Gt: int.__gt__, ast.GtE: int.__ge__, ast.Eq: int.__eq__,
            ast.NotEq: int.__ne__}
_RELATIONS = {"Lt": ast.Lt, "Le": ast.LtE, "Gt": ast.Gt, "Ge": ast.GtE, "Eq": ast.Eq, "Ne": ast.NotEq}
MAX_POINTS = 100_000  # sizes a guard is evaluated at, at most


def _truth(node: ast.AST, n: int) -> bool:
    """A guard's truth at size n (its one input dimension named `n`): and, or, not, comparisons
    (also as sympy's Eq/Ne/Lt/... calls) of size arithmetic, evaluated by format/symbolic.py."""
    from aotpipe.format.symbolic import evaluate

    if isinstance(node, ast.BoolOp):
        values = (_truth(v, n) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _truth(node.operand, n)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RELATIONS \
            and len(node.args) == 2:
        node = ast.Compare(node.args[0], [_RELATIONS[node.func.id]()], [node.args[1]])
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        sides = [evaluate(ast.unparse(e), {"n": n}) for e in [node.left, *node.comparators]]
        return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, sides[:-1], sides[1:], strict=True))
    raise ValueError(f"{type(node).__name__} is not a comparison of sizes")


def guard_holds_on_range(guard: str, sources: list[str], lo: int, hi: int) -> bool | None:
    """Whether torch's guard (``(2*x.size(1) - 1) % x.size(1) != 0``) is true at every size in
    [lo, hi] of the one dimension `sources` name; None where that cannot be said here (it names
    another input dimension, or is not size arithmetic, or the range is too long to walk)."""
    named = set(_SIZE_SOURCE.findall(guard))
    if not named or not named <= set(sources) or hi - lo > MAX_POINTS:
        return None
    try:
        tree = ast.parse(_SIZE_SOURCE.sub("n", guard), mode="eval")
        return all(_truth(tree.body, n) for n in range(lo, hi + 1))
    except Exception:  # not size arithmetic this evaluator knows: undecided, never a crash of the table
        return None


def specialisation_class(message: str, fell_back: bool = False) -> str:
    """The class of why a model of a dynamic run did not end dynamic ok, from its message (the
    dims refusal auto fell back to dynamo for, or the model's error); `fell_back`: the model was
    captured by dynamo, at the example sizes."""
    if "a run-time assertion the capture kept fails" in message:  # job._check_sizes: a deferred guard, false there
        return ASSERTED
    refusal = _REFUSAL.search(message)
    if refusal is not None:
        if "the model fixes it to" in message:
            return FIXED
        guard = _ONLY_RUNS_FOR.search(message)
        if guard is None:
            return REFUSED
        if refusal.group(3) is not None:
            sources = [s.strip() for s in refusal.group(2).split(",")]
            holds = guard_holds_on_range(guard.group(1).rstrip(". "), sources, int(refusal.group(3)),
                                         int(refusal.group(4)))
            if holds:
                return UNPROVEN
        return NARROWED
    if re.search(r"dims: \w+ is static in every graph", message):
        return STATIC
    point = _AT_POINT.search(message)
    if point is not None:
        return DOES_NOT_RUN if point.group(1) == "does not run" else DIFFERS
    if fell_back:
        return FELL_BACK
    if "ran outside its graphs" in message or "outside the graphs ran" in message:
        return PARTIAL
    return OTHER


def dims_row(m: dict[str, Any], manifest: dict[str, Any] | None) -> dict[str, Any]:
    """A dynamic run's fields of one model's row: each dimension's status, the size checks'
    totals, whether it is dynamic ok, and otherwise its class and the message it came from."""
    record = (manifest or {}).get("dims") or {}
    dims = {name: d["status"] for name, d in record.get("dims", {}).items()}
    sized = [c.get("checks") or {} for c in record.get("checked", [])]
    capture = (manifest or {}).get("capture", {})
    fallback = capture.get("fallback") if capture.get("mode") == "dynamo" else None
    dynamic_ok = m["status"] == "ok" and bool(dims) and all(v == "dynamic" for v in dims.values())
    why = ""
    if not dynamic_ok:
        outside = "; ".join(m.get("outside_graphs") or [])
        why = fallback or m.get("error") or outside or next(
            (d.get("reason") or "" for d in record.get("dims", {}).values() if d["status"] != "dynamic"), "")
        if fallback and m["status"] != "ok":
            why += f" (then: {m.get('error') or 'part of the model ran outside its graphs: ' + outside})"
    return {"dims": dims, "dynamic": dynamic_ok,
            "sized": [sum(c.get("passed", 0) for c in sized), sum(c.get("run", 0) for c in sized)] if sized else None,
            "class": "" if dynamic_ok else specialisation_class(why, fell_back=fallback is not None),
            "why": why[:400]}


def read_run(root: Path) -> dict[str, Any]:
    """run.json of a pipeline's output folder (the one place this tool reads it)."""
    return json.loads((root / "run.json").read_text())


def _reason(m: dict[str, Any]) -> str:
    """A model's row's reason: the stage and error it failed with; for a partial one (no stage,
    no error: it passed), what ran outside its graphs."""
    if m.get("error") is None and m.get("outside_graphs"):
        return "partial: part of the model ran outside its graphs: " + "; ".join(m["outside_graphs"])[:110]
    return f"{m['stage']}: {(m['error'] or '')[:140]}"


def rows_from_run(root: Path) -> dict[str, Any]:
    """The zoo table's data: one row per model of the run in ROOT, and the run's totals (a run
    with dynamic dimensions: each row's dims fields too, see :func:`dims_row`)."""
    run = read_run(root)
    manifests: dict[str, dict[str, Any] | None] = {}
    for m in run["models"]:
        path = root / m["name"] / "manifest.json"
        manifests[m["name"]] = json.loads(path.read_text()) if path.is_file() else None
    dynamic = any((mf or {}).get("dims") for mf in manifests.values()) or any(
        "dims: " in (m.get("error") or "") for m in run["models"])
    rows = []
    for m in run["models"]:
        manifest = manifests[m["name"]]
        mode = manifest["capture"].get("mode", "-") if manifest is not None else "-"
        c = m.get("checks") or {}
        row = {
            "name": m["name"], "mode": mode, "status": m["status"], "graphs": len(m["graphs"]),
            "passed": c.get("passed") if c else None, "skipped": c.get("skipped") if c else None,
            "reason": "" if m["status"] == "ok" else _reason(m),
        }
        if dynamic:
            row.update(dims_row(m, manifest))
        rows.append(row)
    save = "docs/data/hf-zoo-dynamic.json" if dynamic else "docs/data/hf-zoo.json"
    return {"pipeline": root.name, "seconds": round(run["seconds"]), "executor": run.get("executor", {}),
            "kept": sum(1 for m in run["models"] if m.get("skipped")),
            "note": f"aotpipe run of pipeline {root.name}, executor {json.dumps(run.get('executor', {}))}; rows "
                    f"saved by: python tools/zoo_table.py {root.as_posix()} --save {save}",
            "models": rows}


def merged(earlier: dict[str, Any], rerun: dict[str, Any], members: list[str] | None = None) -> dict[str, Any]:
    """`rerun`'s rows (a run of some of a zoo's models: `aotpipe run --only ...`, after a fix
    say) in place of the same models' rows of the `earlier` saved data, in the earlier order.
    The earlier run's totals stay (its time is the whole zoo's); the rerun is listed under
    `reruns` (its models, seconds and note), which the pages print after the run's time. A
    model the earlier data does not hold is an error: a rerun refreshes rows, it adds none.

    With `members` (the names the zoo's pipeline holds now, after its definition changed),
    the rows follow it instead: a model it gained comes from the rerun, a model it no longer
    holds is dropped, and the rerun's entry lists both (`added`, `dropped`). A member with no
    row in either is an error: run it too."""
    new = {m["name"]: m for m in rerun["models"]}
    old = {m["name"]: m for m in earlier["models"]}
    if members is None:
        order, where = [m["name"] for m in earlier["models"]], "not in the earlier data (--rerun-of)"
    else:
        order, where = members, "not in the pipeline (--members)"
        missing = [n for n in members if n not in old and n not in new]
        if missing:
            raise SystemExit(f"zoo_table: {', '.join(missing)}: in the pipeline (--members) but in neither run; "
                             "run them too (aotpipe run ... --only NAME)")
    unknown = sorted(set(new) - set(order))
    if unknown:
        raise SystemExit(f"zoo_table: {', '.join(unknown)}: {where}; a rerun refreshes rows of the earlier run"
                         + (", it adds none" if members is None else ""))
    rows = [new.get(n) or old[n] for n in order]
    again: dict[str, Any] = {"models": [m["name"] for m in rerun["models"]], "seconds": rerun["seconds"],
                             "note": rerun["note"]}
    if members is not None:
        again["added"] = [n for n in members if n not in old]
        again["dropped"] = [n for n in old if n not in set(members)]
    return {**earlier, "reruns": [*earlier.get("reruns", []), again], "models": rows}


def with_before(data: dict[str, Any], earlier: dict[str, Any], label: str) -> dict[str, Any]:
    """`data` with an earlier run of the zoo under another definition summed up beside it
    (`before`: its label, seconds, ok and model counts; the page prints it after the time)."""
    before = {"label": label, "seconds": earlier["seconds"], "models": len(earlier["models"]),
              "ok": sum(1 for m in earlier["models"] if m["status"] == "ok")}
    return {**data, "before": before}


def _before(data: dict[str, Any]) -> str:
    b = data.get("before")
    return (f" Beside it, {b['label']}: {b['ok']}/{b['models']} ok in {b['seconds']:,} s."
            if b else "")


def _reruns(data: dict[str, Any]) -> str:
    """The reruns merged into a run's rows (merged), as the pages say them after its time."""
    out = ""
    for r in data.get("reruns", []):
        names = ", ".join(r["models"][:12]) + (f", ... ({len(r['models']) - 12} more)" if len(r["models"]) > 12 else "")
        out += (f" Then {len(r['models'])} of its models were run again and their rows replaced ({r['seconds']:,} s): "
                f"{names}.")
        if r.get("added"):
            out += f" That run added {', '.join(r['added'])}, new in the pipeline."
        if r.get("dropped"):
            out += f" The pipeline no longer holds {', '.join(r['dropped'])}: their rows were dropped."
    return out


def dump(data: dict[str, Any]) -> str:
    """The rows as JSON, one model per line (so a re-run's diff shows which models changed)."""
    head = {k: v for k, v in data.items() if k != "models"}
    rows = ",\n".join("  " + json.dumps(m, ensure_ascii=False) for m in data["models"])
    return json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ',\n "models": [\n' + rows + "\n ]\n}\n"


def _kept(data: dict[str, Any]) -> str:
    """How many of the run's models were kept from an earlier run (incremental: their time is not the run's)."""
    kept = data.get("kept") or 0
    return f" ({kept} of its {len(data['models'])} models kept from an earlier run: their time is not in it)" \
        if kept else ""


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
        f"The run took {data['seconds']:,} s{_kept(data)}.{_reruns(data)}{_before(data)}",
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


def _rate(n: int, total: int) -> str:
    return f"{n}/{total} ({n / max(1, total):.1%})"


def _dims_cell(dims: dict[str, str]) -> str:
    dynamic = [k for k, v in dims.items() if v == "dynamic"]
    static = [k for k, v in dims.items() if v != "dynamic"]
    return "; ".join(part for part in (f"{', '.join(dynamic)} dynamic" if dynamic else "",
                                       f"{', '.join(static)} static" if static else "") if part) or "-"


def render_dynamic(data: dict[str, Any], static: dict[str, Any] | None) -> str:
    """A dynamic zoo run in Markdown: its pass rate beside the static zoo's (`static`: the static
    run's rows, compared on the architectures both ran), the ratio of dynamic ok to static ok,
    the specialisation classes with counts and an example each, and the per-model table."""
    models = data["models"]
    dynamic_ok = [m for m in models if m.get("dynamic")]
    ok = [m for m in models if m["status"] == "ok"]
    partial = [m for m in models if m["status"] == "partial"]
    failed = [m for m in models if m["status"] not in ("ok", "partial")]
    lines = [
        f"**{_rate(len(dynamic_ok), len(models))} dynamic ok**: ok with every named dimension symbolic in every "
        f"graph, and every graph checked at the min, the max and a random size. Of the others, "
        f"{len(ok) - len(dynamic_ok)} ok with a dimension static, {len(partial)} partial, {len(failed)} failed. "
        f"The run took {data['seconds']:,} s{_kept(data)}.{_reruns(data)}", ""]
    by_name = {m["name"]: m for m in (static or {}).get("models", [])}
    if static is not None and len(models) < len(by_name):
        lines += [f"**A sample**: this run holds {len(models)} of the static zoo's {len(by_name)} architectures "
                  "(its pipeline: a share of pipelines/hf-zoo-dynamic.yaml's models); the rates below are the "
                  "sample's.", ""]
    both = [m for m in models if m["name"] in by_name]
    if static is None or not both:
        lines += ["No static zoo run of these architectures is recorded (docs/data/hf-zoo.json), so there is "
                  "nothing to set the rate beside.", ""]
    else:
        static_ok = [m for m in both if by_name[m["name"]]["status"] == "ok"]
        dyn_ok = [m for m in both if m.get("dynamic")]
        ratio = len(dyn_ok) / max(1, len(static_ok))
        lines += [f"Beside the static zoo's run (docs/data/hf-zoo.json), on the {len(both)} architectures both ran:", "",
                  "| run | ok | pass rate |", "|---|---:|---:|",
                  f"| static zoo (hf-zoo.yaml) | {len(static_ok)} | {len(static_ok) / len(both):.1%} |",
                  f"| dynamic zoo (hf-zoo-dynamic.yaml), dynamic ok | {len(dyn_ok)} | {len(dyn_ok) / len(both):.1%} |",
                  "", f"**dynamic ok / static ok: {len(dyn_ok)}/{len(static_ok)} = {ratio:.1%}** "
                  f"(target: 90% or more; {'met' if ratio >= 0.9 else 'not met'}).", ""]
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for m in models:
        if not m.get("dynamic"):
            groups[m.get("class") or OTHER].append(m)
    lines += ["Why the others did not stay dynamic, by class (the message each class is read from: the dims "
              "refusal auto fell back to dynamo for, else the model's error):", "",
              "| class | models | architectures | e.g. |", "|---|---:|---|---|"]
    for cls in sorted(groups, key=lambda c: (-len(groups[c]), CLASSES.index(c) if c in CLASSES else len(CLASSES))):
        ms = groups[cls]
        names = ", ".join(m["name"] for m in ms[:8]) + (f", ... ({len(ms) - 8} more)" if len(ms) > 8 else "")
        lines.append(f"| {cls} | {len(ms)} | {names} | {ms[0]['name']}: {_escape(ms[0]['why'][:240])} |")
    lines += ["", "| architecture | static zoo | dynamic zoo | mode used | dims | size checks passed / run | class | why |",
              "|---|---|---|---|---|---:|---|---|"]
    for m in models:
        before = by_name.get(m["name"])
        was = f"{before['status']} ({before['mode']})" if before is not None else "-"
        sized = f"{m['sized'][0]} / {m['sized'][1]}" if m.get("sized") else "-"
        now = "dynamic ok" if m.get("dynamic") else m["status"]
        lines.append(f"| {m['name']} | {was} | {now} | {m['mode']} | {_dims_cell(m.get('dims') or {})} | {sized} | "
                     f"{m.get('class', '')} | {_escape(m.get('why', '')[:200])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="the pipeline's output folder (holds run.json)")
    ap.add_argument("--failures-only", action="store_true")
    ap.add_argument("--save", type=Path, help="write the rows as JSON here (docs/data/hf-zoo.json, or "
                    "docs/data/hf-zoo-dynamic.json for a run of the dynamic zoo)")
    ap.add_argument("--members", type=Path, metavar="PIPELINE_YAML",
                    help="with --rerun-of, after the zoo's pipeline changed: the rows follow this pipeline's models "
                         "(a model it gained comes from the rerun, one it dropped goes)")
    ap.add_argument("--before", type=Path, metavar="SAVED_JSON",
                    help="an earlier run of the zoo under another definition (saved rows): the page gives its "
                         "time and ok count beside this run's (needs --before-label)")
    ap.add_argument("--before-label", metavar="TEXT", help="what the --before run was, e.g. 'the zoo before "
                    "the shrinker's bounds (commit 7934115)'")
    ap.add_argument("--rerun-of", type=Path, metavar="SAVED_JSON",
                    help="the run in ROOT reran some of the models of this saved data (aotpipe run --only ...): "
                         "its rows replace theirs, and the pages list the rerun after the run's time")
    a = ap.parse_args()
    data = rows_from_run(a.root)
    if a.before and not a.before_label:
        ap.error("--before needs --before-label: say what that run was")
    if a.members and not a.rerun_of:
        ap.error("--members goes with --rerun-of: it says which rows the merged data keeps")
    if a.rerun_of:
        members = None
        if a.members:
            import yaml

            members = [m["name"] for m in yaml.safe_load(a.members.read_text())["models"]]
        data = merged(json.loads(a.rerun_of.read_text()), data, members)
    if a.before:
        data = with_before(data, json.loads(a.before.read_text()), a.before_label)
    if a.save:
        a.save.write_text(dump(data), encoding="utf-8")
    if any("dims" in m for m in data["models"]):
        static = Path(__file__).resolve().parent.parent / "docs" / "data" / "hf-zoo.json"
        print(render_dynamic(data, json.loads(static.read_text()) if static.is_file() else None), end="")
    else:
        print(render(data, a.failures_only), end="")


if __name__ == "__main__":
    main()
