"""The checks of a run: every output against eager, nothing skipped silently, wrong graphs fail."""

import json
import textwrap
from types import SimpleNamespace

import torch
from click.testing import CliRunner

import aotpipe.capture
import aotpipe.pipeline.job
from aotpipe.checks.written import _Checker
from aotpipe.cli import main
from aotpipe.models.eager import EagerRun
from aotpipe.replay import replay


def _pipeline(tmp_path, models, extra=""):
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""
        version: 1
        name: t
        {extra}
        models:
    """) + textwrap.indent(textwrap.dedent(models), "  "))
    return tmp_path / "p.yaml"


def _run(tmp_path, pipeline):
    # In this process: some tests patch capture, which worker processes would not see.
    r = CliRunner().invoke(main, ["run", str(pipeline), "-o", str(tmp_path / "out"), "--no-progress", "--json",
                                  "--executor", "local"])
    return r, (json.loads(r.output) if r.output.startswith("{") else None)


def _manifest(tmp_path, model):
    return json.loads((tmp_path / "out" / "t" / model / "manifest.json").read_text())


def test_a_graph_made_wrong_on_purpose_fails_its_model_and_the_run(tmp_path, monkeypatch):
    real = aotpipe.capture.capture_export

    def relu_becomes_neg(*args, **kwargs):
        cap = real(*args, **kwargs)
        for g in cap.graphs.values():
            for n in g.gm.graph.nodes:
                if n.target is torch.ops.aten.relu.default:
                    n.target = torch.ops.aten.neg.default
            g.gm.recompile()
        return cap

    monkeypatch.setattr(aotpipe.capture, "capture_export", relu_becomes_neg)
    p = _pipeline(tmp_path, """
        - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 1
    (m,) = run["models"]
    assert (m["status"], m["stage"]) == ("failed", "verify")
    assert "differs from the eager model" in m["error"]
    assert m["checks"]["failed"] > 0


DROPOUT = """
    import torch
    class Drop(torch.nn.Module):
        def __init__(self, p=0.3):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.drop = torch.nn.Dropout(p)
        def forward(self, x):
            return self.lin(self.drop(torch.relu(self.lin(x))))
    def drop(p=0.3):
        return Drop(p)
"""


def test_training_graphs_with_dropout_are_compared_with_eager(tmp_path):
    (tmp_path / "drop.py").write_text(textwrap.dedent(DROPOUT))
    p = _pipeline(tmp_path, """
        - {name: d, source: drop:drop, inputs: [{shape: [32, 16]}], graphs: [forward, backward, joint]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 0, r.output
    (m,) = run["models"]
    assert m["checks"]["skipped"] == 0 and m["checks"]["failed"] == 0
    manifest = _manifest(tmp_path, "d")
    assert manifest["graphs"]["forward"]["checks"]["run"] >= 1  # the loss
    assert manifest["graphs"]["backward"]["checks"]["run"] == 2  # the weight and bias of the one Linear (used twice)
    assert "native_dropout" in (tmp_path / "out" / "t" / "d" / "d_forward_0" / "graph.json").read_text()


def test_a_joint_graph_alone_is_checked_against_eager_not_counted_as_chained(tmp_path):
    (tmp_path / "drop.py").write_text(textwrap.dedent(DROPOUT))
    p = _pipeline(tmp_path, """
        - {name: d, source: drop:drop, inputs: [{shape: [32, 16]}], graphs: [joint]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 0, r.output
    checks = _manifest(tmp_path, "d")["graphs"]["joint"]["checks"]
    assert checks["run"] == 3 and checks["indirect"] == 0  # the loss and two gradients
    assert {i["what"] for i in checks["items"]} == {"loss", "gradient of lin.weight", "gradient of lin.bias"}


def test_dropout_with_another_probability_in_the_graph_fails(tmp_path, monkeypatch):
    (tmp_path / "drop.py").write_text(textwrap.dedent(DROPOUT))
    real = aotpipe.capture.capture_export

    def other_p(*args, **kwargs):
        cap = real(*args, **kwargs)
        for g in cap.graphs.values():
            for n in g.gm.graph.nodes:
                if n.target is torch.ops.aten.native_dropout.default:
                    n.args = (n.args[0], 0.6, *n.args[2:])
            g.gm.recompile()
        return cap

    monkeypatch.setattr(aotpipe.capture, "capture_export", other_p)
    p = _pipeline(tmp_path, """
        - {name: d, source: drop:drop, inputs: [{shape: [32, 16]}], graphs: [forward, backward, joint]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 1
    assert "differs from the eager model" in run["models"][0]["error"]


def test_save_inputs_false_says_shapes_only(tmp_path):
    p = _pipeline(tmp_path, """
        - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}], save_inputs: false}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 0, r.output
    manifest = _manifest(tmp_path, "mlp")
    assert {v["status"] for k, v in manifest["verification"].items() if k != "chain"} == {"shapes only"}
    assert manifest["checks"]["failed"] == 0 and manifest["checks"]["run"] > 0  # eager checks still ran
    ls = CliRunner().invoke(main, ["ls", str(tmp_path / "out")])
    assert "shapes only" in ls.output
    assert "shapes only" in (tmp_path / "out" / "t" / "report.md").read_text()
    assert all(r.status == "ran" for r in replay(tmp_path / "out" / "t" / "mlp"))


