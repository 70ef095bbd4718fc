"""What report.html and `aotpipe report` say of each model, decided from run.json and the
files on disk now: fast tests over a small tree (tests/report/tiny.py), plots stubbed."""

import json
import re
import shutil

import pytest
from click.testing import CliRunner

import aotpipe.pipeline.htmlreport as page
from aotpipe.cli import main
from tests.report.tiny import copy_tree, drawn, entry, write_run  # noqa: F401 (drawn: a fixture)

pytestmark = pytest.mark.usefixtures("drawn")


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.fixture()
def tree(tmp_path):
    """The small tree, and a run.json that says both models are ok."""
    root = copy_tree(tmp_path)
    write_run(root, [entry("mlp"), entry("running_norm")])
    return root


def rows(html):
    return re.findall(r'<tr class="model-row" data-status="(\w+)">\s*<td><a href="#m\d+">([^<]*)</a></td>\s*'
                      r'<td class="\w*">([^<]*)<', html)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:300])


def _wrong_version(path):
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))


DAMAGE = {
    "corrupt JSON": (lambda p: p.write_text("{ not json"), "manifest.json: not valid JSON (line 1:"),
    "truncated": (_truncate, "manifest.json: not valid JSON (line "),
    "wrong version": (_wrong_version, "manifest.json: format version 99; this aotpipe reads versions 1, 2, 3, 4; "
                                      "upgrade aotpipe to read it"),
    "missing": (lambda p: p.unlink(), "manifest.json: missing (an incomplete artefact: run the pipeline again)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_model_whose_manifest_cannot_be_read_now_is_not_ok_on_the_page_and_in_the_terminal(tree, damage):
    """run.json says ok (it was, when it ran); the manifest says otherwise now, as verify does."""
    spoil, why = DAMAGE[damage]
    spoil(tree / "mlp" / "manifest.json")
    r = cli("report", tree)
    assert r.exit_code == 0, r.output  # the page is written; a failed model exits 0 too (verify judges)
    lines = r.output.splitlines()
    assert lines[:2] == [f"wrote {tree / 'report.html'}", "1 of 2 models not ok:"] and len(lines) == 3
    assert lines[2].startswith(f"  mlp: unreadable: {tree / 'mlp'}/{why}"), lines[2]
    html = (tree / "report.html").read_text()
    assert rows(html) == [("failed", "mlp", "unreadable"), ("ok", "running_norm", "ok")]
    assert re.search(r'id="sum-ok">1 / 2<', html) and re.search(r'id="sum-failed" class="failed">1<', html)
    assert f"{tree / 'mlp'}/{why}" in html  # the file and what is wrong with it, in the model's errors
    assert cli("verify", tree).exit_code == 1


def test_a_model_run_json_lists_ok_whose_folder_is_gone_is_not_ok(tree):
    shutil.rmtree(tree / "mlp")
    r = cli("report", tree)
    assert r.exit_code == 0
    assert r.output.splitlines()[1:] == [
        "1 of 2 models not ok:",
        f"  mlp: unreadable: {tree / 'mlp'}: missing; run.json lists mlp as ok, but its artefact is not there "
        "(run the pipeline again)"]
    assert rows((tree / "report.html").read_text())[0] == ("failed", "mlp", "unreadable")


def test_a_failed_model_without_a_folder_is_failed_not_missing(tmp_path):
    root = copy_tree(tmp_path)
    shutil.rmtree(root / "mlp")
    write_run(root, [entry("mlp", "failed", stage="capture", error="planted: it raised"), entry("running_norm")])
    r = cli("report", root)
    assert r.output.splitlines()[1:] == ["1 of 2 models not ok:", "  mlp: failed (capture): capture: planted: it raised"]
    assert rows((root / "report.html").read_text())[0] == ("failed", "mlp", "failed (capture)")


def test_without_run_json_a_folder_without_its_manifest_is_a_row_not_ok(tmp_path):
    root = copy_tree(tmp_path)
    (root / "running_norm" / "manifest.json").unlink()
    page_ = page.gather(root)
    assert [(r.name, r.status, r.errors) for r in page_.rows] == [
        ("mlp", "ok", []),
        ("running_norm", "unreadable",
         [f"{root / 'running_norm' / 'manifest.json'}: missing (an incomplete artefact: run the pipeline again)"])]


def test_every_model_ok_prints_only_where_the_page_is(tree):
    r = cli("report", tree)
    assert (r.exit_code, r.output) == (0, f"wrote {tree / 'report.html'}\n")


def test_ops_names_a_model_folder_without_its_manifest_and_exits_2(tree):
    (tree / "mlp" / "manifest.json").unlink()
    r = cli("ops", tree, "--json")
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data["problems"] == [f"{tree / 'mlp' / 'manifest.json'}: missing (an incomplete artefact: run the pipeline "
                                "again)"]
    assert data["models"] == 1 and all(o["models"] == ["running_norm"] for o in data["ops"])


def test_a_model_folder_left_empty_is_named_by_its_missing_manifest(tree):
    shutil.rmtree(tree / "mlp")
    (tree / "mlp").mkdir()  # no manifest and no graph folder: not an artefact at all, but run.json lists it ok
    r = cli("report", tree)
    assert r.output.splitlines()[1:] == [
        "1 of 2 models not ok:",
        f"  mlp: unreadable: {tree / 'mlp' / 'manifest.json'}: missing (an incomplete artefact: run the pipeline again)"]


def _as_rank(root, source, name, rank, world=2):
    """A copy of the model folder `source` as rank `rank` of the distributed model `name`: its
    manifest given a `distributed` record and sealed again (artifact/manifest.seal)."""
    from aotpipe.artifact.manifest import seal

    folder = root / f"{name}.rank{rank}"
    shutil.copytree(root / source, folder)
    data = json.loads((folder / "manifest.json").read_text())
    data["distributed"] = {"world_size": world, "strategy": "fsdp2", "mesh": [world], "mesh_dims": ["dp"],
                           "rank": rank, "coords": {"dp": rank}, "groups": {"0": {"dim": "dp", "ranks": [0, 1]}},
                           "shards": {}}
    data["model"]["name"] = folder.name  # as the distributed job writes it
    (folder / "manifest.json").write_bytes(seal(data))
    return folder


def test_a_distributed_models_ranks_are_its_rows_not_a_missing_artefact(tmp_path):
    from aotpipe.artifact.manifest import seal

    root = copy_tree(tmp_path)
    _as_rank(root, "mlp", "d", 0)
    _as_rank(root, "mlp", "d", 1)
    _as_rank(root, "mlp", "e", 1)  # no rank 0: not taken for e's ranks
    write_run(root, [entry("mlp"), entry("running_norm"), entry("d"), entry("e")])
    r = cli("report", root)
    assert r.exit_code == 0, r.output
    html = (root / "report.html").read_text()
    names = [name for _, name, _ in rows(html)]
    assert names.count("d.rank0") == 1 and names.count("d.rank1") == 1 and "d" not in names
    assert "d: unreadable" not in r.output and "run.json lists d as ok, but its artefact is not there" not in html
    # e's one folder is rank 1 alone: e is missing, and e.rank1 is a folder run.json does not list
    assert "run.json lists e as ok, but its artefact is not there" in html
    assert "e.rank1" in names
    # a folder named like a rank whose manifest is no rank is not one
    shutil.copytree(root / "mlp", root / "f.rank0")
    data = json.loads((root / "f.rank0" / "manifest.json").read_text())
    data["model"]["name"] = "f.rank0"
    (root / "f.rank0" / "manifest.json").write_bytes(seal(data))
    write_run(root, [entry("mlp"), entry("running_norm"), entry("d"), entry("f")])
    assert cli("report", root).exit_code == 0
    html = (root / "report.html").read_text()
    assert "run.json lists f as ok, but its artefact is not there" in html


def test_a_model_with_its_own_folder_is_that_folder_even_beside_rank_folders_of_its_name(tmp_path):
    root = copy_tree(tmp_path)
    _as_rank(root, "running_norm", "mlp", 0)  # a rank artefact named after the model "mlp"
    write_run(root, [entry("mlp"), entry("running_norm")])
    assert cli("report", root).exit_code == 0
    html = (root / "report.html").read_text()
    names = [name for _, name, _ in rows(html)]
    assert names[:2] == ["mlp", "running_norm"] and "mlp.rank0" in names[2:]
