"""A whole pipeline: which models need running, run them on an executor, report.

Data flows one way: the runner decides what is up to date (aotpipe/pipeline/incremental.py, in
this process, without importing torch), hands the rest to an executor as tasks that call
:func:`aotpipe.pipeline.job.run_model`, and writes run.json and report.md from the results.

run.json describes the output tree, not only what this command did (:func:`keep_entries`):
a model found up to date keeps the entry the run that made its artefact wrote (its times,
status and checks, and which run measured them), and the models --only did not select keep
their entries as they were.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from aotpipe.artifact.fsio import OutputError, clean_stale, describe_os_error
from aotpipe.artifact.manifest import file_sha256
from aotpipe.errors import AotpipeError
from aotpipe.errors import AotpipeError as _E
from aotpipe.format.records import (
    MANIFEST,
    RUN_JSON,
    DroppedModel,
    ModelRun,
    RecycledWorker,
    RunRecord,
    RunStamp,
    ShardRecord,
    load_run,
)
from aotpipe.format.vocabulary import ModelStatus, Stage
from aotpipe.pipeline import incremental
from aotpipe.pipeline.config import check_sources
from aotpipe.pipeline.executors import Failure, Outcome, Resources, Task, make_executor
from aotpipe.pipeline.executors.process import ran_out_of_memory, retried_out_of_memory
from aotpipe.pipeline.htmlreport import write_html
from aotpipe.pipeline.job import PROGRESS_DIR_ENV, run_model
from aotpipe.pipeline.report import write_reports
from aotpipe.pipeline.results import ModelResult, RunResult, new_stamp
from aotpipe.pipeline.shards import Shard, shard_models
from aotpipe.spec import ModelSpec, Pipeline


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the results of the models that finished (their artefacts are on disk,
    each complete), the names of those it stopped part way (nothing of theirs looks finished)
    and of those it had not started."""

    def __init__(self, done: list[ModelResult], stopped: list[str], not_run: list[str]):
        super().__init__()
        self.done, self.stopped, self.not_run = done, stopped, not_run


def select_models(pipeline: Pipeline, only: tuple[str, ...] | list[str] | None) -> list[ModelSpec]:
    """The models to run: all, or those named by --only (an unknown name is a user error)."""
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
    executor: Optional[str] = None,
    workers: Optional[int] = None,
    shard: Optional[Shard] = None,
    shard_times: str | Path | None = None,
    sign: bool = True,
    allow_partial: bool = False,
) -> RunResult:
    """Run every selected model of `pipeline`; write run.json and report.md beside them.

    Models whose artefacts are up to date (same fingerprint, files intact, checks passed,
    and a good signature) are kept, unless `force`. Every artefact written is signed: with
    `key`, or else with the user's own key (trust/keyring.py: made on first use), unless
    not `sign`. `executor` and `workers` override
    the pipeline's executor settings. With `shard` (i of n), only that shard's share of the
    selected models runs (aotpipe/pipeline/shards.py: the same partition on every machine, balanced by
    `shard_times`, a run.json all shards read, else by a stable estimate); run.json names the
    shard and every model of the selection, so that `aotpipe merge` can name the missing ones.
    `allow_partial`: a partial model (part of it outside its graphs) leaves the run ok.
    """
    start = time.perf_counter()
    stamp = new_stamp()
    if key is not None or sign:  # the key given, else the user's own
        from aotpipe.trust.keyring import signing_key_spec  # cryptography: only when used

        key = signing_key_spec(key)
    specs = select_models(pipeline, only)
    shard_record = None
    if shard is not None:
        selected = [s.name for s in specs]
        specs = shard_models(specs, shard, Path(shard_times) if shard_times is not None else None)
        shard_record = ShardRecord(index=shard.index, count=shard.count, selection=selected)
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
    last, previous = previous_run(out_root)
    base_dir = Path(pipeline.path).resolve().parent if Path(pipeline.path).exists() else None
    ex = pipeline.executor
    kind = executor or ex.kind
    n_workers = workers or ex.workers
    recycled: list[RecycledWorker] = []
    results = _run_models(specs, out_root, base_dir, kind=kind, workers=n_workers, pipeline=pipeline,
                          progress=progress, force=force, key=key, recycled=recycled, stamp=stamp, last=last)
    run = RunResult(pipeline.name, out_root, results, time.perf_counter() - start, cleaned, kind,
                    n_workers if kind == "process" else 1, shard=shard_record, recycled=recycled,
                    allow_partial=allow_partial, stamp=stamp, previous=previous)
    if shard is None:  # a shard's run.json lists its own share: merge reads each shard's
        run.listed, run.dropped = keep_entries([m.name for m in pipeline.models], results, last, out_root)
    write_reports(run, pipeline)
    write_html(out_root)  # from what is now on disk, as `aotpipe report` rebuilds it
    return run


