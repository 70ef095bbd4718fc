"""aotpipe diff runs the graphs of artefacts it is not told to trust in the sandbox, as replay does."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus.diff import values
from aotpipe.trust.verify import sign_artifact
from tests.helpers.diff_trees import tiny_tree
from tests.sandbox.test_sandbox import _hostile, needs_bwrap


@pytest.fixture(autouse=True)
def sandboxed(monkeypatch):
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)


@needs_bwrap
def test_values_of_untrusted_artefacts_are_compared_in_the_sandbox(quickstart_run, tmp_path, monkeypatch):
    root, _ = quickstart_run
    from aotpipe.corpus.diff import values

    monkeypatch.setattr(values, "compare_values", lambda *a, **k: pytest.fail("ran in this process"))
    b = tmp_path / "mlp"
    shutil.copytree(root / "mlp", b)
    r = CliRunner().invoke(main, ["diff", str(root / "mlp"), str(b), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["first_divergence"]) >= {"inference", "forward", "backward", "joint"}
    assert not any(data["first_divergence"].values()) and data["notes"] == []


@needs_bwrap
def test_a_graph_the_sandbox_refuses_or_crashes_on_leaves_the_record_diff_standing(quickstart_run, tmp_path):
    root, _ = quickstart_run
    bad = _hostile(root / "mlp", tmp_path / "mlp")
    r = CliRunner().invoke(main, ["diff", str(root / "mlp"), str(bad), "--json"])
    assert r.exit_code == 1, r.output
    data = json.loads(r.output)
    nodes = [d for d in data["differences"] if d["section"] == "nodes"]
    assert [(d["where"], d["a"], d["b_target"]) for d in nodes] == [("inference", "permute",
                                                                     "aten._reshape_alias.default")]
    assert any(n.startswith("values not compared: ") for n in data["notes"]), data["notes"]


@needs_bwrap
@pytest.mark.parametrize("signed", ["a", "b"])
def test_with_key_and_one_side_signed_both_sides_run_in_the_sandbox(tmp_path, monkeypatch, signed):
    """The audit's case: --key KEY with only one side signed by KEY ran the other's graphs in
    this process. Both run in the sandbox, and a note says why."""
    monkeypatch.setattr(values, "compare_values", lambda *a, **k: pytest.fail("ran in this process"))
    a, b = tmp_path / "a" / "mlp", tmp_path / "b" / "mlp"
    shutil.copytree(tiny_tree() / "mlp", a)
    shutil.copytree(tiny_tree() / "mlp", b)
    key = tmp_path / "k.key"
    key.write_bytes(b"\x01" * 64)
    sign_artifact(a if signed == "a" else b, f"hmac:{key}")
    r = CliRunner().invoke(main, ["diff", str(a), str(b), "--key", f"hmac:{key}", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["first_divergence"]) == {"inference", "forward", "backward", "inference.freeze"}
    (note,) = data["notes"]
    assert note.startswith(f"not both signed by hmac:{key}, so their graphs ran in the sandbox: ")
    assert str(b if signed == "a" else a) in note
