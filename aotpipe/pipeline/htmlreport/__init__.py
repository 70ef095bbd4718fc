"""report.html: one static page about an output tree, built from what is on disk (run.json,
each model's manifest, graph.json and inputs.json, and bench.json where a bench has run).
CSS, script and plots (SVG) are inline: the page opens from disk with no network.

Every string an artefact or run.json supplies is escaped (Jinja2 autoescape): a model or op
named ``<script>`` shows as text. Every link is a relative path into the page's own folder,
checked to be one (:func:`relative_link`): a folder named ``javascript:...`` is a path, not
a scheme. The page's Content-Security-Policy lets no script run but its own (by its sha256).
Nothing is run; a hostile tree is read like any other.
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote, urlsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from aotpipe.artifact.fsio import OutputError, describe_os_error, write_atomic
from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format.limits import read_json
from aotpipe.format.records import MANIFEST, ModelRun, RunRecord, collectives_text, describe
from aotpipe.format.vocabulary import GRAPH_KINDS, ModelStatus
from aotpipe.pipeline.htmlreport import plots
from aotpipe.pipeline.report import human_size
from aotpipe.pipeline.results import is_partial, outside_graphs_lines, why_failed
from aotpipe.pipeline.tree import ModelView, all_model_folders, incomplete_model, missing_manifest, read_run, read_tree
from aotpipe.pipeline.views import view_candidates

REPORT_HTML = "report.html"
BENCH_JSON = "bench.json"
BASE_KINDS = GRAPH_KINDS
TOP_OPS = 25  # ops shown per graph in the histogram (the rest summed)


# ---------------------------------------------------------------------------------------
# bench.json (optional): `aotpipe bench ... --json > DIR/bench.json`, read leniently.


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class BenchRow(_Loose):
    # `aotpipe bench --json` names a graph's artefact "artifact"; a hand-written file "model"
    model: str = Field("?", validation_alias=AliasChoices("model", "artifact"))
    graph: str = "?"
    backend: Optional[str] = None
    status: str = "?"
    speedup: Optional[float] = None


class KindScore(_Loose):
    """One of `aotpipe bench --json`'s scores (per graph kind, and "all")."""
    graphs: int = 0
    passed: int = 0
    geomean_speedup: float | None = None


class BugRow(_Loose):
    """One unique bug of `aotpipe bench --minimize --json` (triage.py's Bug)."""
    signature: str = "?"
    status: str = "?"
    graphs: list[str] = []
    models: list[str] = []
    repro: str | None = None
    repro_nodes: int | None = None


class BenchFile(_Loose):
    backend: str | None = None
    results: list[BenchRow] = Field([], validation_alias=AliasChoices("results", "graphs"))
    # a number per score (a hand-written file), or bench --json's per kind
    scores: dict[str, float | KindScore | None] = {}
    bugs: list[BugRow] = []

    def bug_graphs(self) -> int:
        """The failing graphs the bugs group."""
        return sum(len(b.graphs) for b in self.bugs)

    def score_texts(self) -> list[str]:
        """Each score as the page says it: "S(0) 1.25", or "all: 7/8 pass, geomean 1.3x"."""
        out = []
        for k, v in self.scores.items():
            if isinstance(v, KindScore):
                gm = "" if v.geomean_speedup is None else f", geomean {v.geomean_speedup:.3g}x"
                out.append(f"{k}: {v.passed}/{v.graphs} pass{gm}")
            else:
                out.append(f"{k} {'-' if v is None else format(v, '.3g')}")
        return out


def read_bench(root: Path) -> Optional[BenchFile]:
    """DIR/bench.json, or None; an ArtifactError naming the file where it is not one."""
    path = root / BENCH_JSON
    if not path.is_file():
        return None
    raw = read_json(path, root)
    if isinstance(raw, list):
        raw = {"results": raw}
    try:
        return BenchFile.model_validate(raw)
    except ValidationError as e:
        raise ArtifactError(f"{path}: not a bench result ({describe(e)}); expected {{\"results\": [{{\"model\", "
                            f"\"graph\", \"status\", \"speedup\"}}], \"scores\": {{...}}}}") from None


# ---------------------------------------------------------------------------------------
# What the page shows


