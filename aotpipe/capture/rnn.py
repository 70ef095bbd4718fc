"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) in captured graphs: one ATen call in inference
graphs, plain ATen unrolled over the time steps in training graphs.

Inference graphs keep ``aten.lstm.input``, ``aten.gru.input``, ``aten.rnn_tanh.input`` and
``aten.rnn_relu.input`` as one call each (:func:`kept_whole`: export's pre-dispatch graph has
them whole; the core-ATen table would decompose them). That call is the eager model's own
kernel, so the graph computes exactly what eager does, on any device; the loader runs it in a
checked form (aotpipe/artifact/checked.py: the weights' and state's shapes), and the op is on
the derived allow-list (aotpipe/artifact/allowed_ops.txt, tools/allowed_ops.py: an op
aotpipe's capture names).

Training graphs (forward, backward, joint) cannot keep the call. The four ops are
CompositeImplicitAutograd: they have no derivative formula of their own, and autograd (so
AOTAutograd) differentiates the ops they are made of, so a training trace must decompose
them; nothing in torch 2.13 gives a differentiable RNN op over the whole sequence that the
artefact allow-list can take (the CPU path goes to ``aten.mkldnn_rnn_layer``, an mkldnn op
the list refuses). And torch's own decompositions do not give the model's function:

- on CPU, ``aten.lstm`` decomposes to ``aten.mkldnn_rnn_layer`` whenever the input does
  not require grad, which is every inference and training capture;
- torch's decomposition of every recurrent op (``_rnn_helper`` in torch/_decomp) never
  applies the dropout between layers in training mode (its condition can never hold), so
  a 2-layer LSTM, GRU or RNN with ``dropout > 0`` captures a graph that is not the model.

:func:`recurrent_decompositions` installs, for the duration of a capture, the
decompositions below as the Python kernels of the four ops (where torch's tracing looks for
them: ``CompositeImplicitAutograd`` and ``Autograd``), and puts torch's back afterwards.
They are written from the recurrences (the equations of nn.LSTM's, nn.GRU's and nn.RNN's
docs), unrolled over the time steps (each step's cell is a handful of ops: the graph grows
with the sequence length, as torch's own decomposition's does), and apply inter-layer
dropout as the eager kernel does: to every layer's output but the last, after both
directions, with ``aten.dropout``.

Packed sequences (``aten.lstm.data`` and the other ``.data`` overloads) keep torch's
decompositions.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from aotpipe.capture.python_kernels import python_kernels

aten = torch.ops.aten

# One layer, one direction: (input [T, B, in], state, weights) -> (output [T, B, out], final state).
Step = Callable[[Tensor, tuple[Tensor, ...], Sequence[Tensor]], tuple[Tensor, tuple[Tensor, ...]]]


def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _weights(params: Sequence[Tensor], has_biases: bool, has_proj: bool
             ) -> tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(w_ih, w_hh, b_ih, b_hh, w_hr) of one layer and direction, in nn.RNNBase's order."""
    it = iter(params)
    w_ih, w_hh = next(it), next(it)
    b_ih, b_hh = (next(it), next(it)) if has_biases else (None, None)
    w_hr = next(it) if has_proj else None
    return w_ih, w_hh, b_ih, b_hh, w_hr


def _time_steps(x: Tensor, reverse: bool) -> list[int]:
    steps = list(range(x.shape[0]))
    return steps[::-1] if reverse else steps


def _lstm_layer(x: Tensor, h: Tensor, c: Tensor, w: tuple, reverse: bool) -> tuple[Tensor, Tensor, Tensor]:
    """i, f, g, o = gates; c' = f*c + i*g; h' = o*tanh(c'), projected by w_hr if there is one."""
    w_ih, w_hh, b_ih, b_hh, w_hr = w
    x_gates = _linear(x, w_ih, b_ih)  # every step's input contribution at once
    outputs: list[Optional[Tensor]] = [None] * x.shape[0]
    for t in _time_steps(x, reverse):
        gates = x_gates[t] + _linear(h, w_hh, b_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        if w_hr is not None:
            h = _linear(h, w_hr, None)
        outputs[t] = h
    return torch.stack(outputs), h, c  # type: ignore[arg-type]


def _gru_layer(x: Tensor, h: Tensor, w: tuple, reverse: bool) -> tuple[Tensor, Tensor]:
    """r, z = gates; n = tanh(x_n + r * (W_hn h + b_hn)); h' = (1 - z) * n + z * h, computed
    as eager's CPU cell does, (h - n) * z + n: under autocast the gates are bfloat16 and h
    float32, and (1 - z) * n would round twice in bfloat16 where eager's form rounds in
    float32 (a GRU's training step under autocast drifted from eager's by that)."""
    w_ih, w_hh, b_ih, b_hh, _ = w
    x_gates = _linear(x, w_ih, b_ih)
    outputs: list[Optional[Tensor]] = [None] * x.shape[0]
    for t in _time_steps(x, reverse):
        x_r, x_z, x_n = x_gates[t].chunk(3, dim=1)
        h_r, h_z, h_n = _linear(h, w_hh, b_hh).chunk(3, dim=1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = (h - n) * z + n
        outputs[t] = h
    return torch.stack(outputs), h  # type: ignore[arg-type]


def _simple_layer(x: Tensor, h: Tensor, w: tuple, reverse: bool, act: Callable[[Tensor], Tensor]
                  ) -> tuple[Tensor, Tensor]:
    """h' = act(W_ih x + b_ih + W_hh h + b_hh)."""
    w_ih, w_hh, b_ih, b_hh, _ = w
    x_in = _linear(x, w_ih, b_ih)
    outputs: list[Optional[Tensor]] = [None] * x.shape[0]
    for t in _time_steps(x, reverse):
        h = act(x_in[t] + _linear(h, w_hh, b_hh))
        outputs[t] = h
    return torch.stack(outputs), h  # type: ignore[arg-type]


def _stack_layers(x: Tensor, states: list[tuple[Tensor, ...]], weights: list[tuple], num_layers: int,
                  dropout: float, train: bool, bidirectional: bool, batch_first: bool,
                  layer: Callable[[Tensor, tuple[Tensor, ...], tuple, bool], tuple]) -> tuple[Tensor, list[tuple]]:
    """Run `layer` over the layers and directions; `states` and `weights` are per (layer,
    direction) in nn.RNNBase's order. Returns the output and each final state, same order."""
    if batch_first:
        x = x.transpose(0, 1)
    directions = 2 if bidirectional else 1
    finals: list[tuple] = []
    for i in range(num_layers):
        outs = []
        for d in range(directions):
            k = i * directions + d
            out, *final = layer(x, states[k], weights[k], d == 1)
            outs.append(out)
            finals.append(tuple(final))
        x = torch.cat(outs, dim=2) if bidirectional else outs[0]
        if dropout > 0 and train and i < num_layers - 1:
            x = torch.dropout(x, dropout, True)
    if batch_first:
        x = x.transpose(0, 1)
    return x, finals


def _grouped(params: Sequence[Tensor], has_biases: bool, has_proj: bool) -> list[tuple]:
    size = 2 + 2 * has_biases + has_proj
    if len(params) % size:
        raise ValueError(f"{len(params)} recurrent weights do not group by {size}")
    return [_weights(params[i:i + size], has_biases, has_proj) for i in range(0, len(params), size)]


def lstm_input(input: Tensor, hx: Sequence[Tensor], params: Sequence[Tensor], has_biases: bool, num_layers: int,
               dropout: float, train: bool, bidirectional: bool, batch_first: bool
               ) -> tuple[Tensor, Tensor, Tensor]:
    """aten.lstm.input: (output, h_n, c_n)."""
    h0, c0 = hx
    has_proj = h0.shape[2] != c0.shape[2]
    weights = _grouped(params, has_biases, has_proj)
    states = [(h0[k], c0[k]) for k in range(h0.shape[0])]
    out, finals = _stack_layers(input, states, weights, num_layers, dropout, train, bidirectional, batch_first,
                                lambda x, s, w, rev: _lstm_layer(x, s[0], s[1], w, rev))
    return out, torch.stack([f[0] for f in finals]), torch.stack([f[1] for f in finals])


def _single_state(layer: Callable[..., tuple[Tensor, Tensor]]):
    def op(input: Tensor, hx: Tensor, params: Sequence[Tensor], has_biases: bool, num_layers: int,
           dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor]:
        weights = _grouped(params, has_biases, False)
        states = [(hx[k],) for k in range(hx.shape[0])]
        out, finals = _stack_layers(input, states, weights, num_layers, dropout, train, bidirectional, batch_first,
                                    lambda x, s, w, rev: layer(x, s[0], w, rev))
        return out, torch.stack([f[0] for f in finals])
    return op


gru_input = _single_state(_gru_layer)
rnn_tanh_input = _single_state(lambda x, h, w, rev: _simple_layer(x, h, w, rev, torch.tanh))
rnn_relu_input = _single_state(lambda x, h, w, rev: _simple_layer(x, h, w, rev, torch.relu))

# The ops decomposed here, and how. docs/capture-modes.md ("Recurrent layers") lists the same.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., tuple]] = {
    aten.lstm.input: lstm_input,
    aten.gru.input: gru_input,
    aten.rnn_tanh.input: rnn_tanh_input,
    aten.rnn_relu.input: rnn_relu_input,
}


def kept_whole(table: dict) -> dict:
    """`table` (a decomposition table for an inference graph) less the recurrent ops: the
    graph keeps each as one call, the eager kernel (see the module's docstring)."""
    for op in DECOMPOSITIONS:
        table.pop(op, None)
    return table


@contextlib.contextmanager
def recurrent_decompositions() -> Iterator[None]:
    """For the duration, tracing decomposes the recurrent ops with this module's functions;
    torch's kernels are back afterwards, also on error."""
    with warnings.catch_warnings():
        # nn.RNNBase refreshes its _flat_weights list in forward; export warns of "tensor
        # attributes assigned during export" for each: they are the module's own parameters.
        warnings.filterwarnings("ignore", message=r".*_flat_weights.*assigned during export")
        with python_kernels(DECOMPOSITIONS):
            yield
