"""More checked forms at their bounds: the recurrent ops (lstm, gru, rnn_tanh, rnn_relu),
oneDNN's fused convolution, the CPU flash attention and its backward, the FFTs, the grid
sampler, segment lengths and offsets, the pooling backwards' batch dimensions; and the view
and allocation checked at run time. Just inside a bound the kernel runs and gives exactly
what it gives unchecked; just outside, one line, and the kernel is never reached.

The recurrent checks are made afresh here (``checked._rnn(gates)``) as well as taken from
``CHECKS``: the table is built once, on import. In-process."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from aotpipe.artifact import checked
from aotpipe.errors import ArtifactError
from aotpipe.format import limits
from tests.helpers.checked_args import WHERE, _i, _r

aten = torch.ops.aten




def _same(got, want):
    """One result, or a tuple of them, equal to the other in dtype, shape and values."""
    got, want = (list(v) if isinstance(v, (tuple, list)) else [v] for v in (got, want))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (g, w)


def runs_as_unchecked(op, args, kwargs=None, check=None):
    """The checked form of `op` (with `check`, default its own) gives what `op` gives."""
    kwargs = kwargs or {}
    form = checked.CheckedOp(op, check or checked.CHECKS[op], WHERE)
    _same(form(*args, **kwargs), op(*args, **kwargs))


def refusal(op, args, kwargs=None, check=None):
    """Why the checked form of `op` refuses `args`: the line between its node and its end."""
    form = checked.CheckedOp(op, check or checked.CHECKS[op], WHERE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checked, "call_kernel", lambda *a: pytest.fail(f"the kernel of {op} was reached"))
        with pytest.raises(ArtifactError) as e:
            form(*args, **(kwargs or {}))
    text = str(e.value)
    prefix, suffix = f"{WHERE} ({op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}): ", \
        "; the kernel was not run"
    assert text.startswith(prefix) and text.endswith(suffix) and "\n" not in text, text
    return text[len(prefix):-len(suffix)]


# ---------------------------------------------------------------------------------------
# lstm, gru, rnn_tanh, rnn_relu: weights and hidden state of the shapes torch.nn gives them

GATES = {aten.lstm.input: 4, aten.gru.input: 3, aten.rnn_tanh.input: 1, aten.rnn_relu.input: 1}
MODULE = {aten.lstm.input: torch.nn.LSTM, aten.gru.input: torch.nn.GRU, aten.rnn_tanh.input: torch.nn.RNN,
          aten.rnn_relu.input: torch.nn.RNN}
NOT_3D = "input and hx are not 3-d tensors (hx: two for an LSTM) or params is not a list"


def _rnn(op=aten.lstm.input, *, layers=1, bidirectional=False, batch_first=False, bias=True, proj=0, seq=5,
         batch=2, features=3, hidden=4):
    """Arguments as torch.nn's module of `op` passes them: input, hx, its flat weights..."""
    dirs = 2 if bidirectional else 1
    module = MODULE[op](features, hidden, num_layers=layers, bias=bias, bidirectional=bidirectional,
                        **({"proj_size": proj} if proj else {}))
    x = _r(batch, seq, features) if batch_first else _r(seq, batch, features)
    h = _r(layers * dirs, batch, proj or hidden)
    hx = [h, _r(layers * dirs, batch, hidden) * 0.5] if op is aten.lstm.input else h
    params = [_r(*p.shape) * 0.3 for p in module._flat_weights]
    return [x, hx, params, bias, layers, 0.0, False, bidirectional, batch_first]


def _fresh(op):
    return checked._rnn(GATES[op])


RNN_CASES = {
    "lstm": (aten.lstm.input, {}),
    "lstm, batch first": (aten.lstm.input, {"batch_first": True}),
    "lstm, 2 layers, bidirectional": (aten.lstm.input, {"layers": 2, "bidirectional": True}),
    "lstm, projected": (aten.lstm.input, {"proj": 2}),
    "lstm, projected, 2 layers, bidirectional, batch first": (
        aten.lstm.input, {"proj": 2, "layers": 2, "bidirectional": True, "batch_first": True}),
    "lstm, 3 layers, no biases": (aten.lstm.input, {"layers": 3, "bias": False}),
    "lstm, projected, no biases": (aten.lstm.input, {"proj": 2, "bias": False}),
    "gru, 2 layers, no biases": (aten.gru.input, {"layers": 2, "bias": False}),
    "gru, bidirectional, batch first": (aten.gru.input, {"bidirectional": True, "batch_first": True}),
    "rnn_tanh": (aten.rnn_tanh.input, {}),
    "rnn_relu, 2 layers, bidirectional, no biases": (
        aten.rnn_relu.input, {"layers": 2, "bidirectional": True, "bias": False}),
}


