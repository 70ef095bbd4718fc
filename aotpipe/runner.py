"""One job per model (source -> capture -> write), and a whole pipeline over an executor."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from aotpipe.config import ModelSpec, Pipeline
from aotpipe.errors import AotpipeError


@dataclass
class GraphResult:
    kind: str
    folder: str
    nodes: int
    inputs: int
    outputs: int


@dataclass
class ModelResult:
    """What happened to one model; `status` is ok or failed."""

    name: str
    status: str
    stage: Optional[str] = None  # where it failed: source | capture | reference | passes | write | verify
    error: Optional[str] = None
    graphs: list[GraphResult] = field(default_factory=list)
    capture_seconds: float = 0.0
    values_seconds: float = 0.0
    write_seconds: float = 0.0
    verify_seconds: float = 0.0
    verification: Optional[dict[str, Any]] = None
    eager: dict[str, Any] = field(default_factory=dict)
    passes: dict[str, Any] = field(default_factory=dict)  # per transformed graph: what each pass did
    total_seconds: float = 0.0
    bytes: int = 0
    files: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: bool = False  # up to date: the artefact on disk was kept
    traceback: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("traceback")
        return d


def model_fingerprint(spec: ModelSpec, base_dir: Path | None = None) -> str:
    """The fingerprint an up-to-date artefact of `spec` carries (spec, source file, options, versions)."""
    from aotpipe.artifact.manifest import file_sha256, fingerprint
    from aotpipe.capture.export import OPTIONS
    from aotpipe.sources import source_file

    src = source_file(spec, base_dir)
    src_hash = file_sha256(src) if src is not None and src.is_file() else None
    return fingerprint(spec.to_json(), src_hash, {"mode": spec.mode, **OPTIONS})


def up_to_date(folder: Path, fp: str) -> Optional[dict[str, Any]]:
    """The manifest of `folder` if it carries fingerprint `fp`, verifies, and passed its checks."""
    from aotpipe.artifact.verify import verify_artifact

    try:
        manifest = written_manifest(folder)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fp:
        return None
    if verify_artifact(folder, load_graphs=False):
        return None
    if _verification_summary(manifest)["problems"] or _eager_problems(manifest) or manifest.get("pass_failures"):
        return None  # it failed last time: try again
    return manifest


def _eager_problems(manifest: dict[str, Any]) -> list[str]:
    return [k for k, g in (manifest.get("graphs") or {}).items()
            if isinstance(g, dict) and g.get("eager") and not g["eager"].get("within_tolerance", True)]


def _skipped_result(spec: ModelSpec, folder: Path, manifest: dict[str, Any], start: float) -> ModelResult:
    r = ModelResult(name=spec.name, status="ok", skipped=True)
    graphs = manifest.get("graphs", {})
    order = ["inference", "forward", "backward", "joint"]
    r.graphs = [GraphResult(k, graphs[k]["folder"], graphs[k]["nodes"], graphs[k]["inputs"], graphs[k]["outputs"])
                for k in sorted(graphs, key=lambda k: order.index(k) if k in order else len(order))]
    for k, g in graphs.items():
        e = g.get("eager") if isinstance(g, dict) else None
        if e and e.get("skipped"):
            r.eager[k] = {"skipped": e["skipped"]}
        elif e and e.get("checks"):
            errs = [c["max_abs_error"] for c in e["checks"]]
            worst = max((float(x) for x in errs), default=0.0)
            r.eager[k] = {"max_abs_error": worst, "within_tolerance": e["within_tolerance"]}
    files = [p for p in folder.rglob("*") if p.is_file()]
    r.bytes, r.files = sum(p.stat().st_size for p in files), len(files)
    r.notes = list(manifest.get("capture", {}).get("notes", []))
    if manifest.get("verification"):
        r.verification = _verification_summary(manifest)
    r.total_seconds = time.perf_counter() - start
    return r


def run_model(spec: ModelSpec, out_dir: Path, base_dir: Path | None = None, *, force: bool = False) -> ModelResult:
    """Build, capture and write one model, unless its artefact is up to date.

    Never raises for a model's own failure: the result says what failed and where.
    """
    from aotpipe.artifact.writer import write_model
    from aotpipe.capture import capture_export
    from aotpipe.capture.values import record_values
    from aotpipe.replay import verify_folder
    from aotpipe.sources import build_model, make_example_inputs

    start = time.perf_counter()
    result = ModelResult(name=spec.name, status="failed")
    stage = "source"
    try:
        fp = model_fingerprint(spec, base_dir)
        if not force:
            manifest = up_to_date(out_dir / spec.name, fp)
            if manifest is not None:
                return _skipped_result(spec, out_dir / spec.name, manifest, start)
        model = build_model(spec, base_dir)
        args, kwargs = make_example_inputs(spec)
        names = [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)]
        ranges = {
            (inp.name or f"arg{i}"): (int(inp.low or 0), int(inp.high if inp.high is not None else 2))
            for i, inp in enumerate(spec.inputs)
            if inp.is_integer
        }
        stage = "capture"
        captured = capture_export(
            model, args, kwargs, name=spec.name, graphs=list(spec.graphs), input_names=names, int_ranges=ranges
        )
        result.capture_seconds = captured.seconds
        result.notes = list(captured.notes)
        values = None
        eager_problems: list[str] = []
        pass_problems: list[str] = []
        if spec.save_inputs or spec.verify or spec.passes:
            stage = "reference"
            t0 = time.perf_counter()
            values = record_values(model, args, kwargs, captured, captured.user_inputs)
            result.values_seconds = time.perf_counter() - t0
            for kind, gv in values.items():
                if gv.eager_skipped:
                    result.eager[kind] = {"skipped": gv.eager_skipped}
                elif gv.eager:
                    worst = max(c.max_abs_error for c in gv.eager)
                    ok = all(c.within_tolerance for c in gv.eager)
                    result.eager[kind] = {"max_abs_error": worst if worst != float("inf") else "inf",
                                          "within_tolerance": ok}
                    if not ok:
                        bad = [c for c in gv.eager if not c.within_tolerance]
                        eager_problems.append(
                            f"{kind} graph differs from the eager model: {len(bad)} output(s) beyond tolerance, "
                            f"e.g. {bad[0].what} by {bad[0].max_abs_error:.3g} (rtol={bad[0].rtol}, atol={bad[0].atol})")
        if spec.passes and values is not None:
            stage = "passes"
            pass_problems = apply_passes(spec, captured, values, result)
        stage = "write"
        t0 = time.perf_counter()
        verify_t = [0.0]

        def verify(path: Path) -> dict[str, Any]:
            v0 = time.perf_counter()
            try:
                return verify_folder(path)
            finally:
                verify_t[0] = time.perf_counter() - v0

        written = write_model(
            out_dir,
            captured,
            model_record=spec.to_json(),
            fingerprint=fp,
            values=values,
            save_inputs=spec.save_inputs,
            verify=verify if spec.verify else None,
            pass_failures=pass_problems,
        )
        result.verify_seconds = verify_t[0]
        result.write_seconds = time.perf_counter() - t0 - verify_t[0]
        result.graphs = [GraphResult(g.kind, g.folder, g.nodes, g.num_inputs, g.num_outputs) for g in written.graphs]
        result.bytes = written.bytes
        result.files = written.files
        result.status = "ok"
        if spec.verify:
            result.verification = _verification_summary(written_manifest(written.path))
            problems = result.verification["problems"] + eager_problems
            if problems:
                result.status, result.stage = "failed", "verify"
                result.error = "; ".join(problems[:3])
        if pass_problems:
            # The raw graphs were written and verified; the failing chain's graph was not.
            result.status, result.stage = "failed", "passes"
            result.error = "; ".join(pass_problems[:3])
    except AotpipeError as e:
        result.stage, result.error = stage, str(e)
        result.traceback = traceback.format_exc()
    except Exception as e:  # a model's own code (or torch) failed: record it, go on
        result.stage, result.error = stage, f"{e.__class__.__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        result.traceback = traceback.format_exc()
    result.total_seconds = time.perf_counter() - start
    return result


def apply_passes(spec: ModelSpec, captured: Any, values: dict[str, Any], result: ModelResult) -> list[str]:
    """Run the model's pass chain on each graph kind it selects; add the results to `captured`.

    Returns the problems (one per failed chain); a failed chain adds no graph.
    """
    import copy

    import torch

    from aotpipe.capture.types import CapturedGraph, DerivedGraph, GraphOutput, TensorMeta
    from aotpipe.capture.values import GraphValues, run_traced
    from aotpipe.passes import parse_pass_entry
    from aotpipe.passes.base import GraphUnderPass, PassError
    from aotpipe.passes.manager import chain_name, run_chain

    steps = [parse_pass_entry({p["name"]: p["options"]})[1] for p in spec.passes]
    problems = []
    for kind, g in list(captured.graphs.items()):
        kind_steps = [s for s in steps if s is not None and kind in s.graphs]
        if not kind_steps or kind not in values:
            continue
        start = GraphUnderPass(copy.deepcopy(g.gm), kind, list(g.inputs), list(g.outputs), list(values[kind].inputs))
        t0 = time.perf_counter()
        try:
            final, records = run_chain(start, kind_steps)
        except PassError as e:
            problems.append(f"{kind} graph: {e}")
            continue
        outs, trace = run_traced(final.gm, final.values)
        outputs = [GraphOutput(go.index, go.role, go.target, TensorMeta.of(o) if isinstance(o, torch.Tensor) else go.meta)
                   for go, o in zip(final.outputs, outs)]
        derived = DerivedGraph(kind, chain_name(kind_steps), CapturedGraph(kind, final.gm, final.inputs, outputs),
                               [r.to_json(timings=False) for r in records])
        captured.derived[derived.key] = derived
        values[derived.key] = GraphValues(final.values, outs, trace)
        result.passes[derived.key] = {"seconds": round(time.perf_counter() - t0, 4),
                                      "steps": [r.to_json() for r in records]}
    return problems


def written_manifest(path: Path) -> dict[str, Any]:
    import json

    return json.loads((path / "manifest.json").read_text(encoding="utf-8"))


def _verification_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    rec = manifest.get("verification") or {}
    problems = []
    statuses = {}
    for kind, r in rec.items():
        statuses[kind] = r["status"]
        if r["status"] not in ("match", "ran"):
            detail = r.get("error") or "; ".join(r.get("mismatches") or r.get("problems") or [])
            if r.get("first_divergence"):
                detail += f" (first divergence: {r['first_divergence']})"
            problems.append(f"{kind} replay {r['status']}: {detail}")
    return {"ok": not problems, "graphs": statuses, "problems": problems}


@dataclass
class RunResult:
    pipeline: str
    output: Path
    models: list[ModelResult]
    seconds: float
    cleaned: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(m.status == "ok" for m in self.models)


def select_models(pipeline: Pipeline, only: tuple[str, ...] | list[str] | None) -> list[ModelSpec]:
    """The models to run: all, or those named by --only (an unknown name is a user error)."""
    from aotpipe.errors import AotpipeError as _E

    if not only:
        return list(pipeline.models)
    names = {m.name for m in pipeline.models}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise _E(f"--only: no model named {', '.join(map(repr, unknown))} in {pipeline.path}; "
                 f"models: {', '.join(sorted(names))}")
    return [m for m in pipeline.models if m.name in set(only)]


def run_pipeline(
    pipeline: Pipeline,
    *,
    output: str | Path | None = None,
    only: tuple[str, ...] | list[str] | None = None,
    progress: bool = True,
    force: bool = False,
) -> RunResult:
    """Run every selected model of `pipeline`; write run.json and report.md beside them.

    Models whose artefacts are up to date (same fingerprint, files intact, checks passed)
    are kept, unless `force`.
    """
    from aotpipe.artifact.fsio import OutputError, describe_os_error
    from aotpipe.artifact.writer import clean_stale
    from aotpipe.executors import run_local
    from aotpipe.report import write_reports

    start = time.perf_counter()
    specs = select_models(pipeline, only)
    out_root = Path(output if output is not None else pipeline.output) / pipeline.name
    try:
        out_root.mkdir(parents=True, exist_ok=True)
        probe = out_root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        err = OutputError(describe_os_error(e, out_root))
        err.exit_code = 2  # the output folder given cannot be used: nothing ran
        raise err from None
    cleaned = clean_stale(out_root)
    base_dir = Path(pipeline.path).resolve().parent if Path(pipeline.path).exists() else None
    results = run_local(specs, out_root, base_dir, progress=progress, force=force)
    run = RunResult(pipeline.name, out_root, results, time.perf_counter() - start, cleaned)
    write_reports(run, pipeline)
    return run