@dataclass
class CheckRow:
    graph: str
    what: str
    method: str
    passed: bool
    error: Optional[float]
    bound: Optional[float]
    ratio: Optional[float]  # error / bound
    detail: Optional[str]


@dataclass
class GraphRow:
    key: str
    folder: str
    nodes: Optional[int]
    ops: list[tuple[str, int, float]]  # op, count, share of the largest (for the bar)
    more_ops: int
    distinct_ops: int
    verified: Optional[str]
    problem: Optional[str]
    view: Optional[str]  # relative link to the model-explorer JSON, where written


@dataclass
class ModelRow:
    name: str
    anchor: str
    status: str  # ok, partial, failed, unreadable
    stage: Optional[str] = None
    kept: Optional[str] = None  # the entry is from an earlier run: which (run.json version 3), or why none timed it
    mode: Optional[str] = None
    graph_breaks: Optional[int] = None
    seconds: dict[str, Optional[float]] = field(default_factory=dict)
    bytes: Optional[int] = None
    nodes: dict[str, Optional[int]] = field(default_factory=dict)
    other_graphs: int = 0
    checks_run: Optional[int] = None
    checks_passed: Optional[int] = None
    checks_failed: Optional[int] = None
    checks_skipped: Optional[int] = None
    settled: str = ""
    worst_ratio: Optional[float] = None
    parameters: Optional[int] = None
    graphs: list[GraphRow] = field(default_factory=list)
    passes: list[dict[str, Any]] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # a partial capture: what ran outside its graphs


def _anchor(i: int) -> str:
    return f"m{i}"  # never the model's name: names may hold anything


def relative_link(root: Path, target: Path) -> Optional[str]:
    """The link from a page in `root` to the file `target`: "./" then target's path under `root`,
    each segment percent-encoded (so no name reads as a scheme, query or fragment); None where
    `target` is not a file inside `root` once links are resolved, or its path climbs ("..")."""
    try:
        parts = Path(target).relative_to(root).parts
    except ValueError:
        return None
    if not parts or any(p in ("", ".", "..") for p in parts):
        return None
    try:
        real = Path(target).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not real.is_file() or not real.is_relative_to(Path(root).resolve()):
        return None
    link = "./" + "/".join(quote(p, safe="") for p in parts)
    u = urlsplit(link)
    if u.scheme or u.netloc or u.query or u.fragment or u.path != link:  # quote leaves no ":?#"; checked all the same
        return None
    return link


def _view_link(root: Path, folder: Path, key: str) -> Optional[str]:
    """The link to a graph's model-explorer view where one is written (views.view_candidates'
    order: the tree's views/ folder, then the model folder's own); None where there is none."""
    for path in view_candidates(root, folder, key):
        link = relative_link(root, path)
        if link is not None:
            return link
    return None


def _csp_hash(script: str) -> Any:
    """A script's CSP source, 'sha256-<base64>', of its exact text."""
    from markupsafe import Markup

    digest = base64.b64encode(hashlib.sha256(str(script).encode("utf-8")).digest()).decode("ascii")
    return Markup(f"'sha256-{digest}'")


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


def kept_text(record: RunRecord, m: ModelRun) -> Optional[str]:
    """What the page says of an entry kept from an earlier run (None: this run measured it)."""
    if not record.kept(m):
        return None
    if m.measured_in is not None:
        return f"kept from run {m.measured_in.id} (started {m.measured_in.started})"
    return "kept, up to date; no measurement" if not m.has_measurement() else "kept from an earlier run"