@pytest.mark.parametrize("case", list(RNN_CASES))
def test_a_recurrent_op_with_the_weights_and_state_torch_nn_gives_runs_as_unchecked(case):
    op, config = RNN_CASES[case]
    args = _rnn(op, **config)
    runs_as_unchecked(op, args)
    runs_as_unchecked(op, args, check=_fresh(op))


def _changed(args, i, value):
    args = list(args)
    args[i] = value
    return args


def _lstm_with(hx=None, params=None, **config):
    args = _rnn(**config)
    if hx is not None:
        args[1] = hx(args[1])
    if params is not None:
        args[2] = params(list(args[2]))
    return args


def _param(i, value):
    def change(params):
        params[i] = value
        return params
    return change


RNN_REFUSED = {
    "input of 2 dimensions": (aten.lstm.input, _changed(_rnn(), 0, _r(5, 3)), NOT_3D),
    "input of 4 dimensions": (aten.lstm.input, _changed(_rnn(), 0, _r(5, 2, 3, 1)), NOT_3D),
    "an lstm's hx of one tensor": (aten.lstm.input, _lstm_with(hx=lambda hx: hx[:1]), NOT_3D),
    "an lstm's hx of three tensors": (aten.lstm.input, _lstm_with(hx=lambda hx: hx + hx[:1]), NOT_3D),
    "a gru's hx of two tensors": (aten.gru.input, _changed(_rnn(aten.gru.input), 1, [_r(1, 2, 4)] * 2), NOT_3D),
    "hx of 2 dimensions": (aten.lstm.input, _lstm_with(hx=lambda hx: [hx[0][0], hx[1]]), NOT_3D),
    "hx of 4 dimensions": (aten.lstm.input, _lstm_with(hx=lambda hx: [hx[0], hx[1][None]]), NOT_3D),
    "hx not a tensor": (aten.rnn_tanh.input, _changed(_rnn(aten.rnn_tanh.input), 1, None), NOT_3D),
    "params a tensor": (aten.lstm.input, _changed(_rnn(), 2, _r(16, 3)), NOT_3D),
    "no layers": (aten.lstm.input, _changed(_rnn(), 4, 0), NOT_3D),
    "a batch hx[0] does not have": (
        aten.lstm.input, _lstm_with(hx=lambda hx: [_r(1, 3, 4), hx[1]]),
        "hx[0] has shape [1, 3, 4] where the input and 1 layers need [1, 2, 4]"),
    "hx[1] of two layers for one": (
        aten.lstm.input, _lstm_with(hx=lambda hx: [hx[0], _r(2, 2, 4)]),
        "hx[1] has shape [2, 2, 4] where the input and 1 layers need [1, 2, 4]"),
    "hx of one layer for two directions": (
        aten.gru.input, _changed(_rnn(aten.gru.input, bidirectional=True), 1, _r(1, 2, 4)),
        "hx[0] has shape [1, 2, 4] where the input and 1 layers need [2, 2, 4]"),
    "hx of the sequence's length for batch first": (
        aten.rnn_relu.input, _changed(_rnn(aten.rnn_relu.input, batch_first=True), 1, _r(1, 5, 4)),
        "hx[0] has shape [1, 5, 4] where the input and 1 layers need [1, 2, 4]"),
    "hx of one layer for two": (
        aten.lstm.input, _lstm_with(hx=lambda hx: [hx[0][:1], hx[1]], layers=2),
        "hx[0] has shape [1, 2, 4] where the input and 2 layers need [2, 2, 4]"),
    "a weight short": (
        aten.lstm.input, _lstm_with(params=lambda p: p[:-1]),
        "params holds 3 tensors where 1 layers and directions need 4"),
    "a weight over": (
        aten.gru.input, _changed(_rnn(aten.gru.input, bias=False), 2, _rnn(aten.gru.input)[2]),
        "params holds 4 tensors where 1 layers and directions need 2"),
    "a projection short, 2 layers, bidirectional": (
        aten.lstm.input, _lstm_with(params=lambda p: p[:-1], proj=2, layers=2, bidirectional=True),
        "params holds 19 tensors where 4 layers and directions need 20"),
    "w_ih of the hidden width": (
        aten.lstm.input, _lstm_with(params=_param(0, _r(16, 4))),
        "params[0] has shape [16, 4] where its layer needs [16, 3]"),
    "w_hh of the input width": (
        aten.lstm.input, _lstm_with(params=_param(1, _r(16, 3))),
        "params[1] has shape [16, 3] where its layer needs [16, 4]"),
    "b_ih of one row short": (
        aten.lstm.input, _lstm_with(params=_param(2, _r(15))), "params[2] has shape [15] where its layer needs [16]"),
    "b_hh of one row over": (
        aten.lstm.input, _lstm_with(params=_param(3, _r(17))), "params[3] has shape [17] where its layer needs [16]"),
    "a weight not a tensor": (
        aten.lstm.input, _lstm_with(params=_param(0, None)), "params[0] has shape [] where its layer needs [16, 3]"),
    "a weight a list": (
        aten.lstm.input, _lstm_with(params=_param(1, [1.0] * 4)), "params[1] has shape [] where its layer needs [16, 4]"),
    "the second layer's w_ih of the input's width": (
        aten.lstm.input, _lstm_with(params=_param(4, _r(16, 3)), layers=2),
        "params[4] has shape [16, 3] where its layer needs [16, 4]"),
    "the reverse direction's w_ih of the output's width": (
        aten.lstm.input, _lstm_with(params=_param(4, _r(16, 8)), layers=2, bidirectional=True),
        "params[4] has shape [16, 8] where its layer needs [16, 3]"),
    "the second layer's w_ih of one direction's width": (
        aten.lstm.input, _lstm_with(params=_param(8, _r(16, 4)), layers=2, bidirectional=True),
        "params[8] has shape [16, 4] where its layer needs [16, 8]"),
    "a gru's w_ih of an lstm's gates": (
        aten.gru.input, _changed(_rnn(aten.gru.input), 2, [_r(16, 3), _r(12, 4), _r(12), _r(12)]),
        "params[0] has shape [16, 3] where its layer needs [12, 3]"),
    "an rnn's w_hh of a gru's gates": (
        aten.rnn_tanh.input, _changed(_rnn(aten.rnn_tanh.input), 2, [_r(4, 3), _r(12, 4), _r(4), _r(4)]),
        "params[1] has shape [12, 4] where its layer needs [4, 4]"),
    "w_hr transposed": (
        aten.lstm.input, _lstm_with(params=_param(4, _r(4, 2)), proj=2),
        "params[4] has shape [4, 2] where its layer needs [2, 4]"),
    "the projected w_hh of the cell's width": (
        aten.lstm.input, _lstm_with(params=_param(1, _r(16, 4)), proj=2),
        "params[1] has shape [16, 4] where its layer needs [16, 2]"),
}


