"""The real zoo: every transformers model of pipelines/zoo-hf.yaml captures all four graph kinds."""

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from tests.conftest import PIPELINES

pytest.importorskip("transformers")

ZOO = ["bert", "gpt2", "t5_encoder", "vit", "resnet", "convnext", "llama"]
KINDS = {"inference", "forward", "backward", "joint"}
OPTIMISED = "inference.freeze+fold_conv_bn+channels_last+reinplace"


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
        assert {g["kind"] for g in m["graphs"]} == KINDS | {OPTIMISED}, m["name"]


@pytest.mark.slow
def test_torch_get_inputs_reads_zoo_input_files(zoo_run):
    from torch._functorch.compilers import get_inputs

    root, _ = zoo_run
    files = [p for p in root.rglob("*.input") if "_joint_" not in p.name]
    assert len(files) == 4 * len(ZOO)
    for f in files:
        assert get_inputs(str(f)), f


@pytest.mark.slow
def test_zoo_graphs_rebuild_from_graph_json(zoo_run):
    from aotpipe.artifact.load import load

    root, _ = zoo_run
    for name in ZOO:
        for ga in load(root / name).graphs.values():
            data = json.loads((ga.folder / "graph.json").read_text())
            assert len(ga.module.graph.nodes) == len(data["nodes"])


@pytest.mark.slow
def test_every_zoo_graph_replays_bit_exactly_and_runs_on_random_inputs(zoo_run):
    from aotpipe.replay import replay

    root, _ = zoo_run
    for name in ZOO:
        manifest = json.loads((root / name / "manifest.json").read_text())
        assert {k: v["status"] for k, v in manifest["verification"].items()} == {
            **{k: "match" for k in KINDS | {OPTIMISED}}, "chain": "match"}, name
        for r in replay(root / name):
            assert r.status == "match" and r.max_abs_error == 0.0, (name, r.kind, r.mismatches)
        for r in replay(root / name, inputs="random", seed=1):
            assert r.status == "ran", (name, r.kind, r.error, r.mismatches)


@pytest.mark.slow
def test_zoo_graphs_agree_with_eager_within_tolerance(zoo_run):
    root, _ = zoo_run
    run = json.loads((root / "run.json").read_text())
    for m in run["models"]:
        assert m["eager"]["inference"]["within_tolerance"], m["name"]
        for kind, e in m["eager"].items():
            assert e.get("within_tolerance", True), (m["name"], kind, e)


@pytest.mark.slow
def test_zoo_run_in_another_process_is_byte_identical(zoo_run, tmp_path):
    import hashlib
    import subprocess
    import sys

    root, _ = zoo_run
    other = tmp_path / "again"
    r = subprocess.run([sys.executable, "-m", "aotpipe.cli", "run", str(PIPELINES / "zoo-hf.yaml"), "-o", str(other),
                        "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]

    def hashes(d):
        return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(d.rglob("*")) if p.is_file() and p.name not in ("run.json", "report.md")}

    a, b = hashes(root), hashes(other / "zoo-hf")
    assert len(a) > 1000 and a == b


@pytest.mark.slow
def test_every_op_in_the_zoo_graphs_is_allowed(zoo_run):
    from aotpipe.artifact.ops import resolve_op
    from tests.artifact.test_ops import graph_ops

    root, _ = zoo_run
    ops = graph_ops(root)
    assert "aten.native_dropout.default" in ops and "aten.slice_scatter.default" in ops
    for name in sorted(ops):
        resolve_op(name)
