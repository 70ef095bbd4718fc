"""Distributed models end to end (capture/distributed.py, checks/distributed.py): each strategy's
ranks written with their collectives and checked together over gloo against the eager model;
faults planted in a rank's graph (a reduce-scatter over the wrong group, one left out) are
named by rank and parameter; a rank's graph replayed alone says what it needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.capture import distributed as capture_distributed
from aotpipe.checks.distributed import run_ranks
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.pipeline.job import run_model
from aotpipe.replay import replay
from aotpipe.spec import ModelSpec
from tests.helpers.forge import reseal
from tests.helpers.parallel_models import PLAN, assert_ok, mlp_spec

KINDS = ["inference", "forward", "backward", "joint"]
C10D = "_c10d_functional."


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _ops(folder: Path, kind: str) -> list[str]:
    graph = next(p for p in folder.iterdir() if p.is_dir() and p.name.endswith(f"_{kind}_0"))
    nodes = json.loads((graph / "graph.json").read_text())["nodes"]
    return [n["target"] for n in nodes if n.get("op") == "call_function"]


def _collectives(folder: Path, kind: str) -> set[str]:
    return {t.removeprefix(C10D).split(".")[0] for t in _ops(folder, kind) if t.startswith(C10D)} - {"wait_tensor"}


def _gathers(folder: Path, kind: str) -> list[int]:
    """The bytes of each all-gather of a rank's graph, in order."""
    rec = _manifest(folder)["distributed"]["collectives"]
    return [c["bytes"] for c in rec if c["graph"] == kind and c["op"] == "all_gather_into_tensor"]


# The stack's fsdp2 units over two ranks, each gathered in one all-gather of float32 shards padded
# to half their first dimension: the root's head (weight 4x8, bias 4: 18 floats a rank), then each
# block (norm 8 + 8, up 16x8 + 16, down 8x16 + 8: 148 floats a rank).
UNITS = [2 * 18 * 4, 2 * 148 * 4, 2 * 148 * 4]


