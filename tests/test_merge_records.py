"""aotpipe merge over run.json files alone: which models are missing or duplicated, what the
merged record says, and where it may write. No model is captured: each run.json is a record
written as `aotpipe run` writes one, and a model's folder is a few plain files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import pytest
from click.testing import CliRunner

from aotpipe.artifact.manifest import versions
from aotpipe.cli import main
from aotpipe.errors import AotpipeError
from aotpipe.format.records import (
    ExecutorRecord,
    ModelRun,
    RecycledWorker,
    RunRecord,
    RunStamp,
    RunSummary,
    ShardRecord,
    load_run,
)
from aotpipe.pipeline.merge import merge_runs, run_folder
from aotpipe.pipeline.report import dump_run


def write_run(folder: Path, models: list[str], *, pipeline: str = "p", shard: Optional[tuple[int, int]] = None,
              selection: Optional[list[str]] = None, failed: tuple[str, ...] = (), kind: str = "local",
              workers: int = 1, seconds: float = 1.0, allow_partial: Optional[bool] = None,
              version: int = 3, stamp: str = "r1", recycled: Optional[list[RecycledWorker]] = None,
              folders: bool = True) -> Path:
    """A run.json in `folder` (made) of a run of `models` (each ok, unless in `failed`), and
    with `folders` each ok model's folder holding one file."""
    folder.mkdir(parents=True, exist_ok=True)
    run = RunStamp(id=stamp, started="2026-01-01T00:00:00Z") if version == 3 else None
    runs = [ModelRun(name=n, status="failed" if n in failed else "ok", stage="capture" if n in failed else None,
                     error="it broke" if n in failed else None, total_seconds=2.0, measured_in=run)
            for n in models]
    record = RunRecord(
        format_version=version, pipeline=pipeline, versions=versions(), seconds=seconds,
        executor=ExecutorRecord(kind=kind, workers=workers, recycled=recycled),
        shard=ShardRecord(index=shard[0], count=shard[1], selection=selection or []) if shard else None,
        ok=not failed, allow_partial=allow_partial, run=run,
        summary=RunSummary(models=len(runs), ok=len(runs) - len(failed), up_to_date=0, failed=len(failed), graphs=0,
                           bytes=0), models=runs)
    (folder / "run.json").write_text(dump_run(record))
    if folders:
        for n in models:
            if n not in failed:
                (folder / n).mkdir(exist_ok=True)
                (folder / n / "manifest.json").write_text(f"{n} from {folder.name}")
    return folder


def merge_cli(*args: object):
    return CliRunner().invoke(main, ["merge", *map(str, args)])


# ---------------------------------------------------------------------------------------
# missing and duplicated


def test_unsharded_runs_that_both_ran_a_model_name_it_duplicated_and_fail(tmp_path):
    one = write_run(tmp_path / "one", ["a", "b"], stamp="r1")
    two = write_run(tmp_path / "two", ["b", "c"], stamp="r2")
    run = merge_runs([one, two])
    assert [m.name for m in run.models] == ["a", "b", "c"]
    assert [(d.name, d.folders) for d in run.merge.duplicated] == [("b", [str(one), str(two)])]
    assert run.merge.missing == [] and not run.ok
    r = merge_cli(one, two)
    assert r.exit_code == 1, r.output
    assert f"DUPLICATED b: in {one}, {two} (kept the first)" in r.output
    assert "3/3 models ok across 2 shard(s) (nothing written: no --output)" in r.output


def test_unsharded_runs_of_different_models_merge_ok_in_the_order_given(tmp_path):
    one = write_run(tmp_path / "one", ["b", "a"], stamp="r1")
    two = write_run(tmp_path / "two", ["c"], stamp="r2")
    run = merge_runs([one, two])
    assert [m.name for m in run.models] == ["b", "a", "c"] and run.ok
    assert run.merge.duplicated == [] and run.merge.missing == []
    assert [s.shard for s in run.merge.shards] == [None, None]
    r = merge_cli(one, two)
    assert r.exit_code == 0, r.output
    assert "shard -          2 model(s)" in r.output and "3/3 models ok across 2 shard(s)" in r.output