@pytest.mark.parametrize("case", list(RNN_REFUSED))
def test_a_recurrent_op_with_a_weight_or_state_of_another_shape_is_refused(case):
    op, args, why = RNN_REFUSED[case]
    assert refusal(op, args, check=_fresh(op)) == why
    assert refusal(op, args) == why


def test_each_recurrent_op_is_checked_for_its_own_gates():
    for op, gates in GATES.items():
        args = _rnn(op)
        assert checked.CHECKS[op](checked._bind(op, tuple(args), {})) is None
        other = _rnn(aten.gru.input if gates != 3 else aten.rnn_tanh.input)
        args[2] = other[2]
        assert refusal(op, args).startswith("params[0] has shape")


# ---------------------------------------------------------------------------------------
# oneDNN's fused convolution: its bias, W's output channels of it, read densely

CONV = getattr(torch.ops.mkldnn, "_convolution_pointwise", None)
needs_conv = pytest.mark.skipif(CONV is None, reason="this torch has no mkldnn._convolution_pointwise")


def _conv(w, b, x=None):
    x = _r(1, 3, 8, 8) if x is None else x
    return [x, w, b, [0] * (w.dim() - 2), [1] * (w.dim() - 2), [1] * (w.dim() - 2), 1, "none", [], None]


def _conv_binary(w, b):
    x = _r(1, 3, 8, 8)
    return [x, _r(1, w.shape[0], 6, 6), w, b, [0, 0], [1, 1], [1, 1], 1, "add", None, None, [], None]


