"""One model's job: source -> capture -> passes -> write -> check, in whatever process runs it.

The executors run :func:`run_model` (bound to its arguments) wherever they run models; it
never raises for a model's own failure. Whether a model needs running at all is decided
before, by the runner (aotpipe/incremental.py), so a warm re-run never gets here.
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from pathlib import Path
from typing import Any

from aotpipe.spec import ModelSpec
from aotpipe.errors import AotpipeError, exception_line
from aotpipe.results import GraphResult, ModelResult, checks_summary, eager_cell, verification_summary, written_manifest


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
    from aotpipe.capture import capture_auto, capture_dynamo, capture_export, custom_ops, subgraph_references
    from aotpipe.capture.binding import graph_inputs
    from aotpipe.checks.written import ModelChecks, check_written, graph_structure
    from aotpipe.eager import EagerReference, model_state
    from aotpipe.incremental import model_fingerprint, skipped_result, up_to_date
    from aotpipe.passes.manager import apply_passes
    from aotpipe.sources import build_model, make_example_inputs

    start = time.perf_counter()
    result = ModelResult(name=spec.name, status="failed")
    stage = _stage(spec, "source")
    try:
        fp = model_fingerprint(spec, base_dir)
        if not force:
            manifest = up_to_date(out_dir / spec.name, fp, key)
            if manifest is not None:
                return skipped_result(spec, out_dir / spec.name, manifest, start)
        meta = spec.mode == "meta"  # built on the meta device: shapes only, no values anywhere
        if meta:
            from aotpipe.capture.meta import build_on_meta, capture_meta, meta_example_inputs

            model = build_on_meta(spec, base_dir)
            args, kwargs = meta_example_inputs(spec)
        else:
            model = build_model(spec, base_dir)
            args, kwargs = make_example_inputs(spec)
        names = [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)]
        ranges = {
            (inp.name or f"arg{i}"): (int(inp.low or 0), int(inp.high if inp.high is not None else 2))
            for i, inp in enumerate(spec.inputs)
            if inp.is_integer
        }
        stage = _stage(spec, "capture")
        capture = capture_meta if meta else \
            {"export": capture_export, "dynamo": capture_dynamo,
             "auto": functools.partial(capture_auto, export=capture_export)}[spec.mode]
        loss = {} if spec.mode == "dynamo" else {"loss": spec.loss}  # dynamo's joint has no loss
        captured = capture(
            model, args, kwargs, name=spec.name, graphs=list(spec.graphs), input_names=names, int_ranges=ranges,
            **loss,
        )
        result.capture_seconds = captured.seconds
        result.notes = list(captured.notes)
        # Library ops left after decomposition: refused unless the pipeline trusts their namespace.
        captured.trusted_ops = custom_ops.trust([g.gm for g in captured.graphs.values()], spec.trusted_ops)
        if meta:
            return _write_meta(spec, out_dir, captured, fp, key, result, start)
        state = model_state(model, captured.constants)
        user = dict(zip(captured.user_inputs, pytree.tree_leaves((args, kwargs))))
        inputs = graph_inputs(captured, state, user, with_backward=spec.save_values == "full")
        pass_problems: list[str] = []
        diagnose: dict[str, Any] = {}
        if spec.passes:
            stage = _stage(spec, "passes")
            t0 = time.perf_counter()
            pass_problems, result.passes, diagnose = apply_passes(spec, captured, inputs)
            result.passes_seconds = time.perf_counter() - t0
        stage = _stage(spec, "write")
        t0 = time.perf_counter()
        eager: Any = None
        if spec.verify:
            # A dynamo capture's graphs are checked against their own subgraph, run eagerly.
            eager = subgraph_references(captured) if captured.subgraphs else \
                EagerReference(model, args, kwargs, captured.constants, captured.user_inputs, loss=spec.loss)
        checked: list[ModelChecks] = []

        def check(folder: Path) -> Any:
            codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(captured)}
            mc = check_written(folder, memory_inputs=inputs, codes=codes, eager=eager, verify=spec.verify,
                               diagnose=lambda key, lines: diagnose[key]() if key in diagnose else "",
                               trust_ops=spec.trusted_ops)
            checked.append(mc)
            pass_problems.extend(mc.pass_failures)
            # Where eager took the traced branch (eager.traced_branches): into the manifest's notes.
            captured.notes.extend(n for n in getattr(eager, "notes", []) if n not in captured.notes)
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
        result.notes = list(captured.notes)
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
        result.stage, result.error = stage, _said_what_next(spec, stage, str(e), e)
        result.traceback = traceback.format_exc()
    except Exception as e:  # a model's own code (or torch) failed: record it, go on
        result.stage, result.error = stage, _said_what_next(spec, stage, exception_line(e), e)
        result.exception = f"{type(e).__module__}.{type(e).__qualname__}"
        result.traceback = traceback.format_exc()
    result.total_seconds = time.perf_counter() - start
    return result


# The runner's progress bar shows each running model's stage: a job writes it to a file named
# after the model in this folder (set by the runner while its bar is shown; inherited by workers).
PROGRESS_DIR_ENV = "AOTPIPE_PROGRESS_DIR"


def _stage(spec: ModelSpec, stage: str) -> str:
    """`stage`, after telling the runner's progress bar (if there is one) that the model is at it."""
    folder = os.environ.get(PROGRESS_DIR_ENV)
    if folder:
        try:
            (Path(folder) / spec.name).write_text(stage)
        except OSError:
            pass  # progress is a courtesy: never a model's failure
    return stage


def _said_what_next(spec: ModelSpec, stage: str, error: str, e: BaseException) -> str:
    """A capture failure's line with what to try next (capture/hints.py); other stages' as they are."""
    if stage != "capture":
        return error
    from aotpipe.capture.hints import chain_text, with_hint

    return with_hint(spec.mode, error, chain_text(e))


def _write_meta(spec: ModelSpec, out_dir: Path, captured: Any, fp: str, key: Path | None, result: ModelResult,
                start: float) -> ModelResult:
    """Write a meta capture: metadata only (no blobs), each graph checked for shapes on fake
    tensors (capture/meta.py). The config refuses passes for mode meta (they need values)."""
    from aotpipe.artifact.signing import signer
    from aotpipe.artifact.writer import graph_entries, write_model
    from aotpipe.checks.written import graph_structure
    from aotpipe.checks.meta import check_meta_written

    checked: list[Any] = []
    t0 = time.perf_counter()

    def check(folder: Path) -> Any:
        codes = {k: graph_structure(g.gm) for k, _, _, g, _ in graph_entries(captured)}
        checked.append(check_meta_written(folder, codes=codes, trust_ops=spec.trusted_ops))
        return checked[-1].outcome

    written = write_model(out_dir, captured, model_record=spec.to_json(), fingerprint=fp, inputs=None,
                          save_values=spec.save_values, check=check, pass_failures=[],
                          sign=signer(key) if key is not None else None)
    mc = checked[0]
    result.checks_seconds = mc.seconds
    result.write_seconds = time.perf_counter() - t0 - mc.seconds
    result.graphs = [GraphResult(g.kind, g.folder, g.nodes, g.num_inputs, g.num_outputs) for g in written.graphs]
    result.bytes, result.files = written.bytes, written.files
    manifest = written_manifest(written.path)
    result.verification = verification_summary(manifest)
    result.checks = checks_summary(manifest)
    problems = mc.problems + result.verification["problems"]
    result.status = "failed" if problems else "ok"
    if problems:
        result.stage, result.error = "verify", "; ".join(problems[:3])
    result.total_seconds = time.perf_counter() - start
    return result
