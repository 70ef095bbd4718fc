"""One job per model (source -> capture -> write), and a whole pipeline over an executor."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from aotpipe.config import ModelSpec, Pipeline
from aotpipe.errors import AotpipeError, exception_line
from aotpipe.artifact.records import GraphChecks, Manifest


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
    stage: Optional[str] = None  # where it failed: source | capture | passes | write | verify
    error: Optional[str] = None
    # The exception's class when the failure was not an aotpipe error: the model's own code,
    # torch, or a bug in aotpipe (the traceback is kept for -v).
    exception: Optional[str] = None
    graphs: list[GraphResult] = field(default_factory=list)
    capture_seconds: float = 0.0
    passes_seconds: float = 0.0
    checks_seconds: float = 0.0  # running the written graphs once: references, eager checks, chain
    write_seconds: float = 0.0
    verification: Optional[dict[str, Any]] = None
    checks: dict[str, Any] = field(default_factory=dict)  # run, passed, failed, skipped (with reasons), indirect
    eager: dict[str, Any] = field(default_factory=dict)  # per graph: its checks in brief
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


def run_model(spec: ModelSpec, out_dir: Path, base_dir: Path | None = None, *, force: bool = False,
              key: Path | None = None) -> ModelResult:
    """Build, capture, write and check one model, unless its artefact is up to date.

    With a signing `key`, the artefact is signed as it is written, and one on disk counts
    as up to date only if its signature checks under that key.

    Never raises for a model's own failure: the result says what failed and where.
    """
    import torch.utils._pytree as pytree

    from aotpipe.artifact.signing import signer
    from aotpipe.artifact.writer import graph_entries, write_model
    from aotpipe.capture import capture_export
    from aotpipe.capture.checks import ModelChecks, check_written, graph_structure
    from aotpipe.eager import EagerReference, model_state
    from aotpipe.incremental import model_fingerprint, skipped_result, up_to_date
    from aotpipe.passes.manager import apply_passes
    from aotpipe.sources import build_model, make_example_inputs

    start = time.perf_counter()
    result = ModelResult(name=spec.name, status="failed")
    stage = "source"
    try:
        fp = model_fingerprint(spec, base_dir)
        if not force:
            manifest = up_to_date(out_dir / spec.name, fp, key)
            if manifest is not None:
                return skipped_result(spec, out_dir / spec.name, manifest, start)
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
        state = model_state(model, captured.constants)
        user = dict(zip(captured.user_inputs, pytree.tree_leaves((args, kwargs))))
        inputs = {kind: bind_inputs(g, state, user) for kind, g in captured.graphs.items() if kind != "backward"}
        if spec.save_values == "full" and "backward" in captured.graphs:
            inputs["backward"] = backward_inputs(captured, inputs["forward"])
        pass_problems: list[str] = []
        diagnose: dict[str, Any] = {}
        if spec.passes:
            stage = "passes"
            t0 = time.perf_counter()
            pass_problems, result.passes, diagnose = apply_passes(spec, captured, inputs)
            result.passes_seconds = time.perf_counter() - t0
        stage = "write"
        t0 = time.perf_counter()
        eager = EagerReference(model, args, kwargs, captured.constants, captured.user_inputs) if spec.verify else None
        checked: list[ModelChecks] = []

        def check(folder: Path) -> Any:
            codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(captured)}
            mc = check_written(folder, memory_inputs=inputs, codes=codes, eager=eager, verify=spec.verify,
                               diagnose=lambda key, lines: diagnose[key]() if key in diagnose else "")
            checked.append(mc)
            pass_problems.extend(mc.pass_failures)
            return mc.outcome

        written = write_model(
            out_dir,
            captured,
            model_record=spec.to_json(),
            fingerprint=fp,
            inputs=inputs if spec.save_inputs else None,
            save_values=spec.save_values,
            check=check,
            pass_failures=pass_problems,
            sign=signer(key) if key is not None else None,
        )
        mc = checked[0]
        result.checks_seconds = mc.seconds
        result.write_seconds = time.perf_counter() - t0 - mc.seconds
        result.graphs = [GraphResult(g.kind, g.folder, g.nodes, g.num_inputs, g.num_outputs) for g in written.graphs]
        result.bytes = written.bytes
        result.files = written.files
        result.status = "ok"
        manifest = written_manifest(written.path)
        result.verification = verification_summary(manifest)
        result.checks = checks_summary(manifest)
        result.eager = {k: eager_cell(g.checks) for k, g in manifest.graphs.items()}
        problems = mc.problems + result.verification["problems"]
        if problems:
            result.status, result.stage = "failed", "verify"
            result.error = "; ".join(problems[:3])
        elif pass_problems:
            # The raw graphs were written and checked; the failing chain's graph was not kept.
            result.status, result.stage = "failed", "passes"
            result.error = "; ".join(pass_problems[:3])
    except AotpipeError as e:
        result.stage, result.error = stage, str(e)
        result.traceback = traceback.format_exc()
    except Exception as e:  # a model's own code (or torch) failed: record it, go on
        result.stage, result.error = stage, exception_line(e)
        result.exception = f"{type(e).__module__}.{type(e).__qualname__}"
        result.traceback = traceback.format_exc()
    result.total_seconds = time.perf_counter() - start
    return result


def bind_inputs(g: Any, state: dict[str, Any], user: dict[str, Any]) -> list[Any]:
    """A graph's real inputs: model tensors by target, user inputs by name, ones for tangents."""
    from aotpipe.tensors import ones

    vals: list[Any] = []
    for gi in g.inputs:
        if gi.role in ("param", "buffer", "constant"):
            vals.append(state[gi.target])
        elif gi.role == "user":
            vals.append(user[gi.target])
        elif gi.role == "tangent":
            vals.append(ones(gi.meta.shape, gi.meta.stride, gi.meta.dtype))
        else:
            raise ValueError(f"cannot bind input {gi.name} with role {gi.role}")
    return vals