def _model_row(i: int, run: Optional[ModelRun], view: Optional[ModelView], root: Path,
               record: Optional[RunRecord] = None) -> ModelRow:
    name = run.name if run is not None else view.name  # type: ignore[union-attr]
    row = ModelRow(name=name, anchor=_anchor(i), status="unreadable")
    if run is not None:
        row.status = run.status
        row.kept = kept_text(record, run) if record is not None else None
        row.stage = run.stage
        if run.has_measurement():  # else no times: "-", and no point in the plots
            row.seconds = {"capture": run.capture_seconds, "passes": run.passes_seconds,
                           "checks": run.checks_seconds, "write": run.write_seconds, "total": run.total_seconds}
        row.bytes = run.bytes
        row.notes = list(run.notes)
        if run.error:
            row.errors.append(f"{run.stage or 'run'}: {run.error}")
    if view is None:
        return row
    if view.problem:  # the manifest cannot be read now, whatever run.json said then (verify fails it too)
        row.errors.append(view.problem)
        row.status = "unreadable"
    m = view.manifest
    if m is None:
        return row
    if run is None:
        failed = why_failed(m)
        row.status = ModelStatus.FAILED if failed else ModelStatus.OK
        if failed:
            row.errors.append(failed)
        row.notes = list(m.capture.notes)
    row.mode = m.capture.mode
    row.graph_breaks = len(m.capture.graph_breaks or [])
    row.breaks = [f"after subgraph {b.subgraph}: {b.reason}" + (f" at {b.where}" if b.where else "")
                  for b in m.capture.graph_breaks or []]
    if m.capture.fallback:
        row.notes.append(f"export failed, dynamo used: {m.capture.fallback}")
    d = m.distributed
    if d is not None:
        row.notes.append(f"rank {d.rank} of a world of {d.world_size} ({d.strategy}): collectives of a training step "
                         f"(forward then backward): {collectives_text(d.per_step())}; of an inference call: "
                         f"{collectives_text(d.per_inference())} (bytes sent in a ring algorithm)")
    row.outside = outside_graphs_lines(m)
    if is_partial(m) and row.status == ModelStatus.OK:  # the manifest says so, whatever run.json said
        row.status = ModelStatus.PARTIAL
    if m.checks is not None:
        c = m.checks
        row.checks_run, row.checks_passed, row.checks_failed, row.checks_skipped = c.run, c.passed, c.failed, c.skipped
        if c.fp64 is not None:
            row.settled = f"{c.exact or 0} exact, {c.floor or 0} floor, {c.fp64 or 0} fp64"
    row.parameters = view.parameters()
    for kind in BASE_KINDS:
        entry = m.graphs.get(kind)
        row.nodes[kind] = entry.nodes if entry is not None else None
    row.other_graphs = sum(1 for k in m.graphs if k not in BASE_KINDS)
    ratios = []
    for g in view.graphs:
        entry = m.graphs[g.key]
        counts = g.ops()
        top = counts.most_common(TOP_OPS)
        biggest = top[0][1] if top else 1
        verified = (m.verification or {}).get(g.key)
        row.graphs.append(GraphRow(
            key=g.key, folder=g.folder, nodes=entry.nodes,
            ops=[(op, n, n / biggest) for op, n in top], more_ops=sum(counts.values()) - sum(n for _, n in top),
            distinct_ops=len(counts), verified=verified.status if verified is not None else None,
            problem=g.problem,
            view=_view_link(root, view.folder, g.key)))
        for step in entry.passes or []:
            row.passes.append({"graph": g.key, "name": step.name, "before": step.nodes_before,
                               "after": step.nodes_after, "modified": step.modified,
                               "did": ", ".join(f"{k} {v}" for k, v in step.stats.items() if v) or "nothing"})
        if entry.checks is not None:
            for item in entry.checks.items:
                err, bound = _finite(item.error), _finite(item.bound)
                ratio = err / bound if err is not None and bound else None
                if ratio is not None:
                    ratios.append(ratio)
                row.checks.append(CheckRow(g.key, item.what, item.method, item.passed, err, bound, ratio, item.detail))
            row.errors += [f"{g.key}: check skipped: {r}" for r in entry.checks.skipped_reasons]
        if verified is not None and verified.error:
            row.errors.append(f"{g.key}: {verified.status}: {verified.error}")
    row.errors += [f"pass chain failed: {p}" for p in m.pass_failures]
    if any(g.problem for g in view.graphs):  # a graph's records cannot be read now
        row.status = "unreadable"
    row.worst_ratio = max(ratios) if ratios else None
    return row


