"""One model's job: source -> capture -> passes -> write -> check, in whatever process runs it.

The executors run :func:`run_model` (bound to its arguments) wherever they run models; it
never raises for a model's own failure. Whether a model needs running at all is decided
before, by the runner (aotpipe/pipeline/incremental.py), so a warm re-run never gets here.

The runner imports this module in the parent process, which never imports torch: the
stages import what needs torch (capture, passes, the writer, the checks) when they run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotpipe.artifact.fsio import TMP_PREFIX
from aotpipe.errors import AotpipeError, CaptureError, SourceError, exception_line
from aotpipe.format.records import MANIFEST
from aotpipe.format.source_files import name_files_in
from aotpipe.format.vocabulary import STAGES as VOCABULARY_STAGES
from aotpipe.format.vocabulary import GraphKind, ModelStatus, Stage
from aotpipe.pipeline.incremental import kept_result, model_fingerprint, summed_checks
from aotpipe.pipeline.results import (
    GraphSummary,
    ModelResult,
    checks_summary,
    eager_cells,
    is_partial,
    outside_graphs_lines,
    sizes_text,
    static_named_dims,
    verification_summary,
    written_manifest,
)
from aotpipe.spec import ModelSpec
from aotpipe.spec.modes import CaptureMode, CaptureRequest, DynamicDims, capture_mode

if TYPE_CHECKING:  # torch and the modules that import it: the runner's parent process imports this one
    import torch

    from aotpipe.checks.written import ModelChecks
    from aotpipe.format.ir import CapturedGraphs
    from aotpipe.format.records import SkippedPass
    from aotpipe.models.eager import EagerReference, SubgraphReference
    from aotpipe.models.train_step import StepReference


@dataclass
class ModelJob:
    """One model's job as it goes through the stages: what each stage leaves for the next.
    A field a stage fills is None (or empty) until that stage has run; the stage that needs
    it takes it through the accessor that says so (:meth:`capture_result`)."""

    spec: ModelSpec
    mode: CaptureMode
    out_dir: Path
    base_dir: Path | None
    key: Path | None
    result: ModelResult
    stage: Stage = Stage.SOURCE  # the stage it is at: where it stopped if it fails
    fingerprint: str = ""
    model: torch.nn.Module | None = None  # source: the model as the capture mode builds it
    args: tuple[Any, ...] = ()  # source: its example inputs
    kwargs: dict[str, Any] = field(default_factory=dict)
    captured: CapturedGraphs | None = None  # capture (passes add their derived graphs)
    inputs: dict[str, list[Any]] | None = None  # capture: each graph's real inputs (None: a mode without values)
    pass_problems: list[str] = field(default_factory=list)
    skipped_passes: list[SkippedPass] = field(default_factory=list)  # optional passes left out
    pass_tracebacks: list[str] = field(default_factory=list)  # of the passes that failed, for -v
    diagnose: dict[str, Callable[[], str]] = field(default_factory=dict)  # by derived key: the pass at fault
    # write: what the checks compare against: the eager model, or dynamo's subgraphs by index
    eager: EagerReference | dict[int, EagerReference | SubgraphReference] | None = None
    steps: StepReference | None = None  # write: a train_step's eager steps (models/train_step.py)
    checks: ModelChecks | None = None  # write (at stage verify): what the checks found
    kinds: list[GraphKind] | None = None  # the graph kinds this process captures (None: the spec's)
    memory_gb: float | None = None  # the worker's memory limit (the model's resources', else the executor's)

    def built_model(self) -> torch.nn.Module:
        """The model, for a stage after source."""
        if self.model is None:
            raise RuntimeError(f"{self.spec.name}: stage {self.stage} needs the model, and source has not run")
        return self.model

    def capture_result(self) -> CapturedGraphs:
        """The captured graphs, for a stage after capture."""
        if self.captured is None:
            raise RuntimeError(f"{self.spec.name}: stage {self.stage} needs the captured graphs, and capture has not run")
        return self.captured

    def check_result(self) -> ModelChecks:
        """What the checks found, once they have run (in write, at stage verify)."""
        if self.checks is None:
            raise RuntimeError(f"{self.spec.name}: stage {self.stage} needs the checks' results, and they have not run")
        return self.checks

    def at(self, stage: Stage) -> None:
        """Enter `stage` (and tell the runner's progress bar)."""
        self.stage = _stage(self.spec, stage)


def _source(job: ModelJob) -> None:
    """The model and its example inputs, built as the capture mode builds them."""
    job.model = job.mode.function("build")(job.spec, job.base_dir)
    job.args, job.kwargs = job.mode.function("example_inputs")(job.spec, job.base_dir)
    if job.spec.device is not None and job.mode.values:  # device: cuda (a meta capture has no values to move)
        from aotpipe.models.inputs_data import on_device  # torch

        job.model, job.args, job.kwargs = on_device(job.spec, job.model, job.args, job.kwargs)
    if job.mode.values:  # an input mistake named as one, before capture blames it on tracing
        from aotpipe.models.eager import input_problem, layout_problem  # torch

        names = [inp.name or f"inputs[{i}]" for i, inp in enumerate(job.spec.inputs)]
        problem = layout_problem(job.model, job.args, job.kwargs, names) or \
            input_problem(job.model, job.args, job.kwargs, names)
        if problem is not None:
            raise SourceError(problem)


def _capture(job: ModelJob) -> None:
    """The graphs, by the capture mode; then (for a mode with values) each graph's real inputs."""
    import torch.utils._pytree as pytree  # torch: only in the process that runs the job

    from aotpipe.capture import custom_ops  # torch
    from aotpipe.capture.binding import graph_inputs  # torch
    from aotpipe.models import inputs_data  # torch
    from aotpipe.models.eager import model_state  # torch

    spec, mode = job.spec, job.mode
    names = [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)]
    ranges = {
        (inp.name or f"arg{i}"): (int(inp.low or 0), int(inp.high if inp.high is not None else 2))
        for i, inp in enumerate(spec.inputs)
        if inp.is_integer
    }
    dynamic = DynamicDims(ranges={n: (d.min, d.max) for n, d in spec.dims.items()},
                          inputs={n: tuple(inp.dims) for n, inp in zip(names, spec.inputs, strict=True) if inp.dims},
                          auto=spec.auto_dims) if spec.dynamic else None
    kinds = list(job.kinds or spec.graphs)
    step = GraphKind.TRAIN_STEP in kinds  # made from the joint, after the mode's capture (capture/train_step.py)
    asked = [k for k in kinds if k != GraphKind.TRAIN_STEP] + ([GraphKind.JOINT] if step and GraphKind.JOINT not in kinds else [])
    request = CaptureRequest(job.built_model(), job.args, job.kwargs, name=spec.name, graphs=tuple(asked),
                             input_names=tuple(names), int_ranges=ranges, loss=spec.loss, dynamic=dynamic,
                             step_autocast=spec.optimizer.autocast if step and spec.optimizer is not None else None)
    captured = job.captured = mode.capture_graphs(request)
    user = dict(zip(captured.user_inputs, pytree.tree_leaves((job.args, job.kwargs))))
    if step and spec.optimizer is not None:
        from aotpipe.capture.train_step import add_train_step  # torch

        add_train_step(captured, job.built_model(), job.args, job.kwargs, spec.loss, spec.optimizer, user,
                       keep_joint=GraphKind.JOINT in kinds)
    job.result.capture_seconds = captured.seconds
    if inputs_data.is_structured(spec):  # the manifest says what the graphs hold fixed
        captured.notes.append(inputs_data.structure_note(spec))
    job.result.notes = [name_files_in(n) for n in captured.notes]  # torch quotes files by absolute path
    # Library ops left after decomposition: refused unless the pipeline trusts their namespace.
    captured.trusted_ops = custom_ops.trust([g.gm for g in captured.graphs.values()], spec.trusted_ops)
    if mode.values:
        state = model_state(job.built_model(), captured.constants)
        job.inputs = graph_inputs(captured, state, user, with_backward=spec.save_values == "full")