def backward_inputs(captured: Any, forward_inputs: list[Any]) -> list[Any]:
    """The backward graph's real inputs: the forward's saved outputs, then ones for tangents."""
    from aotpipe.execution import run_graph
    from aotpipe.tensors import ones

    fw_out = run_graph(captured.graphs["forward"].gm, forward_inputs)
    saved = fw_out[captured.contract.num_forward_outputs:]
    bw = captured.graphs["backward"]
    tangents = [ones(gi.meta.shape, gi.meta.stride, gi.meta.dtype) for gi in bw.inputs if gi.role == "tangent"]
    return list(saved) + tangents


def eager_cell(checks: Optional[GraphChecks]) -> dict[str, Any]:
    """A graph's checks in brief: counts, the worst error as a multiple of eager's own."""
    if checks is None:
        return {}
    ratios = [c.ratio for c in checks.items if c.ratio is not None]
    return {"run": checks.run, "passed": checks.passed, "failed": checks.failed, "skipped": checks.skipped,
            "indirect": checks.indirect, "worst_ratio": max(ratios) if ratios else None,
            "skipped_reasons": list(checks.skipped_reasons)}


def checks_summary(manifest: Manifest) -> dict[str, Any]:
    """The model's checks in brief: counts, and the reasons for every skipped one."""
    totals: dict[str, Any] = manifest.checks.model_dump() if manifest.checks is not None else {}
    totals["skipped_reasons"] = [f"{key}: {r}" for key, g in manifest.graphs.items()
                                 for r in (g.checks.skipped_reasons if g.checks is not None else [])]
    return totals


# Verification statuses that are not problems: recorded by the run after writing (v2),
# replayed bit for bit or ran without saved values (v1), shapes only (save_inputs: false).
VERIFIED = ("recorded", "shapes only", "match", "ran")


def written_manifest(path: Path) -> Manifest:
    """The manifest of a model folder, read within the limits and validated (an ArtifactError
    if it is not one)."""
    from aotpipe.artifact import records

    return records.read(Manifest, path / records.MANIFEST, path)[1]


def verification_summary(manifest: Manifest) -> dict[str, Any]:
    problems = []
    statuses = {}
    for kind, r in (manifest.verification or {}).items():
        statuses[kind] = r.status
        if r.status not in VERIFIED:
            detail = r.error or "; ".join(str(x) for x in (r.mismatches or r.problems or []))
            if r.first_divergence:
                detail += f" (first divergence: {r.first_divergence})"
            problems.append(f"{kind} replay {r.status}: {detail}")
    return {"ok": not problems, "graphs": statuses, "problems": problems}


def failed_last_time(manifest: Manifest) -> bool:
    """Whether the run that wrote an artefact found a problem: a graph that did not run as
    recorded, a failed check, or a failed pass chain (such a model is redone, and ls says FAILED)."""
    return bool(verification_summary(manifest)["problems"] or (manifest.checks is not None and manifest.checks.failed)
                or manifest.pass_failures)


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
    key: str | Path | None = None,
) -> RunResult:
    """Run every selected model of `pipeline`; write run.json and report.md beside them.

    Models whose artefacts are up to date (same fingerprint, files intact, checks passed,
    and with a signing `key`, a good signature) are kept, unless `force`. With `key`, every
    artefact written is signed (see artifact/signing.py).
    """
    from aotpipe.artifact.fsio import OutputError, describe_os_error
    from aotpipe.artifact.writer import clean_stale
    from aotpipe.executors import run_local
    from aotpipe.report import write_reports

    start = time.perf_counter()
    if key is not None:
        from aotpipe.artifact.signing import load_key

        load_key(key, for_signing=True)  # a bad key is a user error before any work
        key = Path(key)
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
    results = run_local(specs, out_root, base_dir, progress=progress, force=force, key=key)
    run = RunResult(pipeline.name, out_root, results, time.perf_counter() - start, cleaned)
    write_reports(run, pipeline)
    return run