def test_fsdp2_gathers_each_block_in_one_collective_and_gathers_again_for_the_backward(world):
    r0, r1 = world / "mlp.rank0", world / "mlp.rank1"
    assert _collectives(r0, "forward") == {"all_gather_into_tensor"}
    assert _collectives(r0, "backward") == {"all_gather_into_tensor", "reduce_scatter_tensor"}
    assert _collectives(r0, "joint") == {"all_gather_into_tensor", "reduce_scatter_tensor"}
    assert _gathers(r0, "forward") == _gathers(r0, "backward") == _gathers(r0, "inference") == UNITS
    m0, m1 = _manifest(r0), _manifest(r1)
    d0, d1 = m0["distributed"], m1["distributed"]
    scatters = [c["bytes"] for c in d0["collectives"] if c["graph"] == "backward" and c["op"] == "reduce_scatter_tensor"]
    assert sorted(scatters) == sorted(b // 2 for b in UNITS)  # each unit's gradient shard
    assert (d0["rank"], d1["rank"], d0["world_size"], d0["strategy"]) == (0, 1, 2, "fsdp2")
    # each parameter split on its first dimension: the two shards tile it
    up0, up1 = d0["shards"]["blocks.0.up.weight"], d1["shards"]["blocks.0.up.weight"]
    assert up0["shape"] == [16, 8] and up0["local_shape"] == up1["local_shape"] == [8, 8]
    assert (up0["offset"], up1["offset"]) == ([0, 0], [8, 0]) and up0["placements"] == ["Shard(0)"]
    assert d0["batch"] == [0, 2, 4] and d1["batch"] == [2, 2, 4]
    (group,) = d0["groups"].values()
    assert group == {"dim": "dp", "ranks": [0, 1]}
    assert all(c["bytes"] > 0 and c["group"] in d0["groups"] for c in d0["collectives"])
    assert m0["verification"]["ranks"]["status"] == "match"
    assert m0["checks"]["failed"] == 0 and m0["checks"]["run"] == m0["verification"]["ranks"]["compared"] > 0


def test_fsdp2_without_resharding_keeps_the_gathered_parameters_for_the_backward(tmp_path):
    assert_ok(run_model(mlp_spec("fsdp2", reshard_after_forward=False), tmp_path))
    r1 = tmp_path / "mlp.rank1"
    assert _gathers(r1, "forward") == UNITS and _gathers(r1, "backward") == []
    assert _collectives(r1, "backward") == {"reduce_scatter_tensor"}


def test_fsdp2_units_are_the_modules_of_the_block_class_named(tmp_path):
    assert_ok(run_model(mlp_spec("fsdp2", block="LayerNorm"), tmp_path))
    # the root keeps every Linear (head 18, up and down 140 a block); each norm is a unit (8 a rank)
    assert _gathers(tmp_path / "mlp.rank0", "forward") == [2 * (18 + 2 * 140) * 4, 2 * 8 * 4, 2 * 8 * 4]


def test_a_block_class_the_model_does_not_hold_is_refused_naming_its_classes(tmp_path):
    result = run_model(mlp_spec("fsdp2", block="DecoderLayer"), tmp_path)
    assert result.status == "failed" and result.stage == "capture"
    assert "distributed.block 'DecoderLayer': no module of the model is one, so fsdp2 has no block to shard; its " \
           "module classes: Block, LayerNorm, Linear, ModuleList, Stack" in result.error, result.error


def test_ddp_ranks_hold_whole_parameters_and_all_reduce_each_gradient(tmp_path):
    assert_ok(run_model(mlp_spec("ddp"), tmp_path))
    r1 = tmp_path / "mlp.rank1"
    assert _collectives(r1, "forward") == set()
    assert _collectives(r1, "backward") == {"all_reduce"}
    shard = _manifest(r1)["distributed"]["shards"]["blocks.0.up.weight"]
    assert shard["local_shape"] == shard["shape"] and shard["placements"] == ["Replicate()"]


def test_tp_ranks_split_the_planned_layers_and_keep_the_batch_whole(tmp_path):
    assert_ok(run_model(mlp_spec("tp", batch=3), tmp_path))
    d1 = _manifest(tmp_path / "mlp.rank1")["distributed"]
    assert d1["batch"] is None and sorted(d1["tensor_parallel"]) == ["blocks.0.down", "blocks.0.up", "blocks.1.down",
                                                                      "blocks.1.up"]
    assert d1["shards"]["blocks.0.up.weight"]["offset"] == [8, 0]  # colwise: output rows
    assert d1["shards"]["blocks.0.down.weight"]["offset"] == [0, 8]  # rowwise: input columns
    assert d1["shards"]["head.weight"]["local_shape"] == [4, 8]  # not in the plan: whole
    assert "all_reduce" in _collectives(tmp_path / "mlp.rank1", "inference")


def _plant(monkeypatch, fault) -> None:
    """Rank 0's captured graphs changed by `fault(graph_module, record)` before they are written."""
    real = capture_distributed.capture_rank

    def planted(*args, **kwargs):
        rc = real(*args, **kwargs)
        if rc.record.rank == 0:
            for key in ("backward", "joint"):
                gm = rc.captured.graphs[key].gm
                fault(gm, rc.record)
                gm.recompile()
        return rc

    monkeypatch.setattr(capture_distributed, "capture_rank", planted)


def _reduce_scatters(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops._c10d_functional.reduce_scatter_tensor.default]


def test_a_reduce_scatter_over_the_wrong_group_is_named_before_any_rank_runs(tmp_path, monkeypatch):
    def wrong_group(gm, record):
        tp = next(name for name, g in record.groups.items() if g.dim == "tp")
        for n in _reduce_scatters(gm):
            n.args = (*n.args[:-1], tp)  # the tensor-parallel group: same size, other ranks

    _plant(monkeypatch, wrong_group)
    result = run_model(mlp_spec("fsdp2+tp", world=4, mesh=[2, 2]), tmp_path)
    assert result.status == "failed" and result.stage == "verify", result.error
    # the backward gathers the three units again first: its first reduce-scatter is its 4th collective
    assert "backward: collective #4 on the dp group [0, 2]: rank 0 has none (it calls 3)" in result.error, result.error
    assert "rank 2's is reduce_scatter_tensor" in result.error and "would not meet" in result.error
    m0 = _manifest(tmp_path / "mlp.rank0")
    assert m0["verification"]["ranks"]["status"] == "error"


def test_a_dropped_reduce_scatter_is_named(tmp_path, monkeypatch):
    def dropped(gm, record):
        for n in _reduce_scatters(gm):
            x, _, size, _ = n.args
            rows = x.meta["val"].shape[0] // size
            with gm.graph.inserting_before(n):
                local = gm.graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, rows))
            local.meta["val"] = n.meta["val"]
            wait = next(iter(n.users))
            wait.replace_all_uses_with(local)
            gm.graph.erase_node(wait)
            gm.graph.erase_node(n)

    _plant(monkeypatch, dropped)
    result = run_model(mlp_spec("fsdp2"), tmp_path)
    assert result.status == "failed" and result.stage == "verify"
    assert "backward: collective #4 on the dp group [0, 1]: rank 0 has none (it calls 3) where rank 1's is " \
           "reduce_scatter_tensor" in result.error, result.error