def _passes(job: ModelJob) -> None:
    """The pass chain applied to the graph kinds it selects (the derived graphs join the capture)."""
    from aotpipe.passes.manager import apply_passes  # torch

    t0 = time.perf_counter()
    applied = apply_passes(job.spec, job.capture_result(), job.inputs)
    job.pass_problems, job.result.passes, job.diagnose = applied.problems, applied.runs, applied.diagnose
    job.skipped_passes = applied.skipped
    job.pass_tracebacks = applied.tracebacks + [lo.traceback for lo in applied.left_out]
    job.result.passes_seconds = time.perf_counter() - t0


def _write(job: ModelJob) -> None:
    """The artefact written, checked by :func:`_check` before it is renamed into place, and signed."""
    from aotpipe.artifact.writer import staged_model  # torch
    from aotpipe.capture import subgraph_references  # torch
    from aotpipe.models.eager import EagerReference  # torch
    from aotpipe.trust.signing import signer  # cryptography

    spec, result, captured = job.spec, job.result, job.capture_result()
    t0 = time.perf_counter()
    if spec.verify and job.mode.values:
        # A dynamo capture's graphs are checked against their own subgraph, run eagerly.
        job.eager = subgraph_references(captured) if captured.subgraphs else \
            EagerReference(job.built_model(), job.args, job.kwargs, captured.constants, captured.user_inputs, loss=spec.loss)
        if captured.step_start is not None and spec.optimizer is not None:
            from aotpipe.models.train_step import StepReference  # torch

            job.steps = StepReference(captured.step_start, job.args, job.kwargs, spec.loss, spec.optimizer)
    with staged_model(job.out_dir, captured, model_record=spec.to_json(), fingerprint=job.fingerprint,
                      inputs=job.inputs if spec.save_inputs else None, save_values=spec.save_values,
                      skipped_passes=job.skipped_passes) as staged:
        # The checks run on the written folder before it is renamed into place: stage verify.
        job.at(Stage.VERIFY)
        outcome = staged.check(functools.partial(_check, job))
        job.at(Stage.WRITE)  # signing and the rename
        written = staged.finish(outcome, pass_failures=job.pass_problems,
                                sign=signer(job.key) if job.key is not None else None)
    mc = job.check_result()
    result.checks_seconds = mc.seconds
    result.write_seconds = time.perf_counter() - t0 - mc.seconds
    _written_result(job, written)
    result.notes = [name_files_in(n) for n in captured.notes]  # with the checks' notes on eager's branches
    problems = mc.problems + result.verification.problems
    if problems:
        result.status, result.stage = ModelStatus.FAILED, Stage.VERIFY
        result.error = "; ".join(problems[:3])
    elif job.pass_problems:
        # The raw graphs were written and checked; the failing chain's graph was not kept.
        result.status, result.stage = ModelStatus.FAILED, Stage.PASSES
        result.error = "; ".join(job.pass_problems[:3])
    if job.pass_tracebacks:  # shown under -v, whether the model failed for them or not
        result.traceback = "\n".join(job.pass_tracebacks)


