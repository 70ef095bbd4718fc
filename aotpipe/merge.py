"""`aotpipe merge`: shard output trees -> one run.json and report, naming the gaps.

Each shard of `aotpipe run --shard I/N` writes an ordinary output tree whose run.json names
its shard and the models every shard shares out (its "selection"). Merging reads those
run.json files only: a model is *missing* when it is in the selection and in no shard's
run.json (a shard that never ran, or ran another pipeline version), *duplicated* when two
shards both report it (the first folder given wins; both are named). With an output folder
the merged tree holds every kept model's folder (hard links where the filesystem allows, so
no artefact is copied twice on one disk) and the merged run.json and report.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Optional

from aotpipe.format.records import DuplicatedModel, MergedShard, MergeRecord, ModelRun, RunRecord
from aotpipe.errors import AotpipeError
from aotpipe.results import ModelResult, RunResult
from aotpipe.shards import read_run_json
from aotpipe.artifact.fsio import OutputError, describe_os_error
from aotpipe.htmlreport import write_html
from aotpipe.report import RUN_JSON, write_reports


@dataclasses.dataclass(frozen=True)
class NamedPipeline:
    """What the report writer reads of a pipeline: its name (merge has no YAML)."""

    name: str


def run_folder(given: Path) -> Path:
    """The run folder (the one holding run.json) for a path given to merge: itself, or the one
    pipeline folder inside it (`-o DIR` of `aotpipe run` makes DIR/<pipeline>/)."""
    if (given / RUN_JSON).is_file():
        return given
    if not given.is_dir():
        raise AotpipeError(f"{given}: no such folder; give the output folder of `aotpipe run --shard I/N`")
    inside = sorted(p.parent for p in given.glob(f"*/{RUN_JSON}") if p.is_file())
    if len(inside) == 1:
        return inside[0]
    if not inside:
        raise AotpipeError(f"{given}: no {RUN_JSON} here or in a pipeline folder inside; give the folder "
                           "`aotpipe run --shard I/N -o DIR` wrote (DIR or DIR/<pipeline>)")
    raise AotpipeError(f"{given}: {len(inside)} pipeline folders inside ({', '.join(p.name for p in inside)}); "
                       "give the one to merge")


def model_result(record: ModelRun) -> ModelResult:
    """A ModelResult from its run.json record."""
    return ModelResult.model_validate(record.model_dump())


def _read(folder: Path) -> RunRecord:
    try:
        return read_run_json(folder / RUN_JSON)
    except (OSError, AotpipeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:200]
        raise AotpipeError(f"{folder / RUN_JSON}: not a run.json aotpipe can merge ({why}); rerun that shard") \
            from None


def merge_runs(folders: list[Path], output: Optional[Path] = None) -> RunResult:
    """Merge the runs in `folders` (shard output trees); with `output`, write the merged tree
    (model folders, run.json, report) in `output`/<pipeline>/. Raises AotpipeError when the
    folders are not runs of one pipeline sharded one way."""
    runs = [(f, _read(f)) for f in (run_folder(Path(g)) for g in folders)]
    pipelines = sorted({r.pipeline for _, r in runs})
    if len(pipelines) > 1:
        raise AotpipeError(f"the folders hold runs of different pipelines ({', '.join(map(repr, pipelines))}); "
                           "merge the shards of one pipeline at a time")
    shard_records = [(f, r.shard) for f, r in runs if r.shard is not None]
    counts = sorted({s.count for _, s in shard_records})
    if len(counts) > 1:
        raise AotpipeError(f"the shards were cut into different counts ({', '.join(map(str, counts))}): a model "
                           "can be in two shards or none; rerun them all with one --shard I/N count")
    expected: list[str] = []
    for f, s in shard_records:
        if expected and s.selection != expected:
            raise AotpipeError(f"{f}: its shard shares out other models than {shard_records[0][0]}'s (another "
                               "pipeline version or --only); rerun the shards from one pipeline file")
        expected = list(s.selection)

    found: dict[str, list[tuple[Path, ModelRun]]] = {}
    for f, r in runs:
        for m in r.models:
            found.setdefault(m.name, []).append((f, m))
    order = expected + [n for n in found if n not in expected]
    models = [model_result(found[n][0][1]) for n in order if n in found]
    missing = [n for n in expected if n not in found]
    duplicated = [DuplicatedModel(name=n, folders=[str(f) for f, _ in found[n]]) for n in order
                  if len(found.get(n, [])) > 1]
    kinds = sorted({r.executor.kind for _, r in runs})
    recycled = [x.model_copy(update={"shard": str(f)}) for f, r in runs for x in r.executor.recycled or []]
    merge = MergeRecord(
        shards=[MergedShard(folder=str(f), shard=f"{r.shard.index}/{r.shard.count}" if r.shard else None,
                            models=len(r.models), seconds=r.seconds) for f, r in runs],
        missing=missing,
        duplicated=duplicated,
    )
    out_root = Path(output) / pipelines[0] if output is not None else runs[0][0]
    run = RunResult(pipelines[0], out_root, models, max(r.seconds for _, r in runs),
                    executor=kinds[0] if len(kinds) == 1 else "mixed",
                    workers=sum(r.executor.workers for _, r in runs),
                    recycled=recycled, merge=merge)
    if output is not None:
        _link_models(out_root, [(found[m.name][0][0], m.name) for m in models])
        write_reports(run, NamedPipeline(pipelines[0]))  # type: ignore[arg-type]
        write_html(out_root)  # the merged tree's page, as a run writes its own
    return run


def _link_models(out_root: Path, models: list[tuple[Path, str]]) -> None:
    """Each (run folder, model) folder into `out_root`, hard-linked where possible, each folder
    appearing whole or not at all; a model folder already in place from this shard is left."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    try:
        out_root.mkdir(parents=True, exist_ok=True)
        for folder, name in models:
            src, dst = folder / name, out_root / name
            if not src.is_dir() or (dst.exists() and src.resolve() == dst.resolve()):
                continue  # a model that failed before writing has no folder
            tmp = out_root / f".merge-{name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, copy_function=link_or_copy, symlinks=True)
            if dst.exists():
                shutil.rmtree(dst)
            os.replace(tmp, dst)
    except OSError as e:
        raise OutputError(describe_os_error(e, Path(e.filename) if e.filename else out_root)) from None