def test_a_wrong_gradient_shard_is_named_by_rank_and_parameter(tmp_path, monkeypatch):
    def scaled(gm, record):  # the collectives as they were; one gradient's shard off by 1%
        out = next(n for n in gm.graph.nodes if n.op == "output")
        for n in _reduce_scatters(gm)[-1:]:
            wait = next(iter(n.users))
            with gm.graph.inserting_after(wait):
                off = gm.graph.call_function(torch.ops.aten.mul.Tensor, (wait, 1.01))
            off.meta["val"] = wait.meta["val"]
            out.replace_input_with(wait, off) if wait in out.all_input_nodes else None
            for user in list(wait.users):
                if user is not off:
                    user.replace_input_with(wait, off)

    _plant(monkeypatch, scaled)
    result = run_model(mlp_spec("fsdp2"), tmp_path)
    assert result.status == "failed" and result.stage == "verify", result.error
    # the last reduce-scatter of the backward is the first unit's: the root's (the head)
    assert result.error.startswith("rank 0: joint: gradient of head.bias (shard at [0]): RMS error"), result.error
    assert "rank 0: joint: gradient of head.weight (shard at [0, 0])" in result.error
    assert "rank 0: backward: gradient of head.bias" in result.error
    problems = _manifest(tmp_path / "mlp.rank0")["verification"]["ranks"]["problems"]
    assert problems and all(p.startswith("rank 0: ") for p in problems)
    assert _manifest(tmp_path / "mlp.rank1")["verification"]["ranks"]["status"] == "match"


def test_a_group_no_rank_set_up_is_refused_in_one_line(tmp_path, monkeypatch):
    def unknown(gm, record):
        for n in _reduce_scatters(gm):
            n.args = (*n.args[:-1], "77")

    _plant(monkeypatch, unknown)
    result = run_model(mlp_spec("fsdp2"), tmp_path)
    assert result.status == "failed" and result.stage == "verify"
    assert "rank 0: backward: reduce_scatter_tensor (reduce_scatter_tensor) calls group '77', which is none of its " \
           "mesh's" in result.error, result.error


