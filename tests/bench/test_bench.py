"""`aotpipe bench` end to end through the real CLI, on the quickstart's artefacts.

Planted backends (tests/bench/backends.py) break one thing each; every test asserts the
status, reason or node the bench must report for it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main

PLANTED = "tests.bench.backends"


def bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args, "--no-progress", "--threads", "1", "--rounds", "2"])


def bench_json(*args: str):
    r = bench(*args, "--json")
    return r, (json.loads(r.output[r.output.index("{"):]) if "{" in r.output else None)


def by_graph(data):
    return {g["graph"]: g for g in data["graphs"]}


def test_eager_over_mlp_passes_every_graph_of_every_kind_with_timings(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", "eager")
    assert r.exit_code == 0, r.output
    graphs = by_graph(data)
    assert {g["kind"] for g in graphs.values()} == {"inference", "forward", "backward", "joint"}
    assert set(graphs) == {"inference", "forward", "backward", "joint",
                           "inference.freeze+fold_conv_bn+channels_last+reinplace"}
    for g in graphs.values():
        assert g["status"] == "pass", g
        assert g["speedup"] is not None and g["speedup"] > 0 and g["compile_s"] is not None
        assert g["reason"].endswith("outputs within the bound")
    assert data["scores"]["all"]["pass_rate"] == 1.0
    assert set(data["scores"]) == {"inference", "forward", "backward", "joint", "all"}


@pytest.mark.slow
def test_aot_eager_over_mlp_passes(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", "aot_eager", "--graphs", "inference,backward")
    assert r.exit_code == 0, r.output
    assert {g["kind"]: g["status"] for g in data["graphs"]} == {"inference": "pass", "backward": "pass"}


# small_cnn's joint graph passes only with the bench's second noise sample (float32 summed
# sequentially): inductor sums its batch norm's reductions so (docs/bench.md, the finding).
RESCALED = {("small_cnn", "joint")}


@pytest.mark.slow
def test_inductor_over_quickstart_passes_every_graph_with_speedup_and_compile_time(quickstart_run):
    root, _ = quickstart_run
    csv_path = root.parent / "inductor.csv"
    r = bench(str(root), "--backend", "inductor", "--csv", str(csv_path), "--clock", "cpu")
    rows = csv_path.read_text().splitlines()
    header = rows[0].split(",")
    assert len(rows) == 1 + 4 * 5, r.output  # four models, five graphs each
    import csv

    for row in csv.DictReader(rows):
        assert float(row["compile_s"]) > 0, row
        assert row["status"] == "pass", row
        if (row["artifact"], row["graph"]) in RESCALED:
            assert "only with float32 summed sequentially as the scale" in row["reason"], row
        # a speedup with its interval, or "within noise" with the interval that holds 1.0x
        assert row["verdict"] in ("faster", "slower", "within noise"), row
        assert 0 < float(row["speedup_low"]) <= float(row["speedup_high"]), row
        low, high = float(row["speedup_low"]), float(row["speedup_high"])  # the CSV rounds to 0.01
        assert {"faster": low >= 0.995, "slower": high <= 1.005,
                "within noise": low <= 1.005 and high >= 0.995}[row["verdict"]], row
    assert header[:3] == ["artifact", "graph", "status"]
    assert "compile" in r.output and "speedup (eager / inductor" in r.output
    assert re.search(r"\d+\.\d\dx \(\d|within noise \(\d", r.output), r.output


@pytest.mark.slow
def test_gelu_computed_as_relu_fails_accuracy_and_locate_names_the_gelu(quickstart_run, tmp_path):
    root, _ = quickstart_run
    art = str(root / "tiny_transformer")
    ok, _ = bench_json(art, "--backend", "eager", "--graphs", "inference")
    assert ok.exit_code == 0, ok.output  # the same graphs pass with the backend that changes nothing
    repros = tmp_path / "repros"
    r, data = bench_json(art, "--backend", f"{PLANTED}:gelu_as_relu", "--graphs", "inference", "--locate",
                         "--locate-dir", str(repros))
    assert r.exit_code == 1, r.output
    g = by_graph(data)["inference"]
    assert g["status"] == "fail_accuracy"
    assert "outside the bound" in g["reason"] and "against the float64 eager model" in g["reason"]
    [loc] = [x for x in data["located"] if x["graph"] == "inference"]
    assert loc["found"] and loc["op"] == "aten.gelu.default" and loc["node"] == "gelu"
    assert loc["output_shape"] == "float32[2, 16, 256]"
    # Where the node came from: graph.json's origin of the node (module path, class, source line).
    assert loc["module_path"].startswith("layers.0 (aotpipe.models.zoo.EncoderLayer), aotpipe/models/zoo.py:")
    repro = Path(loc["repro"])
    assert repro.parent == repros
    # The repro is an artefact replay and bench take: it replays bit for bit, and still fails.
    rp = CliRunner().invoke(main, ["replay", str(repro)])
    assert rp.exit_code == 0 and "match" in rp.output, rp.output
    again, data2 = bench_json(str(repro), "--backend", f"{PLANTED}:gelu_as_relu")
    assert again.exit_code == 1 and data2["graphs"][0]["status"] == "fail_accuracy", again.output


@pytest.mark.slow
def test_one_add_off_by_1e_2_fails_accuracy_and_locate_names_that_add(quickstart_run, tmp_path):
    root, _ = quickstart_run
    art = root / "mlp"
    graph = json.loads(next(art.glob("mlp_forward_0/graph.json")).read_text())
    first_add = next(n["name"] for n in graph["nodes"] if n.get("target") == "aten.add.Tensor")
    r, data = bench_json(str(art), "--backend", f"{PLANTED}:first_add_off", "--graphs", "forward", "--locate",
                         "--locate-dir", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert by_graph(data)["forward"]["status"] == "fail_accuracy"
    [loc] = data["located"]
    assert loc["found"] and loc["node"] == first_add and loc["op"] == "aten.add.Tensor", loc


@pytest.mark.slow
def test_a_segfaulting_backend_marks_its_graph_crashed_and_the_others_still_run(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", f"{PLANTED}:segfault_on_relu_backward",
                         "--graphs", "backward,inference")
    assert r.exit_code == 1, r.output
    graphs = by_graph(data)
    assert graphs["backward"]["status"] == "crashed"
    assert "SIGSEGV" in graphs["backward"]["reason"]
    assert graphs["inference"]["status"] == "pass"
    assert graphs["inference.freeze+fold_conv_bn+channels_last+reinplace"]["status"] == "pass"


@pytest.mark.slow
def test_a_hanging_backend_times_out_its_graph_and_the_others_still_run(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", f"{PLANTED}:hang_on_relu_backward",
                         "--graphs", "backward,inference", "--timeout", "20")
    assert r.exit_code == 1, r.output
    graphs = by_graph(data)
    assert graphs["backward"]["status"] == "timeout"
    assert "timed out after 20 s" in graphs["backward"]["reason"]
    assert graphs["inference"]["status"] == "pass"


@pytest.mark.slow
def test_baseline_round_trips_and_one_flipped_status_exits_1_naming_that_graph(quickstart_run, tmp_path):
    root, _ = quickstart_run
    art = str(root / "mlp")
    base = tmp_path / "expected.csv"
    args = (art, "--backend", f"{PLANTED}:fails_to_compile", "--graphs", "inference")
    w = bench(*args, "--write-baseline", str(base))
    assert w.exit_code == 0, w.output
    rows = base.read_text().splitlines()
    assert rows == ["artifact,graph,status", "mlp,inference,compile_error",
                    "mlp,inference.freeze+fold_conv_bn+channels_last+reinplace,compile_error"]
    same = bench(*args, "--baseline", str(base))
    assert same.exit_code == 0 and "no regressions" in same.output, same.output
    base.write_text(base.read_text().replace("mlp,inference,compile_error", "mlp,inference,pass"))
    flipped = bench(*args, "--baseline", str(base))
    assert flipped.exit_code == 1, flipped.output
    assert "regressions (passed in the baseline, fail now): 1" in flipped.output
    assert "mlp inference: pass -> compile_error (" in flipped.output
    assert "reinplace: pass ->" not in flipped.output


def test_a_backend_that_fails_to_compile_is_compile_error_with_its_message(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", f"{PLANTED}:fails_to_compile", "--graphs", "inference")
    assert r.exit_code == 1, r.output
    for g in data["graphs"]:
        assert g["status"] == "compile_error" and "no lowering for this graph" in g["reason"], g


def test_an_unknown_backend_is_a_user_error_listing_the_backends(quickstart_run):
    root, _ = quickstart_run
    r = bench(str(root / "mlp"), "--backend", "tensorrt")
    assert r.exit_code == 2
    assert "--backend 'tensorrt' is not a backend; use one of eager, aot_eager, inductor, inductor-freezing" in r.output


def test_a_user_backend_that_does_not_import_is_a_user_error(quickstart_run):
    root, _ = quickstart_run
    r = bench(str(root / "mlp"), "--backend", "no_such_module_here:fn")
    assert r.exit_code == 2 and "cannot import 'no_such_module_here'" in r.output, r.output
    r = bench(str(root / "mlp"), "--backend", f"{PLANTED}:NOT_CALLABLE")
    assert r.exit_code == 2 and "'NOT_CALLABLE' is a int, not a callable" in r.output, r.output


def test_unsigned_artefacts_are_not_benched_without_a_key_or_no_sandbox(quickstart_run, monkeypatch, tmp_path):
    root, _ = quickstart_run
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")
    r = bench(str(root / "mlp"), "--backend", "eager")
    assert r.exit_code == 2
    assert "not signed by a key you trust, so not benched" in r.output and "aotpipe trust add" in r.output
    assert "pass --no-sandbox if you otherwise trust them" in r.output, r.output
    key = tmp_path / "k.key"
    key.write_bytes(bytes(range(64)))
    r = bench(str(root / "mlp"), "--backend", "eager", "--key", f"hmac:{key}")
    assert r.exit_code == 2 and f"not signed by hmac:{key}, so not benched" in r.output, r.output
    assert "not the sandbox): mlp: " in r.output, r.output


def test_graphs_names_only_known_kinds(quickstart_run):
    root, _ = quickstart_run
    r = bench(str(root / "mlp"), "--backend", "eager", "--graphs", "forward,backwards")
    assert r.exit_code == 2 and "backwards is not a graph kind" in r.output, r.output


def test_a_folder_without_artefacts_is_a_user_error(tmp_path):
    r = bench(str(tmp_path), "--backend", "eager")
    assert r.exit_code == 2 and "no artefact under it" in r.output, r.output


@pytest.mark.slow
def test_signed_artefacts_are_benched_with_their_key(quickstart_run, tmp_path, monkeypatch):
    root, _ = quickstart_run
    art = tmp_path / "lib" / "mlp"
    shutil.copytree(root / "mlp", art)
    key = tmp_path / "k.key"
    key.write_bytes(bytes(range(64, 128)))
    s = CliRunner().invoke(main, ["sign", str(art.parent), "--key", f"hmac:{key}"])
    assert s.exit_code == 0, s.output
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")
    r = bench(str(art), "--backend", "eager", "--graphs", "inference", "--key", f"hmac:{key}")
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_inductor_freezing_benches_inference_graphs_only_and_says_so(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", "inductor-freezing", "--graphs", "inference,joint")
    assert r.exit_code == 0, r.output
    assert {g["kind"] for g in data["graphs"]} == {"inference"} and len(data["graphs"]) == 2
    assert data["notes"] == ["inductor-freezing takes inference graphs only; left out: 1 joint"]


@pytest.mark.slow
def test_random_inputs_are_benched_like_saved_ones(quickstart_run):
    root, _ = quickstart_run
    r, data = bench_json(str(root / "mlp"), "--backend", "eager", "--graphs", "backward", "--inputs", "random",
                         "--clock", "cpu")
    assert r.exit_code == 0, r.output
    [g] = data["graphs"]
    assert g["status"] == "pass" and g["inputs"] == "random"


DYNAMO_MODEL = '''
import torch
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        return self.fc2(h * 2)


def branchy():
    return Branchy()
'''


@pytest.mark.slow
def test_dynamo_subgraphs_are_benched_each_under_its_own_key(tmp_path, monkeypatch):
    (tmp_path / "benchdyn.py").write_text(DYNAMO_MODEL)
    (tmp_path / "p.yaml").write_text(
        "version: 1\nname: p\nexecutor: {kind: local}\ndefaults: {graphs: [inference, forward, backward]}\n"
        "models:\n  - {name: dyn, source: \"benchdyn:branchy\", inputs: [{shape: [4, 8]}], mode: dynamo}\n")
    run = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress"])
    assert run.exit_code == 0, run.output
    r, data = bench_json(str(tmp_path / "out" / "p"), "--backend", "eager")
    assert r.exit_code == 0, r.output
    keys = {g["graph"]: g["status"] for g in data["graphs"]}
    assert {"inference", "inference_1", "forward", "forward_1", "backward", "backward_1"} <= set(keys), keys
    assert set(keys.values()) == {"pass"}


def _result(artifact, graph, status):
    from aotpipe.corpus.bench.graph import GraphResult

    return GraphResult(artifact=artifact, graph=graph, kind=graph.split(".")[0], status=status, reason="")


def test_a_graph_that_passed_and_is_gone_is_a_regression_unless_removed_on_purpose():
    from aotpipe.corpus.bench.baseline import compare

    baseline = {("kept", "inference"): "pass", ("gone", "inference"): "pass", ("broken", "inference"): "compile_error",
                ("kept", "forward"): "pass"}
    results = [_result("kept", "inference", "pass")]
    # the failing artefact deleted: the one that failed before is only missing; the passing one is a regression
    c = compare(results, baseline)
    assert not c.ok and c.regressions == []
    assert [v.split(":")[0] for v in c.vanished] == ["gone inference", "kept forward"]
    assert c.missing == ["broken inference: compile_error", "gone inference: pass", "kept forward: pass"]
    # just inside: the user says they were removed on purpose
    c = compare(results, baseline, removed=["gone", "kept/forward", "broken"])
    assert c.ok and c.vanished == [] and c.missing == [] and len(c.removed) == 3
    # graphs this bench would not have run at all (--graphs inference) are neither
    c = compare(results, baseline, benched_kinds=lambda g: g.split(".")[0] == "inference")
    assert [v.split(":")[0] for v in c.vanished] == ["gone inference"]
    assert "kept forward: pass" not in c.missing


def test_the_gate_fails_from_the_command_line_when_a_passing_graph_is_gone(quickstart_run, tmp_path):
    root, _ = quickstart_run
    base = tmp_path / "expected.csv"
    args = (str(root / "mlp"), "--backend", f"{PLANTED}:fails_to_compile", "--graphs", "inference")
    assert bench(*args, "--write-baseline", str(base)).exit_code == 0
    base.write_text(base.read_text() + "deleted_model,inference,pass\ndeleted_model,forward,pass\n")
    r = bench(*args, "--baseline", str(base))
    assert r.exit_code == 1, r.output
    assert "regressions (passed in the baseline, gone now): 1" in r.output
    assert "deleted_model inference: pass -> not benched" in r.output
    assert "deleted_model forward: pass -> not benched" not in r.output  # --graphs inference: not this bench's
    r = bench(*args, "--baseline", str(base), "--removed", "deleted_model")
    assert r.exit_code == 0 and "no regressions" in r.output, r.output
    assert "deleted_model inference: pass -> removed (--removed deleted_model)" in r.output
