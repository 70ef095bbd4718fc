"""Capture mode export: the graphs compute what the eager model computes."""

import pytest
import torch
from torch import nn

from aotpipe.capture import capture_export
from aotpipe.models import zoo
from aotpipe.models.eager import model_loss

KINDS = ["inference", "forward", "backward", "joint"]


def _capture(model, args, kwargs=None, names=None, graphs=KINDS):
    names = names or [f"arg{i}" for i in range(len(args))]
    return capture_export(model, args, kwargs or {}, name="m", graphs=graphs, input_names=names)


def _bind(graph, model, user):
    """Real values for a graph's inputs, from the model's state and the user inputs by name."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    vals = []
    for gi in graph.inputs:
        if gi.role in ("param", "buffer", "constant"):
            vals.append(state[gi.target].detach().clone())
        elif gi.role == "user":
            vals.append(user[gi.target])
        elif gi.role == "tangent":
            vals.append(torch.ones(gi.meta.shape, dtype=gi.meta.dtype))
        else:
            raise AssertionError(gi)
    return vals


def _user_outputs(graph, outs):
    return [o for o, go in zip(outs, graph.outputs) if go.role == "user"]


@pytest.mark.parametrize("name,args", [
    ("mlp", (torch.randn(4, 32),)),
    ("small_cnn", (torch.randn(2, 3, 16, 16),)),
])
def test_inference_graph_matches_eager(name, args):
    model = getattr(zoo, name)()
    cap = _capture(model, args, graphs=["inference"])
    g = cap.graphs["inference"]
    model.eval()
    expected = model(*args)
    outs = g.gm(*_bind(g, model, {"arg0": args[0]}))
    torch.testing.assert_close(_user_outputs(g, outs)[0], expected)
    assert set(cap.graphs) == {"inference"}


def test_joint_gradients_match_eager_autograd():
    torch.manual_seed(0)
    model = zoo.mlp()
    x = torch.randn(4, 32)
    cap = _capture(model, (x,))
    joint = cap.graphs["joint"]
    assert joint.input_groups == (len(joint.inputs) - 1, 1)
    assert [gi.role for gi in joint.inputs][-1] == "tangent"
    outs = joint.gm(*_bind(joint, model, {"arg0": x}))
    model.train()
    model.zero_grad()
    model_loss(model(x)).backward()  # the default loss, weighted
    grads = {go.target: o for o, go in zip(outs, joint.outputs) if go.role == "grad"}
    assert set(grads) == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad)


def test_forward_then_backward_chain_matches_joint():
    torch.manual_seed(0)
    model = zoo.small_cnn(channels=4)
    x = torch.randn(2, 3, 8, 8)
    cap = _capture(model, (x,))
    fw, bw, joint, c = cap.graphs["forward"], cap.graphs["backward"], cap.graphs["joint"], cap.contract
    # batchnorm in train mode mutates running_mean, running_var, num_batches_tracked in both bn layers
    assert c.num_mutated_inputs == 6
    assert set(c.mutated_inputs) == {f"bn{i}.{b}" for i in (1, 2) for b in ("running_mean", "running_var", "num_batches_tracked")}
    assert c.num_user_outputs == 1 and c.num_tangents == 1
    fw_out = fw.gm(*_bind(fw, model, {"arg0": x}))
    assert len(fw_out) == c.num_forward_outputs + c.num_saved_tensors + c.num_saved_symints
    saved = list(fw_out[c.num_forward_outputs:])
    loss = fw_out[c.num_mutated_inputs]
    grads = bw.gm(*saved, torch.ones_like(loss))
    assert len(grads) == len(c.grad_of) == len(fw.inputs)
    joint_out = joint.gm(*_bind(joint, model, {"arg0": x}))
    joint_grads = {go.target: o for o, go in zip(joint_out, joint.outputs) if go.role == "grad"}
    for g, target in zip(grads, c.grad_of):
        if target is not None:
            torch.testing.assert_close(g, joint_grads[target])
    # the forward's mutated outputs are the new buffer values, in the contract's order
    model.train()
    model(x)
    buffers = dict(model.named_buffers())
    for value, target in zip(fw_out[: c.num_mutated_inputs], c.mutated_inputs):
        torch.testing.assert_close(value, buffers[target])


def test_unused_parameters_still_capture_all_kinds():
    model = zoo.tiny_transformer(vocab=50, dim=16, heads=2, layers=1)
    ids = torch.randint(0, 50, (2, 5))
    cap = _capture(model, (), {"input_ids": ids}, names=[])
    assert set(cap.graphs) == set(KINDS)
    assert any("pooler.weight" in n for n in cap.notes)
    assert "pooler.weight" in cap.contract.grad_of or None in cap.contract.grad_of
    bw = cap.graphs["backward"]
    none_targets = [go.target for go in cap.graphs["joint"].outputs if go.role == "none" and go.target]
    assert "pooler.weight" in none_targets and "pooler.bias" in none_targets
    assert bw.outputs  # the backward still returns one slot per primal


def test_embedding_index_range_is_recorded():
    model = zoo.tiny_transformer(vocab=50, dim=16, heads=2, layers=1, max_len=8)
    ids = torch.randint(0, 3, (2, 5))
    cap = _capture(model, (), {"input_ids": ids}, names=[])
    for kind in KINDS:
        user = [gi for gi in cap.graphs[kind].inputs if gi.role == "user"]
        if user:
            assert user[0].target == "input_ids"
            assert user[0].int_range == (0, 50), kind


def test_buffer_mutation_in_inference_graph_is_an_output():
    model = zoo.running_norm(features=4)
    cap = _capture(model, (torch.randn(3, 4),), graphs=["inference"])
    g = cap.graphs["inference"]
    roles = [(go.role, go.target) for go in g.outputs]
    assert roles == [("mutation", "running_mean"), ("mutation", "calls"), ("user", None)]
    assert [gi.role for gi in g.inputs] == ["param", "param", "buffer", "buffer", "user"]


class _WithConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a plain tensor attribute: a lifted constant

    def forward(self, x):
        return self.fc(x) * self.scale


def test_tensor_constants_are_inputs_with_role_constant():
    model = _WithConstant()
    x = torch.randn(2, 4)
    cap = _capture(model, (x,))
    for kind in ("inference", "joint", "forward"):
        roles = {gi.target: gi.role for gi in cap.graphs[kind].inputs}
        assert roles["scale"] == "constant", kind
    joint = cap.graphs["joint"]
    vals = []
    for gi in joint.inputs:
        vals.append({"fc.weight": model.fc.weight, "fc.bias": model.fc.bias, "scale": model.scale,
                     "arg0": x}.get(gi.target, torch.ones(())))
    out = joint.gm(*[v.detach() for v in vals])
    torch.testing.assert_close(out[0], model_loss(model.fc(x) * model.scale))


def test_dict_and_integer_outputs_loss_uses_floats_only():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            y = self.fc(x)
            return {"y": y, "idx": y.argmax(-1), "pair": (y * 2, y.sum())}

    model = M()
    x = torch.randn(2, 3)
    cap = _capture(model, (x,))
    joint = cap.graphs["joint"]
    out = joint.gm(model.fc.weight.detach(), model.fc.bias.detach(), x, torch.ones(()))
    y = model.fc(x)
    torch.testing.assert_close(out[0], model_loss((y, y * 2, y.sum())))  # the float outputs, weighted
    inf = cap.graphs["inference"]
    assert sum(go.role == "user" for go in inf.outputs) == 4


def test_untraceable_model_raises_capture_error():
    from aotpipe.errors import CaptureError

    class Bad(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x
            return -x

    with pytest.raises(CaptureError, match="torch.export"):
        _capture(Bad(), (torch.randn(3),))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_sdpa_gradients_match_eager(tmp_path):
    # Regression: left to the CPU flash kernel, core-ATen decomposition rewrote the forward
    # but not the backward, and the joint graph's gradients were off by ~100.
    from tests.helpers.checking import capture_and_check

    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(2, 8, 16)
    _, checked = capture_and_check(model, (x,), {}, tmp_path, graphs=("forward", "backward", "joint"))
    checks = checked.graphs["backward"].checks
    assert any(c.what == "gradient of qkv.weight" for c in checks)
    assert all(c.passed for c in checks), [c.line() for c in checks]
    assert checked.problems == []


def test_tied_weights_are_noted_as_tied_not_gradientless():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    cap = _capture(Tied(), (torch.randint(0, 10, (2, 3)),))
    assert not any("get no gradient" in n for n in cap.notes), cap.notes
    assert any("tied to" in n for n in cap.notes), cap.notes


def test_embedding_range_applies_to_training_graphs_without_inference():
    model = zoo.tiny_transformer(vocab=50, dim=16, heads=2, layers=1, max_len=8)
    ids = torch.randint(0, 3, (2, 5))
    cap = _capture(model, (), {"input_ids": ids}, names=[], graphs=["forward", "joint"])
    for kind in ("forward", "joint"):
        (user,) = [gi for gi in cap.graphs[kind].inputs if gi.role == "user"]
        assert user.int_range == (0, 50), kind


def test_training_graphs_of_a_model_without_a_floating_output_are_a_capture_error():
    from aotpipe.errors import CaptureError

    class ArgMax(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x).argmax(-1)

    with pytest.raises(CaptureError, match="no floating-point output to build a loss from"):
        _capture(ArgMax(), (torch.randn(2, 4),), graphs=["forward", "backward", "joint"])


def test_capture_renders_no_graph_as_text_for_logs_and_leaves_torch_as_it_was(monkeypatch):
    import torch._functorch._aot_autograd.graph_compile as graph_compile
    from torch.fx._lazy_graph_module import _LazyGraphModule

    rendered = []  # AOTAutograd's renderers of the joint, forward and backward for its logs
    for name in ("_log_joint_graph", "_log_fw_bw_graphs"):
        real = getattr(graph_compile, name)
        monkeypatch.setattr(graph_compile, name, lambda *a, _real=real, _name=name, **k: rendered.append(_name) or _real(*a, **k))
    logs = (graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs)
    cap = _capture(zoo.mlp(), (torch.randn(4, 32),))
    assert set(cap.graphs) == set(KINDS)
    assert rendered == []
    assert (graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs) == logs  # put back
    assert not torch.fx._lazy_graph_module._use_lazy_graph_module_flag
    # the graphs kept are plain GraphModules with their code generated
    assert not any(isinstance(g.gm, _LazyGraphModule) for g in cap.graphs.values())
    assert all("def forward" in g.gm.code for g in cap.graphs.values())