def _rank_views(name: str, by_name: dict[str, ModelView]) -> list[ModelView]:
    """The rank artefacts of the distributed model `name` (`<name>.rank0`, `<name>.rank1`, ...),
    in rank order: those whose manifest says they are a rank."""
    out: list[ModelView] = []
    while (v := by_name.get(f"{name}.rank{len(out)}")) is not None and v.manifest is not None \
            and v.manifest.distributed is not None:
        out.append(v)
    return out


def missing_model(root: Path, m: ModelRun) -> ModelView:
    """The view of a model run.json lists as written (ok or partial) that no model folder under
    `root` holds: its problem names the folder or manifest that is not there."""
    folder = root / m.name
    if folder.is_dir():
        why = missing_manifest(folder)
    else:
        why = f"{folder}: missing; run.json lists {m.name} as {m.status}, but its artefact is not there (run the " \
              "pipeline again)"
    return ModelView(name=m.name, folder=folder, problem=why)


@dataclass
class Report:
    title: str
    versions: str
    rows: list[ModelRow]
    summary: dict[str, Any]
    plots: list[tuple[str, str, str]]  # (id, caption, svg)
    bench: Optional[BenchFile]
    problems: list[str]


def gather(root: Path) -> Report:
    """Everything report.html shows about the output tree `root`, read from disk."""
    root = Path(root)
    if not root.is_dir():
        raise AotpipeError(f"{root}: not a folder; pass a pipeline's output folder (it holds run.json)")
    run: Optional[RunRecord] = read_run(root)
    folders, incomplete = all_model_folders(root)
    views = read_tree(root, keep_nodes=False, folders=folders)  # the page shows op counts, never nodes
    views += [incomplete_model(f) for f in incomplete]  # no manifest.json: shown unreadable, as verify fails them
    if run is None and not views:
        raise AotpipeError(f"{root}: no run.json and no artefacts (manifest.json) found in it or below; "
                           "pass a pipeline's output folder, e.g. artifacts/quickstart")
    problems: list[str] = []
    by_name: dict[str, ModelView] = {}
    for v in views:
        # run.json names models; a model folder is named after its model
        by_name.setdefault(v.name, v)
        by_name.setdefault(v.folder.name, v)
    rows: list[ModelRow] = []
    seen: set[int] = set()
    for i, rm in enumerate(run.models if run is not None else []):
        v = by_name.get(rm.name)
        ranks: list[ModelView] = [] if v is not None else _rank_views(rm.name, by_name)
        if ranks:  # a distributed model: one artefact per rank, <name>.rank<r>, each a row as its manifest says
            for rv in ranks:
                seen.add(id(rv))
                rows.append(_model_row(len(rows), None, rv, root))
            continue
        if v is not None:
            seen.add(id(v))
        elif rm.status != ModelStatus.FAILED:  # run.json lists an artefact (a failed model may have none): it is gone
            v = missing_model(root, rm)
        rows.append(_model_row(i, rm, v, root, run))
    for v in views:
        if id(v) not in seen:
            row = _model_row(len(rows), None, v, root)
            if run is not None:
                row.notes.append("not in run.json: not part of the pipeline's last run (removed from the pipeline, "
                                 "or copied here); delete its folder to drop it from this page")
            rows.append(row)
    bench = None
    try:
        bench = read_bench(root)
    except AotpipeError as e:
        problems.append(e.lines()[0])
    total_checks: dict[str, int] = {}
    for r in rows:
        for k, v in (("run", r.checks_run), ("passed", r.checks_passed), ("failed", r.checks_failed),
                     ("skipped", r.checks_skipped)):
            total_checks[k] = total_checks.get(k, 0) + (v or 0)
    settled = {"exact": 0, "floor": 0, "fp64": 0, "within_noise": 0}
    for v in views:
        c = v.manifest.checks if v.manifest is not None else None
        if c is not None:
            for k in settled:
                settled[k] += getattr(c, k) or 0
    on_disk = sum(r.bytes or 0 for r in rows)
    summary = {
        "models": len(rows),
        "ok": sum(r.status == ModelStatus.OK for r in rows),
        "partial": sum(r.status == ModelStatus.PARTIAL for r in rows),
        "failed": sum(r.status not in (ModelStatus.OK, ModelStatus.PARTIAL) for r in rows),
        "kept": sum(r.kept is not None for r in rows),
        "graphs": sum(len(r.graphs) for r in rows),
        "bytes": on_disk,
        "seconds": run.seconds if run is not None else None,
        "checks": total_checks,
        "settled": settled,
    }
    charts: Any = plots
    try:
        import matplotlib  # noqa: F401  (a declared dependency; a page without plots if it is missing)
    except ImportError:
        problems.append("no plots: matplotlib is not installed (pip install matplotlib -c constraints.txt)")
        charts = None
    figures = [] if charts is None else [
        ("plot-capture", "Capture seconds against parameter count (parameters: elements of the graphs' param "
                         "inputs).",
         charts.capture_vs_parameters([(r.name, r.parameters or 0, r.seconds.get("capture") or 0.0) for r in rows
                                      if r.seconds])),
        ("plot-stages", "Seconds per stage: capture, passes, checks (every written graph run once against the "
                        "eager model), write.",
         charts.seconds_per_stage([(r.name, [r.seconds.get(s) or 0.0 for s in charts.STAGES]) for r in rows
                                  if r.seconds])),
        ("plot-ratios", "Each check's error against its bound (the float64 rule or the noise floor); above 1 "
                        "fails.",
         charts.ratio_histogram([c.ratio for r in rows for c in r.checks if c.ratio is not None])),
    ]
    if bench is not None and charts is not None:
        figures.append(("plot-bench", f"Bench ({bench.backend or 'backend'}): speedup over eager per graph; "
                                      "red: not ok (speedup 0 where none was measured).",
                        charts.bench_speedups([(f"{b.model}/{b.graph}", b.status, b.speedup)
                                              for b in bench.results])))

    versions = (f"torch {run.versions.torch}, python {run.versions.python}, aotpipe {run.versions.aotpipe}"
                if run is not None else "")
    return Report(
        title=run.pipeline if run is not None else root.name,
        versions=versions, rows=rows, summary=summary | {"size": human_size(on_disk)},
        plots=[(pid, cap, svg) for pid, cap, svg in figures if svg], bench=bench, problems=problems)