def _written_result(job: ModelJob, written: Any) -> None:
    """The job's result as its written artefact says: graphs, sizes, notes, checks; ok."""
    result = job.result
    manifest = written_manifest(written.path)
    result.notes = list(manifest.capture.notes)  # files named by module (name_files_in)
    result.graphs = [GraphSummary(kind=g.kind, folder=g.folder, nodes=g.nodes, inputs=g.num_inputs, outputs=g.num_outputs)
                     for g in written.graphs]
    result.bytes = written.bytes
    result.files = written.files
    result.status = ModelStatus.OK
    if is_partial(manifest):  # written and checked, but part of the model is in no graph
        result.status, result.outside_graphs = ModelStatus.PARTIAL, outside_graphs_lines(manifest)
    result.verification = verification_summary(manifest)
    result.checks = checks_summary(manifest)
    if manifest.dims is not None:
        result.sizes = sizes_text(manifest.dims)
    result.skipped_passes = list(manifest.skipped_passes)
    if job.mode.values:
        result.eager = eager_cells(manifest)


def _check(job: ModelJob, folder: Path) -> Any:
    """The written folder's checks (run by _write, before the rename): their outcome."""
    return _check_values(job, folder) if job.mode.values else _check_shapes(job, folder)


def _codes(job: ModelJob) -> dict[str, list[str]]:
    """Each captured graph's structure, which graph.json must rebuild exactly."""
    from aotpipe.artifact.writer import graph_entries  # torch
    from aotpipe.checks.written import graph_structure  # torch

    return {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(job.capture_result())}


def _check_shapes(job: ModelJob, folder: Path) -> Any:
    """A mode without values (meta): each graph run on fake tensors, for shapes only."""
    from aotpipe.checks.meta import check_meta_written  # torch

    mc = job.checks = check_meta_written(folder, codes=_codes(job), trust_ops=job.spec.trusted_ops, own_capture=True)
    _note_ops_refused_elsewhere(job)
    return mc.outcome


def _note_ops_refused_elsewhere(job: ModelJob) -> None:
    """Our own capture is never refused for its ops (checked with ops.OWN_CAPTURE); an op the
    list for artefacts from elsewhere lacks is said in the manifest's notes, since another
    loader refuses it until the list's rule covers it (tools/allowed_ops.py)."""
    from aotpipe.artifact.graph_json import target_name  # torch
    from aotpipe.artifact.ops import refused_elsewhere  # torch
    from aotpipe.artifact.writer import graph_entries  # torch

    captured = job.capture_result()
    names = {target_name(n.target) for _, _, _, g, _ in graph_entries(captured)
             for n in g.gm.graph.nodes if n.op == "call_function"}
    trusted = {ns for ns in job.spec.trusted_ops}
    outside = [n for n in refused_elsewhere(names) if n.partition(".")[0] not in trusted]
    if outside:
        note = (f"holds {len(outside)} op(s) the loader refuses in artefacts from elsewhere ({', '.join(outside[:5])}"
                f"{', ...' if len(outside) > 5 else ''}): checked here, where aotpipe captured it; "
                "another machine loads it once tools/allowed_ops.py's rule covers them")
        if note not in captured.notes:
            captured.notes.append(note)


