"""Collectives counted per training step and per inference call (DistributedRecord.per_step): by
kind, the bytes their outputs hold, the bytes a rank sends in a ring algorithm; shown by `aotpipe
ops` and on report.html's rank rows."""

from __future__ import annotations

import json

from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.format.records import CollectiveTotal, DistributedRecord, bytes_text, collectives_text
from aotpipe.pipeline.htmlreport import gather

C10D = "_c10d_functional."


def _record(graphs_ops_bytes, groups=None):
    groups = groups or {"0": {"dim": "dp", "ranks": [0, 1, 2, 3]}, "1": {"dim": "tp", "ranks": [0, 1]}}
    return DistributedRecord.model_validate(dict(
        world_size=8, strategy="fsdp2+tp", mesh=[4, 2], mesh_dims=["dp", "tp"], rank=0, coords={"dp": 0, "tp": 0},
        groups=groups, shards={},
        collectives=[dict(graph=g, node=f"n{i}", op=op, group=grp, dim="dp", bytes=b)
                     for i, (g, op, grp, b) in enumerate(graphs_ops_bytes)]))


def test_a_step_is_the_forward_and_backward_and_a_ring_sends_what_each_kind_needs():
    rec = _record([("forward", "all_gather_into_tensor", "0", 400),  # 4 ranks: sends 3/4 of its output
                   ("backward", "reduce_scatter_tensor", "0", 100),  # sends 3 times its output
                   ("backward", "all_reduce", "1", 100),  # 2 ranks: sends 2 * 1/2 of it
                   ("backward", "all_reduce", "1", 50),
                   ("joint", "all_gather_into_tensor", "0", 400),  # the same step once more: not counted again
                   ("inference", "all_gather_into_tensor", "0", 400)])
    assert rec.per_step() == {"all_gather_into_tensor": CollectiveTotal(1, 400, 300),
                              "reduce_scatter_tensor": CollectiveTotal(1, 100, 300),
                              "all_reduce": CollectiveTotal(2, 150, 150)}
    assert rec.per_inference() == {"all_gather_into_tensor": CollectiveTotal(1, 400, 300)}
    assert collectives_text(rec.per_step()) == "all-gather 1, all-reduce 2, reduce-scatter 1; sends 750 B"
    assert collectives_text({}) == "none"


def test_a_rank_with_the_joint_alone_counts_the_joints():
    rec = _record([("joint", "all_gather_into_tensor", "0", 400), ("inference", "all_reduce", "1", 8)])
    assert rec.per_step() == {"all_gather_into_tensor": CollectiveTotal(1, 400, 300)}


def test_bytes_read_as_a_person_reads_them():
    assert [bytes_text(n) for n in (1023, 1024, 3 << 20, 5 << 30)] == ["1023 B", "1.0 KiB", "3.0 MiB", "5.0 GiB"]


def _step_nodes(folder):
    """The collectives the forward and backward graph.json call, by op (the wait aside)."""
    out = {}
    for kind in ("forward", "backward"):
        graph = next(folder.glob(f"*_{kind}_0")) / "graph.json"
        for n in json.loads(graph.read_text())["nodes"]:
            t = n.get("target") or ""
            if n.get("op") == "call_function" and t.startswith(C10D) and "wait_tensor" not in t:
                op = t.removeprefix(C10D).split(".")[0]
                out[op] = out.get(op, 0) + 1
    return out


def test_ops_counts_each_ranks_collectives_per_step(world):
    r = CliRunner().invoke(main, ["ops", str(world), "--json"])
    assert r.exit_code == 0, r.output
    rows = {c["model"]: c for c in json.loads(r.output)["collectives"]}
    assert sorted(rows) == ["mlp.rank0", "mlp.rank1"]
    for name, row in rows.items():
        assert (row["world"], row["strategy"]) == (2, "fsdp2")
        assert {op: t["calls"] for op, t in row["step"].items()} == _step_nodes(world / name)
        gather_, scatter = row["step"]["all_gather_into_tensor"], row["step"]["reduce_scatter_tensor"]
        # two ranks: an all-gather sends half its output, a reduce-scatter its output once
        assert gather_["sent"] == gather_["bytes"] // 2 and scatter["sent"] == scatter["bytes"] > 0
    text = CliRunner().invoke(main, ["ops", str(world)]).output
    line = next(ln for ln in text.splitlines() if ln.startswith("mlp.rank0 "))
    # three units (the root, two blocks): gathered for the forward and again for the backward
    assert "2 fsdp2" in line and "all-gather 6, reduce-scatter 3; sends" in line


def test_the_report_says_each_ranks_collectives(world):
    notes = sorted(n for row in gather(world).rows for n in row.notes if "collectives of a training step" in n)
    assert len(notes) == 2 and notes[1].startswith("rank 1 of a world of 2 (fsdp2)")
    note = notes[0]
    assert note.startswith("rank 0 of a world of 2 (fsdp2): collectives of a training step (forward then backward): "
                           "all-gather 6, reduce-scatter 3; sends ")
    assert "of an inference call: all-gather 3; sends" in note