def render(report: Report) -> str:
    """The page, as one HTML string."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.PackageLoader("aotpipe.pipeline.htmlreport", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda x, fmt=".2f": "-" if x is None else format(x, fmt)
    env.filters["g"] = lambda x: "-" if x is None else format(x, ".3g")
    env.filters["csp_hash"] = _csp_hash
    # The plots are matplotlib's own SVG (every text escaped by it, labels drawn as paths).
    plots = [(pid, cap, Markup(svg)) for pid, cap, svg in report.plots]
    return env.get_template("report.html.j2").render(r=report, plots=plots, kinds=BASE_KINDS)


def build_html(root: Path) -> str:
    return render(gather(root))


def not_ok_lines(report: Report) -> list[str]:
    """The terminal's account of the models the page shows not ok (failed, unreadable): a count,
    then one line each with its first error (the file and what is wrong with it); none when
    every model is ok or partial."""
    bad = [r for r in report.rows if r.status not in (ModelStatus.OK, ModelStatus.PARTIAL)]
    if not bad:
        return []
    return [f"{len(bad)} of {len(report.rows)} models not ok:"] + [
        f"  {r.name}: {r.status}" + (f" ({r.stage})" if r.stage else "") + (f": {r.errors[0]}" if r.errors else "")
        for r in bad]


def write_page(root: Path, output: Optional[Path] = None) -> tuple[Path, Report]:
    """Write the page of the output folder `root` to `output`, or to root/report.html (never
    into a model folder); its path and what it shows. Replaced atomically."""
    root = Path(root)
    if output is None and (root / MANIFEST).exists():  # a file there would be one the manifest does not list
        raise AotpipeError(f"{root} is a model folder; write its page elsewhere (aotpipe report {root} -o FILE) or "
                           "pass the output folder above it")
    report = gather(root)
    path = Path(output) if output is not None else root / REPORT_HTML
    try:
        write_atomic(path, render(report).encode("utf-8"))
    except OSError as e:
        raise OutputError(describe_os_error(e, path)) from None
    return path, report


def write_html(root: Path) -> Path:
    """Write report.html into the output folder `root` (replaced atomically); its path."""
    return write_page(root)[0]