def _check_values(job: ModelJob, folder: Path) -> Any:
    """Each graph run from its files against the eager model and the chain."""
    from aotpipe.checks.written import check_written  # torch

    spec, captured, diagnose = job.spec, job.capture_result(), job.diagnose
    mc = job.checks = check_written(folder, memory_inputs=job.inputs, codes=_codes(job), eager=job.eager,
                                    verify=spec.verify,
                                    diagnose=lambda key, lines: diagnose[key]() if key in diagnose else "",
                                    trust_ops=spec.trusted_ops, own_capture=True, steps=job.steps)
    _note_ops_refused_elsewhere(job)
    job.pass_problems.extend(mc.pass_failures)
    # Where eager took the traced branch (eager.traced_branches): into the manifest's notes.
    captured.notes.extend(n for n in getattr(job.eager, "notes", []) if n not in captured.notes)
    if spec.dynamic and (captured.mode == "export" or not spec.auto_dims) and not captured.static_sizes:
        _check_sizes(job, folder, mc)  # dynamo marks named dimensions dynamic too
    elif spec.dynamic:  # auto fell back to dynamo, which captured the example's sizes (dims: auto, or a split)
        from aotpipe.checks.sizes import static_dims  # torch

        mc.outcome.dims = static_dims(spec, f"specialised: captured by {captured.mode} at the example sizes "
                                            f"(export failed; {captured.static_sizes or 'dims: auto'})")
    return mc.outcome


def _check_sizes(job: ModelJob, folder: Path, mc: Any) -> None:
    """A shape-polymorphic capture's graphs checked at min, max and a random size too
    (checks/sizes.py): the manifest's `dims`; a failure at any size fails the model."""
    from aotpipe.capture.dynamic import assertion_holds, failed_assertion  # torch
    from aotpipe.capture.export import DEFERRED_GUARD  # torch
    from aotpipe.checks.sizes import check_sizes, size_one_hint  # torch

    start = time.perf_counter()
    spec, captured = job.spec, job.capture_result()
    make = job.mode.function("example_inputs")
    memory = spec.resources.memory_gb if spec.resources is not None and spec.resources.memory_gb else job.memory_gb
    dims = check_sizes(folder, spec, job.built_model(), lambda s: make(s, job.base_dir), captured.constants,
                       captured.user_inputs, captured.dims_report,
                       budget=int(memory * 2**30 / 2) if memory else None, trust_ops=spec.trusted_ops,
                       own_capture=True)
    mc.outcome.dims = dims
    mc.problems += static_named_dims(dims)
    deferred = [n.removeprefix(DEFERRED_GUARD) for n in captured.notes if n.startswith(DEFERRED_GUARD)]
    for c in dims.checked:
        at = ", ".join(f"{k}={v}" for k, v in c.sizes.items())
        if deferred and any("_assert_scalar" in p for p in c.problems):
            # a guard torch could not prove, kept as an assertion, fails here: torch's refusal says why
            where = assertion_holds(c.problems, captured.graphs)
            failing = failed_assertion(c.problems, captured.graphs)
            # deferred[0] is the first guard torch could not prove, which may hold everywhere (a
            # remainder of a padded length): the one false here leads where it is known
            said = (f"{failing} is false here (the graphs run only where it holds; the first guard torch could "
                    f"not prove at capture: {deferred[0]})" if failing else deferred[0])
            mc.problems.append(f"dims: at {c.point} ({at}) a run-time assertion the capture kept fails: {said}; "
                               + (f"{where}, or make the dimension static" if where else
                                  "narrow the range to where it holds, or make the dimension static"))
            continue
        mc.problems += [f"at {c.point} ({at}): {p}" for p in c.problems[:2]]
        if c.problems:
            mc.problems[-1] += size_one_hint(c, dims.checked)
    mc.seconds += time.perf_counter() - start  # the checks' time: at the example and at these sizes


# A model's stages in order: (name, the stage, whether the job needs it). The name is what the
# progress bar shows and, if the stage fails, the result's `stage` (vocabulary.Stage); the
# checks run inside write, before the folder is renamed into place, as stage verify.
STAGES: tuple[tuple[Stage, Callable[[ModelJob], None], Callable[[ModelJob], bool]], ...] = (
    (Stage.SOURCE, _source, lambda job: job.model is None),  # built already where the job decided on its size
    (Stage.CAPTURE, _capture, lambda job: True),
    (Stage.PASSES, _passes, lambda job: bool(job.spec.passes)),
    (Stage.WRITE, _write, lambda job: True),
)