@needs_conv
@pytest.mark.parametrize("w,b", [
    (_r(4, 3, 3, 3), _r(4)), (_r(4, 3, 3, 3), None),
    (_r(5, 3, 3), _r(5)),  # a 1-d convolution's weight: 3 dimensions
])
def test_a_fused_convolution_with_a_bias_per_output_channel_runs_as_unchecked(w, b):
    x = _r(1, 3, 8) if w.dim() == 3 else None
    runs_as_unchecked(CONV.default, _conv(w, b, x))
    if w.dim() == 4:
        runs_as_unchecked(CONV.binary, _conv_binary(w, b))


@needs_conv
@pytest.mark.parametrize("w,b,why", [
    (_r(4, 3, 3, 3), _r(3), "B has 3 elements where the input needs 4"),
    (_r(4, 3, 3, 3), _r(5), "B has 5 elements where the input needs 4"),
    (_r(4, 3, 3, 3), [0.0] * 4, "B is not a tensor"),
    (_r(4, 3, 3, 3), torch.ones(1).expand(4), "B is not dense (sizes [4], strides [0]) where the kernel reads it so"),
    (_r(4, 3, 3, 3), _r(8)[::2], "B is not dense (sizes [4], strides [2]) where the kernel reads it so"),
    (_r(4, 27), _r(4), "W is not a convolution's weight"),
    (None, _r(4), "W is not a convolution's weight"),
])
def test_a_fused_convolution_with_a_bias_of_another_size_or_layout_is_refused(w, b, why):
    unary = _conv(_r(4, 3, 3, 3), b)
    unary[1] = w
    assert refusal(CONV.default, unary) == why
    binary = _conv_binary(_r(4, 3, 3, 3), b)
    binary[2] = w
    assert refusal(CONV.binary, binary) == why


# ---------------------------------------------------------------------------------------
# the CPU flash attention: one batch, heads that group, positions, dense head vectors

FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.mark.parametrize("q,k,v", [
    (_r(2, 4, 8, 16), _r(2, 2, 5, 16), _r(2, 2, 5, 16)),
    (_r(1, 3, 8, 4), _r(1, 1, 1, 4), _r(1, 1, 1, 4)),  # one key position, one key head
    # a head size of 1: its one element at any stride
    (_r(1, 1, 8, 2)[..., ::2], _r(1, 1, 8, 3)[..., 1:2], _r(1, 1, 8, 1)),
])
def test_flash_attention_within_its_kernels_bounds_runs_as_unchecked(q, k, v):
    runs_as_unchecked(FLASH, (q, k, v))


@pytest.mark.parametrize("q,k,v,why", [
    (_r(1, 1, 8, 4)[0], _r(1, 1, 8, 4), _r(1, 1, 8, 4),
     "query, key and value are not 4-d tensors [batch, heads, positions, head size]"),
    (_r(1, 1, 8, 4), _r(1, 1, 8, 4), None,
     "query, key and value are not 4-d tensors [batch, heads, positions, head size]"),
    (_r(2, 2, 8, 4), _r(1, 2, 8, 4), _r(2, 2, 8, 4),
     "query, key and value have batch sizes 2, 1, 2 where the kernel needs one"),
    (_r(3, 2, 8, 4), _r(3, 2, 8, 4), _r(2, 2, 8, 4),
     "query, key and value have batch sizes 3, 3, 2 where the kernel needs one"),
    (_r(1, 4, 8, 4), _r(1, 2, 8, 4), _r(1, 1, 8, 4),
     "key and value have 2 and 1 heads for query's 4 (the kernel needs one number, dividing query's)"),
    (_r(1, 4, 8, 4), _r(1, 0, 8, 4), _r(1, 0, 8, 4),
     "key and value have 0 and 0 heads for query's 4 (the kernel needs one number, dividing query's)"),
    (_r(1, 1, 8, 4), _r(1, 1, 0, 4), _r(1, 1, 0, 4),
     "query, key and value have 8, 0 and 0 positions (the kernel needs at least one, and as many in key as in "
     "value)"),
    (_r(1, 1, 0, 4), _r(1, 1, 8, 4), _r(1, 1, 8, 4),
     "query, key and value have 0, 8 and 8 positions (the kernel needs at least one, and as many in key as in "
     "value)"),
    (_r(1, 1, 8, 4), _r(1, 1, 8, 2), _r(1, 1, 8, 4),
     "query, key and value have head sizes 4, 2 and 4 where the kernel needs one"),
    (_r(1, 1, 8, 4), _r(1, 1, 8, 4), _r(1, 1, 8, 3),
     "query, key and value have head sizes 4, 4 and 3 where the kernel needs one"),
    (_r(1, 1, 8, 4)[..., ::2], _r(1, 1, 8, 2), _r(1, 1, 8, 2),
     "query's last dimension (2 elements) has stride 2 where the kernel reads it densely (stride 1)"),
    (_r(1, 1, 8, 2), _r(1, 1, 8, 2), torch.ones(1).expand(1, 1, 8, 2),
     "value's last dimension (2 elements) has stride 0 where the kernel reads it densely (stride 1)"),
])
def test_flash_attention_outside_its_kernels_bounds_is_refused(q, k, v, why):
    assert refusal(FLASH, (q, k, v)) == why


