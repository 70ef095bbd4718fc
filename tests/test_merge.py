"""aotpipe merge: shard trees -> one run.json and report, the same models and statuses as one run."""

import json
import shutil

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.runner import run_pipeline
from aotpipe.pipeline.shards import Shard

PIPELINE = """
version: 1
name: small
executor: {kind: local}
defaults: {mode: export, graphs: [inference], passes: [], verify: true}
models:
  - {name: a, source: 'aotpipe.zoo:mlp', args: {in_features: 8, hidden: 8, depth: 1}, inputs: [{shape: [2, 8]}]}
  - {name: b, source: 'aotpipe.zoo:mlp', args: {in_features: 8, hidden: 16, depth: 2}, inputs: [{shape: [2, 8]}]}
  - {name: broken, source: 'tests.test_merge:broken_model', inputs: [{shape: [2, 8]}]}
  - {name: c, source: 'aotpipe.zoo:running_norm', args: {features: 8}, inputs: [{shape: [4, 8]}]}
  - {name: d, source: 'aotpipe.zoo:mlp', args: {in_features: 16, hidden: 8, depth: 1}, inputs: [{shape: [4, 16]}]}
"""


def broken_model():
    raise ValueError("this model cannot be built")


def _untimed(value):
    if isinstance(value, dict):  # and not which run measured it
        return {k: _untimed(v) for k, v in value.items() if not k.endswith("seconds") and k != "measured_in"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def structure(run_json):
    """run.json's models without the timings (at any depth: a pass step's seconds too): what
    must not depend on how the run was cut."""
    return {m["name"]: _untimed(m) for m in json.loads(run_json.read_text())["models"]}


class _Runs:
    """The small pipeline run whole, and cut in n shards on request (each its own output tree)."""

    def __init__(self, root):
        self.root = root
        yaml_path = root / "small.yaml"
        yaml_path.write_text(PIPELINE)
        self.pipeline = parse_pipeline(PIPELINE, str(yaml_path))
        self.whole = run_pipeline(self.pipeline, output=root / "whole", progress=False).output
        self._shards = {}

    def __getitem__(self, n):
        if n not in self._shards:
            self._shards[n] = [run_pipeline(self.pipeline, output=self.root / f"of{n}-{i}", progress=False,
                                            shard=Shard(i, n)).output for i in range(1, n + 1)]
        return self._shards[n]


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    runs = _Runs(tmp_path_factory.mktemp("merge"))
    return runs.root, runs.whole, runs


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_shards_merged_give_the_models_and_statuses_of_one_run(small_runs, n):
    root, whole, shards = small_runs
    # Each shard ran only its share, and says which shard it was.
    for i, s in enumerate(shards[n], 1):
        rec = json.loads((s / "run.json").read_text())
        assert rec["shard"]["index"] == i and rec["shard"]["count"] == n
        assert len(rec["models"]) < 5
    r = CliRunner().invoke(main, ["merge", *map(str, shards[n]), "-o", str(root / f"merged{n}")])
    assert r.exit_code == 1, r.output  # the broken model failed, as in the whole run
    assert "FAILED  broken" in r.output and "4/5 models ok across" in r.output
    merged = root / f"merged{n}" / "small"
    assert structure(merged / "run.json") == structure(whole / "run.json")
    assert list(structure(merged / "run.json")) == ["a", "b", "broken", "c", "d"]  # pipeline order
    rec = json.loads((merged / "run.json").read_text())
    assert rec["merge"]["missing"] == [] and rec["merge"]["duplicated"] == []
    assert rec["summary"]["ok"] == 4 and rec["summary"]["failed"] == 1
    # Each entry was measured by its shard's run, which counts as the merged run's own: none kept.
    assert rec["summary"]["kept"] == 0 and {s["run"]["id"] for s in rec["merge"]["shards"]} == {
        m["measured_in"]["id"] for m in rec["models"]}
    # The merged tree holds each model's folder: `aotpipe ls` and `verify` read it like a run's.
    assert sorted(p.name for p in merged.iterdir() if p.is_dir()) == ["a", "b", "c", "d"]
    v = CliRunner().invoke(main, ["verify", str(merged)])
    assert v.exit_code == 0, v.output
    assert "## Merged shards" in (merged / "report.md").read_text()
    page = (merged / "report.html").read_text()  # the merged tree's page lists every model
    assert all(f">{name}<" in page for name in ("a", "b", "broken", "c", "d"))


def test_a_shard_not_merged_is_named_missing(small_runs):
    root, _, shards = small_runs
    given = shards[2][1:]  # shard 1 of 2 left out
    left_out = [m["name"] for m in json.loads((shards[2][0] / "run.json").read_text())["models"]]
    assert left_out
    r = CliRunner().invoke(main, ["merge", *map(str, given)])
    assert r.exit_code == 1
    assert f"MISSING {len(left_out)} model(s) in no shard: {', '.join(left_out)}" in r.output
    assert "(nothing written: no --output)" in r.output


def test_a_model_two_shards_ran_is_named_duplicated_and_the_first_kept(small_runs, tmp_path):
    root, _, shards = small_runs
    extra = tmp_path / "again" / "small"
    shutil.copytree(shards[2][0], extra)
    name = json.loads((extra / "run.json").read_text())["models"][0]["name"]
    r = CliRunner().invoke(main, ["merge", *map(str, shards[2]), str(extra.parent), "-o", str(tmp_path / "m")])
    assert r.exit_code == 1
    assert f"DUPLICATED {name}: in {shards[2][0]}, {extra} (kept the first)" in r.output
    rec = json.loads((tmp_path / "m" / "small" / "run.json").read_text())
    assert rec["merge"]["duplicated"][0] == {"name": name, "folders": [str(shards[2][0]), str(extra)]}
    assert [m["name"] for m in rec["models"]].count(name) == 1
    assert rec["ok"] is False


def test_shards_of_different_counts_or_pipelines_are_a_user_error(small_runs, tmp_path):
    root, whole, shards = small_runs
    cut3 = tmp_path / "cut3"
    shutil.copytree(shards[2][1], cut3)
    rec = json.loads((cut3 / "run.json").read_text())
    rec["shard"]["count"] = 3
    (cut3 / "run.json").write_text(json.dumps(rec))
    r = CliRunner().invoke(main, ["merge", str(shards[2][0]), str(cut3)])
    assert r.exit_code == 2
    assert r.output.startswith("error: the shards were cut into different counts (2, 3)")
    other = tmp_path / "other"
    shutil.copytree(whole, other)
    rec = json.loads((other / "run.json").read_text())
    rec["pipeline"] = "another"
    (other / "run.json").write_text(json.dumps(rec))
    r = CliRunner().invoke(main, ["merge", str(whole), str(other)])
    assert r.exit_code == 2 and "runs of different pipelines ('another', 'small')" in r.output


def test_a_folder_without_run_json_or_a_bad_one_is_one_line_exit_2(small_runs, tmp_path):
    root, _, shards = small_runs
    r = CliRunner().invoke(main, ["merge", str(shards[2][0]), str(tmp_path)])
    assert r.exit_code == 2
    assert r.output == (f"error: {tmp_path}: no run.json here or in a pipeline folder inside; give the folder "
                        "`aotpipe run --shard I/N -o DIR` wrote (DIR or DIR/<pipeline>)\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text('{"pipeline": "small", "models": [{"name": "x", "graphs": [{"nodes": 1}]}]}')
    r = CliRunner().invoke(main, ["merge", str(bad)])
    assert r.exit_code == 2 and "run.json: not a run.json aotpipe can merge" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_merging_into_a_shards_own_folder_keeps_its_models(small_runs, tmp_path):
    """-o pointing at the first shard's output: its own model folders stay, the others join them."""
    root, _, shards = small_runs
    copies = [tmp_path / f"s{i}" for i in (1, 2)]
    for src, dst in zip(shards[2], copies):
        shutil.copytree(src, dst / "small")
    r = CliRunner().invoke(main, ["merge", str(copies[0]), str(copies[1]), "-o", str(copies[0])])
    assert r.exit_code == 1, r.output  # broken failed
    assert sorted(p.name for p in (copies[0] / "small").iterdir() if p.is_dir()) == ["a", "b", "c", "d"]
    v = CliRunner().invoke(main, ["verify", str(copies[0] / "small")])
    assert v.exit_code == 0, v.output


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_quickstart_in_shards_through_the_cli_merges_to_the_quickstart_run(quickstart_run, tmp_path, n):
    from tests.conftest import PIPELINES

    whole, _ = quickstart_run
    outs = []
    for i in range(1, n + 1):
        r = CliRunner().invoke(main, ["run", str(PIPELINES / "quickstart.yaml"), "--shard", f"{i}/{n}",
                                      "-o", str(tmp_path / f"s{i}"), "--no-progress"])
        assert r.exit_code == 0, r.output
        outs.append(tmp_path / f"s{i}")
    r = CliRunner().invoke(main, ["merge", *map(str, outs), "-o", str(tmp_path / "all")])
    assert r.exit_code == 0, r.output
    assert structure(tmp_path / "all" / "quickstart" / "run.json") == structure(whole / "run.json")


# ---------------------------------------------------------------------------------------
# Hostile shards: names that are paths, links out of the shard. Each plants the attack, then
# checks the one-line refusal names the field or path, that a victim folder beside -o is
# byte for byte as it was, and that what -o held before is still there.


def _snapshot(root):
    """Every path under `root` (links not followed) with its kind and bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", str(p.readlink()))
        elif p.is_dir():
            out[rel] = ("dir", None)
        else:
            out[rel] = ("file", p.read_bytes())
    return out


@pytest.fixture
def hostile(small_runs, tmp_path):
    """Copies of the two shards (tmp/a/s1/small, tmp/a/s2/small), an output folder tmp/a/out that
    already holds an earlier merge's file, and a victim folder tmp/victim laid out like a merged
    tree (folders named like the models, run.json, report.md, report.html)."""
    _, _, shards = small_runs
    copies = [tmp_path / "a" / f"s{i}" / "small" for i in (1, 2)]
    for src, dst in zip(shards[2], copies):
        shutil.copytree(src, dst)
    out = tmp_path / "a" / "out"
    (out / "small").mkdir(parents=True)
    (out / "small" / "kept.txt").write_text("an earlier merge's file")
    victim = tmp_path / "victim"
    for name in ("a", "b", "c", "d"):
        (victim / name).mkdir(parents=True)
        (victim / name / "secret.txt").write_text(f"{name}'s secret")
    for name in ("run.json", "report.md", "report.html"):
        (victim / name).write_text(f"the victim's {name}")
    before = (_snapshot(victim), _snapshot(out))

    class Planted:
        pass

    h = Planted()
    h.copies, h.out, h.victim, h.victim_before = copies, out, victim, before[0]

    def edit_run_json(i, change):
        path = copies[i] / "run.json"
        rec = json.loads(path.read_text())
        change(rec)
        path.write_text(json.dumps(rec))

    def merge(*extra):
        return CliRunner().invoke(main, ["merge", *(str(c.parent) for c in copies), "-o", str(out), *extra])

    def unharmed():
        assert (_snapshot(victim), _snapshot(out)) == before

    def model_in(i):
        """A model shard i ran whose folder is there (ok)."""
        rec = json.loads((copies[i] / "run.json").read_text())
        return next(m["name"] for m in rec["models"] if (copies[i] / m["name"]).is_dir())

    h.edit_run_json, h.merge, h.unharmed, h.model_in = edit_run_json, merge, unharmed, model_in
    return h


def _one_line_error(r):
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("error: ")
    return r.output


def test_a_pipeline_name_that_climbs_out_of_the_output_folder_is_refused(hostile):
    for i in (0, 1):
        hostile.edit_run_json(i, lambda rec: rec.update(pipeline="../../victim"))
    out = _one_line_error(hostile.merge())
    assert "pipeline: '../../victim' is not a name" in out, out
    hostile.unharmed()
    # Checking alone (no -o) refuses it too: it is not a run aotpipe wrote.
    r = CliRunner().invoke(main, ["merge", *(str(c.parent) for c in hostile.copies)])
    assert "pipeline: '../../victim' is not a name" in _one_line_error(r)


@pytest.mark.parametrize("bad", ["../../victim/a", "x/a", "..", "", "a\x00b", "a\x1b[31m", "a\n"],
                         ids=["climbs", "separator", "dotdot", "empty", "nul", "escape", "newline"])
def test_a_model_name_that_is_not_a_name_is_refused(hostile, bad):
    def rename(rec):
        rec["models"][0]["name"] = bad

    hostile.edit_run_json(0, rename)
    out = _one_line_error(hostile.merge())
    assert "models[0].name: " in out and "is not a name" in out, out
    hostile.unharmed()


def test_a_symlinked_model_folder_is_refused(hostile):
    name = hostile.model_in(0)
    folder = hostile.copies[0] / name
    shutil.rmtree(folder)
    folder.symlink_to(hostile.victim / name, target_is_directory=True)
    out = _one_line_error(hostile.merge())
    assert f"{folder}: a symbolic link" in out, out
    hostile.unharmed()


def test_a_symlinked_file_inside_a_model_folder_is_refused(hostile):
    name = hostile.model_in(1)
    planted = hostile.copies[1] / name / "manifest.json"
    planted.unlink()
    planted.symlink_to(hostile.victim / name / "secret.txt")
    out = _one_line_error(hostile.merge())
    assert f"{planted}: a symbolic link" in out, out
    hostile.unharmed()


def test_a_symlink_to_a_folder_outside_inside_a_model_folder_is_refused(hostile):
    name = hostile.model_in(0)
    planted = hostile.copies[0] / name / "outside"
    planted.symlink_to(hostile.victim, target_is_directory=True)
    out = _one_line_error(hostile.merge())
    assert f"{planted}: a symbolic link" in out, out
    hostile.unharmed()


def test_a_symlinked_run_json_is_refused(hostile):
    planted = hostile.copies[1] / "run.json"
    (hostile.victim / "run.json").write_text(planted.read_text())
    planted.unlink()
    planted.symlink_to(hostile.victim / "run.json")
    out = _one_line_error(hostile.merge())
    assert f"{planted}: a symbolic link" in out, out
    assert (hostile.victim / "run.json").read_text().startswith("{")


def test_a_fifo_in_a_model_folder_is_refused_not_read(hostile):
    import os

    name = hostile.model_in(0)
    planted = hostile.copies[0] / name / "pipe"
    os.mkfifo(planted)
    out = _one_line_error(hostile.merge())
    assert f"{planted}: not a regular file or folder" in out, out
    hostile.unharmed()


def test_a_model_folder_in_the_output_that_is_a_link_out_is_not_followed(hostile):
    """-o holding a link where a model's folder goes (a shard's own folder used as -o): the merge
    refuses rather than remove or write through it."""
    name = hostile.model_in(1)
    planted = hostile.out / "small" / name
    planted.symlink_to(hostile.victim / name, target_is_directory=True)
    before = _snapshot(hostile.victim)
    out = _one_line_error(hostile.merge())
    assert f"{planted}: a symbolic link" in out, out
    assert _snapshot(hostile.victim) == before and planted.is_symlink()


def test_an_honest_merge_into_an_output_folder_keeps_what_was_there(hostile):
    r = hostile.merge()
    assert r.exit_code == 1, r.output  # broken failed, as in the whole run
    merged = hostile.out / "small"
    assert sorted(p.name for p in merged.iterdir() if p.is_dir()) == ["a", "b", "c", "d"]
    assert (merged / "kept.txt").read_text() == "an earlier merge's file"
    assert _snapshot(hostile.victim) == hostile.victim_before
