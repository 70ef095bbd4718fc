"""bench on a distributed rank's graphs (aotpipe/corpus/bench/ranks.py): its collectives replaced by
the results a run of its world recorded (the default), or executed with its world over gloo; said
which; a planted backend fault still caught; a world that cannot run named by rank."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.checks.distributed import FAILED_GRACE, run_ranks, sibling_ranks, spawn_world
from aotpipe.cli import main
from aotpipe.corpus.bench.graph import GraphTask
from aotpipe.corpus.bench.ranks import COLLECTIVE_ROLE, RECORDED, RankGraphTask, _recorded, record_worlds
from aotpipe.pipeline.job import run_model
from aotpipe.runtime.execution import run_graph
from aotpipe.spec import ModelSpec
from tests.helpers.forge import reseal
from tests.helpers.parallel_models import assert_ok, mlp_spec

C10D = "_c10d_functional"


def _bench(*args):
    r = CliRunner().invoke(main, ["bench", *map(str, args), "--no-progress", "--rounds", "2", "--json"])
    return r, (json.loads(r.output) if r.output.lstrip().startswith("{") else None)


def test_a_ranks_graphs_bench_with_their_collectives_replaced_by_recorded_results(world):
    r, out = _bench(world / "mlp.rank0", "--backend", "aot_eager")
    assert r.exit_code == 0, r.output
    graphs = out["graphs"]
    assert sorted(g["graph"] for g in graphs) == ["backward", "forward", "inference", "joint"]
    assert all(g["status"] == "pass" and g["collectives"] == "recorded" for g in graphs), graphs
    (note,) = [n for n in out["notes"] if "mlp.rank0" in n]
    assert "a rank of a world of 2 ranks (fsdp2)" in note and "replaced by the results a run of the world over " \
        "gloo recorded, so their time is not counted" in note and "in 4 graphs" in note


def test_inductor_benches_a_ranks_inference_graph(world):
    r, out = _bench(world / "mlp.rank1", "--backend", "inductor", "--graphs", "inference")
    assert r.exit_code == 0, r.output
    (g,) = out["graphs"]
    assert g["status"] == "pass" and g["speedup"] > 0 and g["collectives"] == "recorded"


def test_a_planted_backend_fault_fails_a_ranks_graph_and_locate_says_it_does_not_bisect_one(world, tmp_path):
    r, out = _bench(world / "mlp.rank0", "--backend", "tests.bench.backends:gelu_as_relu", "--graphs", "inference",
                    "--locate", "--locate-dir", tmp_path)
    assert r.exit_code == 1, r.output
    (g,) = out["graphs"]
    assert g["status"] == "fail_accuracy", g
    (located,) = out["located"]
    assert not located["found"] and located["reason"].startswith("a distributed rank's graph: --locate does not "
                                                                 "bisect one yet")
    assert not list(tmp_path.iterdir())


def test_the_graph_benched_computes_with_recorded_results_what_the_world_computes(world, tmp_path):
    folders, rec = sibling_ranks(world / "mlp.rank1")
    art = load(folders[1])
    tasks = [RankGraphTask(GraphTask(str(folders[1]), "mlp.rank1", key, "eager"), RECORDED)
             for key in ("inference", "joint")]
    done = record_worlds(tasks, tmp_path, ())
    assert all(t.recorded and not t.error for t in done)
    world_ran = run_ranks(folders, rec, own_capture=False)[1]
    for t in done:
        ga = art.graphs[t.task.graph]
        prepared = _recorded(ga, t.recorded)
        assert not [n for n in prepared.module.graph.nodes if C10D in str(n.target)]
        called = [c for c in rec.collectives if c.graph == ga.kind]
        assert called and prepared.roles.count(COLLECTIVE_ROLE) == len(called)
        outs = run_graph(prepared.module, prepared.saved)
        ran = world_ran[t.task.graph]
        if t.task.graph == "inference":
            torch.testing.assert_close(outs[0], ran.outputs[0], rtol=1e-5, atol=1e-6)
        else:
            grads = {o.target: v for o, v in zip(ga.record.outputs, outs, strict=True) if o.role == "grad"}
            assert grads.keys() == ran.grads.keys() and len(grads) == len(rec.shards)
            for name, g in grads.items():
                torch.testing.assert_close(g, ran.grads[name], rtol=1e-5, atol=1e-6)


def test_collectives_gloo_benches_the_rank_in_step_with_its_world(world):
    r, out = _bench(world / "mlp.rank1", "--backend", "aot_eager", "--graphs", "forward,backward",
                    "--collectives", "gloo")
    assert r.exit_code == 0, r.output
    assert sorted(g["graph"] for g in out["graphs"]) == ["backward", "forward"]
    for g in out["graphs"]:
        assert g["status"] == "pass" and g["collectives"] == "gloo" and g["clock"] == "wall", g
        assert g["artifact"] == "mlp.rank1" and g["eager_s"] > 0
    (note,) = [n for n in out["notes"] if "mlp.rank1" in n]
    assert "benched in step with the other ranks, one local process each over gloo" in note
    assert "executed and their time counted" in note


def test_a_world_whose_one_rank_fails_is_not_waited_on(world):
    # rank 1 is refused at once; rank 0 joins the world and waits on it: it is killed after the grace
    folders = {0: world / "mlp.rank0", 1: world / "mlp.rank0"}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^rank 1 failed: .*mlp.rank0: not rank 1 of a world of 2"):
        spawn_world("aotpipe.checks.distributed", lambda r: [str(folders[r]), str(r), "2", "/dev/null", "elsewhere"],
                    2, timeout=200)
    assert time.monotonic() - start < 200 - FAILED_GRACE  # not the timeout's message: the grace's kill


def test_a_world_that_cannot_run_fails_each_benched_graph_naming_the_rank(world, tmp_path):
    for r in (0, 1):
        shutil.copytree(world / f"mlp.rank{r}", tmp_path / f"mlp.rank{r}")
    graph = next((tmp_path / "mlp.rank1").glob("*_inference_0")) / "graph.json"
    data = json.loads(graph.read_text())
    for n in data["nodes"]:
        if n.get("target", "").startswith(f"{C10D}.all_gather"):
            n["args"][-1] = "77"  # a group the world does not set up
    graph.write_text(json.dumps(data))
    assert reseal(tmp_path / "mlp.rank1")
    r, out = _bench(tmp_path / "mlp.rank0", "--backend", "eager", "--graphs", "inference")
    assert r.exit_code == 1, r.output
    (g,) = out["graphs"]
    assert g["status"] == "runtime_error" and g["reason"].startswith(
        "its world's run over gloo, which records its collectives' results, failed: rank 1 failed: "), g
    assert "process group '77' is not one this process set up" in g["reason"]


def test_a_rank_without_its_world_beside_it_is_refused(world, tmp_path):
    shutil.copytree(world / "mlp.rank0", tmp_path / "mlp.rank0")
    r, _ = _bench(tmp_path / "mlp.rank0", "--backend", "eager")
    assert r.exit_code == 2
    assert f"{tmp_path / 'mlp.rank1'}: missing; a bench of a rank's graphs runs all 2 ranks of the world together" \
           in r.output, r.output


def test_collectives_for_artefacts_without_ranks_is_refused(tmp_path):
    spec = ModelSpec.model_validate({**mlp_spec("ddp").model_dump(), "distributed": None, "graphs": ["inference"]})
    assert_ok(run_model(spec, tmp_path))
    r, _ = _bench(tmp_path / "mlp", "--backend", "eager", "--collectives", "gloo")
    assert r.exit_code == 2 and "--collectives gloo: none of the graphs benched is a distributed rank's" in r.output
    r, _ = _bench(tmp_path / "mlp", "--backend", "eager", "--collectives", "sometimes")
    assert r.exit_code == 2 and "'sometimes' is not one of 'recorded', 'gloo'" in r.output
