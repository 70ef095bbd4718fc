"""Two output trees (a pipeline's output folder: run.json and one artefact per model)
compared model by model: models new or missing, status changes (ok to failed, failed to ok),
graph-break and check counts, time and bytes beyond a threshold, and for each model both
trees hold, what :mod:`aotpipe.corpus.diff.artifacts` finds between its two artefacts.

Times compare only where both sides hold a measurement (ModelRun.has_measurement): an entry
kept from an earlier run compares by that run's measurement; one with none (an artefact kept
as up to date that no finished run timed, or before run.json version 3, any model kept as up
to date) is "-" in a note, never a percentage."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from aotpipe.corpus.diff.artifacts import compare_artifacts, compare_fields, read_side
from aotpipe.corpus.diff.model import Diff, Finding
from aotpipe.errors import AotpipeError
from aotpipe.format import records
from aotpipe.format.vocabulary import ModelStatus

RUN_JSON = "run.json"
# A time change counts when it is beyond the threshold and at least this many seconds:
# captures of small models take a few seconds, which machine load alone moves by a second.
MIN_SECONDS = 1.0


def read_run(tree: Path) -> records.RunRecord:
    """run.json of an output tree, as its record (read within the format's limits)."""
    return records.load_run(tree / RUN_JSON)


def _breaks(tree: Path, name: str) -> Optional[int]:
    path = tree / name / records.MANIFEST
    if not path.exists():
        return None
    try:
        _, manifest = records.read(records.Manifest, path, tree / name)
    except AotpipeError:
        return None
    return len(manifest.capture.graph_breaks or [])


def _first_line(text: Any) -> str:
    line = str(text or "").strip().splitlines()
    return line[0][:160] if line else ""


def _beyond(a: Any, b: Any, threshold: float, floor: float = 0.0) -> bool:
    """Whether `b` is more than 1 + threshold times `a` or less than `a` / (1 + threshold)
    (and moved by at least `floor`): symmetric, so 2 s -> 4 s counts as 4 s -> 2 s does."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0 or b <= 0:
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b and abs(b - a) >= floor
    return abs(b - a) >= floor and max(a / b, b / a) > 1 + threshold


def _seconds(m: records.ModelRun) -> Optional[float]:
    return m.total_seconds if m.has_measurement() else None


def _time_text(t: Optional[float]) -> str:
    return "-" if t is None else f"{t:.2f} s"


def compare_times(diff: Diff, name: str, x: records.ModelRun, y: records.ModelRun, threshold: float) -> Optional[str]:
    """Add a time finding for model `name` (A's entry `x`, B's `y`) where both hold a
    measurement and it moved past `threshold`; the line for a note where only one side
    holds one ("- -> 3.20 s"), else None."""
    ta, tb = _seconds(x), _seconds(y)
    if ta is None or tb is None:
        return f"{name} {_time_text(ta)} -> {_time_text(tb)}" if ta is not None or tb is not None else None
    if _beyond(ta, tb, threshold, MIN_SECONDS):
        change = f" ({(tb - ta) / ta:+.0%})" if ta > 0 else ""
        diff.add("time", name, f"{ta:.2f} s -> {tb:.2f} s{change}", model=name, a=ta, b=tb)
    return None


def compare_trees(a: Path, b: Path, diff: Diff, threshold: float) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """Add the differences between trees `a` and `b` to `diff`."""
    ra, rb = read_run(a), read_run(b)
    untimed: list[str] = []
    compare_fields(diff, "environment", "", ra.versions.model_dump(), rb.versions.model_dump(), "versions")
    ma, mb = {m.name: m for m in ra.models}, {m.name: m for m in rb.models}
    for name in ma:
        if name not in mb:
            diff.add("models", name, f"missing in B (was {ma[name].status} in A)", model=name, change="missing")
    for name in mb:
        if name not in ma:
            diff.add("models", name, f"new in B ({mb[name].status})", model=name, change="new")
    per_model: list[Diff] = []
    for name in [n for n in ma if n in mb]:
        x, y = ma[name], mb[name]
        if x.status != y.status:
            why = _first_line(y.error) if y.status != ModelStatus.OK else ""
            diff.add("status", name, f"{x.status} -> {y.status}" + (f": {why}" if why else ""), model=name,
                     a=x.status, b=y.status)
        for key in ("run", "passed", "failed", "skipped"):
            ca, cb = (getattr(c, key) if c is not None else None for c in (x.checks, y.checks))
            if ca != cb:
                diff.add("checks", name, f"{key} {ca} -> {cb}", model=name, field=key, a=ca, b=cb)
        ba, bb = _breaks(a, name), _breaks(b, name)
        if ba != bb and ba is not None and bb is not None:
            diff.add("breaks", name, f"graph breaks {ba} -> {bb}", model=name, a=ba, b=bb)
        one_sided = compare_times(diff, name, x, y, threshold)
        if one_sided is not None:
            untimed.append(one_sided)
        za, zb = x.bytes, y.bytes
        if _beyond(za, zb, threshold):
            change = f" ({(zb - za) / za:+.0%})" if za > 0 else ""  # a model that wrote nothing in A: no ratio
            diff.add("bytes", name, f"{za} -> {zb}{change}", model=name, a=za, b=zb)
        if (a / name / records.MANIFEST).exists() and (b / name / records.MANIFEST).exists():
            inner = Diff("artifact", str(a / name), str(b / name))
            compare_artifacts(read_side(a / name), read_side(b / name), inner, model=name)
            per_model.append(inner)
    if untimed:
        diff.notes.append(f"time not compared for {len(untimed)} model(s) measured on one side only (\"-\": kept "
                          f"as up to date without a measurement): {'; '.join(untimed[:5])}"
                          + (f"; and {len(untimed) - 5} more" if len(untimed) > 5 else ""))
    _merge(diff, per_model)
    return []


def _merge(diff: Diff, per_model: list[Diff]) -> None:
    """The models' artefact findings, one line for what several models share (the same
    environment change under another torch shows once, with how many models it holds for);
    a model's checks are already counted from run.json."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for d in per_model:
        weights = [f for f in d.findings if f.section == "weights"]
        if len(weights) > 3:  # a tree says how many of a model's weights differ; an artefact diff names each
            names = [str(f.data.get("name")) for f in weights]
            d.findings = [f for f in d.findings if f.section != "weights"] + [Finding(
                "weights", weights[0].where,
                f"{len(weights)} weights and constants differ ({', '.join(names[:2])}, ...; diff the model's "
                "artefacts for each digest)", {"names": names})]
        for f in d.findings:
            if f.section == "checks":
                continue
            model = f.where.split("/", 1)[0]
            rest = f.where[len(model) + 1:]
            groups.setdefault((f.section, f"{rest}: {f.text}" if rest else f.text), []).append(
                Finding(f.section, model, f.text, {**f.data, "model": model}))
    for (section, text), found in groups.items():
        if len(found) == 1:
            f = found[0]
            f_where = f.where + (f"/{text.split(': ', 1)[0]}" if text != f.text else "")
            diff.findings.append(Finding(section, f_where, f.text, f.data))
        else:
            models = [f.where for f in found]
            where = f"{len(models)} models" if len(models) > 3 else ", ".join(models)
            diff.findings.append(Finding(section, where, text, {**found[0].data, "models": models}))
