"""The real zoo: every transformers model of pipelines/zoo-hf.yaml captures all four graph kinds."""

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from tests.conftest import PIPELINES

pytest.importorskip("transformers")

ZOO = ["bert", "gpt2", "t5_encoder", "vit", "resnet", "convnext", "llama"]
KINDS = {"inference", "forward", "backward", "joint"}


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    r = CliRunner().invoke(main, ["run", str(PIPELINES / "zoo-hf.yaml"), "-o", str(out), "--no-progress"])
    return out / "zoo-hf", r


@pytest.mark.slow
def test_every_zoo_model_captures_every_graph_kind(zoo_run):
    root, r = zoo_run
    assert r.exit_code == 0, r.output
    run = json.loads((root / "run.json").read_text())
    assert [m["name"] for m in run["models"]] == ZOO
    for m in run["models"]:
        assert m["status"] == "ok", (m["name"], m["error"])
        assert {g["kind"] for g in m["graphs"]} == KINDS, m["name"]


@pytest.mark.slow
def test_torch_get_inputs_reads_zoo_input_files(zoo_run):
    from torch._functorch.compilers import get_inputs

    root, _ = zoo_run
    files = [p for p in root.rglob("*.input") if "_joint_" not in p.name]
    assert len(files) == 3 * len(ZOO)
    for f in files:
        assert get_inputs(str(f)), f


@pytest.mark.slow
def test_zoo_graphs_rebuild_from_graph_json(zoo_run):
    from aotpipe.artifact.graph_json import graph_from_json

    root, _ = zoo_run
    for gj in root.rglob("graph.json"):
        data = json.loads(gj.read_text())
        assert len(graph_from_json(data, where=str(gj)).graph.nodes) == len(data["nodes"])