def _flash_backward(head=16):
    q, kv = _r(2, 4, 8, head), _r(2, 2, 8, head)
    out, lse = FLASH(q, kv, kv)[:2]
    return [torch.ones(2, 4, 8, head), q, kv, kv, out, lse, 0.0, False]


def test_flash_attention_backward_of_a_head_size_of_1_at_any_stride_runs_as_unchecked():
    args = _flash_backward(1)
    args[0] = torch.ones(2, 4, 8, 2)[..., ::2]
    args[4] = torch.cat([args[4], args[4]], -1)[..., ::2]
    assert args[0].stride(3) == args[4].stride(3) == 2
    runs_as_unchecked(FLASH_BACKWARD, args)
    runs_as_unchecked(FLASH_BACKWARD, _flash_backward())


@pytest.mark.parametrize("i,value,why", [
    (4, None, "out is NoneType where query and value give torch.float32 [2, 4, 8, 16] (the forward's output)"),
    (0, 1.5, "grad_out is float where query and value give torch.float32 [2, 4, 8, 16] (the forward's output)"),
    (4, _r(2, 4, 8, 8), "out is torch.float32 [2, 4, 8, 8] where query and value give torch.float32 [2, 4, 8, 16] "
                        "(the forward's output)"),
    (0, _r(2, 4, 8, 16).double(), "grad_out is torch.float64 [2, 4, 8, 16] where query and value give "
                                  "torch.float32 [2, 4, 8, 16] (the forward's output)"),
    (5, None, "logsumexp is NoneType where query gives [batch, heads, positions] [2, 4, 8]"),
    (5, _r(2, 4, 7), "logsumexp is torch.float32 [2, 4, 7] where query gives [batch, heads, positions] [2, 4, 8]"),
])
def test_flash_attention_backward_of_outputs_the_forward_did_not_give_is_refused(i, value, why):
    args = _flash_backward()
    args[i] = value
    assert refusal(FLASH_BACKWARD, args) == why


def test_flash_attention_backward_of_a_strided_head_of_2_is_refused():
    args = _flash_backward(2)
    args[4] = _r(2, 4, 8, 4)[..., ::2]
    assert refusal(FLASH_BACKWARD, args) == \
        "out's last dimension has stride 2 where the kernel reads it densely (stride 1)"
    args = _flash_backward(2)
    args[0] = torch.ones(2, 4, 8, 1).expand(2, 4, 8, 2)
    assert refusal(FLASH_BACKWARD, args) == \
        "grad_out's last dimension has stride 0 where the kernel reads it densely (stride 1)"


# ---------------------------------------------------------------------------------------
# the FFTs, the grid sampler, segment lengths, the pooling backwards' batch dimensions


def test_fft_of_self_not_a_tensor_is_refused():
    assert refusal(aten._fft_c2c.default, ([1.0, 2.0], [0], 0, True)) == "self is not a tensor"
    assert refusal(aten._fft_r2c.default, (None, [0], 0, True)) == "self is not a tensor"


@pytest.mark.parametrize("limit,why", [
    (32, None),  # 4 rows of 1 at the input's element size (8: complex64)
    (31, "last_dim_size makes 4 elements (32 bytes), over the limit of 31 bytes (raise it with "
         "AOTPIPE_MAX_TENSOR_BYTES)"),
])
def test_fft_c2r_of_a_last_dimension_of_one_counts_each_row(limit, why):
    args = (_r(4, 1).to(torch.cfloat), [1], 2, 1)
    with limits.override(max_tensor_bytes=limit):
        if why is None:
            runs_as_unchecked(aten._fft_c2r.default, args)
        else:
            assert refusal(aten._fft_c2r.default, args) == why


