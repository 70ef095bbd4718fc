"""Sequence parallelism (``distributed: {..., sequence_parallel: true}``): inside each block of
the tensor-parallel plan the activations are split on the sequence (dimension 1) between its
layers: its norms run on the rank's part (torch's SequenceParallel, their weights replicated and
their gradients all-reduced), its colwise layers all-gather the sequence, its rowwise layers
reduce-scatter onto it. Checked over gloo against the single-process eager model like any world."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.distributed.tensor.parallel import ParallelStyle

from aotpipe.capture import distributed as capture_distributed
from aotpipe.pipeline.job import run_model
from tests.helpers.parallel_models import assert_ok, mlp_spec

C10D = "_c10d_functional."


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _counts(folder: Path, kind: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in _manifest(folder)["distributed"]["collectives"]:
        if c["graph"] == kind:
            out[c["op"]] = out.get(c["op"], 0) + 1
    return out


def test_tp_with_sequence_parallel_reduce_scatters_where_tp_all_reduces_and_all_reduces_the_norms(tmp_path):
    assert_ok(run_model(mlp_spec("tp", seq=4), tmp_path / "tp"))
    assert_ok(run_model(mlp_spec("tp", seq=4, sequence_parallel=True), tmp_path / "sp"))
    tp, sp = tmp_path / "tp" / "mlp.rank1", tmp_path / "sp" / "mlp.rank1"
    assert _counts(tp, "inference") == {"all_reduce": 2}  # each block's rowwise down, whole
    # per block: the colwise up gathers the sequence, the rowwise down reduce-scatters onto it, and the
    # block's output is gathered whole again for what follows (the head)
    assert _counts(sp, "inference") == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 2}
    backward = _counts(sp, "backward")
    assert backward.get("all_reduce") == 4  # each block's norm weight and bias: their gradients summed over tp
    d = _manifest(sp)["distributed"]
    norm = d["shards"]["blocks.0.norm.weight"]
    assert norm["placements"] == ["Replicate()"] and norm["local_shape"] == norm["shape"] == [8]
    assert sorted(d["tensor_parallel"]) == ["blocks.0.down", "blocks.0.up", "blocks.1.down", "blocks.1.up"]
    notes = " ".join(_manifest(sp)["capture"]["notes"])
    assert "sequence parallel: 2 norms on the rank's part of the sequence" in notes


@pytest.mark.slow  # four rank processes over gloo: about a minute and a half
def test_fsdp2_tp_with_sequence_parallel_passes_on_a_2x2_mesh(tmp_path):
    result = run_model(mlp_spec("fsdp2+tp", world=4, mesh=[2, 2], seq=4, sequence_parallel=True), tmp_path)
    assert_ok(result)
    assert _counts(tmp_path / "mlp.rank3", "backward").get("all_reduce") == 4  # the norms, over tp


class _Unsplit(ParallelStyle):
    """A style that leaves the module as it is: a norm computed on the rank's part of the
    sequence with a plain weight, whose gradient is then that part's alone."""

    def _apply(self, module, device_mesh):
        return module


def test_norms_left_out_of_sequence_parallelism_give_partial_gradients_and_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_distributed, "SequenceParallel", _Unsplit)
    result = run_model(mlp_spec("tp", seq=4, sequence_parallel=True), tmp_path)
    assert result.status == "failed" and result.stage == "verify", result.error
    assert "gradient of blocks.0.norm.weight" in result.error, result.error


@pytest.mark.parametrize("spec, error", [
    (dict(seq=3), "sequence_parallel: block blocks.0's hidden states are [4, 3, 8]; their sequence (dimension 1) must "
                  "split evenly over the 2 tensor-parallel ranks: make it a multiple of 2, or drop sequence_parallel"),
    (dict(seq=4, plan={"head": "colwise"}), "sequence_parallel: no layer of the tensor-parallel plan is inside a "
                                            "block (a child of an nn.ModuleList)"),
])
def test_what_sequence_parallelism_cannot_split_is_refused_in_one_line(tmp_path, spec, error):
    result = run_model(mlp_spec("tp", sequence_parallel=True, **spec), tmp_path)
    assert result.status == "failed" and result.stage == "capture", result.error
    assert error in result.error and "\n" not in result.error, result.error


def test_a_block_without_a_norm_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_distributed, "_is_norm", lambda module: False)
    result = run_model(mlp_spec("tp", seq=4, sequence_parallel=True), tmp_path)
    assert result.status == "failed" and "block blocks.0 has no norm layer" in result.error, result.error


@pytest.mark.parametrize("strategy, world, mesh, sp", [
    ("tp", 2, None, False),
    pytest.param("fsdp2+tp", 4, [2, 2], True, marks=pytest.mark.slow),  # four rank processes: a minute and a half
])
def test_transformers_conv1d_layers_split_as_their_transposed_weights_ask(tmp_path, strategy, world, mesh, sp):
    """GPT-2's Conv1D (x @ W + b, W stored [in, out]): colwise splits W's dimension 1 and b, rowwise
    W's dimension 0 and keeps b whole; the ranks' gradients reassembled match the eager model's."""
    pytest.importorskip("transformers")
    spec = mlp_spec(strategy, world=world, mesh=mesh, seq=4, source="conv1d_stack", sequence_parallel=sp)
    assert_ok(run_model(spec, tmp_path))
    shards = _manifest(tmp_path / f"mlp.rank{world - 1}")["distributed"]["shards"]
    tp = {name: shard["placements"][-1] for name, shard in shards.items()}  # the tp coordinate is the mesh's last
    assert shards["blocks.0.up.weight"]["shape"] == [8, 16]  # Conv1D: [in, out]
    assert (tp["blocks.0.up.weight"], tp["blocks.0.up.bias"]) == ("Shard(1)", "Shard(0)")
    assert (tp["blocks.0.down.weight"], tp["blocks.0.down.bias"]) == ("Shard(0)", "Replicate()")
    # the last rank: tp's second half of the output features; under fsdp2+tp also dp's second half of the rows
    up = shards["blocks.0.up.weight"]
    assert (up["local_shape"], up["offset"]) == (([8, 8], [0, 8]) if world == 2 else ([4, 8], [4, 8]))


def test_a_fused_q_k_v_conv1d_split_colwise_is_refused_naming_what_to_plan(tmp_path):
    pytest.importorskip("transformers")
    result = run_model(mlp_spec("tp", source="fused_conv1d_stack"), tmp_path)
    assert result.status == "failed" and result.stage == "capture", result.error
    assert "the tensor-parallel plan splits blocks.0.up colwise, a Conv1D of three times its input features" in \
        result.error and "plan the MLP: mlp.c_fc colwise, mlp.c_proj rowwise" in result.error, result.error