def previous_run(out_root: Path) -> tuple[Optional[RunRecord], Optional[str]]:
    """(the run.json in `out_root` before this run, or None; why it could not be read, where
    it is there but is not one: an older aotpipe's cut short, or a newer aotpipe's)."""
    if not (out_root / RUN_JSON).exists():
        return None, None
    try:
        return load_run(out_root), None
    except (OSError, AotpipeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:300]
        return None, f"the run.json before this run could not be read, so no entry was kept from it: {why}"


def manifest_sha256(folder: Path) -> Optional[str]:
    """The sha256 of `folder`'s manifest.json; None where there is none (or it cannot be read)."""
    try:
        return file_sha256(folder / MANIFEST)
    except OSError:
        return None


def kept_result(checked: ModelResult, last: Optional[ModelRun], folder: Path) -> ModelResult:
    """The result of a model found up to date (`checked`, built from its manifest): the entry
    the run.json before holds for this very artefact (same manifest sha256), kept whole and
    marked skipped; else `checked` with no measurement (the run that wrote the artefact did
    not finish, or timed another artefact of the model)."""
    sha = manifest_sha256(folder)
    if last is not None and sha is not None and last.manifest_sha256 == sha and last.status in (ModelStatus.OK, ModelStatus.PARTIAL):
        return ModelResult.model_validate(last.model_dump(exclude_unset=True) | {"skipped": True})
    for name in ("capture_seconds", "passes_seconds", "checks_seconds", "write_seconds", "total_seconds"):
        setattr(checked, name, 0.0)  # the time the check took is no measurement of the model
    checked.measured_in, checked.manifest_sha256 = None, sha
    return checked


def keep_entries(names: list[str], results: list[ModelResult], last: Optional[RunRecord],
                 out_root: Path) -> tuple[list[ModelRun], list[DroppedModel]]:
    """run.json's entries, in the pipeline's order (`names`): this run's results, and for the
    models it did not select, their entries in the run.json before (`last`), as they were; and
    the entries of `last` not carried over, and why: a model no longer in the pipeline, or one
    whose artefact the entry describes is gone or was replaced since."""
    ran = {r.name: r for r in results}
    before = {m.name: m for m in last.models} if last is not None else {}
    listed: list[ModelRun] = []
    dropped: list[DroppedModel] = []
    for name in names:
        if name in ran:
            listed.append(ran[name].to_record())
            continue
        entry = before.get(name)
        if entry is None:
            continue
        if entry.status in (ModelStatus.OK, ModelStatus.PARTIAL):
            sha = manifest_sha256(out_root / name)
            if sha is None:
                dropped.append(DroppedModel(name=name, reason=f"its artefact ({name}/) is gone; run it to make it"))
                continue
            if entry.manifest_sha256 is not None and sha != entry.manifest_sha256:
                dropped.append(DroppedModel(name=name, reason=f"its artefact ({name}/) was replaced since the run "
                                                              "that measured it; run it to measure it again"))
                continue
        listed.append(entry)
    for name in before:
        if name not in names:
            left = f" (its folder {name}/ is left on disk: delete it to drop it from report.html)" \
                if (out_root / name).is_dir() else ""
            dropped.append(DroppedModel(name=name, reason=f"no longer in the pipeline{left}"))
    return listed, dropped


