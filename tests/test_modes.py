"""Capture modes from the YAML: dynamo and auto through `aotpipe run` (the process executor),
replay and verify of what they wrote, and the fingerprint of each mode."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.incremental import model_fingerprint

MODELS = '''
import torch
from torch import nn


class Branchy(nn.Module):
    """A graph break, then a branch on a value (torch.export refuses it)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        if h.sum() > 0:
            h = h * 2
        return self.fc2(h)


def branchy():
    return Branchy()
'''

PIPELINE = """
version: 1
name: modes
executor: {kind: process, workers: 2}
models:
  - {name: dyn, source: "models:branchy", inputs: [{shape: [4, 8]}], mode: dynamo}
  - {name: auto, source: "models:branchy", inputs: [{shape: [4, 8]}], mode: auto}
  - {name: exp, source: "models:branchy", inputs: [{shape: [4, 8]}], mode: export}
"""


def test_dynamo_and_auto_capture_what_export_refuses(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(PIPELINE))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 1, r.output  # export fails; the others do not
    by = {m["name"]: m for m in json.loads(r.stdout)["models"]}
    assert by["exp"]["status"] == "failed" and by["exp"]["stage"] == "capture", by["exp"]
    for name in ("dyn", "auto"):
        m = by[name]
        assert m["status"] == "ok", m
        assert m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m["checks"]
        keys = {g["kind"] for g in m["graphs"]}
        # subgraph 1 only computes the branch condition (nothing to differentiate): inference only
        assert {"forward", "backward", "joint", "inference", "inference_1", "forward_2", "backward_2"} <= keys, keys
        assert "forward_1" not in keys
        manifest = json.loads((tmp_path / "out" / "modes" / name / "manifest.json").read_text())
        assert manifest["capture"]["graph_breaks"], manifest["capture"]
        assert (tmp_path / "out" / "modes" / name / f"{name}_forward_2").is_dir()
    auto = json.loads((tmp_path / "out" / "modes" / "auto" / "manifest.json").read_text())
    assert auto["capture"]["fallback"], auto["capture"]  # why export was not used
    for name in ("dyn", "auto"):
        folder = tmp_path / "out" / "modes" / name
        rr = CliRunner().invoke(main, ["replay", str(folder), "--chain"])
        assert rr.exit_code == 0, rr.output
        rv = CliRunner().invoke(main, ["verify", str(folder)])
        assert rv.exit_code == 0, rv.output
    # A re-run keeps them; changing a model's mode redoes it.
    r2 = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                   "--json", "--only", "dyn", "--only", "auto"])
    again = {m["name"]: m for m in json.loads(r2.stdout)["models"]}
    assert r2.exit_code == 0 and again["dyn"]["skipped"] and again["auto"]["skipped"], r2.output
    assert again["exp"]["status"] == "failed" and not again["exp"]["skipped"]  # --only left its entry as it was


def test_each_mode_has_its_own_fingerprint():
    text = textwrap.dedent("""
        version: 1
        name: f
        models:
          - {name: a, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 16]}]}
    """)
    fps = set()
    for mode in ("export", "dynamo", "auto"):
        p = parse_pipeline(text.replace("inputs:", f"mode: {mode}, inputs:"), "p.yaml")
        fps.add(model_fingerprint(p.models[0]))
    assert len(fps) == 3


def test_meta_mode_from_the_yaml_writes_shapes_only_and_replays_on_random_inputs(tmp_path):
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: m
        models:
          - {name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}],
             mode: meta}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 0, r.output
    (m,) = json.loads(r.stdout)["models"]
    assert {g["kind"] for g in m["graphs"]} == {"inference", "forward", "backward", "joint"}
    assert m["checks"]["run"] == 0 and m["checks"]["skipped"] > 0  # no values: nothing to compare, and it says so
    folder = tmp_path / "out" / "m" / "cnn"
    assert not (folder / "blobs").exists() or not any((folder / "blobs").iterdir())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["capture"]["mode"] == "meta"
    assert {v["status"] for v in manifest["verification"].values()} == {"shapes only"}
    rr = CliRunner().invoke(main, ["replay", str(folder), "--inputs", "random", "--json"])
    assert rr.exit_code == 0 and all(x["status"] == "ran" for x in json.loads(rr.stdout)["graphs"]), rr.output


def test_meta_mode_with_passes_is_a_config_error_naming_the_field():
    from aotpipe.errors import ConfigError

    text = textwrap.dedent("""
        version: 1
        name: m
        defaults: {passes: [freeze]}
        models:
          - {name: cnn, source: aotpipe.zoo:small_cnn, inputs: [{shape: [2, 3, 8, 8]}], mode: meta}
    """)
    try:
        parse_pipeline(text, "p.yaml")
    except ConfigError as e:
        assert "models[0].passes" in str(e) and "mode meta" in str(e), str(e)
    else:
        raise AssertionError("mode meta with passes was accepted")
