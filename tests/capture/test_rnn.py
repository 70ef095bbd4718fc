"""Recurrent layers capture as plain ATen that computes the model (capture/rnn.py)."""

import pytest
import torch
from torch import nn

from aotpipe.capture import capture_export, rnn
from aotpipe.capture.rnn import recurrent_decompositions
from aotpipe.models import zoo

KINDS = ["inference", "forward", "backward", "joint"]
aten = torch.ops.aten


def _call(op, mod: nn.RNNBase, x: torch.Tensor):
    """`op` (one of rnn's decompositions) on `mod`'s weights, with zero initial state, as nn.RNNBase calls it."""
    d = 2 if mod.bidirectional else 1
    b = x.shape[0 if mod.batch_first else 1]
    h = torch.zeros(mod.num_layers * d, b, getattr(mod, "proj_size", 0) or mod.hidden_size)
    hx = (h, torch.zeros(mod.num_layers * d, b, mod.hidden_size)) if isinstance(mod, nn.LSTM) else h
    return op(x, hx, mod._flat_weights, mod.bias, mod.num_layers, mod.dropout, mod.training, mod.bidirectional,
              mod.batch_first)


CONFIGS = [{}, {"num_layers": 2}, {"num_layers": 2, "bidirectional": True}, {"batch_first": True},
           {"num_layers": 2, "dropout": 0.5}, {"bias": False}]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("cls,op", [(nn.LSTM, rnn.lstm_input), (nn.GRU, rnn.gru_input),
                                    (nn.RNN, rnn.rnn_tanh_input)], ids=["lstm", "gru", "rnn"])
def test_decomposition_computes_what_the_eager_kernel_computes(cls, op, config, train):
    torch.manual_seed(0)
    mod = cls(8, 16, **config).train(train)
    x = torch.randn(5, 3, 8)
    torch.manual_seed(1)
    expected = mod(x)
    torch.manual_seed(1)  # the same dropout draws, in the same order, as the eager kernel's
    got = _call(op, mod, x)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1][0] if isinstance(mod, nn.LSTM) else expected[1])


def test_lstm_projection_and_relu_rnn_match_eager():
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True, proj_size=5)
    x = torch.randn(5, 3, 8)
    out, (h, c) = lstm(x)
    got = _call(rnn.lstm_input, lstm, x)
    torch.testing.assert_close(got, (out, h, c))
    relu = nn.RNN(8, 16, nonlinearity="relu", num_layers=2)
    torch.testing.assert_close(_call(rnn.rnn_relu_input, relu, x)[0], relu(x)[0])


def test_torch_kernels_are_back_after_capture_also_on_error():
    before = {op: dict(op.py_kernels) for op in rnn.DECOMPOSITIONS}
    with pytest.raises(RuntimeError, match="planted"):
        with recurrent_decompositions():
            assert aten.lstm.input.py_kernels[torch._C.DispatchKey.CompositeImplicitAutograd] is rnn.lstm_input
            raise RuntimeError("planted")
    assert {op: dict(op.py_kernels) for op in rnn.DECOMPOSITIONS} == before


def _graph_ops(cap):
    return {str(n.target) for g in cap.graphs.values() for n in g.gm.graph.nodes if n.op == "call_function"}


def test_lstm_captures_without_mkldnn_ops_and_its_training_graph_applies_the_dropout():
    torch.manual_seed(0)
    model = zoo.lstm(num_layers=2, dropout=0.5)
    x = torch.randn(5, 3, 8)
    cap = capture_export(model, (x,), {}, name="m", graphs=KINDS, input_names=["x"])
    assert not [op for op in _graph_ops(cap) if "mkldnn" in op]
    # One call in the inference graph; unrolled (no RNN op) in the training graphs.
    assert _calls(cap.graphs["inference"], aten.lstm.input) == 1
    assert all(_calls(cap.graphs[k], aten.lstm.input) == 0 for k in ("forward", "backward", "joint"))
    joint = cap.graphs["joint"]
    # The joint keeps the inter-layer dropout: it draws random numbers (torch's own
    # decomposition drops it, and its graph draws none).
    assert any("native_dropout" in str(n.target) or "rand" in str(n.target) or "bernoulli" in str(n.target)
               for n in joint.gm.graph.nodes if n.op == "call_function")
    # ... and the inference graph matches eager (eval mode: no dropout).
    g = cap.graphs["inference"]
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    vals = [state[gi.target].detach() if gi.role in ("param", "buffer") else x for gi in g.inputs]
    model.eval()
    torch.testing.assert_close([o for o, go in zip(g.gm(*vals), g.outputs) if go.role == "user"][0], model(x))


def _calls(g, op):
    return sum(1 for n in g.gm.graph.nodes if n.op == "call_function" and n.target is op)


@pytest.mark.parametrize("build,op", [
    (lambda: zoo.gru(num_layers=2, bidirectional=True, batch_first=True), aten.gru.input),
    (lambda: zoo.rnn(nonlinearity="relu"), aten.rnn_relu.input),
    (lambda: zoo.lstm(proj_size=4), aten.lstm.input)], ids=["gru", "rnn_relu", "lstm_proj"])
def test_an_inference_graph_keeps_the_recurrent_layer_as_one_call_computing_what_eager_does(build, op):
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(3, 5, 8)
    cap = capture_export(model, (x,), {}, name="m", graphs=["inference"], input_names=["x"])
    g = cap.graphs["inference"]
    assert _calls(g, op) == 1
    assert not {"aten.sigmoid.default", "aten.tanh.default", "aten.relu.default"} & _graph_ops(cap)  # not unrolled
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    vals = [state[gi.target].detach() if gi.role in ("param", "buffer") else x for gi in g.inputs]
    (out,) = [o for o, go in zip(g.gm(*vals), g.outputs) if go.role == "user"]
    torch.testing.assert_close(out, model(x))
