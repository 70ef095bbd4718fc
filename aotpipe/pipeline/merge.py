"""`aotpipe merge`: shard output trees -> one run.json and report, naming the gaps.

Each shard of `aotpipe run --shard I/N` writes an ordinary output tree whose run.json names
its shard and the models every shard shares out (its "selection"). Merging reads those
run.json files only: a model is *missing* when it is in the selection and in no shard's
run.json (a shard that never ran, or ran another pipeline version), *duplicated* when two
shards both report it (the first folder given wins; both are named). With an output folder
the merged tree holds every kept model's folder (hard links where the filesystem allows, so
no artefact is copied twice on one disk) and the merged run.json and report.

A shard may come from anyone (a tarball off a shared disk), so what it says is checked before
anything is written: its pipeline and model names are names (the pipeline file's rule, not
paths), it holds no symbolic link or special file where merge reads (run.json, each model's
folder and everything in it), and every place merge writes or removes lies inside `-o`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from pathlib import Path
from typing import Iterator, Optional

from aotpipe.artifact.fsio import OutputError, describe_os_error
from aotpipe.errors import AotpipeError
from aotpipe.format.records import DuplicatedModel, MergedShard, MergeRecord, ModelRun, RunRecord, updated
from aotpipe.pipeline.config import is_name
from aotpipe.pipeline.htmlreport import REPORT_HTML, write_html
from aotpipe.pipeline.report import REPORT_MD, RUN_JSON, write_reports
from aotpipe.pipeline.results import ModelResult, RunResult
from aotpipe.pipeline.shards import read_run_json

# What merge writes beside the model folders: no model may be named like one.
_REPORT_FILES = (RUN_JSON, REPORT_MD, REPORT_HTML)


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
        _refuse_link(inside[0])
        return inside[0]
    if not inside:
        raise AotpipeError(f"{given}: no {RUN_JSON} here or in a pipeline folder inside; give the folder "
                           "`aotpipe run --shard I/N -o DIR` wrote (DIR or DIR/<pipeline>)")
    raise AotpipeError(f"{given}: {len(inside)} pipeline folders inside ({', '.join(p.name for p in inside)}); "
                       "give the one to merge")


def model_result(record: ModelRun) -> ModelResult:
    """A ModelResult from its run.json record."""
    return ModelResult.model_validate(record.model_dump())


def _refuse_link(path: Path) -> None:
    """An AotpipeError when `path` is a symbolic link: one in a shard could point anywhere."""
    if path.is_symlink():
        raise AotpipeError(f"{path}: a symbolic link in a shard; merge reads only regular files and folders, "
                           "never where a link points (a shard's link can point anywhere): rerun that shard, or "
                           "replace the link by what it points to")


def _name_problem(value: str, *, model: bool) -> Optional[str]:
    """Why `value`, a pipeline or model name read from a shard's run.json, cannot name a folder
    inside -o, or None. The rule is the pipeline file's (config), so every name aotpipe run
    wrote passes."""
    if not is_name(value):
        return f"{value[:80]!r} is not a name (letters, digits, '_', '.', '-', not starting with '.')"
    if model and value in _REPORT_FILES:
        return f"{value!r} is the name of a file merge writes, not a model's"
    return None


def _check_names(path: Path, record: RunRecord) -> None:
    """An AotpipeError naming the first field of `record` (read from `path`) whose name would be
    a path: a run.json aotpipe run wrote holds only names its pipeline file allowed."""
    fields = [("pipeline", record.pipeline, False)]
    fields += [(f"models[{i}].name", m.name, True) for i, m in enumerate(record.models)]
    if record.shard is not None:
        fields += [(f"shard.selection[{i}]", n, True) for i, n in enumerate(record.shard.selection)]
    for field, value, model in fields:
        why = _name_problem(value, model=model)
        if why:
            raise AotpipeError(f"{path}: {field}: {why}; aotpipe run writes no such {RUN_JSON}, so merge will not "
                               "use it as a folder name: rerun that shard")


def _read(folder: Path) -> RunRecord:
    path = folder / RUN_JSON
    _refuse_link(path)
    try:
        record = read_run_json(path)
    except (OSError, AotpipeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:200]
        raise AotpipeError(f"{path}: not a run.json aotpipe can merge ({why}); rerun that shard") from None
    _check_names(path, record)
    return record


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
    recycled = [updated(x, shard=str(f)) for f, r in runs for x in r.executor.recycled or []]
    merge = MergeRecord(
        shards=[MergedShard(folder=str(f), shard=f"{r.shard.index}/{r.shard.count}" if r.shard else None,
                            models=len(r.models), seconds=r.seconds, **({"run": r.run} if r.run else {}))
                for f, r in runs],
        missing=missing,
        duplicated=duplicated,
    )
    out_root = Path(output) / pipelines[0] if output is not None else runs[0][0]
    kept = [(found[m.name][0][0], m.name) for m in models]
    if output is not None:
        _check_output(Path(output), out_root, kept)
    run = RunResult(pipelines[0], out_root, models, max(r.seconds for _, r in runs),
                    executor=kinds[0] if len(kinds) == 1 else "mixed",
                    workers=sum(r.executor.workers for _, r in runs),
                    recycled=recycled, merge=merge, allow_partial=all(bool(r.allow_partial) for _, r in runs))
    if output is not None:
        _link_models(out_root, kept)
        write_reports(run, NamedPipeline(pipelines[0]))  # type: ignore[arg-type]
        write_html(out_root)  # the merged tree's page, as a run writes its own
    return run


def _tree(path: Path) -> Iterator[tuple[Path, bool]]:
    """`path` and everything under it, folders before their contents, as (path, is a folder);
    an AotpipeError naming the first symbolic link or special file (a FIFO would block the
    copy, a device would be read)."""
    _refuse_link(path)
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode):
        yield path, False
        return
    if not stat.S_ISDIR(mode):
        raise AotpipeError(f"{path}: not a regular file or folder (a FIFO, socket or device) in a shard's model "
                           "folder; merge will not read it: rerun that shard")
    yield path, True
    for name in sorted(os.listdir(path)):
        yield from _tree(path / name)


def _inside(root: Path, path: Path) -> bool:
    """Whether `path`, its links resolved, lies in `root` (resolved)."""
    return path.resolve().is_relative_to(root.resolve())


def _check_output(output: Path, out_root: Path, models: list[tuple[Path, str]]) -> None:
    """An AotpipeError, before anything is written, when a kept model's shard folder holds a link
    or a special file, or when a place merge would write or remove (the pipeline folder, a
    model's folder) is a link or lies outside `output`."""
    try:
        for folder, name in models:
            src = folder / name
            if os.path.lexists(src):
                for _ in _tree(src):
                    pass
        for dst in [out_root] + [out_root / name for _, name in models]:
            _refuse_output_link(dst)
            if not _inside(output, dst):
                raise AotpipeError(f"{dst}: outside the output folder {output}; merge writes only inside -o")
    except OSError as e:
        raise AotpipeError(f"{e.filename or out_root}: cannot read it ({e.strerror}); rerun that shard or "
                           "choose another -o") from None


def _refuse_output_link(dst: Path) -> None:
    if dst.is_symlink():
        raise AotpipeError(f"{dst}: a symbolic link where merge would write; merge writes and removes only "
                           "inside -o, never through a link: remove the link or choose another -o")


def _link_models(out_root: Path, models: list[tuple[Path, str]]) -> None:
    """Each (run folder, model) folder into `out_root`, hard-linked where possible, each folder
    appearing whole or not at all; a model folder already in place from this shard is left."""
    def link_or_copy(src: Path, dst: Path) -> None:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)

    try:
        out_root.mkdir(parents=True, exist_ok=True)
        for folder, name in models:
            src, dst = folder / name, out_root / name
            _refuse_link(src)
            if not src.is_dir() or (dst.exists() and src.resolve() == dst.resolve()):
                continue  # a model that failed before writing has no folder
            tmp = out_root / f".merge-{name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                # _tree again, not copytree: a link put in the shard since _check_output is refused too
                for path, is_folder in _tree(src):
                    target = tmp / path.relative_to(src)
                    if is_folder:
                        target.mkdir()
                    else:
                        link_or_copy(path, target)
                _refuse_output_link(dst)
                if dst.exists():
                    shutil.rmtree(dst)
                os.replace(tmp, dst)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise OutputError(describe_os_error(e, Path(e.filename) if e.filename else out_root)) from None