def run_model(spec: ModelSpec, out_dir: Path, base_dir: Path | None = None, *, force: bool = False,
              key: Path | None = None, beside: bool | None = None, memory_gb: float | None = None) -> ModelResult:
    """Build, capture, write and check one model, unless its artefact is up to date.

    With a signing `key`, the artefact is signed as it is written, and one on disk counts
    as up to date only if its signature checks under that key.

    `beside`: capture mode meta's inference graph in a second process, beside the training
    graphs (see :func:`beside_kinds`); None decides by the cores the job has. `memory_gb`: the
    worker's memory limit, which bounds the size checks' largest point (half of it).

    Never raises for a model's own failure: the result says what failed and where.
    """
    start = time.perf_counter()
    result = ModelResult(name=spec.name, status=ModelStatus.FAILED)
    job = ModelJob(spec, capture_mode(spec.mode), out_dir, base_dir, key, result, memory_gb=memory_gb)
    job.at(Stage.SOURCE)
    try:
        job.fingerprint = model_fingerprint(spec, base_dir)
        if not force:
            kept = kept_result(spec, out_dir, job.fingerprint, key, start)
            if kept is not None:
                return kept
    except Exception as e:
        _failed(job, e)
    else:
        kinds = beside_kinds(spec, beside)
        if kinds is None:
            _attempt(job)
        else:
            _attempt(job, functools.partial(_run_beside_if_worth_it, kinds=kinds, always=beside is True))
    result.total_seconds = time.perf_counter() - start
    return result


def _attempt(job: ModelJob, run: Callable[[ModelJob], None] | None = None) -> None:
    """`run` (default: the job's stages) with the job's settings; a model's own failure is
    recorded in its result, never raised."""
    try:
        with _distribution_checks_off(), collections_paced():
            (run or _run)(job)
    except Exception as e:
        _failed(job, e)


def _failed(job: ModelJob, e: Exception) -> None:
    """The job's result says that `e` stopped it, at the stage it was at."""
    spec, result = job.spec, job.result
    if isinstance(e, AotpipeError):
        result.stage, result.error = job.stage, _said_what_next(spec, job.stage, str(e), e)
    else:  # a model's own code (or torch) failed: record it, go on
        result.stage, result.error = job.stage, _said_what_next(spec, job.stage, exception_line(e), e)
        result.exception = f"{type(e).__module__}.{type(e).__qualname__}"
    result.traceback = traceback.format_exc()


# ---------------------------------------------------------------------------------------
# Mode meta's inference graph captured beside its training graphs, in a second process

# Mode meta computes nothing, so a job given two or more cores (its intra-op threads: the
# process executor gives each worker its share) has a core its capture leaves idle. It
# captures the inference graph there, in a second interpreter, while it captures the training
# graphs; each writes and checks its graphs as a whole artefact would be, and the two
# folders are joined into one (writer.join_parts), the same files as one process writes.
# A Llama-3-70B-size config takes about 70% of one process's time (docs/capture-speed.md).
BESIDE_KINDS = (GraphKind.INFERENCE,)

# Starting the second interpreter (torch and the model's library imported again) costs a few
# seconds, repaid only where the inference capture takes longer: by the model's module count,
# a proxy for its graphs' size. Llama configs 64 wide, one process against two, wall: 2 layers
# (33 modules) 2.7 s against 5.9; 4 (59) 4.3 against 6.2; 8 (111) 8.0 against 7.5; 16 (215)
# 14.9 against 10.6; 32 (423) 29.7 against 20.1.
BESIDE_MIN_MODULES = 100


def beside_kinds(spec: ModelSpec, beside: bool | None = None) -> tuple[list[GraphKind], list[GraphKind]] | None:
    """(the kinds a second process captures, the kinds this one does) when the job may split
    so, else None: mode meta, no pass chain, both an inference and a training graph asked
    for, and `beside` true, or None and the job has two cores or more (it then splits if the
    model has :data:`BESIDE_MIN_MODULES` modules or more)."""
    first = [k for k in spec.graphs if k in BESIDE_KINDS]
    rest = [k for k in spec.graphs if k not in BESIDE_KINDS]
    if beside is False or spec.mode != "meta" or spec.passes or not first or not rest:
        return None
    if beside is None:
        import torch  # only in the process that runs the job

        if torch.get_num_threads() < 2:
            return None
    return first, rest


def _run_beside_if_worth_it(job: ModelJob, kinds: tuple[list[GraphKind], list[GraphKind]], always: bool = False) -> None:
    """The model built; then the job in two processes if it has :data:`BESIDE_MIN_MODULES`
    modules or more (or `always`), else in this one."""
    job.at(Stage.SOURCE)
    _source(job)
    if always or sum(1 for _ in job.built_model().modules()) >= BESIDE_MIN_MODULES:
        _run_beside(job, kinds)
    else:
        _run(job)


