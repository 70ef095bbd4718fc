"""The YAML's ``distributed:`` block (spec/distributed.py, pipeline/config.py): every bound at
its edge, every refusal one line with the file, line and field, and the fix. Torch-free."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import ValidationError

from aotpipe.errors import ConfigError
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.spec.distributed import MAX_WORLD, DistributedSpec


def _yaml(block: str, *, shape: str = "[4, 8]", extra: str = "") -> str:
    return textwrap.dedent(f"""\
        version: 1
        name: t
        models:
          - name: m
            source: aotpipe.zoo:mlp
            inputs: [{{shape: {shape}}}]
            distributed: {block}
        """) + extra


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, "p.yaml", check_sources=False)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("world, ok", [(1, False), (2, True), (MAX_WORLD, True), (MAX_WORLD + 1, False)])
def test_world_size_bounds(world, ok):
    if ok:
        assert DistributedSpec(world_size=world, strategy="ddp").shape == (world,)
    else:
        with pytest.raises(ValidationError):
            DistributedSpec(world_size=world, strategy="ddp")


def test_a_mesh_must_multiply_to_the_world_size():
    assert DistributedSpec(world_size=4, strategy="fsdp2+tp", mesh=[2, 2]).shape == (2, 2)
    with pytest.raises(ValidationError, match=r"mesh \[2, 3\] holds 6 ranks and world_size is 4"):
        DistributedSpec(world_size=4, strategy="fsdp2+tp", mesh=[2, 3])


def test_a_2d_strategy_without_a_mesh_is_told_one():
    with pytest.raises(ValidationError, match=r"2-D mesh \[dp, tp\]: add mesh: \[2, 4\]"):
        DistributedSpec(world_size=8, strategy="fsdp2+tp")


def test_a_mesh_of_the_wrong_rank_names_the_dimensions():
    with pytest.raises(ValidationError, match=r"has 1 dimension\(s\) \(dp\), not 2"):
        DistributedSpec(world_size=4, strategy="fsdp2", mesh=[2, 2])


def test_a_tp_plan_only_with_tensor_parallelism():
    DistributedSpec(world_size=2, strategy="tp", tp_plan={"a": "colwise"})
    with pytest.raises(ValidationError, match="tp_plan is for the tensor-parallel strategies"):
        DistributedSpec(world_size=2, strategy="ddp", tp_plan={"a": "colwise"})
    with pytest.raises(ValidationError):
        DistributedSpec(world_size=2, strategy="tp", tp_plan={"a": "diagonal"})


@pytest.mark.parametrize("strategy, ok", [("tp", True), ("fsdp2+tp", True), ("ddp+tp", True), ("ddp", False),
                                          ("fsdp2", False)])
def test_sequence_parallel_only_with_tensor_parallelism_and_off_the_fingerprint_unless_asked(strategy, ok):
    mesh = [2, 2] if "+" in strategy else None
    world = 4 if mesh else 2
    if ok:
        assert DistributedSpec(world_size=world, strategy=strategy, mesh=mesh, sequence_parallel=True).sequence_parallel
    else:
        with pytest.raises(ValidationError, match=f"sequence_parallel is for the tensor-parallel strategies .* not "
                                                  f"{strategy}: drop it or change the strategy"):
            DistributedSpec(world_size=world, strategy=strategy, sequence_parallel=True)
    plain = parse_pipeline(_yaml("{world_size: 2, strategy: tp}"), "p.yaml", check_sources=False).models[0]
    assert "sequence_parallel" not in plain.to_json()["distributed"]  # earlier worlds' fingerprints stay
    sp = parse_pipeline(_yaml("{world_size: 2, strategy: tp, sequence_parallel: true}"), "p.yaml",
                        check_sources=False).models[0]
    assert sp.to_json()["distributed"]["sequence_parallel"] is True


def test_coords_are_row_major_as_torch_lays_a_mesh():
    spec = DistributedSpec(world_size=4, strategy="fsdp2+tp", mesh=[2, 2])
    assert [spec.coords(r) for r in range(4)] == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0},
                                                  {"dp": 1, "tp": 1}]
    assert spec.size("dp") == spec.size("tp") == 2
    assert DistributedSpec(world_size=3, strategy="tp").size("dp") == 1


def test_a_good_block_parses_into_the_model_spec():
    p = parse_pipeline(_yaml("{world_size: 2, strategy: fsdp2}"), "p.yaml", check_sources=False)
    d = p.models[0].distributed
    assert d is not None and d.strategy == "fsdp2" and d.world_size == 2
    assert p.models[0].to_json()["distributed"]["strategy"] == "fsdp2"
    # a model without one keeps its fingerprint: no distributed key at all
    q = parse_pipeline(_yaml("null"), "p.yaml", check_sources=False)
    assert "distributed" not in q.models[0].to_json()


def test_a_batch_the_data_parallel_ranks_do_not_divide_is_named_at_its_shape():
    assert parse_pipeline(_yaml("{world_size: 2, strategy: ddp}", shape="[4, 8]"), "p.yaml", check_sources=False)
    (line,) = _problems(_yaml("{world_size: 2, strategy: ddp}", shape="[3, 8]"))
    assert line.startswith("p.yaml:6: models[0].inputs[0].shape")
    assert "over 2 data-parallel ranks" in line and "multiple of 2" in line
    # tensor parallelism alone does not split the batch
    assert parse_pipeline(_yaml("{world_size: 2, strategy: tp, tp_plan: {a: colwise}}", shape="[3, 8]"), "p.yaml",
                          check_sources=False)
    # the 2-D mesh's dp size is what divides it
    (line,) = _problems(_yaml("{world_size: 4, strategy: fsdp2+tp, mesh: [4, 1]}", shape="[2, 8]"))
    assert "over 4 data-parallel ranks" in line


@pytest.mark.parametrize("extra, said", [
    ("    mode: dynamo\n", "use mode export or auto"),
    ("    passes: [freeze]\n", "set passes: [] for this model"),
    ("    graphs: [joint, train_step]\n    optimizer: {name: sgd, lr: 0.1}\n", "leave train_step out of graphs"),
])
def test_what_a_distributed_model_does_not_take_yet_is_refused_at_its_block(extra, said):
    lines = _problems(_yaml("{world_size: 2, strategy: ddp}", extra=extra))
    mine = [ln for ln in lines if "models[0].distributed" in ln]
    assert mine and mine[0].startswith("p.yaml:7: models[0].distributed") and said in mine[0], lines


def test_a_bad_block_is_one_line_naming_the_field():
    (line,) = _problems(_yaml("{world_size: 4, strategy: fsdp2+tp, mesh: [2, 3]}"))
    assert line.startswith("p.yaml:7: models[0].distributed") and "multiply to the world size" in line


def test_block_and_resharding_only_with_fsdp2():
    assert DistributedSpec(world_size=2, strategy="fsdp2").reshards
    assert not DistributedSpec(world_size=2, strategy="fsdp2", reshard_after_forward=False).reshards
    DistributedSpec(world_size=4, strategy="fsdp2+tp", mesh=[2, 2], block="Block", reshard_after_forward=True)
    for key, value in (("block", "Block"), ("reshard_after_forward", False)):
        with pytest.raises(ValidationError, match=f"{key} is for the fsdp2 strategies \\(fsdp2, fsdp2\\+tp\\), which "
                                                  "shard parameters by block, not ddp: drop it"):
            DistributedSpec(world_size=2, strategy="ddp", **{key: value})
    (line,) = _problems(_yaml("{world_size: 2, strategy: tp, tp_plan: {a: colwise}, block: Layer}"))
    assert line.startswith("p.yaml:7: models[0].distributed") and "block is for the fsdp2 strategies" in line