def test_a_duplicated_model_keeps_the_first_folders_entry_and_artefact(tmp_path):
    one = write_run(tmp_path / "one", ["a"], failed=("a",), stamp="r1")
    two = write_run(tmp_path / "two", ["a"], stamp="r2")
    run = merge_runs([one, two], tmp_path / "out")
    assert [(m.name, m.status) for m in run.models] == [("a", "failed")]  # the first given wins
    assert not (tmp_path / "out" / "p" / "a").exists()  # the first had no folder: none is taken from two
    run = merge_runs([two, one], tmp_path / "out2")
    assert [(m.name, m.status) for m in run.models] == [("a", "ok")]
    assert (tmp_path / "out2" / "p" / "a" / "manifest.json").read_text() == "a from two"


def test_shards_name_each_model_of_the_selection_no_shard_ran_missing(tmp_path):
    sel = ["a", "b", "c", "d"]
    s1 = write_run(tmp_path / "s1", ["a", "c"], shard=(1, 2), selection=sel)
    s2 = write_run(tmp_path / "s2", ["b", "d"], shard=(2, 2), selection=sel)
    run = merge_runs([s2, s1])
    assert [m.name for m in run.models] == sel and run.ok  # selection order, whatever the folder order
    assert [s.shard for s in run.merge.shards] == ["2/2", "1/2"]
    run = merge_runs([s1])
    assert run.merge.missing == ["b", "d"] and not run.ok
    r = merge_cli(s1)
    assert r.exit_code == 1 and "MISSING 2 model(s) in no shard: b, d" in r.output
    assert "2/4 models ok across 1 shard(s)" in r.output


def test_a_shard_that_ran_a_model_outside_the_selection_lists_it_after_the_selection(tmp_path):
    s1 = write_run(tmp_path / "s1", ["x", "a"], shard=(1, 2), selection=["a", "b"])
    s2 = write_run(tmp_path / "s2", ["b"], shard=(2, 2), selection=["a", "b"])
    run = merge_runs([s1, s2])
    assert [m.name for m in run.models] == ["a", "b", "x"] and run.ok


def test_a_failed_model_fails_the_merge_with_exit_1(tmp_path):
    one = write_run(tmp_path / "one", ["a", "b"], failed=("b",))
    r = merge_cli(one)
    assert r.exit_code == 1
    assert "FAILED  b                        capture: it broke" in r.output
    assert "1/2 models ok across 1 shard(s)" in r.output


# ---------------------------------------------------------------------------------------
# what the folders must agree on


