"""A capture is whole or it says so (issue 35): a model part of whose computation runs outside
its stored graphs is "partial", never "ok", everywhere a user looks."""

from __future__ import annotations

import collections
import contextlib
import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.capture import capture_auto, capture_dynamo, cumulative_bn
from aotpipe.capture import dynamo as dynamo_capture
from aotpipe.cli import main
from aotpipe.format.records import load_run
from aotpipe.pipeline.results import written_manifest
from tests.capture import partial_models
from tests.helpers.pipelines import run_yaml

KINDS = ["inference", "forward", "backward", "joint"]

PIPELINE = textwrap.dedent("""\
    version: 1
    name: partial
    defaults: {{passes: []}}
    models:
      - name: ctc
        source: tests.capture.partial_models:ctc_head
        inputs:
          - {{name: x, shape: [12, 2, 8]}}
          - {{name: targets, shape: [2, 4], dtype: int64, low: 1, high: 5}}
          - {{name: input_lengths, shape: [2], dtype: int64, low: 12, high: 13}}
          - {{name: target_lengths, shape: [2], dtype: int64, low: 1, high: 5}}
      - name: bn
        source: tests.capture.partial_models:conv_bn_cumulative
        inputs: [{{shape: [2, 3, 8, 8]}}]
      - name: brk
        source: tests.capture.partial_models:two_linears_break
        mode: dynamo
        inputs: [{{shape: [3, 4]}}]
      - name: tail
        source: tests.capture.partial_models:disabled_loss_head
        mode: dynamo
        inputs: [{{shape: [3, 8]}}]
    {extra}""")


def _graph_ops(folder):
    return {n.get("target") for n in json.loads((folder / "graph.json").read_text())["nodes"]}


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("partial")
    result, out = run_yaml(tmp, PIPELINE.format(extra=""), "--no-sign")
    return result, out / "partial"


def test_a_loss_dynamo_is_told_to_skip_is_partial_naming_the_ops_and_the_break():
    cap = capture_dynamo(partial_models.disabled_loss_head(), (torch.randn(3, 8),), {}, name="tail", graphs=KINDS,
                         input_names=["x"])
    assert cap.partial
    for o in cap.outside_graphs:
        assert o.ops == {"aten.mul.Tensor": 1, "aten.mean.default": 1} and "model output 0" in o.values
    assert not any("reproduce" in n for n in cap.notes)  # no claim that the graphs compute the model
    assert any(n.startswith("partial (inference): part of the model ran outside the graphs after subgraph 0's "
                            "graph break (Skip calling `torch.compiler.disable()`d function at ") for n in cap.notes)


def test_a_graph_break_with_no_tensor_code_after_it_is_whole_and_composed_without_glue():
    model = partial_models.two_linears_break()
    calls = collections.Counter()
    forward = type(model).forward

    def counted(self, x):  # the model's own Python: what "glue" is
        calls["forward"] += 1
        return forward(self, x)

    type(model).forward = counted
    try:
        cap = capture_dynamo(model, (torch.randn(3, 4),), {}, name="m", graphs=["inference"], input_names=["x"])
    finally:
        type(model).forward = forward
    assert not cap.partial and len(cap.subgraphs) == 2
    assert any(n.startswith("checked: the 2 subgraph(s) alone, each fed the outputs of those before it") for n in
               cap.notes)
    assert calls["forward"] == 2  # the compiled run and the eager reference: the composition ran no model code


def test_the_rule_counts_ops_run_outside_the_graphs_and_values_no_graph_made():
    call = dynamo_capture._Call(0, [("input", 0), ("glue",)], [None, None])
    eager = collections.Counter({"aten.addmm.default": 2, "aten._ctc_loss.Tensor": 1, "aten.detach.default": 3,
                                 "aten._local_scalar_dense.default": 1})
    graphs = collections.Counter({"aten.addmm.default": 2})
    o = dynamo_capture.outside_graphs(eager, graphs, [call], [("glue",)], "training")
    assert o.ops == {"aten._ctc_loss.Tensor": 1}  # detach (bookkeeping) and value reads are not computation
    assert o.values == ["subgraph 0 input 1", "model output 0"]
    whole = dynamo_capture.outside_graphs(graphs, graphs, [], [("output", 0, 0)], "training")
    assert whole is None


def test_batch_norm_momentum_none_exports_whole_with_this_steps_factor():
    model = partial_models.conv_bn_cumulative()
    model.bn.num_batches_tracked.fill_(3)  # the next step's factor is 1/4
    cap = capture_auto(model, (torch.randn(2, 3, 8, 8),), {}, name="bn", graphs=KINDS, input_names=["x"])
    assert cap.mode == "export" and not cap.partial and cap.fallback is None
    assert model.bn.momentum is None  # given back
    assert any("momentum=None" in n and "bn (1/4)" in n for n in cap.notes)
    assert any("batch_norm" in str(n.target) for n in cap.graphs["forward"].gm.graph.nodes)