@pytest.mark.parametrize("interp,pad", [(0, 0), (1, 1), (2, 2), (1, 2)])
def test_grid_sampler_of_each_mode_runs_as_unchecked(interp, pad):
    runs_as_unchecked(aten.grid_sampler_2d.default, (_r(1, 2, 4, 4), _r(1, 3, 3, 2), interp, pad, False))
    runs_as_unchecked(aten.grid_sampler_2d_backward.default,
                      (_r(1, 2, 3, 3), _r(1, 2, 4, 4), _r(1, 3, 3, 2), interp, pad, False, [True, True]))


def test_grid_sampler_backward_of_a_grad_not_a_tensor_is_refused():
    assert refusal(aten.grid_sampler_2d_backward.default,
                   (1.5, _r(1, 2, 4, 4), _r(1, 3, 3, 2), 0, 0, False, [True, True])) == \
        "grad_output has shape [] where input and grid give [1, 2, 3, 3]"


@pytest.mark.parametrize("kwargs", [
    {"lengths": _i(2, 0, 4)},  # an empty segment
    {"lengths": _i(6)},
    {"lengths": _i(0, 6, 0)},
    {"lengths": torch.tensor([[2, 4], [3, 3], [6, 0]]), "axis": 1},  # a row of lengths per row of data
    {"offsets": _i(0, 2, 2, 6)},  # an empty segment
    {"offsets": torch.tensor([[0, 2, 6], [0, 6, 6], [0, 0, 6]]), "axis": 1},
])
def test_segment_reduce_with_lengths_or_offsets_that_cover_the_axis_runs_as_unchecked(kwargs):
    data = _r(3, 6) if kwargs.get("axis") == 1 else _r(6)
    runs_as_unchecked(aten.segment_reduce.default, (data, "sum"), kwargs)


def test_segment_reduce_with_one_offset_over_an_empty_axis_runs_as_unchecked():
    runs_as_unchecked(aten.segment_reduce.default, (_r(0), "sum"), {"offsets": _i(0)})


@pytest.mark.parametrize("kwargs,why", [
    ({"lengths": [2, 4]}, "lengths is not a tensor"),
    ({"lengths": torch.tensor([[2, 4], [3, 4]]), "axis": 1}, "lengths add up to 7, the data has 6 along the axis"),
    ({"lengths": torch.tensor([[2, 4], [3, 2]]), "axis": 1}, "lengths add up to 6, the data has 6 along the axis"),
    ({"offsets": [0, 6]}, "offsets is not a tensor of offsets"),
    ({"offsets": torch.tensor(0)}, "offsets is not a tensor of offsets"),
    ({"offsets": _i()}, "offsets is not a tensor of offsets"),
    ({"offsets": torch.zeros(2, 0, dtype=torch.int64)}, "offsets is not a tensor of offsets"),
    ({"offsets": _i(6, 0)}, "offsets decrease"),
    ({"offsets": _i(0, 3, 2, 6)}, "offsets decrease"),
    ({"offsets": torch.tensor([[0, 2, 6], [0, 6, 5]]), "axis": 1}, "offsets decrease"),
])
def test_segment_reduce_with_lengths_or_offsets_that_miss_the_axis_is_refused(kwargs, why):
    data = _r(2, 6) if kwargs.get("axis") == 1 else _r(6)
    assert refusal(aten.segment_reduce.default, (data, "sum"), kwargs) == why


def test_lengths_of_no_dimension_or_no_rows_are_summed_as_the_kernel_reads_them():
    """A 0-d length is one segment (the kernel refuses it itself); no rows of lengths: nothing
    to add up."""
    assert checked._lengths(torch.tensor(6), None, 6) is None
    assert checked._lengths(torch.tensor(5), None, 6) == "lengths add up to 5, the data has 6 along the axis"
    assert checked._lengths(torch.zeros(0, 2, dtype=torch.int64), None, 6) is None