def _run_beside(job: ModelJob, kinds: tuple[list[GraphKind], list[GraphKind]]) -> None:
    """The job's stages in two processes, each capturing some of the graph kinds into a
    folder of its own under a temporary one; the two folders joined into the artefact."""
    import torch  # only in the process that runs the job

    from aotpipe.artifact.writer import join_parts  # torch
    from aotpipe.capture.meta import join_notes  # torch
    from aotpipe.trust.signing import signer  # cryptography

    spec, result = job.spec, job.result
    parts = job.out_dir / f"{TMP_PREFIX}{spec.name}.parts-{os.getpid()}"  # removed by clean_stale if killed
    job.at(Stage.CAPTURE)
    child = send = receive = None
    try:
        child, send, receive = _start_half()
        send.send((spec, parts / "0", job.base_dir, kinds[0], job.fingerprint, torch.get_num_threads()))
        mine = ModelJob(spec, job.mode, parts / "1", job.base_dir, None, ModelResult(name=spec.name, status=ModelStatus.FAILED),
                    fingerprint=job.fingerprint, model=job.model, args=job.args, kwargs=job.kwargs, kinds=kinds[1])
        _attempt(mine)
        try:
            theirs = receive.recv()
        except (EOFError, OSError):  # it died before it could say
            raise CaptureError(f"the process that captured the {', '.join(kinds[0])} graph beside this one died "
                               f"({_how_it_ended(_ended(child))}); next: rerun it, or capture it in one process "
                               "(OMP_NUM_THREADS=1: mode meta computes nothing, one core is enough)") from None
        halves = [theirs, mine.result]
        folders = [parts / "0" / spec.name, parts / "1" / spec.name]
        if all((f / MANIFEST).is_file() for f in folders):  # both written, checked (perhaps failing)
            job.at(Stage.WRITE)
            written = join_parts(folders, job.out_dir, spec.name, notes=join_notes,
                                 sign=signer(job.key) if job.key is not None else None)
            _written_result(job, written)
            result.graphs = [g for r in halves for g in r.graphs]  # in capture order, as one process lists them
        _failed_as_one(result, halves)
        # The halves ran side by side: each stage took the longer half's time.
        for f in ("capture_seconds", "passes_seconds", "write_seconds", "checks_seconds"):
            setattr(result, f, max(getattr(r, f) for r in halves))
    finally:
        for end in (send, receive):
            if end is not None:
                end.close()
        if child is not None:
            _ended(child)
        shutil.rmtree(parts, ignore_errors=True)


def _failed_as_one(result: ModelResult, halves: list[ModelResult]) -> None:
    """`result` failed as one process would have failed, if a half failed: at the earliest
    stage a half failed at (one process captures every kind before it writes any), with that
    half's error, or both halves' problems where both failed their checks."""
    failed = [r for r in halves if r.status != ModelStatus.OK]
    if not failed:
        return
    first = min(failed, key=lambda r: VOCABULARY_STAGES.index(r.stage) if r.stage in VOCABULARY_STAGES else 0)
    result.status = ModelStatus.FAILED
    for f in ("stage", "exception", "traceback"):
        setattr(result, f, getattr(first, f))
    same = [r.error or "" for r in failed if r.stage == first.stage]
    result.error = "; ".join(same) if first.stage == Stage.VERIFY else first.error


def _ended(child: Any, timeout: float = 30.0) -> int:
    """`child`'s exit code, once it has exited (killed if it has not within `timeout` s)."""
    import subprocess

    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _how_it_ended(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


# The second process: a fresh interpreter (not a fork of this one, whose threads' locks it would
# copy; not multiprocessing's spawn, which imports the caller's __main__ again) with this one's
# import path, told what to do through a pipe (see _half_main). It is killed if this process
# dies (executors/worker.py: _die_with_parent), as the process executor's workers are.
_HALF_CODE = ("import sys; from multiprocessing.connection import Connection; "
              "receive, send = Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False); "
              "sys.path[:] = receive.recv(); from aotpipe.pipeline.executors.worker import _die_with_parent; "
              "_die_with_parent(int(sys.argv[3])); from aotpipe.pipeline.job import _half_main; _half_main(receive, send)")


def _start_half() -> tuple[Any, Any, Any]:
    """The second process started: (its Popen, the connection to it, the one from it)."""
    import subprocess
    import sys
    from multiprocessing.connection import Connection

    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-c", _HALF_CODE, str(to_r), str(from_w), str(os.getpid())],
                                 pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL)  # its output goes where ours goes
    except BaseException:
        for fd in (to_w, from_r):
            os.close(fd)
        raise
    finally:
        os.close(to_r)
        os.close(from_w)  # so that its death is an EOF here
    send, receive = Connection(to_w, readable=False), Connection(from_r, writable=False)
    try:
        send.send(list(sys.path))
    except BaseException:
        send.close()
        receive.close()
        child.kill()
        child.wait()
        raise
    return child, send, receive


