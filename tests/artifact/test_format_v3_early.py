"""A pass chain is stored once in the manifest (graphs[key].passes); version 3 manifests
written before kept two more copies (model.passes, passes[key]) and still load, replay and
read their chain the same (tests/data/format_v3_early/README.md says how the fixture was made)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.format.records import MANIFEST, Manifest
from aotpipe.replay import replay
from tests.helpers.forge import reseal
from tests.helpers.pipelines import run_yaml
from tests.helpers.replays import assert_match_or_close_for_want_of_a_recorded_cpu

EARLY = Path(__file__).resolve().parent.parent / "data" / "format_v3_early"
DERIVED = "inference.freeze+reinplace"


def chain_as_read(manifest: Manifest) -> dict[str, list[dict]]:
    return {key: [s.model_dump() for s in steps] for key, steps in manifest.pass_chains().items()}


@pytest.fixture
def early(tmp_path):
    shutil.copytree(EARLY / "mlp", tmp_path / "mlp")
    return tmp_path / "mlp"


def test_the_fixture_holds_the_three_copies_a_new_manifest_does_not():
    raw = json.loads((EARLY / "mlp" / MANIFEST).read_text())
    assert raw["format_version"] == 3
    assert [s["name"] for s in raw["model"]["passes"]] == ["freeze", "reinplace"]
    assert raw["passes"][DERIVED] == raw["graphs"][DERIVED]["passes"]


def test_a_new_manifest_holds_each_chain_once_in_its_graph_entry(quickstart_run):
    root, _ = quickstart_run
    for path in sorted(root.glob("*/" + MANIFEST)):
        raw = json.loads(path.read_text())
        assert "passes" not in raw, path  # no top-level copy
        assert "passes" not in raw["model"], path  # no copy in the model entry
        chains = {k: g["passes"] for k, g in raw["graphs"].items() if "passes" in g}
        assert [[s["name"] for s in c] for c in chains.values()] == [
            ["freeze", "fold_conv_bn", "channels_last", "reinplace"]], path
        assert json.dumps(raw).count('"nodes_before"') == 4, path  # each step's record, once


def test_an_early_version_3_artefact_loads_replays_match_and_reads_its_chain(early):
    art = aotpipe.load(early)
    assert art.manifest.format_version == 3
    results = replay(art)
    assert len(results) == 3
    assert_match_or_close_for_want_of_a_recorded_cpu(results, art.manifest.environment)
    (steps,) = art.manifest.pass_chains().values()
    assert [(s.name, s.modified, s.stats.get("ops_reinplaced")) for s in steps] == [
        ("freeze", True, None), ("reinplace", True, 1)]
    r = CliRunner().invoke(main, ["verify", str(early)])
    assert r.exit_code == 0, r.output


def test_a_chain_reads_the_same_from_the_one_copy_as_from_the_three(early, tmp_path):
    before = chain_as_read(aotpipe.load(early).manifest)
    edited = tmp_path / "once" / "mlp"
    shutil.copytree(early, edited)
    raw = json.loads((edited / MANIFEST).read_text())
    del raw["passes"], raw["model"]["passes"]  # as the writer writes it now
    (edited / MANIFEST).write_text(json.dumps(raw))
    reseal(edited, digests=False)
    art = aotpipe.load(edited)
    assert chain_as_read(art.manifest) == before and list(before) == [DERIVED]
    results = replay(art)
    assert_match_or_close_for_want_of_a_recorded_cpu(results, art.manifest.environment)
    assert [(r.status, r.environment) for r in results] == \
        [(r.status, r.environment) for r in replay(aotpipe.load(early))]
    # aotpipe diff reads the chain from its one copy too: the two say the same.
    r = CliRunner().invoke(main, ["diff", str(early), str(edited), "--json", "--no-values"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["differences"] == []


def test_a_manifest_with_only_the_top_level_copy_still_reads_its_chain(early):
    """A graph entry without its chain (no writer made one, but the field is optional): the
    top-level copy an older writer kept is read."""
    raw = json.loads((early / MANIFEST).read_text())
    del raw["graphs"][DERIVED]["passes"]
    m = Manifest.model_validate(raw)
    assert [s.name for s in m.pass_chains()[DERIVED]] == ["freeze", "reinplace"]


def test_the_early_chain_reads_the_same_as_one_written_now(tmp_path):
    result, out = run_yaml(tmp_path, (EARLY / "early.yaml").read_text())
    assert result.exit_code == 0, result.output
    new = out / "early" / "mlp"
    raw = json.loads((new / MANIFEST).read_text())
    assert "passes" not in raw and "passes" not in raw["model"]
    now, early = chain_as_read(aotpipe.load(new).manifest), chain_as_read(aotpipe.load(EARLY / "mlp").manifest)
    # a pass may count more since (reinplace's scalar_self_kept): the early stats are a subset, equal
    for steps_now, steps_early in zip(now.values(), early.values()):
        for s_now, s_early in zip(steps_now, steps_early):
            stats_now, stats_early = s_now.pop("stats") or {}, s_early.pop("stats") or {}
            assert {k: stats_now.get(k) for k in stats_early} == stats_early, (s_now["name"], stats_now)
    assert now == early