def test_a_pooling_backward_of_an_unbatched_input_runs_and_one_of_no_channel_dimension_is_refused():
    args = [_r(1, 2, 2), _r(1, 4, 4), [2, 2], [2, 2], [0, 0], False, True, None]
    runs_as_unchecked(aten.avg_pool2d_backward.default, args)
    why = "grad_output or self is not a tensor of more than 2 dimensions"
    assert refusal(aten.avg_pool2d_backward.default, [_r(2, 2), _r(4, 4)] + args[2:]) == why
    assert refusal(aten.avg_pool2d_backward.default, [None, _r(1, 4, 4)] + args[2:]) == why
    assert refusal(aten.avg_pool2d_backward.default, [_r(1, 2, 2), None] + args[2:]) == why


def test_a_batch_norm_of_an_input_of_two_dimensions_runs_as_unchecked():
    op = aten._native_batch_norm_legit_no_training.default
    runs_as_unchecked(op, (_r(4, 3), _r(3), _r(3), _r(3), _r(3).abs(), 0.1, 1e-5))
    assert refusal(op, (_r(3), _r(3), _r(3), _r(3), _r(3).abs(), 0.1, 1e-5)) == "input has fewer than 2 dimensions"


# ---------------------------------------------------------------------------------------
# the shared checks' edges


def test_a_layout_is_checked_only_for_tensors_and_shown_to_eight_dimensions():
    assert checked._dense(None, "t") is None and checked._dense([1.0, 2.0], "t") is None
    t = torch.ones(2).expand(*[1] * 8, 2, 2)
    assert checked._dense(t, "t") == ("t is not dense (sizes [1, 1, 1, 1, 1, 1, 1, 1], strides "
                                      f"{list(t.stride())[:8]}) where the kernel reads it so")


def test_shapes_are_compared_only_between_tensors():
    assert checked._same_shape(torch.zeros(2), None, "a", "b") == "a or b is not a tensor"
    assert checked._same_shape(None, torch.zeros(2), "a", "b") == "a or b is not a tensor"
    assert refusal(aten._softmax_backward_data.default, (_r(2, 3), None, 1, torch.float32)) == \
        "grad_output or output is not a tensor"


def test_outputs_of_a_size_only_the_run_decides_are_expected_as_any_size():
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        u = mode.shape_env.create_unbacked_symint()
        value = (torch.empty(u, 3), torch.empty(2, u, dtype=torch.int64))
    assert checked.expected_outputs(value) == (("float32", (None, 3)), ("int64", (2, None)))


# ---------------------------------------------------------------------------------------
# views and allocations checked at run time


def test_a_view_at_run_reaches_bytes_at_its_own_element_size():
    x = torch.arange(8, dtype=torch.float64)  # 64 bytes
    view = checked.ViewCheckedAtRun(aten.as_strided.default, WHERE)
    _same(view(x, [4], [1], 4), x[4:])
    view.inner = lambda *a, **k: pytest.fail("the view was made")
    with pytest.raises(ArtifactError, match=r"storage offset 5\) that reaches byte 72 of a storage of 64 bytes"):
        view(x, [4], [1], 5)


def test_a_view_at_run_takes_its_arguments_by_name_too():
    x = torch.arange(16.0)
    view = checked.ViewCheckedAtRun(aten.as_strided.default, WHERE)
    _same(view(x, size=[4], stride=[1], storage_offset=12), x[12:])
    with pytest.raises(ArtifactError, match="storage offset 13"):
        view(x, size=[4], stride=[1], storage_offset=13)


def test_a_view_at_run_shows_its_first_eight_sizes_and_strides():
    view = checked.ViewCheckedAtRun(aten.as_strided.default, WHERE)
    with pytest.raises(ArtifactError) as e:
        view(torch.zeros(16), [1] * 8 + [2], [1] * 8 + [16], 0)
    assert str(e.value) == (f"{WHERE} (aten.as_strided.default): gives a view (sizes [1, 1, 1, 1, 1, 1, 1, 1], "
                            "strides [1, 1, 1, 1, 1, 1, 1, 1], storage offset 0) that reaches byte 68 of a storage "
                            "of 64 bytes; the kernel was not run")


def _view_and_rank(x):
    return x.view(-1), x.dim()


def test_a_view_at_run_passes_over_what_is_not_a_tensor():
    view = checked.ViewCheckedAtRun(_view_and_rank, WHERE)
    flat, rank = view(torch.arange(6.0).view(2, 3))
    assert rank == 2
    _same(flat, torch.arange(6.0))


def _alloc(limit, op, expected=None):
    return checked.AllocationCheckedAtRun(op, limit, WHERE, expected)