def test_shards_of_other_selections_or_counts_or_pipelines_are_refused_with_exit_2(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"], shard=(1, 2), selection=["a", "b"])
    s2 = write_run(tmp_path / "s2", ["b"], shard=(2, 2), selection=["a", "c"])
    with pytest.raises(AotpipeError, match=rf"^{s2}: its shard shares out other models than {s1}'s \(another "):
        merge_runs([s1, s2])
    s3 = write_run(tmp_path / "s3", ["b"], shard=(2, 3), selection=["a", "b"])
    r = merge_cli(s1, s3)
    assert r.exit_code == 2 and r.output.startswith("error: the shards were cut into different counts (2, 3)")
    other = write_run(tmp_path / "o", ["b"], pipeline="q", shard=(2, 2), selection=["a", "b"])
    r = merge_cli(s1, other)
    assert r.exit_code == 2 and "runs of different pipelines ('p', 'q')" in r.output


def test_one_sharded_and_one_unsharded_run_of_a_pipeline_merge(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"], shard=(1, 2), selection=["a", "b"])
    whole = write_run(tmp_path / "w", ["b"])
    run = merge_runs([s1, whole])
    assert [m.name for m in run.models] == ["a", "b"] and run.ok and run.merge.missing == []


# ---------------------------------------------------------------------------------------
# the merged record


def test_the_merged_record_sums_workers_takes_the_longest_shard_and_names_mixed_executors(tmp_path):
    w = RecycledWorker(pid=7, after="a", models=1, reason="max_models_per_worker")
    s1 = write_run(tmp_path / "s1", ["a"], kind="process", workers=2, seconds=3.0, recycled=[w], stamp="r1")
    s2 = write_run(tmp_path / "s2", ["b"], kind="process", workers=3, seconds=5.0, stamp="r2")
    run = merge_runs([s1, s2])
    assert (run.executor, run.workers, run.seconds) == ("process", 5, 5.0)
    assert [(x.pid, x.shard) for x in run.recycled] == [(7, str(s1))]
    assert [(s.models, s.seconds, s.run.id) for s in run.merge.shards] == [(1, 3.0, "r1"), (1, 5.0, "r2")]
    s3 = write_run(tmp_path / "s3", ["c"], kind="ray", workers=1, seconds=1.0)
    run = merge_runs([s1, s2, s3])
    assert (run.executor, run.workers, run.seconds) == ("mixed", 6, 5.0)


def test_allow_partial_holds_for_the_merge_only_where_every_run_allowed_it(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"], allow_partial=True)
    s2 = write_run(tmp_path / "s2", ["b"], allow_partial=True)
    s3 = write_run(tmp_path / "s3", ["c"], allow_partial=None)
    assert merge_runs([s1, s2]).allow_partial is True
    assert merge_runs([s1, s3]).allow_partial is False


@pytest.mark.parametrize("version", [1, 2, 3])
def test_run_json_of_every_version_merges(tmp_path, version):
    s1 = write_run(tmp_path / "s1", ["a"], version=version, stamp="r1")
    s2 = write_run(tmp_path / "s2", ["b"], version=version, stamp="r2")
    run = merge_runs([s1, s2], tmp_path / "out")
    assert [m.name for m in run.models] == ["a", "b"] and run.ok
    assert [s.run.id if s.run else None for s in run.merge.shards] == (["r1", "r2"] if version == 3 else [None, None])
    written = load_run(tmp_path / "out" / "p")
    assert written.format_version == 3 and [m.name for m in written.models] == ["a", "b"]
    assert [s.model_dump(exclude_none=True).get("run") for s in written.merge.shards] == (
        [{"id": "r1", "started": "2026-01-01T00:00:00Z"}, {"id": "r2", "started": "2026-01-01T00:00:00Z"}]
        if version == 3 else [None, None])


def test_with_json_the_merged_run_json_is_printed(tmp_path):
    one = write_run(tmp_path / "one", ["a"])
    r = merge_cli(one, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["merge"] == {"shards": [{"folder": str(one), "shard": None, "models": 1, "seconds": 1.0,
                                         "run": {"id": "r1", "started": "2026-01-01T00:00:00Z"}}],
                             "missing": [], "duplicated": []}


# ---------------------------------------------------------------------------------------
# which folder holds the run


def test_the_run_folder_is_the_one_given_or_the_one_pipeline_folder_inside(tmp_path):
    run = write_run(tmp_path / "out" / "p", ["a"])
    assert run_folder(run) == run
    assert run_folder(tmp_path / "out") == run
    with pytest.raises(AotpipeError, match=r"no such folder; give the output folder of `aotpipe run --shard I/N`"):
        run_folder(tmp_path / "absent")
    write_run(tmp_path / "out" / "q", ["a"], pipeline="q")
    with pytest.raises(AotpipeError, match=r"out: 2 pipeline folders inside \(p, q\); give the one to merge$"):
        run_folder(tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AotpipeError, match=r"empty: no run.json here or in a pipeline folder inside"):
        run_folder(tmp_path / "empty")


def test_a_folder_named_run_json_is_not_a_run(tmp_path):
    (tmp_path / "x" / "run.json").mkdir(parents=True)
    with pytest.raises(AotpipeError, match="no run.json here"):
        run_folder(tmp_path / "x")
    (tmp_path / "y" / "p" / "run.json").mkdir(parents=True)
    with pytest.raises(AotpipeError, match="no run.json here"):
        run_folder(tmp_path / "y")


def test_a_pipeline_folder_inside_that_is_a_link_is_refused(tmp_path):
    real = write_run(tmp_path / "real" / "p", ["a"])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p").symlink_to(real, target_is_directory=True)
    with pytest.raises(AotpipeError, match=r"out/p: a symbolic link in a shard"):
        run_folder(tmp_path / "out")


@pytest.mark.parametrize("name", ["run.json", "report.md", "report.html"])
def test_a_model_named_like_a_file_merge_writes_is_refused(tmp_path, name):
    one = write_run(tmp_path / "one", [name], folders=False)
    r = merge_cli(one)
    assert r.exit_code == 2
    assert f"models[0].name: {name!r} is the name of a file merge writes, not a model's" in r.output


def test_a_selection_entry_that_is_not_a_name_is_refused(tmp_path):
    one = write_run(tmp_path / "one", ["a"], shard=(1, 1), selection=["a", "../b"])
    with pytest.raises(AotpipeError, match=r"shard.selection\[1\]: '../b' is not a name"):
        merge_runs([one])


def test_a_pipeline_named_like_a_report_file_is_a_name(tmp_path):
    """Only model folders sit beside run.json and the reports: a pipeline may be called so."""
    one = write_run(tmp_path / "one", ["a"], pipeline="report.md")
    assert merge_runs([one], tmp_path / "out").pipeline == "report.md"
    assert (tmp_path / "out" / "report.md" / "a" / "manifest.json").is_file()


# ---------------------------------------------------------------------------------------
# the merged tree


def test_the_merged_tree_holds_each_models_folder_hard_linked(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    (s1 / "a" / "sub").mkdir()
    (s1 / "a" / "sub" / "blob").write_bytes(b"\x00\x01")
    s2 = write_run(tmp_path / "s2", ["b"], failed=("b",))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["merge", str(s1), str(s2), "-o", str(out)])
    assert r.exit_code == 1, r.output  # b failed
    merged = out / "p"
    assert r.output.endswith(f"1/2 models ok across 2 shard(s) -> {merged}/ (see report.md)\n")
    assert sorted(p.name for p in merged.iterdir()) == ["a", "report.html", "report.md", "run.json"]
    assert (merged / "a" / "sub" / "blob").read_bytes() == b"\x00\x01"
    assert os.stat(merged / "a" / "sub" / "blob").st_ino == os.stat(s1 / "a" / "sub" / "blob").st_ino
    assert [m.name for m in load_run(merged).models] == ["a", "b"]
    assert not [p for p in merged.iterdir() if p.name.startswith(".merge-")]


def test_merging_again_replaces_a_models_folder_whole(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    out = tmp_path / "out"
    (out / "p" / "a").mkdir(parents=True)
    (out / "p" / "a" / "stale").write_text("from an earlier merge")
    merge_runs([s1], out)
    assert sorted(p.name for p in (out / "p" / "a").iterdir()) == ["manifest.json"]


def test_a_copy_is_made_where_a_hard_link_cannot_be(tmp_path, monkeypatch):
    s1 = write_run(tmp_path / "s1", ["a"])

    def no_link(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    merge_runs([s1], tmp_path / "out")
    copied = tmp_path / "out" / "p" / "a" / "manifest.json"
    assert copied.read_text() == "a from s1" and os.stat(copied).st_ino != os.stat(s1 / "a" / "manifest.json").st_ino


def test_an_output_folder_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p").write_text("a file where the pipeline's folder goes")
    r = CliRunner().invoke(main, ["merge", str(s1), "-o", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output  # the environment's fault, not the shards'
    assert r.output == f"error: cannot write {tmp_path / 'out' / 'p'}: File exists\n"
    assert len(r.output.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------
# a shard's links and special files, and links where merge writes: refused before writing


def snapshot(root: Path) -> dict[str, object]:
    return {str(p.relative_to(root)): (p.is_symlink(), p.is_dir() or p.read_bytes() if not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


def test_a_link_inside_a_kept_models_folder_is_refused_and_nothing_is_written(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a", "b"])
    (tmp_path / "secret").write_text("not the shard's")
    (s1 / "b" / "deep").mkdir()
    (s1 / "b" / "deep" / "link").symlink_to(tmp_path / "secret")
    r = CliRunner().invoke(main, ["merge", str(s1), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and f"{s1 / 'b' / 'deep' / 'link'}: a symbolic link in a shard" in r.output
    assert not (tmp_path / "out").exists()


def test_a_fifo_in_a_model_folder_is_refused_not_read(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    os.mkfifo(s1 / "a" / "pipe")
    with pytest.raises(AotpipeError, match=r"a/pipe: not a regular file or folder \(a FIFO, socket or device\)"):
        merge_runs([s1], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_whose_folder_is_a_link_is_refused_checking_alone_too(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    (tmp_path / "elsewhere").mkdir()
    (s1 / "a" / "manifest.json").unlink()
    (s1 / "a").rmdir()
    (s1 / "a").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(AotpipeError, match=r"s1/a: a symbolic link in a shard"):
        merge_runs([s1], tmp_path / "out")


def test_a_link_where_merge_writes_is_refused_and_what_it_points_to_is_left(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    victim = tmp_path / "victim"
    (victim / "a").mkdir(parents=True)
    (victim / "a" / "own").write_text("the victim's")
    before = snapshot(victim)
    out = tmp_path / "out"
    (out / "p").mkdir(parents=True)
    (out / "p" / "a").symlink_to(victim / "a", target_is_directory=True)
    with pytest.raises(AotpipeError, match=r"out/p/a: a symbolic link where merge would write; merge writes and "
                                           r"removes only inside -o"):
        merge_runs([s1], out)
    (out / "p" / "a").unlink()
    (out / "p").rmdir()
    (out / "p").symlink_to(victim, target_is_directory=True)
    with pytest.raises(AotpipeError, match=r"out/p: a symbolic link where merge would write"):
        merge_runs([s1], out)
    assert snapshot(victim) == before


def test_a_run_json_that_is_a_link_is_refused(tmp_path):
    s1 = write_run(tmp_path / "elsewhere", ["a"])
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "run.json").symlink_to(s1 / "run.json")
    with pytest.raises(AotpipeError, match=r"s1/run.json: a symbolic link in a shard"):
        merge_runs([tmp_path / "s1"])


def test_a_run_json_that_is_not_one_is_one_line_naming_why(tmp_path):
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "run.json").write_text('{"pipeline": "p"}\n')
    with pytest.raises(AotpipeError) as e:
        merge_runs([tmp_path / "s1"])
    assert str(e.value).startswith(f"{tmp_path / 's1' / 'run.json'}: not a run.json aotpipe can merge (")
    assert str(e.value).endswith("); rerun that shard") and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# each refusal, word for word (they name the file or field and the fix)


def test_without_an_output_the_run_stays_in_the_first_folder(tmp_path):
    s1 = write_run(tmp_path / "s1" / "p", ["a"])
    s2 = write_run(tmp_path / "s2", ["b"])
    assert merge_runs([tmp_path / "s1", s2]).output == s1
    assert merge_runs([s2, s1], tmp_path / "out").output == tmp_path / "out" / "p"


def test_a_shard_of_version_1_or_2_is_merged_without_a_run_of_its_own(tmp_path):
    old = write_run(tmp_path / "old", ["a"], version=2)
    new = write_run(tmp_path / "new", ["b"], version=3, stamp="r2")
    merge_runs([old, new], tmp_path / "out")
    shards = json.loads((tmp_path / "out" / "p" / "run.json").read_text())["merge"]["shards"]
    assert "run" not in shards[0] and shards[1]["run"]["id"] == "r2"


def test_the_refusals_of_folders_that_do_not_fit_together_say_what_to_do(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"], shard=(1, 2), selection=["a", "b"])
    s2 = write_run(tmp_path / "s2", ["b"], shard=(2, 2), selection=["a", "c"])
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1, s2])
    assert str(e.value) == (f"{s2}: its shard shares out other models than {s1}'s (another pipeline version or "
                            "--only); rerun the shards from one pipeline file")
    s3 = write_run(tmp_path / "s3", ["b"], shard=(2, 3), selection=["a", "b"])
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1, s3])
    assert str(e.value) == ("the shards were cut into different counts (2, 3): a model can be in two shards or none; "
                            "rerun them all with one --shard I/N count")
    q = write_run(tmp_path / "q", ["b"], pipeline="q")
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1, q])
    assert str(e.value) == ("the folders hold runs of different pipelines ('p', 'q'); merge the shards of one "
                            "pipeline at a time")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AotpipeError) as e:
        run_folder(tmp_path / "empty")
    assert str(e.value) == (f"{tmp_path / 'empty'}: no run.json here or in a pipeline folder inside; give the folder "
                            "`aotpipe run --shard I/N -o DIR` wrote (DIR or DIR/<pipeline>)")


@pytest.mark.parametrize("field", ["pipeline", "model", "selection"])
def test_a_name_that_is_not_one_is_refused_naming_its_field_whatever_else_is_there(tmp_path, field):
    bad = "../" + "x" * 100
    one = write_run(tmp_path / "one", ["a", "b"], pipeline=bad if field == "pipeline" else "p", shard=(1, 1),
                    selection=["a", "b", bad] if field == "selection" else ["a", "b"], folders=False)
    if field == "model":
        data = json.loads((one / "run.json").read_text())
        data["models"][1]["name"] = bad
        (one / "run.json").write_text(json.dumps(data))
    where = {"pipeline": "pipeline", "model": "models[1].name", "selection": "shard.selection[2]"}[field]
    with pytest.raises(AotpipeError) as e:
        merge_runs([one])
    assert str(e.value) == (f"{one / 'run.json'}: {where}: {bad[:80]!r} is not a name (letters, digits, '_', '.', "
                            "'-', not starting with '.'); aotpipe run writes no such run.json, so merge will not use it "
                            "as a folder name: rerun that shard")


def test_a_selection_entry_named_like_a_report_file_is_refused(tmp_path):
    one = write_run(tmp_path / "one", ["a"], shard=(1, 1), selection=["a", "report.html"])
    with pytest.raises(AotpipeError, match=r"shard.selection\[1\]: 'report.html' is the name of a file merge writes"):
        merge_runs([one])


def test_a_run_json_that_cannot_be_read_names_why_in_its_first_line(tmp_path, monkeypatch):
    import aotpipe.pipeline.merge as merge

    one = write_run(tmp_path / "one", ["a"])

    def unreadable(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(merge, "read_run_json", unreadable)
    with pytest.raises(AotpipeError) as e:
        merge_runs([one])
    assert str(e.value) == f"{one / 'run.json'}: not a run.json aotpipe can merge (Input/output error); rerun that shard"

    def long_error(path):
        raise AotpipeError("first " + "y" * 300 + "\nsecond line")

    monkeypatch.setattr(merge, "read_run_json", long_error)
    with pytest.raises(AotpipeError) as e:
        merge_runs([one])
    assert str(e.value) == (f"{one / 'run.json'}: not a run.json aotpipe can merge ({('first ' + 'y' * 300)[:200]}); "
                            "rerun that shard")

    def no_strerror(path):
        raise OSError("no reason given")

    monkeypatch.setattr(merge, "read_run_json", no_strerror)
    with pytest.raises(AotpipeError, match=r"can merge \(no reason given\); rerun that shard$"):
        merge_runs([one])


def test_the_link_and_special_file_refusals_say_what_to_do(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    (s1 / "a" / "link").symlink_to(s1 / "a" / "manifest.json")
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1], tmp_path / "out")
    assert str(e.value) == (f"{s1 / 'a' / 'link'}: a symbolic link in a shard; merge reads only regular files and "
                            "folders, never where a link points (a shard's link can point anywhere): rerun that shard, "
                            "or replace the link by what it points to")
    (s1 / "a" / "link").unlink()
    os.mkfifo(s1 / "a" / "pipe")
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1], tmp_path / "out")
    assert str(e.value) == (f"{s1 / 'a' / 'pipe'}: not a regular file or folder (a FIFO, socket or device) in a "
                            "shard's model folder; merge will not read it: rerun that shard")
    (s1 / "a" / "pipe").unlink()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1], tmp_path / "out")
    assert str(e.value) == (f"{tmp_path / 'out' / 'p'}: a symbolic link where merge would write; merge writes and "
                            "removes only inside -o, never through a link: remove the link or choose another -o")


def test_a_shard_folder_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    s1 = write_run(tmp_path / "s1", ["a"])
    real = os.listdir

    def denied(path):
        if Path(path) == s1 / "a":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", denied)
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1], tmp_path / "out")
    assert str(e.value) == f"{s1 / 'a'}: cannot read it (Permission denied); rerun that shard or choose another -o"
    monkeypatch.setattr(os, "listdir", lambda path: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(AotpipeError) as e:
        merge_runs([s1], tmp_path / "out")
    assert str(e.value) == f"{tmp_path / 'out' / 'p'}: cannot read it (Input/output error); rerun that shard or " \
                           "choose another -o"
    assert not (tmp_path / "out").exists()


def test_a_model_without_a_folder_does_not_stop_the_next_ones_from_being_linked(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a", "b", "c"], failed=("a",))
    merge_runs([s1], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "p").iterdir() if p.is_dir()) == ["b", "c"]


def test_a_half_made_folder_of_an_interrupted_merge_is_replaced(tmp_path):
    s1 = write_run(tmp_path / "s1", ["a"])
    left = tmp_path / "out" / "p" / f".merge-a-{os.getpid()}"
    (left / "junk").mkdir(parents=True)
    merge_runs([s1], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "p" / "a").iterdir()) == ["manifest.json"]
    assert not left.exists()


def test_a_copy_that_fails_leaves_no_half_made_folder_and_names_the_file(tmp_path, monkeypatch):
    import shutil as sh

    s1 = write_run(tmp_path / "s1", ["a"])

    def fails(src, dst, **kwargs):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(os, "link", fails)
    monkeypatch.setattr(sh, "copy2", fails)
    r = CliRunner().invoke(main, ["merge", str(s1), "-o", str(tmp_path / "out")])
    tmp = tmp_path / "out" / "p" / f".merge-a-{os.getpid()}"
    assert r.exit_code == 1, r.output
    assert r.output == (f"error: no space left on the device writing {tmp / 'manifest.json'}; free some space and "
                        "run again\n")
    assert not tmp.exists() and not (tmp_path / "out" / "p" / "a").exists()

    def fails_unnamed(src, dst, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", fails_unnamed)
    monkeypatch.setattr(sh, "copy2", fails_unnamed)
    r = CliRunner().invoke(main, ["merge", str(s1), "-o", str(tmp_path / "out")])
    assert r.output == f"error: no space left on the device writing {tmp_path / 'out' / 'p'}; free some space and run again\n"