def test_a_rank_process_that_fails_is_named(world):
    record = load(world / "mlp.rank0").manifest.distributed
    swapped = {0: world / "mlp.rank1", 1: world / "mlp.rank0"}
    with pytest.raises(RuntimeError, match=r"^rank 0 failed: .*mlp.rank1: not rank 0 of a world of 2"):
        run_ranks(swapped, record, timeout=120)
    with pytest.raises(ValueError, match=r"every rank of the world \(2\); it was given ranks \[0\]"):
        run_ranks({0: world / "mlp.rank0"}, record)


def test_a_rank_replayed_alone_says_it_needs_its_peers(world):
    art = load(world / "mlp.rank0")
    with pytest.raises(ArtifactError, match=r"runs with its peer ranks"):
        replay(art)


def _replay(*args):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


def test_replay_ranks_runs_the_world_again_bit_for_bit(world):
    r = _replay(world / "mlp.rank1", "--ranks")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert [ln.split()[:3] for ln in lines] == [[f"rank{k}", key, "match"] for k in (0, 1)
                                                 for key in ("inference", "forward", "backward", "joint")]
    assert all(ln.endswith("outputs bit for bit") for ln in lines)
    assert "--graph" in _replay(world / "mlp.rank1", "--ranks", "--graph", "joint").output


def test_replay_ranks_names_a_rank_whose_outputs_differ_from_the_capture(world, tmp_path, monkeypatch):
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")  # the suite's default (conftest): this test decides it
    for r in (0, 1):
        shutil.copytree(world / f"mlp.rank{r}", tmp_path / f"mlp.rank{r}")
    path = tmp_path / "mlp.rank0" / "manifest.json"
    data = json.loads(path.read_text())
    digests = data["verification"]["ranks"]["graph_digests"]["joint"]
    digests[1] = "0" * 64  # the first gradient's, as if the capture's run had given another
    path.write_text(json.dumps(data))
    assert reseal(tmp_path / "mlp.rank0")
    # not signed (run_model without a key), and changed: not replayed outside the sandbox unless the user says so
    r = _replay(tmp_path / "mlp.rank1", "--ranks")
    assert r.exit_code == 2 and "--ranks runs the ranks in local processes over gloo, outside the sandbox" in r.output
    r = _replay(tmp_path / "mlp.rank1", "--ranks", "--no-sandbox")
    assert r.exit_code == 1, r.output
    bad = [ln for ln in r.output.splitlines() if "mismatch" in ln]
    assert len(bad) == 1 and bad[0].startswith("rank0   joint     mismatch  1 of 16 outputs differ from the "
                                               "capture's run (outputs 1; at "), bad
    assert "rank0" in bad[0] and "joint" in bad[0] and "(outputs 1;" in bad[0], r.output


def test_replay_ranks_needs_every_rank_beside_it_and_a_rank_to_start_from(world, tmp_path):
    shutil.copytree(world / "mlp.rank0", tmp_path / "mlp.rank0")
    r = _replay(tmp_path / "mlp.rank0", "--ranks")
    assert r.exit_code == 2 and f"{tmp_path / 'mlp.rank1'}: missing; --ranks runs all 2 ranks of the world " \
                                 "together, and finds rank 1 beside mlp.rank0" in r.output, r.output
    shutil.copytree(world / "mlp.rank0", tmp_path / "renamed")
    r = _replay(tmp_path / "renamed", "--ranks")
    assert r.exit_code == 2 and "rank 0's folder is named <model>.rank0" in r.output, r.output


def test_get_inputs_regenerates_a_ranks_local_shards(world):
    from aotpipe.replay import get_inputs

    for r in (0, 1):
        folder = world / f"mlp.rank{r}"
        shards = _manifest(folder)["distributed"]["shards"]
        graph = folder / f"mlp.rank{r}_forward_0"
        inputs = get_inputs(graph / f"{graph.name}.input", seed=1)
        record = json.loads((graph / "inputs.json").read_text())["inputs"]
        params = {rec["target"]: t for rec, t in zip(record, inputs, strict=True) if rec["role"] == "param"}
        assert params and {n: list(t.shape) for n, t in params.items()} == \
            {n: s["local_shape"] for n, s in shards.items()}