def test_the_optimised_graph_has_checks_of_its_own(tmp_path):
    p = _pipeline(tmp_path, """
        - {name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}],
           graphs: [inference], passes: [freeze, fold_conv_bn]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 0, r.output
    g = _manifest(tmp_path, "cnn")["graphs"]["inference.freeze+fold_conv_bn"]
    assert g["checks"]["run"] == 1 and g["checks"]["passed"] == 1


PUT = """
    import torch
    class Put(torch.nn.Module):
        def forward(self, x):
            idx = torch.tensor([0, 0, 1])
            return torch.zeros(4).put(idx, x) * 2
    def put():
        return Put()
"""


def test_an_op_without_a_deterministic_kernel_is_named_and_compared_within_its_spread(tmp_path):
    (tmp_path / "put.py").write_text(textwrap.dedent(PUT))
    p = _pipeline(tmp_path, """
        - {name: p, source: put:put, inputs: [{shape: [3]}], graphs: [inference]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 0, r.output
    manifest = _manifest(tmp_path, "p")
    assert manifest["graphs"]["inference"]["nondeterministic"] == ["put_"]
    rec = json.loads((tmp_path / "out" / "t" / "p" / "p_inference_0" / "inputs.json").read_text())
    assert rec["outputs"][0]["spread"] is not None and rec["outputs"][0]["blob"] is not None
    assert [x.status for x in replay(tmp_path / "out" / "t" / "p")] == ["match"]


def _fake_graph(kind, outputs, inputs=()):
    from aotpipe.format.records import InputsRecord

    outputs = [{"index": i, **o} for i, o in enumerate(outputs)]
    record = InputsRecord.model_validate({"format_version": 2, "kind": kind, "storages": [], "inputs": list(inputs),
                                          "outputs": outputs})
    return SimpleNamespace(kind=kind, record=record)


def _fake_eager(run):
    return SimpleNamespace(run=lambda mode, fp64=False: run if not fp64 else None, errors={})


def test_an_extra_graph_output_fails():
    eager = EagerRun(outputs=[torch.ones(2)], state={}, mutated=[])
    ga = _fake_graph("inference", [{"role": "user"}, {"role": "user"}])
    gc = _Checker(_fake_eager(eager), True).check_outputs(ga, [torch.ones(2), torch.ones(3)])
    assert [c.what for c in gc.checks if not c.passed] == ["user outputs"]


def test_none_where_eager_has_a_gradient_fails():
    eager = EagerRun(outputs=[], state={}, mutated=[], grads={"w": torch.ones(2), "b": None})
    ga = _fake_graph("backward", [{"role": "none", "target": "w"}, {"role": "none", "target": "b"}])
    gc = _Checker(_fake_eager(eager), True).check_outputs(ga, [None, None])
    assert [c.passed for c in gc.checks] == [False, True]


def test_a_buffer_eager_mutates_that_the_graph_does_not_return_fails():
    eager = EagerRun(outputs=[torch.ones(1)], state={"count": torch.ones(1)}, mutated=["count"])
    ga = _fake_graph("inference", [{"role": "user"}])
    gc = _Checker(_fake_eager(eager), True).check_outputs(ga, [torch.ones(1)])
    (bad,) = [c for c in gc.checks if not c.passed]
    assert bad.what == "new value of count" and "does not return" in bad.detail


def test_verify_false_counts_every_check_as_skipped():
    ga = _fake_graph("inference", [{"role": "user"}, {"role": "user"}])
    gc = _Checker(None, False).check_outputs(ga, [torch.ones(1), torch.ones(1)])
    assert gc.checks == [] and gc.skipped == ["verify: false", "verify: false"]


def test_the_write_time_check_is_not_held_to_a_loaders_byte_limit(tmp_path, monkeypatch):
    # A loader's limit guards against hostile artefacts; the one just written from the model
    # is checked in full (the executor's memory_gb limits it), whatever AOTPIPE_MAX_BYTES says.
    import json
    import textwrap

    from click.testing import CliRunner

    from aotpipe.cli import main

    monkeypatch.setenv("AOTPIPE_MAX_BYTES", "100kB")
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: big
        models:
          - {name: mlp, source: "aotpipe.zoo:mlp", args: {hidden: 256}, inputs: [{shape: [64, 32]}]}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    (m,) = json.loads(r.stdout)["models"]
    assert m["status"] == "ok" and m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m
    replayed = CliRunner().invoke(main, ["replay", str(tmp_path / "out" / "big" / "mlp")])
    assert replayed.exit_code == 2 and "max" in replayed.output.lower(), replayed.output  # the loader's limit holds


def test_checks_are_counted_by_how_they_were_settled(tmp_path):
    p = _pipeline(tmp_path, """
        - {name: rn, source: aotpipe.zoo:running_norm, args: {features: 8}, inputs: [{shape: [4, 8]}],
           graphs: [inference, forward, backward]}
    """)
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--no-progress", "--executor", "local"])
    assert r.exit_code == 0, r.output
    manifest = _manifest(tmp_path, "rn")
    totals = manifest["checks"]
    # calls (an int64 counter) is compared exactly; the float values by the floor or float64.
    assert totals["exact"] >= 2 and totals["exact"] + totals["floor"] + totals["fp64"] == totals["run"]
    for key, g in manifest["graphs"].items():
        c = g["checks"]
        assert c["exact"] + c["floor"] + c["fp64"] == c["run"], key
        assert c["exact"] == sum(i["method"] in ("exact", "none") for i in c["items"]), key
        assert c["fp64"] == sum(i["method"] == "fp64" for i in c["items"]), key
    assert sum(g["checks"]["floor"] for g in manifest["graphs"].values()) == totals["floor"]
    brief = f"{totals['exact']} exact, {totals['floor']} floor, {totals['fp64']} fp64"
    assert f"{totals['passed']}/{totals['run']} checks ({brief})" in r.output
    report = (tmp_path / "out" / "t" / "report.md").read_text()
    assert f"{totals['passed']}/{totals['run']} passed ({brief})" in report
    assert (f"Checks settled: {totals['run']} run: {totals['exact']} exactly (integers, shapes, None), "
            f"{totals['floor']} within the float-noise floor of eager float32, {totals['fp64']} by the float64 "
            f"rule (0 of them values zero in exact arithmetic, held to eager's own noise); 0 skipped.") in report
    run = json.loads((tmp_path / "out" / "t" / "run.json").read_text())
    assert run["summary"]["checks"] == {k: totals[k] for k in ("run", "skipped", "exact", "floor", "fp64",
                                                               "within_noise")}


def test_a_written_graph_that_does_not_run_fails_its_model_naming_the_graph(tmp_path, monkeypatch):
    import aotpipe.checks.written as written

    def refuse(*args, **kwargs):
        raise RuntimeError("planted: the kernel refused")

    monkeypatch.setattr(written, "run_with_summaries", refuse)
    p = _pipeline(tmp_path, """
        - {name: m, source: aotpipe.zoo:mlp, args: {in_features: 8, hidden: 8}, inputs: [{shape: [2, 8]}],
           graphs: [inference]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 1, r.output
    [m] = run["models"]
    assert m["status"] == "failed"
    assert "inference graph: the written graph does not run: RuntimeError: planted: the kernel refused" in m["error"]


def test_a_graph_json_that_rebuilds_differently_is_redone_by_the_next_run(tmp_path, monkeypatch):
    """The manifest records the rebuild difference as an error: a rerun does not keep the model."""
    real = aotpipe.pipeline.job._codes

    def expects_another_graph(job):
        return {key: code + ["an extra node the written graph lacks"] for key, code in real(job).items()}

    monkeypatch.setattr(aotpipe.pipeline.job, "_codes", expects_another_graph)
    p = _pipeline(tmp_path, """
        - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
    """)
    r, run = _run(tmp_path, p)
    assert r.exit_code == 1, r.output
    (m,) = run["models"]
    assert m["status"] == "failed" and "does not rebuild the captured graph exactly" in m["error"]
    verification = _manifest(tmp_path, "mlp")["verification"]
    assert verification["inference"]["status"] == "error"
    assert "does not rebuild the captured graph exactly" in verification["inference"]["error"]
    r, run = _run(tmp_path, p)  # still wrong: redone, fails again, never "kept"
    assert r.exit_code == 1, r.output
    (m,) = run["models"]
    assert m["status"] == "failed" and "does not rebuild" in m["error"]
    monkeypatch.setattr(aotpipe.pipeline.job, "_codes", real)
    r, run = _run(tmp_path, p)  # fixed: redone and ok
    assert r.exit_code == 0, r.output
    assert run["models"][0]["status"] == "ok"