def _run_models(specs: list[ModelSpec], out_root: Path, base_dir: Optional[Path], *, kind: str, workers: int,
                pipeline: Pipeline, progress: bool, force: bool, key: Optional[Path],
                recycled: Optional[list[RecycledWorker]] = None, stamp: Optional[RunStamp] = None,
                last: Optional[RunRecord] = None) -> list[ModelResult]:
    """Keep what is up to date (with the entry `last`, the run.json before, holds for it);
    run the rest on the executor, their results stamped with `stamp`; one result per spec, in
    order. Workers the executor replaced (recycled) are appended to `recycled`."""
    from tqdm import tqdm

    results: list[Optional[ModelResult]] = [None] * len(specs)
    # disable=None: tqdm shows the bar on a terminal only, never in a redirected log
    bar = tqdm(total=len(specs), unit="model", disable=None if progress else True, dynamic_ncols=True)
    running: list[str] = []
    stages = _StageWatch(bar, running) if not bar.disable else None

    fresh = ran_out_of_memory_last_run(out_root)
    before = {m.name: m for m in last.models} if last is not None else {}
    stamp = stamp or new_stamp()

    def measured(r: ModelResult) -> ModelResult:
        r.measured_in = stamp
        if r.status in (ModelStatus.OK, ModelStatus.PARTIAL):  # a failed model's folder, if any, is an earlier artefact
            r.manifest_sha256 = manifest_sha256(out_root / r.name)
        return r

    def finished(i: int, r: ModelResult) -> None:
        if r.name in fresh:  # the mark stays: a model that passes afresh would run out again in a used worker
            r.fresh_worker = True
        results[i] = r
        bar.set_postfix_str(f"{r.name}: {'up to date' if r.skipped else r.status}")
        if r.status == ModelStatus.FAILED and progress:
            bar.write(f"FAILED {r.name} ({r.stage}): {r.error}")
        bar.update(1)

    try:
        todo = []
        for i, spec in enumerate(specs):
            kept = None if force else incremental.check(spec, out_root, base_dir, key)
            if kept is not None:
                finished(i, kept_result(kept, before.get(spec.name), out_root / spec.name))
            else:
                todo.append(i)
        if not todo:
            return [r for r in results if r is not None]

        check_sources(pipeline, [specs[i] for i in todo])  # what was not checked at load
        todo = longest_first(todo, [s.name for s in specs], out_root)
        ex = pipeline.executor
        executor = make_executor(kind, workers=workers, timeout_s=ex.timeout_s, memory_gb=ex.memory_gb,
                                 address=ex.address, max_models_per_worker=ex.max_models_per_worker,
                                 recycle_memory_gb=ex.recycle_memory_gb)
        # Absolute paths: a worker (a Ray worker above all) may start in another folder.
        root = out_root.resolve()
        resources = {i: _resources(specs[i], pipeline) for i in todo}
        tasks = [Task(specs[i].name, functools.partial(run_model, specs[i], root, base_dir, force=True, key=key,
                                                       memory_gb=resources[i].memory_gb),
                      resources[i], fresh=specs[i].name in fresh) for i in todo]

        def on_start(t: int) -> None:
            running.append(tasks[t].name)
            bar.set_description(stages.describe() if stages else ", ".join(running[-3:]))

        def on_done(t: int, outcome: Outcome) -> None:
            name = tasks[t].name
            if name in running:
                running.remove(name)
            if isinstance(outcome, Failure):
                r = ModelResult(name=name, status=ModelStatus.FAILED, stage=Stage.WORKER, error=outcome.reason,
                                traceback=outcome.detail)
            else:
                r = outcome
            r = measured(r)
            # A dead worker's half-written folder: this model's, or an earlier attempt's (a model
            # out of memory in a used worker runs again in a fresh one).
            clean_stale(out_root)
            finished(todo[t], r)

        with stages if stages is not None else contextlib.nullcontext():
            try:
                executor.run(tasks, on_start=on_start, on_done=on_done)
            finally:
                if recycled is not None:
                    recycled.extend(RecycledWorker(pid=r.pid, after=r.after, models=r.tasks, reason=r.reason,
                                                   **({"out_of_memory": True} if r.out_of_memory else {}))
                                    for r in getattr(executor, "recycled", []))
    except KeyboardInterrupt:
        clean_stale(out_root)  # the folder of a model stopped part way
        left = [s.name for s, r in zip(specs, results) if r is None]
        raise RunInterrupted([r for r in results if r is not None], [n for n in left if n in running],
                             [n for n in left if n not in running]) from None
    finally:
        bar.close()
    return [r for r in results if r is not None]


