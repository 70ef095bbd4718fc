"""Capture mode dynamo: one group of graphs per compiled subgraph, written, checked, replayed."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from aotpipe.artifact.load import load
from aotpipe.artifact.writer import graph_entries, write_model
from aotpipe.capture import capture_auto, capture_dynamo, capture_export, subgraph_references
from aotpipe.capture.binding import graph_inputs
from aotpipe.checks.written import check_written, graph_structure
from aotpipe.errors import CaptureError
from aotpipe.models import zoo
from aotpipe.replay import replay, replay_chain
from aotpipe.runtime.execution import run_graph

KINDS = ["inference", "forward", "backward", "joint"]


class Branchy(nn.Module):
    """An explicit graph break, then a data-dependent branch (which torch.export refuses)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.fc1(x)))
        torch._dynamo.graph_break()
        if h.sum() > 0:
            h = h * 2
        else:
            h = h - 1
        return self.fc2(h)


class OneBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x).tanh()
        print("between subgraphs", end="")  # dynamo breaks the graph here
        return (h * 3).sum(dim=1)


def _branchy():
    torch.manual_seed(0)
    return Branchy(), torch.randn(4, 8)


def _capture(model, x, graphs=KINDS, capture=capture_dynamo):
    return capture(model, (x,), {}, name="m", graphs=list(graphs), input_names=["x"])


def _write_and_check(cap, out_dir):
    """Write `cap` under `out_dir` with the checks a run makes; (model folder, ModelChecks)."""
    inputs = graph_inputs(cap, {}, {})
    found = []

    def check(folder):
        codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(cap)}
        found.append(check_written(folder, memory_inputs=inputs, codes=codes, eager=subgraph_references(cap)))
        return found[0].outcome

    written = write_model(out_dir, cap, model_record={"name": "m", "source": "tests"}, fingerprint="0" * 64,
                          inputs=inputs, check=check)
    return written.path, found[0]


@pytest.fixture(scope="module")
def branchy_cap():
    model, x = _branchy()
    return _capture(model, x)


def test_each_subgraph_has_its_own_graphs_keyed_by_index(branchy_cap):
    cap = branchy_cap
    # Subgraph 1 computes only `h.sum() > 0`: nothing in it requires grad, so no training graphs.
    assert list(cap.graphs) == ["inference", "forward", "backward", "joint", "inference_1",
                                "inference_2", "forward_2", "backward_2", "joint_2"]
    assert [sg.index for sg in cap.subgraphs] == [0, 1, 2]
    assert cap.subgraphs[1].keys == {"inference": "inference_1"}
    assert any("subgraph 1: no output requires grad" in n for n in cap.notes)
    # Each forward is paired with its own backward.
    c0, c2 = cap.subgraphs[0].contract, cap.subgraphs[2].contract
    assert cap.contract is c0 and cap.contract_of("backward_2") is c2
    assert c0.mutated_inputs == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    assert c2.grad_of == ["fc2.weight", "fc2.bias", "h"]  # the activation from subgraph 0 gets one too
    assert c2.num_tangents == 1 and c2.num_user_outputs == 1


def test_graph_breaks_are_recorded_with_reason_and_place(branchy_cap):
    breaks = branchy_cap.graph_breaks
    assert [b.subgraph for b in breaks] == [0, 1]
    assert "graph_break()" in breaks[0].reason and breaks[0].code == "torch._dynamo.graph_break()"
    assert breaks[1].code == "if h.sum() > 0:"
    assert breaks[1].where.startswith("tests/capture/test_dynamo.py:") and breaks[1].where.endswith(" in forward")
    assert sum("graph break after subgraph" in n for n in branchy_cap.notes) == 2
    record = branchy_cap.capture_record()
    assert record.subgraphs == 3 and record.graph_breaks == breaks


def test_lifted_parameters_are_weights_named_as_in_the_model(branchy_cap):
    fw, inf2 = branchy_cap.graphs["forward"], branchy_cap.graphs["inference_2"]
    assert [(gi.role, gi.target) for gi in fw.inputs] == [
        ("param", "fc1.weight"), ("param", "fc1.bias"), ("param", "bn.weight"), ("param", "bn.bias"),
        ("buffer", "bn.num_batches_tracked"), ("buffer", "bn.running_mean"), ("buffer", "bn.running_var"),
        ("user", "x")]
    assert [(gi.role, gi.target) for gi in inf2.inputs] == [("param", "fc2.weight"), ("param", "fc2.bias"),
                                                            ("user", "h")]
    assert all(gi.meta.requires_grad for gi in fw.inputs if gi.role == "param")