def test_an_allocation_at_run_takes_its_arguments_by_name_too():
    _same(_alloc(40, aten.arange.start_step)(0, 10, 1, dtype=torch.float32), torch.arange(10, dtype=torch.float32))
    _same(_alloc(80, aten.arange.start_step)(0, 10, 1, dtype=torch.float64), torch.arange(10, dtype=torch.float64))
    with pytest.raises(ArtifactError, match=r"makes float64\[10\] \(80 bytes\)"):
        _alloc(40, aten.arange.start_step)(0, 10, 1, dtype=torch.float64)


def test_an_op_sized_by_its_data_runs_as_is_with_its_arguments_by_name():
    x, mask = _r(4), torch.tensor([True, False, True, True])
    _same(_alloc(1, aten.masked_select.default)(x, mask=mask), x[mask])


def test_an_allocation_at_run_by_a_function_not_an_op_is_bounded_too():
    neg = _alloc(16, torch.neg)
    _same(neg(torch.ones(4)), -torch.ones(4))
    with pytest.raises(ArtifactError, match=r"makes float32\[5\] \(20 bytes\)"):
        neg(torch.ones(5))


def test_an_allocation_at_run_shows_each_tensor_it_makes_to_eight_dimensions():
    with pytest.raises(ArtifactError) as e:
        _alloc(40, aten.sort.default)(torch.zeros(5))
    assert "makes float32[5], int64[5] (60 bytes) from values read while the graph runs, over the 40 bytes" \
        in str(e.value)
    with pytest.raises(ArtifactError) as e:
        _alloc(8, aten.neg.default)(torch.zeros([1] * 8 + [3]))
    assert "makes float32[1, 1, 1, 1, 1, 1, 1, 1] (12 bytes)" in str(e.value)


@needs_conv
@pytest.mark.parametrize("other,why", [
    (_r(1, 4, 5, 5), "other has shape [1, 4, 5, 5] where the output has [1, 4, 6, 6]"),  # smaller: read past its end
    (_r(1, 4, 6, 7), "other has shape [1, 4, 6, 7] where the output has [1, 4, 6, 6]"),
    (_r(2, 4, 6, 6), "other has shape [2, 4, 6, 6] where the output has [1, 4, 6, 6]"),
])
def test_a_fused_residual_of_another_shape_than_the_output_is_refused(other, why):
    """The binary kernel reads its residual as the output's shape and checks nothing (a
    [1, 4, 4, 4] residual of an 8x8 output runs): the checked form holds it to that shape."""
    binary = _conv_binary(_r(4, 3, 3, 3), _r(4))
    binary[1] = other
    assert refusal(CONV.binary, binary) == why


@needs_conv
@pytest.mark.parametrize("padding,stride,dilation,kernel,out", [
    ([1, 1], [2, 2], [1, 1], (3, 3), [1, 4, 4, 4]),
    ([1, 0], [1, 2], [2, 1], (3, 3), [1, 4, 6, 3]),  # each spatial dimension its own arguments
    ([1], [1], [1], (3, 5), [1, 4, 8, 6]),  # one value for both, as the kernel takes it; a 3x5 kernel
])
def test_a_fused_residual_is_held_to_the_output_shape_of_its_convolution_s_arguments(padding, stride, dilation,
                                                                                     kernel, out):
    def binary(other_shape):
        args = _conv_binary(_r(4, 3, *kernel), _r(4))
        args[1], args[4:7] = _r(*other_shape), [padding, stride, dilation]
        return args

    runs_as_unchecked(CONV.binary, binary(out))
    wrong = [out[0], out[1], out[2], out[3] + 1]
    assert refusal(CONV.binary, binary(wrong)) == f"other has shape {wrong} where the output has {out}"
    wrong = [out[0], out[1], out[2] + 1, out[3]]
    assert refusal(CONV.binary, binary(wrong)) == f"other has shape {wrong} where the output has {out}"


@needs_conv
@pytest.mark.parametrize("x,other", [(_r(3, 8, 8), _r(1, 4, 6, 6)), (_r(1, 3, 8, 8), None), (None, _r(1, 4, 6, 6))])
def test_a_fused_residual_or_input_that_is_not_a_tensor_of_the_convolution_s_rank_is_refused(x, other):
    args = _conv_binary(_r(4, 3, 3, 3), _r(4))
    args[0], args[1] = x, other
    assert refusal(CONV.binary, args) == "X or other is not a tensor of the convolution's rank"