EMBEDDED_PLAN = {"stack.blocks.*.up": "colwise", "stack.blocks.*.down": "rowwise"}


def test_an_embedding_split_rowwise_splits_the_vocabulary_and_all_reduces_its_output(tmp_path):
    result = run_model(mlp_spec("tp", plan={"embed": "rowwise", **EMBEDDED_PLAN}, embedded=True), tmp_path)
    assert_ok(result)
    d = _manifest(tmp_path / "mlp.rank1")["distributed"]
    assert d["shards"]["embed.weight"] == {"shape": [16, 8], "local_shape": [8, 8], "offset": [8, 0],
                                           "placements": ["Shard(0)"]}
    assert "embed" in d["tensor_parallel"]
    # the embedding's partial rows summed whole, then the block's rowwise down: two all-reduces
    ops = _ops(tmp_path / "mlp.rank1", "inference")
    assert ops.count(f"{C10D}all_reduce.default") == 2


def test_an_embedding_split_colwise_under_fsdp2_tp_gathers_its_output_whole(tmp_path):
    result = run_model(mlp_spec("fsdp2+tp", world=4, mesh=[2, 2], plan={"embed": "colwise", **EMBEDDED_PLAN},
                                embedded=True), tmp_path)
    assert_ok(result)
    d = _manifest(tmp_path / "mlp.rank3")["distributed"]
    # dp shards the vocabulary, tp the embedding dimension
    assert d["shards"]["embed.weight"] == {"shape": [16, 8], "local_shape": [8, 4], "offset": [8, 4],
                                           "placements": ["Shard(0)", "Shard(1)"]}


@pytest.mark.parametrize("plan, error", [
    ({"nothing.*": "colwise"}, "the tensor-parallel plan names no module of the model (patterns: nothing.*); its "
                               "nn.Linear, nn.Embedding and Conv1D layers: blocks.0.up, blocks.0.down, blocks.1.up, "
                               "blocks.1.down ..."),
    ({"blocks.*.norm": "colwise"}, "the tensor-parallel plan names blocks.0.norm, a LayerNorm: colwise and rowwise "
                                   "split nn.Linear, nn.Embedding and transformers' Conv1D layers; narrow the pattern"),
    ({**PLAN, "blocks.*.gate": "colwise"}, "tp_plan pattern 'blocks.*.gate' matches no module of the model; its "
                                           "nn.Linear, nn.Embedding and Conv1D layers"),
])
def test_a_plan_torch_cannot_apply_to_the_model_is_refused_in_one_line(tmp_path, plan, error):
    result = run_model(mlp_spec("tp", plan=plan), tmp_path)
    assert result.status == "failed" and result.stage == "capture", result.error
    assert error in result.error and "\n" not in result.error, result.error


def test_tensor_parallelism_without_a_plan_on_a_model_that_carries_none_is_told_to_add_one(tmp_path):
    data = mlp_spec("tp").model_dump()
    data["distributed"]["tp_plan"] = None
    result = run_model(ModelSpec.model_validate(data), tmp_path)
    assert result.status == "failed" and result.stage == "capture", result.error
    assert "strategy tp needs a tensor-parallel plan and the model carries none (config.base_model_tp_plan): add " \
           "tp_plan:" in result.error, result.error


@pytest.mark.parametrize("code", [0, 3])
def test_a_rank_process_ends_with_its_status_and_its_output_flushed_without_teardown(code):
    import subprocess
    import sys

    script = ("import atexit, sys; atexit.register(lambda: print('teardown ran', file=sys.stderr)); "
              "from aotpipe.checks.distributed import exit_rank; print('saved', end=''); "
              f"print('said', end='', file=sys.stderr); exit_rank({code})")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (code, "saved", "said")  # atexit (teardown) never ran