def test_written_graphs_load_replay_bit_exact_and_pass_their_checks(branchy_cap, tmp_path):
    path, mc = _write_and_check(branchy_cap, tmp_path)
    assert mc.problems == []
    assert mc.graphs["forward_2"].record().passed == 1  # its user output vs the dynamo graph's
    assert mc.graphs["backward_2"].record().passed == 3  # both parameters and the activation
    # fc1.bias feeds a train-mode BatchNorm, which subtracts its mean: its gradient is zero in
    # exact arithmetic, float noise in eager, and checked all the same; nothing is skipped.
    assert {k: gc.skipped for k, gc in mc.graphs.items() if gc.skipped} == {}
    (bias,) = [c for c in mc.graphs["backward"].checks if c.what == "gradient of fc1.bias"]
    assert bias.passed and bias.method in ("floor", "fp64")
    assert sorted(p.name for p in path.iterdir() if p.name.startswith("m_")) == [
        "m_backward_0", "m_backward_2", "m_forward_0", "m_forward_2", "m_inference_0", "m_inference_1",
        "m_inference_2", "m_joint_0", "m_joint_2"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["capture"]["subgraphs"] == 3
    assert [b["subgraph"] for b in manifest["capture"]["graph_breaks"]] == [0, 1]
    assert manifest["verification"]["chain"]["status"] == "match"
    assert manifest["verification"]["chain_2"]["status"] == "match"
    assert manifest["checks"]["failed"] == 0 and manifest["checks"]["skipped"] == 0
    art = load(path)
    assert art.subgraph_keys() == {0: {k: k for k in KINDS}, 1: {"inference": "inference_1"},
                                   2: {"inference": "inference_2", "forward": "forward_2",
                                       "backward": "backward_2", "joint": "joint_2"}}
    assert art.graphs["backward_2"].upstream is art.graphs["forward_2"]
    assert art.graphs["forward_2"].record.partition.grad_of == ["fc2.weight", "fc2.bias", "h"]
    results = replay(art)
    assert [(r.kind, r.status) for r in results] == [(k, "match") for k in art.graphs]
    assert [r.status for r in replay(art, graphs=["joint_2"])] == ["match"]
    chain = replay_chain(art, rebuild_source=False)
    assert (chain.status, chain.compared) == ("match", 12)


def test_same_model_same_seed_same_artefact_and_indices_restart_per_model(tmp_path):
    paths = []
    for run in ("a", "b"):
        _capture(OneBreak(), torch.randn(2, 8), graphs=["inference"])  # another model captured before
        model, x = _branchy()
        cap = _capture(model, x)
        assert next(iter(cap.graphs)) == "inference"  # never "inference_3": indices are per model
        paths.append(_write_and_check(cap, tmp_path / run)[0])
    files = sorted(p.relative_to(paths[0]) for p in paths[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(paths[1]) for p in paths[1].rglob("*") if p.is_file())
    for rel in files:
        assert (paths[0] / rel).read_bytes() == (paths[1] / rel).read_bytes(), rel


def test_a_print_breaks_the_graph_and_capture_leaves_the_model_as_it_was(capsys):
    torch.manual_seed(0)
    model = OneBreak()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cap = _capture(model, torch.randn(4, 8))
    assert list(cap.graphs) == ["inference", "forward", "backward", "joint", "inference_1", "forward_1",
                                "backward_1", "joint_1"]
    assert len(cap.graph_breaks) == 1 and cap.graph_breaks[0].code.startswith("print(")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_batch_norm_running_stats_are_not_changed_by_capture():
    model, x = _branchy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _capture(model, x, graphs=["forward"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training


def test_export_refuses_a_data_dependent_branch_and_auto_falls_back_to_dynamo():
    model, x = _branchy()
    with pytest.raises(CaptureError, match="GuardOnDataDependentSymNode"):
        _capture(model, x, graphs=["inference"], capture=capture_export)
    cap = _capture(model, x, graphs=["inference"], capture=capture_auto)
    assert cap.mode == "dynamo" and "GuardOnDataDependentSymNode" in cap.fallback
    assert cap.notes[0].startswith("export failed (torch.export (inference) failed")
    # the manifest names the model's file by import name, never by its absolute path
    recorded = cap.capture_record().fallback
    assert "tests/capture/test_dynamo.py:" in cap.fallback and "/tests/capture/test_dynamo.py" not in recorded
    assert recorded == cap.fallback.replace(str(Path(__file__).resolve()), "tests/capture/test_dynamo.py")
    assert list(cap.graphs) == ["inference", "inference_1", "inference_2"]


def test_auto_keeps_export_when_export_works():
    cap = _capture(zoo.mlp(in_features=8), torch.randn(2, 8), graphs=["inference"], capture=capture_auto)
    assert cap.mode == "export" and cap.fallback is None and cap.subgraphs == []


def test_export_captures_record_nothing_new(tmp_path):
    cap = _capture(zoo.mlp(in_features=8), torch.randn(2, 8), graphs=["inference"], capture=capture_export)
    assert cap.subgraphs == [] and cap.graph_breaks == [] and cap.inputs == {}
    assert cap.capture_record().model_fields_set == {"mode", "options", "notes"}  # what the manifest holds


def test_subgraph_checks_catch_a_wrong_graph(tmp_path):
    model, x = _branchy()
    cap = _capture(model, x, graphs=["inference"])
    g = cap.graphs["inference_2"]  # relu in subgraph 0; here: the last linear layer, made wrong
    for n in g.gm.graph.nodes:
        if n.target is torch.ops.aten.addmm.default:
            n.target = torch.ops.aten.sub.Tensor
            n.args = (n.args[0], n.args[0])
    g.gm.recompile()
    _, mc = _write_and_check(cap, tmp_path)
    assert len(mc.problems) == 1 and mc.problems[0].startswith("inference_2 graph differs from the eager model")


def test_a_model_without_tensor_operations_is_one_line_capture_error():
    class Identity(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(CaptureError, match="^torch.compile captured no graph") as e:
        _capture(Identity(), torch.randn(2, 8))
    assert "\n" not in str(e.value)


def test_a_model_that_fails_under_dynamo_is_one_line_capture_error(capfd):
    with pytest.raises(CaptureError, match=r"^torch.compile \(inference\) failed: TorchRuntimeError") as e:
        _capture(nn.Linear(3, 3), torch.randn(2, 8))
    assert "\n" not in str(e.value) and "same reduction dim" in str(e.value)
    assert "Traceback" not in capfd.readouterr().err


def test_cli_replays_one_subgraph_and_shows_and_verifies_the_artefact(branchy_cap, tmp_path):
    from click.testing import CliRunner

    from aotpipe.cli import main

    path, _ = _write_and_check(branchy_cap, tmp_path)
    r = CliRunner().invoke(main, ["replay", str(path), "--graph", "forward_2", "--graph", "backward_2", "--json"])
    assert r.exit_code == 0, r.output
    assert [(g["kind"], g["status"]) for g in json.loads(r.output)["graphs"]] == [("forward_2", "match"),
                                                                                 ("backward_2", "match")]
    r = CliRunner().invoke(main, ["replay", str(path / "m_joint_2")])
    assert r.exit_code == 0 and r.output.startswith("joint_2 ")
    r = CliRunner().invoke(main, ["replay", str(path), "--graph", "forward_1"])
    assert r.exit_code == 2 and "no forward_1 graph" in r.output
    r = CliRunner().invoke(main, ["show", str(path)])
    assert r.exit_code == 0 and "capture: dynamo, 3 subgraphs, 2 graph breaks" in r.output
    assert "m_backward_2: backward graph of subgraph 2, " in r.output
    r = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert r.exit_code == 0, r.output


class MaskedWrite(nn.Module):
    """wav2vec2's SpecAugment in small: after a graph break, a learned embedding is written
    into the masked rows of an activation (x[mask] = v): an in-place write into a subgraph
    input that requires grad, selecting rows by a boolean mask (nonzero: a dynamic shape)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.embed = nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = self.fc(x)
        torch._dynamo.graph_break()
        mask = h[..., 0] > 0
        h[mask] = self.embed
        return h.tanh()


def test_a_masked_in_place_write_into_an_activation_captures_and_checks(tmp_path):
    torch.manual_seed(0)
    cap = capture_dynamo(MaskedWrite(), (torch.randn(4, 6, 8),), {}, name="m", graphs=KINDS, input_names=["x"])
    assert {"forward_1", "backward_1", "joint_1"} <= set(cap.graphs)
    assert any("x.copy_(where(mask, v, x))" in n for n in cap.notes), cap.notes
    assert any("writes in place into input(s) that require grad (h" in n for n in cap.notes), cap.notes
    path, mc = _write_and_check(cap, tmp_path)
    assert mc.problems == []
    grads = load(path).graphs["forward_1"].record.partition.grad_of
    assert "embed" in grads and "h" in grads
    assert mc.graphs["backward_1"].record().passed >= 2  # embed's and h's gradients vs eager


class ViewAfterBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        torch._dynamo.graph_break()
        return h.view(-1)[:3]  # a subgraph that only views its input: nothing to differentiate


def test_a_subgraph_with_nothing_to_differentiate_has_no_training_graphs_and_says_why():
    cap = capture_dynamo(ViewAfterBreak(), (torch.randn(2, 4),), {}, name="m", graphs=KINDS, input_names=["x"])
    assert sorted(cap.graphs) == ["backward", "forward", "inference", "inference_1", "joint"]
    assert any(n.startswith("subgraph 1: AOTAutograd found no gradient to compute") for n in cap.notes), cap.notes


class ReturnsAViewOfItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc1(x)
        torch._dynamo.graph_break()
        return h.view(-1, 8), self.fc2(h)  # subgraph 1 returns a view of its input h


def test_a_subgraph_output_that_views_its_input_is_not_in_the_eager_gradient_either(tmp_path):
    # AOTAutograd regenerates such an output outside the graph: the graph's gradient of h
    # has only fc2's part, and so must the reference's.
    torch.manual_seed(0)
    cap = capture_dynamo(ReturnsAViewOfItsInput(), (torch.randn(4, 8),), {}, name="m", graphs=KINDS,
                         input_names=["x"])
    path, mc = _write_and_check(cap, tmp_path)
    assert mc.problems == []
    items = {i.what: i for i in mc.graphs["backward_1"].record().items}
    assert items["gradient of h"].passed, items


class SplitsItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 12)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc1(x)
        torch._dynamo.graph_break()
        a, b = h.split([4, 8], 1)
        return a.permute(1, 0).view(2, 2, -1), self.fc2(b)  # Mask2Former's levels: views of h


def test_an_input_view_the_joint_keeps_a_tangent_for_is_in_the_eager_gradient_too(tmp_path):
    # Here AOTAutograd keeps the split-permute-view of h in the graph, with a tangent: the
    # graph's gradient of h has both parts, and so must the reference's (it follows the tangents).
    torch.manual_seed(0)
    cap = capture_dynamo(SplitsItsInput(), (torch.randn(4, 8),), {}, name="m", graphs=KINDS, input_names=["x"])
    assert [gi.target for gi in cap.graphs["backward_1"].inputs if gi.role == "tangent"] == ["output[0]", "output[1]"]
    path, mc = _write_and_check(cap, tmp_path)
    assert mc.problems == []
    items = {i.what: i for i in mc.graphs["backward_1"].record().items}
    assert items["gradient of h"].passed, items


class ReturnsATranspose(nn.Module):
    """GroupViT's logits_per_text = logits_per_image.t(): an output that views another."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        a = self.fc(x) @ self.fc.weight
        return a, a.t()


class ReturnsTwoViews(nn.Module):
    """Two outputs viewing one intermediate: AOTAutograd adds the intermediate as an output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        a = self.fc(x)
        return a.t(), a.view(-1)


@pytest.mark.parametrize("cls", [ReturnsATranspose, ReturnsTwoViews])
def test_outputs_that_share_memory_are_returned_as_copies_each_with_its_tangent(cls, tmp_path):
    torch.manual_seed(0)
    cap = capture_dynamo(cls(), (torch.randn(4, 8),), {}, name="m", graphs=KINDS, input_names=["x"])
    copied = "0, 1" if cls is ReturnsTwoViews else "1"
    assert f"subgraph 0: output(s) {copied} share memory with another output or an intermediate value; the training " \
           "graphs return copies, so each output has its own tangent" in cap.notes, cap.notes
    assert [gi.target for gi in cap.graphs["joint"].inputs if gi.role == "tangent"] == ["output[0]", "output[1]"]
    path, mc = _write_and_check(cap, tmp_path)
    assert mc.problems == [] and mc.outcome.verification["chain"].status == "match"
    items = {i.what: i for i in mc.graphs["backward"].record().items}
    assert items["gradient of fc.weight"].passed and items["gradient of fc.bias"].passed, items


def test_without_the_copies_capture_refuses_in_one_line_instead_of_losing_a_gradient(monkeypatch):
    # The fault planted: outputs left sharing memory. A transpose of an output gets no tangent
    # (before the copies, GroupViT's gradients lacked logits_per_text's part and failed the
    # float64 check); two views of an intermediate make AOTAutograd output the intermediate.
    from aotpipe.capture import dynamo

    monkeypatch.setattr(dynamo, "_copy_aliasing_outputs", lambda lifted, outs: [])
    torch.manual_seed(0)
    with pytest.raises(CaptureError) as e:
        capture_dynamo(ReturnsATranspose(), (torch.randn(4, 8),), {}, name="m", graphs=KINDS, input_names=["x"])
    assert str(e.value) == "subgraph 0: the joint takes no tangent for output(s) 1, so its gradients would leave them out"
    with pytest.raises(CaptureError) as e:
        capture_dynamo(ReturnsTwoViews(), (torch.randn(4, 8),), {}, name="m", graphs=KINDS, input_names=["x"])
    assert str(e.value).startswith("AOTAutograd joint capture: output 2 is "), str(e.value)
    assert str(e.value).endswith("which aotpipe's graphs have no role for"), str(e.value)


class NormalisedBreak(nn.Module):
    """A graph break, then a subgraph whose only output is a LayerNorm's (rows sum to zero)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16, elementwise_affine=False)

    def forward(self, x):
        h = self.fc(x)
        torch._dynamo.graph_break()
        return self.ln(h * 10)


def test_a_subgraph_of_normalised_outputs_gets_real_gradients_from_its_weighted_tangents(tmp_path):
    # A tangent of ones would make every gradient through the LayerNorm zero in exact
    # arithmetic; each output's loss weights (recorded as such, remade by replay) do not.
    from aotpipe.runtime.tensors import loss_weights

    torch.manual_seed(0)
    cap = _capture(NormalisedBreak(), torch.randn(4, 8))
    path, mc = _write_and_check(cap, tmp_path)
    assert mc.problems == [] and all(not gc.skipped for gc in mc.graphs.values())
    art = load(path)
    assert art.manifest.capture.options["tangents"] == "loss weights"
    (tangent,) = [i for i in art.graphs["backward_1"].record.inputs if i.role == "tangent"]
    assert (tangent.source, tangent.shape) == ("weights", [4, 16])
    grads = dict(zip((o.target for o in art.graphs["backward_1"].record.outputs),
                     run_graph(art.graphs["backward_1"].module, art.graphs["backward_1"].saved_inputs(
                         forward_outputs=run_graph(art.graphs["forward_1"].module,
                                                   art.graphs["forward_1"].saved_inputs())))))
    h = next(v for k, v in grads.items() if k == "h")
    assert h.abs().mean() > 0.01  # a real gradient, not rounding noise
    # It is the gradient of the weighted sum of the LayerNorm's output.
    h_in = art.graphs["forward_1"].saved_inputs()[0].detach().requires_grad_(True)
    (expected,) = torch.autograd.grad((nn.functional.layer_norm(h_in * 10, (16,)) * loss_weights((4, 16),
                                                                                                torch.float32)).sum(), h_in)
    torch.testing.assert_close(h, expected)
    assert [r.status for r in replay(path)] == ["match"] * len(art.graphs)  # the tangent remade alike