def _half_main(receive: Any, send: Any) -> None:
    """The second process of :func:`_run_beside`: the job's stages for the kinds it is sent;
    sends back its result."""
    import torch  # the process that runs the job

    spec, out_dir, base_dir, kinds, fingerprint, threads = receive.recv()
    torch.set_num_threads(threads)  # as the first process: the manifests' environment is one
    os.environ.pop(PROGRESS_DIR_ENV, None)  # the progress bar shows the first process's stage
    job = ModelJob(spec, capture_mode(spec.mode), out_dir, base_dir, None, ModelResult(name=spec.name, status=ModelStatus.FAILED),
               fingerprint=fingerprint, kinds=kinds)
    _attempt(job)
    send.send(job.result)


def _run(job: ModelJob) -> None:
    """The stages; for mode auto, again with dynamo where export lost a custom backward."""
    result = job.result
    if job.spec.distributed is not None:
        _run_distributed(job)
        return
    _run_stages(job)
    lost = _lost_custom_backwards(job)
    if lost and job.spec.mode == "auto":  # what auto does when export's capture fails: dynamo
        why = _LOST_BACKWARD.format(names=", ".join(lost))
        job.mode = capture_mode("dynamo")
        job.inputs, job.pass_problems, job.diagnose, job.eager, job.checks = None, [], {}, None, None
        job.skipped_passes, job.pass_tracebacks = [], []
        job.model = None  # built afresh, as dynamo's mode builds it
        result.status, result.stage, result.error = ModelStatus.FAILED, None, None
        try:
            _run_stages(job, fallback=why)
        except Exception as e:  # both reasons, as auto's export-failure fallback keeps them
            detail = str(e) if isinstance(e, AotpipeError) else exception_line(e)
            raise CaptureError(f"export's training graphs failed their gradient checks ({why}); dynamo "
                               f"failed: {detail}") from e
    elif lost:
        result.error = f"{result.error}; why: {_LOST_BACKWARD.format(names=', '.join(lost))}: capture with " \
                       "mode: dynamo (or auto), which keeps it"


def _run_distributed(job: ModelJob) -> None:
    """A distributed model (spec/distributed.py): every rank captured in turn on torch's fake
    process group (capture/distributed.py) and written as ``<name>.rank<r>``; then all ranks
    run together over gloo and are held to the eager model (checks/distributed.py) before
    any of them is put in place."""
    import torch.utils._pytree as pytree  # torch: only in the process that runs the job

    from aotpipe.artifact.writer import CheckOutcome, staged_model  # torch
    from aotpipe.capture.binding import graph_inputs  # torch
    from aotpipe.capture.distributed import capture_rank  # torch
    from aotpipe.checks.distributed import RANKS_KEY, check_ranks  # torch
    from aotpipe.trust.signing import signer  # cryptography

    spec, result = job.spec, job.result
    world = spec.distributed
    assert world is not None
    job.at(Stage.SOURCE)
    _source(job)
    job.at(Stage.CAPTURE)
    names = [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)]
    ranges = {n: (int(inp.low or 0), int(inp.high if inp.high is not None else 2))
              for n, inp in zip(names, spec.inputs, strict=True) if inp.is_integer}
    t0 = time.perf_counter()
    ranks = [capture_rank(job.built_model(), job.args, job.kwargs, spec=world, rank=r, name=f"{spec.name}.rank{r}",
                          graphs=tuple(spec.graphs), input_names=tuple(names), int_ranges=ranges, loss=spec.loss)
             for r in range(world.world_size)]
    result.capture_seconds = time.perf_counter() - t0
    result.notes = [name_files_in(n) for n in ranks[0].captured.notes]
    job.at(Stage.WRITE)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        staged = {}
        for rc in ranks:
            user = dict(zip(rc.captured.user_inputs, pytree.tree_leaves((rc.args, rc.kwargs)), strict=False))
            inputs = graph_inputs(rc.captured, rc.state, user, with_backward=spec.save_values == "full")
            staged[rc.record.rank] = stack.enter_context(staged_model(
                job.out_dir, rc.captured, model_record={**spec.to_json(), "name": rc.captured.model},
                fingerprint=job.fingerprint, inputs=inputs, save_values=spec.save_values))
        checked = None
        if spec.verify:
            job.at(Stage.VERIFY)
            checked = check_ranks({r: st.folder for r, st in staged.items()}, {rc.record.rank: rc.record for rc in ranks},
                                  job.built_model(), job.args, job.kwargs, spec.loss)
            result.checks_seconds = checked.seconds
            job.at(Stage.WRITE)
        sign = signer(job.key) if job.key is not None else None
        written = {r: st.finish(CheckOutcome(verification={RANKS_KEY: checked.entries[r]},
                                             checks=checked.totals.get(r)) if checked else None, sign=sign)
                   for r, st in staged.items()}
    result.write_seconds = time.perf_counter() - t0 - result.checks_seconds
    first = written[0]
    result.graphs = [GraphSummary(kind=g.kind, folder=g.folder, nodes=g.nodes, inputs=g.num_inputs,
                                  outputs=g.num_outputs) for g in first.graphs]
    result.bytes = sum(w.bytes for w in written.values())
    result.files = sum(w.files for w in written.values())
    collectives = sum(len(rc.record.collectives) for rc in ranks)
    result.notes.append(f"written as {world.world_size} artefacts, one per rank: {spec.name}.rank0 ... "
                        f"{spec.name}.rank{world.world_size - 1} ({collectives} collectives in all; graphs listed here: "
                        "rank 0's)")
    result.status = ModelStatus.OK
    if checked is not None:
        result.checks = summed_checks(list(checked.totals.values()))
    if checked is not None and checked.problems:
        result.status, result.stage = ModelStatus.FAILED, Stage.VERIFY
        result.error = "; ".join(checked.problems[:3])


