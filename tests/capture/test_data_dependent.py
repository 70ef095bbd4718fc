"""Models whose sizes or control flow depend on tensor values: captured in the default mode,
and when capture fails, the line says where and what to try next."""

import textwrap

import pytest
import torch
from torch import nn

from aotpipe.capture import capture_auto, capture_export
from aotpipe.capture import dynamo as dynamo_capture
from aotpipe.capture.hints import capture_hint, where_in_model
from aotpipe.errors import CaptureError
from aotpipe.models import zoo
from tests.helpers.pipelines import run_yaml

KINDS = ["inference", "forward", "backward", "joint"]


def _bind(g, model, user):
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    vals = []
    for gi in g.inputs:
        if gi.role in ("param", "buffer", "constant"):
            vals.append(state[gi.target].detach().clone())
        elif gi.role == "user":
            vals.append(user[gi.target])
        else:
            vals.append(torch.ones(gi.meta.shape, dtype=gi.meta.dtype))
    return vals


@pytest.mark.slow
def test_topk_moe_training_graphs_trace_data_dependent_routing_and_match_eager_gradients():
    torch.manual_seed(0)
    model = zoo.topk_moe()
    x = torch.randn(2, 5, 16)
    cap = capture_export(model, (x,), {}, name="m", graphs=KINDS, input_names=["x"], loss="sum")
    joint = cap.graphs["joint"]
    assert any("nonzero" in str(n.target) for n in joint.gm.graph.nodes)  # routing stays data-dependent
    outs = joint.gm(*_bind(joint, model, {"x": x}))
    model.train()
    model.zero_grad()
    model(x).sum().backward()
    grads = {o.target: v for o, v in zip(joint.outputs, outs) if o.role == "grad"}
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
    # The backward takes the forward's saved sizes where the forward returns them (after its tensors).
    bw = cap.graphs["backward"]
    roles = [gi.role for gi in bw.inputs]
    assert "symint" in roles and roles.index("symint") > roles.index("saved")


def test_lstm_and_topk_moe_capture_in_the_default_mode_with_every_check(tmp_path):
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: dd
        defaults: {graphs: [inference, forward, backward, joint]}
        models:
          - {name: lstm, source: "aotpipe.zoo:lstm", args: {num_layers: 2, dropout: 0.1}, inputs: [{shape: [4, 2, 8]}]}
          - {name: moe, source: "aotpipe.zoo:topk_moe", inputs: [{shape: [2, 3, 16]}]}
        """))
    assert result.exit_code == 0, result.output
    assert "2/2 models ok" in result.output
    assert "failed" not in result.output.lower().replace("0 failed", "")


class _BranchInLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            if x.sum() > 0:
                x = layer(x)
        return x


def test_auto_error_keeps_exports_and_dynamos_reasons():
    with pytest.raises(CaptureError) as e:
        capture_auto(_BranchInLoop(), (torch.ones(2, 4),), {}, name="m", graphs=["inference"], input_names=["x"])
    msg = str(e.value)
    assert msg.startswith("export failed: torch.export (inference) failed: GuardOnDataDependentSymNode")
    assert "test_data_dependent.py:" in msg and "if x.sum() > 0:" in msg  # the model's line
    assert "; dynamo failed: torch.compile captured no graph" in msg


def test_export_failure_on_a_branch_names_the_line_and_suggests_auto(tmp_path):
    result, _ = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: br
        defaults: {mode: export, graphs: [inference]}
        models:
          - {name: branch, source: "aotpipe.zoo:sign_branch", inputs: [{shape: [2, 16]}]}
        """))
    line = next(ln for ln in result.output.splitlines() if ln.startswith("FAILED"))
    assert "GuardOnDataDependentSymNode" in line
    assert "; next: the model branches on a tensor's values at " in line
    assert "zoo.py:" in line and "(`if x.sum() > 0:`)" in line and "use mode: auto" in line


def test_default_mode_is_auto():
    from aotpipe.pipeline.config import Defaults

    assert Defaults().mode == "auto"


def test_hints_say_what_to_try_for_each_kind_of_failure():
    detail = 'The following call raised this error:\n  File "/m/model.py", line 12, in forward\n    if x.max() > 1:\n'
    assert where_in_model(detail) == "/m/model.py:12 (`if x.max() > 1:`)"
    assert "use mode: auto" in capture_hint("export", "GuardOnDataDependentSymNode: ...", detail)
    assert "torch.cond" in capture_hint("auto", "GuardOnDataDependentSymNode: ...", detail)
    assert "try mode: export" in capture_hint("dynamo", "torch.compile captured no graph: ...")
    assert "mode: export traces such ops" in capture_hint("dynamo", "DynamicOutputShapeException: aten.nonzero")
    assert "try mode: auto" in capture_hint("export", "torch.export (inference) failed: Unsupported thing")


def test_dynamo_capture_notes_that_its_subgraphs_reproduce_the_model():
    cap = dynamo_capture.capture_dynamo(zoo.sign_branch(), (torch.ones(2, 16),), {}, name="m",
                                        graphs=["inference"], input_names=["x"])
    assert not cap.partial  # the branch's condition is a value read: no tensor computation outside the graphs
    assert ("checked: the 2 subgraph(s) alone, each fed the outputs of those before it as recorded (no code "
            "between them), reproduce the eager model's outputs (inference)") in cap.notes


def test_subgraphs_that_do_not_reproduce_the_model_fail_the_capture():
    model = zoo.mlp()
    x = torch.randn(2, 32)
    with torch.no_grad():
        wrong = model(x) + 1  # what a broken chain of subgraphs would return
    with torch.no_grad():
        right = model(x)
    with pytest.raises(CaptureError, match=r"dynamo's 1 subgraph\(s\) composed \(inference\) do not "
                                           r"reproduce the model: output 0 differs from eager"):
        dynamo_capture._check_together(right, wrong, 1, False)