class _StageWatch:
    """While entered: the stage each running model is at (source, capture, passes, write, verify),
    as its job reports it (job.PROGRESS_DIR_ENV), shown in the bar's description twice a second."""

    def __init__(self, bar: Any, running: list[str]):
        self.bar, self.running = bar, running
        self.folder: Optional[Path] = None
        self.stop = threading.Event()

    def describe(self) -> str:
        parts = []
        for name in self.running[-3:]:
            try:
                stage = (self.folder / name).read_text().strip() if self.folder else ""
            except OSError:
                stage = ""
            parts.append(f"{name}: {stage}" if stage else name)
        return ", ".join(parts)

    def _watch(self) -> None:
        while not self.stop.wait(0.5):
            self.bar.set_description(self.describe(), refresh=True)

    def __enter__(self) -> "_StageWatch":
        self.folder = Path(tempfile.mkdtemp(prefix="aotpipe-progress-"))
        self._saved = os.environ.get(PROGRESS_DIR_ENV)
        os.environ[PROGRESS_DIR_ENV] = str(self.folder)
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        if self._saved is None:
            os.environ.pop(PROGRESS_DIR_ENV, None)
        else:
            os.environ[PROGRESS_DIR_ENV] = self._saved
        shutil.rmtree(self.folder, ignore_errors=True)


def _last_run(out_root: Path) -> Optional[RunRecord]:
    """The last run's run.json in `out_root`; None if there is none or it does not read."""
    try:
        return load_run(out_root)
    except (OSError, AotpipeError):
        return None


def longest_first(todo: list[int], names: list[str], out_root: Path) -> list[int]:
    """`todo` in the order to start them: models the last run (its run.json) did not time first,
    in pipeline order, then the rest, longest first. With N workers the batch then ends with
    short models running beside each other, not with one long model running alone."""
    last = _last_run(out_root)
    took = {m.name: m.total_seconds for m in last.models if m.has_measurement() and m.total_seconds} if last else {}
    unknown = [i for i in todo if names[i] not in took]
    known = sorted((i for i in todo if names[i] in took), key=lambda i: -took[names[i]])
    return unknown + known


def ran_out_of_memory_last_run(out_root: Path) -> set[str]:
    """The models that ran out of memory in the last run (its run.json): in a used worker (its
    replacement says so; the model then ran again in a fresh one) or in a fresh one (its failure),
    and those it already started in a fresh worker for that reason (`fresh_worker`: the mark
    stays, or a model that passed afresh would run out again in a used worker the run after).
    This run starts them in a fresh worker (Task.fresh), which spares a first run that the
    leftovers of the models before it would push over the limit again."""
    last = _last_run(out_root)
    if last is None:
        return set()
    names = {r.after for r in last.executor.recycled or []
             if r.out_of_memory or (r.out_of_memory is None and retried_out_of_memory(r.reason))}
    names |= {m.name for m in last.models if m.fresh_worker or (
        m.status != ModelStatus.OK and m.stage == Stage.WORKER and m.error and ran_out_of_memory(m.error))}
    return names


def _resources(spec: ModelSpec, pipeline: Pipeline):
    ex, own = pipeline.executor, spec.resources
    pick = lambda name, default: getattr(own, name) if own is not None and getattr(own, name) is not None \
        else default  # noqa: E731
    return Resources(num_cpus=pick("num_cpus", ex.num_cpus), num_gpus=pick("num_gpus", ex.num_gpus),
                     memory_gb=pick("memory_gb", ex.memory_gb), timeout_s=pick("timeout_s", ex.timeout_s))
