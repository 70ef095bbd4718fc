"""The mid-size and real-size pipelines: they validate, and the mid-size models run.

The real-size models are not run here (minutes and GB each); benchmarks/realsize_bench.py
runs them beside torch.export and a dynamo backend dump.
"""

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.pipeline.config import load_pipeline
from tests.conftest import PIPELINES

pytest.importorskip("transformers")

KINDS = ["inference", "forward", "backward", "joint"]
PASSES = ["freeze", "fold_conv_bn", "channels_last", "reinplace"]
MODELS = {
    "mid-size": ["resnet_bottleneck", "bert_4l"],
    "real-size": ["resnet18", "resnet50", "bert_base", "gpt2", "vit_b16", "llama_200m"],
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cli_validate_accepts_pipeline(name):
    path = PIPELINES / f"{name}.yaml"
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"ok: {path}: pipeline '{name}', {len(MODELS[name])} model(s)"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pipeline_captures_every_kind_with_the_default_passes(name):
    p = load_pipeline(PIPELINES / f"{name}.yaml")
    assert p.name == name
    assert [m.name for m in p.models] == MODELS[name]
    for m in p.models:
        assert m.graphs == KINDS, m.name
        assert [s.name for s in m.passes] == PASSES, m.name
        assert m.source.startswith("hf:") and m.save_inputs and m.verify, m.name


def test_real_size_shapes():
    models = {m.name: m for m in load_pipeline(PIPELINES / "real-size.yaml").models}
    assert models["resnet18"].config["depths"] == [2, 2, 2, 2]
    assert models["resnet18"].config["layer_type"] == "basic"
    assert models["resnet50"].config["depths"] == [3, 4, 6, 3]
    assert models["resnet50"].config["layer_type"] == "bottleneck"
    assert [i.shape for i in models["resnet50"].inputs] == [[8, 3, 224, 224]]
    assert [i.name for i in models["bert_base"].inputs] == ["input_ids", "attention_mask"]
    assert models["gpt2"].config == {"use_cache": False, "attn_implementation": "eager"}
    assert models["llama_200m"].config["use_cache"] is False


@pytest.mark.slow
def test_mid_size_models_run_ok_with_no_check_skipped(tmp_path):
    r = CliRunner().invoke(main, ["run", str(PIPELINES / "mid-size.yaml"), "--output", str(tmp_path), "--no-progress"])
    run = json.loads((tmp_path / "mid-size" / "run.json").read_text())
    statuses = {m["name"]: (m["status"], m["stage"], m["error"]) for m in run["models"]}
    assert list(statuses) == MODELS["mid-size"]
    assert r.exit_code == 0, (r.output, statuses)
    assert all(s == "ok" for s, _, _ in statuses.values()), statuses
    for m in run["models"]:
        assert m["checks"]["skipped"] == 0 and m["checks"]["failed"] == 0 and m["checks"]["run"] > 50, m["checks"]


def _bench():
    """benchmarks/realsize_bench.py as a module."""
    import importlib.util
    import sys

    path = PIPELINES.parent / "benchmarks" / "realsize_bench.py"
    spec = importlib.util.spec_from_file_location("realsize_bench", path)
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(path.parent))
    return bench


def test_the_bench_splits_an_artefacts_bytes_by_what_they_hold(quickstart_run):
    """benchmarks/realsize_bench.py's split of a model folder's bytes: every byte in one kind,
    the weights those of the parameters and buffers (the mlp: its float32 parameters)."""
    bench = _bench()
    folder = quickstart_run[0] / "mlp"
    kinds = bench.bytes_by_kind(folder)
    assert sum(kinds.values()) == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert kinds["other"] == 0 and all(kinds[k] > 0 for k in ("weights", "inputs", "evidence", "graph.json",
                                                              "module.py", "trace.json", "inputs.json", ".input",
                                                              "manifest")), kinds
    from aotpipe.models.sources import build_model
    from aotpipe.pipeline.config import load_pipeline as load

    spec_mlp = next(m for m in load(PIPELINES / "quickstart.yaml").models if m.name == "mlp")
    model = build_model(spec_mlp, PIPELINES)
    tensors = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    # a blob is a safetensors file: the tensor's bytes and a small header each
    assert tensors <= kinds["weights"] <= tensors + 1024 * (len(list(model.parameters())) + 1), (kinds, tensors)


def test_the_bench_splits_the_checks_time_and_gives_their_floor(quickstart_run):
    """The checks' split by timers (eager float32/float64, graph runs, the rest), each graph
    run once on its saved inputs (the backward on its forward's outputs), and the floor ratio
    they make with eager's times."""
    bench = _bench()
    runs = bench.graph_runs(quickstart_run[0] / "mlp")
    assert sorted(runs) == sorted(["inference", "forward", "backward", "joint",
                                   *[k for k in runs if k.startswith("inference.")]]) and len(runs) >= 4, runs
    assert all(t > 0 for t in runs.values()), runs
    split = bench.checks_split({"eager float32": 1.0, "eager float64": 2.0, "graph runs": 3.0, "ignored": 9.0}, 10.0)
    assert split == {"eager float32": 1.0, "eager float64": 2.0, "eager nudged": 0.0, "graph runs": 3.0, "other": 4.0}
    assert bench._split_cell({"checks_split": split}) == "1.0/2.0/3.0/4.0"
    assert bench._split_cell({"checks_split": {**split, "eager nudged": 0.5}}) == "1.0/2.0/3.0/4.0 (+0.5 nudged)"
    assert bench._split_cell({"error": "x"}) == "-" and bench._runs_cell({"graph_runs": {"a": 1.0, "b": 0.25}}) == "1.25"
    row = {"eager": {"fwd_bwd_s": 2.0, "fwd_s": 0.5}, "aotpipe": {"graph_runs": {"a": 1.0, "b": 0.5}, "checks_s": 8.0}}
    ratios = bench.ratios(row)
    assert ratios["floor_vs_eager"] == pytest.approx((2.0 + 0.5 + 1.5) / 2.0) and ratios["checks_vs_eager"] == 4.0
    assert bench.ratios({**row, "aotpipe": {"graph_runs": {}}})["floor_vs_eager"] is None  # nothing ran: no floor
    seconds = {}
    with bench._timing(bench.time, "sleep", seconds, lambda *a: "slept"):
        bench.time.sleep(0.01)
    assert seconds["slept"] >= 0.01 and bench.time.sleep.__name__ == "sleep"  # timed, then put back