def test_no_model_is_ok_while_part_of_it_is_outside_its_graphs(partial_run):
    result, root = partial_run
    assert result.exit_code == 1, result.output  # a partial model fails the run unless allowed
    lines = {ln.split()[1]: ln for ln in result.output.splitlines() if ln.split()[:1] in (["ok"], ["PARTIAL"])}
    assert lines["tail"].startswith("PARTIAL ") and "aten.mean.default" in lines["tail"]
    assert "tests/capture/partial_models.py:" in lines["tail"] and "(`return _eager_loss(" in lines["tail"]
    assert lines["bn"].startswith("ok ") and lines["brk"].startswith("ok ") and lines["ctc"].startswith("ok ")
    assert "3/4 models ok, 1 partial (exit 1; --allow-partial accepts them)" in result.output
    run = load_run(root)
    assert run.format_version == 3 and not run.ok and run.summary.partial == 1 and run.summary.ok == 3
    status = {m.name: m for m in run.models}
    assert status["tail"].status == "partial" and "aten.mean.default" in status["tail"].outside_graphs[0]
    for m in run.models:  # the pin: ok means every op the eager model ran is in a graph
        manifest = written_manifest(root / m.name)
        assert (m.status == "ok") == (manifest.capture.outside_graphs is None), m.name
    # CTCLoss captured whole (capture/ctc.py): its graphs hold the loss, not the log-probabilities
    assert any("gather" in str(op) for op in _graph_ops(root / "ctc" / "ctc_forward_0"))
    assert any("CTC loss captured" in n for n in written_manifest(root / "ctc").capture.notes)
    # BatchNorm(momentum=None) captured whole: its training graphs hold the batch norm
    assert any("batch_norm" in str(op) for op in _graph_ops(root / "bn" / "bn_forward_0"))
    report = (root / "report.md").read_text()
    assert "## Partial captures" in report and "- **tail**: inference after graph break" in report
    html = (root / "report.html").read_text()
    assert 'id="sum-partial"' in html and "Outside the graphs (partial capture)" in html


def test_ls_export_pt2_ops_and_bench_say_an_artefact_is_partial(partial_run):
    _, root = partial_run
    runner = CliRunner()
    ls = runner.invoke(main, ["ls", str(root)])
    row = next(ln for ln in ls.output.splitlines() if ln.startswith("tail"))
    assert row.split()[1] == "PARTIAL" and "outside the graphs, inference after graph break" in ls.output
    pt2 = runner.invoke(main, ["export-pt2", str(root / "tail"), "-o", str(root / "tail.pt2"), "--no-sandbox"])
    assert pt2.exit_code == 2 and not (root / "tail.pt2").exists()
    assert pt2.output.startswith(f"error: {root / 'tail'}: partial capture: part of the model ran outside its "
                                 "inference graph (aten.m") and pt2.output.count("\n") == 1
    ops = runner.invoke(main, ["ops", str(root)])
    assert f"warning: {root / 'tail'} is a partial capture (inference after graph break" in ops.output
    assert ops.output.count("is a partial capture") == 1  # ctc, bn and brk are whole


def test_allow_partial_exits_0_and_says_so(tmp_path):
    result, out = run_yaml(tmp_path, PIPELINE.format(extra=""), "--no-sign", "--only", "tail", "--allow-partial")
    assert result.exit_code == 0, result.output
    assert "0/1 models ok, 1 partial (allowed)" in result.output
    run = load_run(out / "partial")
    assert run.ok and run.allow_partial


def test_a_wrong_cumulative_factor_fails_the_checks(tmp_path, monkeypatch):
    real = cumulative_bn.cumulative_factors_specialised

    @contextlib.contextmanager
    def wrong(model, notes):  # the default momentum instead of this step's 1/(n + 1)
        with real(model, notes):
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.momentum = 0.1
            yield

    monkeypatch.setattr("aotpipe.capture.export.cumulative_factors_specialised", wrong)
    result, _ = run_yaml(tmp_path, PIPELINE.format(extra=""), "--no-sign", "--only", "bn")
    line = next(ln for ln in result.output.splitlines() if ln.split()[1:2] == ["bn"])
    assert line.startswith("FAILED") and "bn.running_mean" in line, result.output


def test_run_json_version_1_still_reads(partial_run, tmp_path):
    _, root = partial_run
    data = json.loads((root / "run.json").read_text())
    data["format_version"] = 1
    data["summary"].pop("partial")
    for m in data["models"]:
        m["status"] = "ok" if m["status"] == "partial" else m["status"]
        m.pop("outside_graphs", None)
    (tmp_path / "run.json").write_text(json.dumps(data))
    run = load_run(tmp_path)
    assert run.format_version == 1 and run.summary.partial is None and all(m.status == "ok" for m in run.models)