# Python's cyclic garbage collector, as a job paces it (gc.set_threshold): a young collection
# every 100,000 container allocations instead of 700, and a full one at most every 50 x 1000
# of those. A job makes millions of long-lived objects (FX nodes, fake tensors, records) and
# each full collection walks them all. Six of the zoo's models, run as a worker runs them:
# 81.0 s of CPU with the defaults, 74.5 s at (10000, 50, 50), 67.5 s at these; their peak
# memory 6.09, 6.14 and 6.17 GiB. Objects are freed by reference counts as before; only
# garbage in cycles waits longer. (benchmarks/meta_bench.py measures the 70B-size capture.)
JOB_GC_THRESHOLDS = (100_000, 50, 1000)


@contextlib.contextmanager
def collections_paced(thresholds: tuple[int, int, int] = JOB_GC_THRESHOLDS) -> Iterator[None]:
    """Python's garbage collector at `thresholds` for the job, the caller's restored after."""
    was = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*was)


@contextlib.contextmanager
def _distribution_checks_off() -> Iterator[None]:
    """torch.distributions' argument checks off for the job, restored after.

    torch.compile turns them off for the rest of the process the first time dynamo runs
    (torch._dynamo.eval_frame.TorchPatcher). Left alone, a model that builds a distribution
    (GroupViT's Gumbel noise) was refused by torch.export on the checks' data-dependent
    guard in a fresh worker and captured by export in one where an earlier model had used
    dynamo: its outcome depended on the worker's history. Every job now runs as after
    dynamo. The checks only raise on invalid parameters; they change no value.
    """
    import torch  # only in the process that runs the job

    was = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(was)


# Why a model whose eager gradient runs custom autograd.Function backwards fails export mode's checks.
_LOST_BACKWARD = ("the model's torch.autograd.Function(s) {names} have a backward of their own, which torch.export "
                  "does not keep (it traces their forward, and AOTAutograd differentiates that instead)")


def _run_stages(job: ModelJob, fallback: str | None = None) -> None:
    for name, run, needed in STAGES:
        if needed(job):
            job.at(name)
            run(job)
            if name == Stage.CAPTURE and fallback is not None:  # said as auto's export-failure fallback is
                captured = job.capture_result()
                captured.fallback = fallback
                captured.notes.insert(0, f"export's training graphs failed their gradient checks ({fallback}); "
                                         "captured with dynamo, which keeps it")
                job.result.notes = [name_files_in(n) for n in captured.notes]


def _lost_custom_backwards(job: ModelJob) -> list[str]:
    """The custom autograd.Functions an export capture's training graphs failed their checks
    for: a backward or joint check failed, and the eager gradient ran their own backwards."""
    if job.result.status != ModelStatus.FAILED or job.result.stage != Stage.VERIFY or job.captured is None \
            or job.captured.mode != "export" or job.checks is None:
        return []
    failed = [key for key, gc in job.checks.graphs.items()
              if key.split(".")[0] in (GraphKind.BACKWARD, GraphKind.JOINT) and any(not c.passed for c in gc.checks)]
    eager = job.eager  # the eager model (an EagerReference), or dynamo's subgraphs by index
    run = eager.run("training") if failed and eager is not None and not isinstance(eager, dict) else None
    return list(run.custom_backwards) if run is not None else []


# The runner's progress bar shows each running model's stage: a job writes it to a file named
# after the model in this folder (set by the runner while its bar is shown; inherited by workers).
PROGRESS_DIR_ENV = "AOTPIPE_PROGRESS_DIR"


def _stage(spec: ModelSpec, stage: Stage) -> Stage:
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
    if stage != Stage.CAPTURE or error.startswith("dims: "):  # a dimension's refusal says its own fix
        return error
    from aotpipe.capture.hints import chain_text, with_hint  # torch (the capture package)

    return with_hint(spec.mode, error, chain_text(e))
