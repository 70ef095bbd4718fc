"""The checked forms of the norms (layer, group, batch, weight norm) and the embeddings
(embedding and embedding_bag, forward and backward), at each bound: an argument just inside
runs the kernel and gives exactly what the kernel gives unchecked; one just outside is one
line naming the argument and the bound, and the kernel is never reached. In-process."""

import pytest
import torch

from aotpipe.artifact import checked
from aotpipe.errors import ArtifactError
from tests.helpers.checked_args import WHERE, _i, _r

aten = torch.ops.aten
T, F = True, False




def _expanded(n):
    """n elements that are one element of storage (stride 0): not dense."""
    return torch.ones(1).expand(n)


def _form(op, check=None):
    return checked.CheckedOp(op, check or checked.CHECKS[op], WHERE)


def _same(got, want):
    if isinstance(want, (tuple, list)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape and \
            bool(((got == want) | (got.isnan() & want.isnan())).all())  # (an empty row's rstd is nan)
    return got == want


def runs_as_the_kernel(op, make, check=None):
    """The checked form runs the kernel on make()'s arguments and gives what the op gives on a
    fresh copy of them (some of these ops update their arguments in place)."""
    got, want = _form(op, check)(*make()), op(*make())
    assert _same(got, want), (got, want)


def refused(op, *args, check=None):
    """The one line the checked form refuses `args` with (the kernel never reached), less
    the node and op before it and "the kernel was not run" after it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checked, "call_kernel", lambda *a: pytest.fail("the kernel was reached"))
        with pytest.raises(ArtifactError) as e:
            _form(op, check)(*args)
    text = str(e.value)
    prefix = f"{WHERE} ({op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}): "
    suffix = "; the kernel was not run"
    assert text.startswith(prefix) and text.endswith(suffix) and "\n" not in text, text
    return text[len(prefix):-len(suffix)]


def passes_its_check(op, *args, check=None):
    """The check lets `args` through to the kernel (not run here: torch's own argument checks
    answer for what it refuses itself)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checked, "call_kernel", lambda *a: "ran")
        return _form(op, check)(*args) == "ran"


# ---------------------------------------------------------------------------------------
# embedding_dense_backward: grad_output is indices' shape and one more dimension


EMB = aten.embedding_dense_backward.default


@pytest.mark.parametrize("grad,indices", [
    (lambda: _r(3, 4), lambda: _i(0, 9, 9)),  # the last index of 10 weights
    (lambda: _r(4), lambda: torch.tensor(3)),  # one index, no dimension: grad is the embedding alone
    (lambda: _r(2, 3, 4), lambda: _i(0, 1, 2, 3, 4, 9).view(2, 3)),
], ids=["rows", "one index", "a batch of rows"])
@pytest.mark.parametrize("freq", [False, True])
def test_embedding_backward_of_indices_within_num_weights_runs_as_the_kernel(grad, indices, freq):
    runs_as_the_kernel(EMB, lambda: (grad(), indices(), 10, -1, freq))


@pytest.mark.parametrize("index", [10, -1])
def test_embedding_backward_of_an_index_just_outside_num_weights_is_refused(index):
    assert refused(EMB, _r(2, 4), _i(0, index), 10, -1, False) == \
        f"indices (num_weights 10) holds {index}, outside [0, 10)"


@pytest.mark.parametrize("grad,indices", [
    (torch.tensor(1.0), torch.tensor(0)),  # no dimension for the embedding
    (_r(2, 4), [0, 1]),
    ([[0.0] * 4] * 2, _i(0, 1)),
], ids=["0-d grad", "indices a list", "grad a list"])
def test_embedding_backward_refuses_arguments_that_are_not_its_tensors(grad, indices):
    assert refused(EMB, grad, indices, 10, -1, False) == "grad_output or indices is not a tensor"


def test_embedding_backward_grad_must_have_the_indices_shape_before_its_last_dimension():
    assert refused(EMB, _r(2, 3, 4), _i(0, 1), 10, -1, False) == \
        "grad_output has shape [2, 3, 4] for indices of shape [2]"


# ---------------------------------------------------------------------------------------
# _embedding_bag (and _embedding_bag_forward_only): offsets into 1-d indices, a bag each


BAG_FORWARDS = [aten._embedding_bag.default, aten._embedding_bag_forward_only.default]


@pytest.mark.parametrize("op", BAG_FORWARDS, ids=lambda op: op._schema.name)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("offsets,last", [
    (_i(0), False), (_i(0, 2), True),  # the fewest offsets that make a bag
    (_i(0, 2, 3), False), (_i(0, 3), False),  # the last bag empty
    (_i(0, 1, 1), True),
])
def test_embedding_bag_offsets_that_make_bags_run_as_the_kernel(op, mode, offsets, last):
    runs_as_the_kernel(op, lambda: (_r(10, 4), _i(1, 2, 9), offsets, False, mode, False, None, last))


@pytest.mark.parametrize("op", BAG_FORWARDS, ids=lambda op: op._schema.name)
def test_embedding_bag_of_no_indices_runs_as_the_kernel(op):
    runs_as_the_kernel(op, lambda: (_r(10, 4), _i(), _i(), False, 0, False, None, False))
    runs_as_the_kernel(op, lambda: (_r(10, 4), _i(), _i(0), False, 2, False, None, True))


@pytest.mark.parametrize("op", BAG_FORWARDS, ids=lambda op: op._schema.name)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("offsets,last", [(_i(), False), (_i(0), True)])
def test_embedding_bag_offsets_that_make_no_bag_for_its_indices_are_refused(op, mode, offsets, last):
    # the kernel would count every index into bag -1: a row before its output (max mode, or
    # sum off its fast path, writes there)
    assert refused(op, _r(10, 4).double(), _i(1, 2), offsets, False, mode, False, None, last) == \
        f"offsets has {offsets.numel()} elements (include_last_offset={last}), no bag for the 2 indices"


@pytest.mark.parametrize("op", BAG_FORWARDS, ids=lambda op: op._schema.name)
@pytest.mark.parametrize("indices", [_i(1, 2, 3, 4).view(2, 2), torch.tensor(1), [1, 2]], ids=["2-d", "0-d", "list"])
def test_embedding_bag_indices_must_be_one_dimensional(op, indices):
    # 2-d indices: the kernel sizes offset2bag by their rows and, in max mode, reads it for
    # each of their elements
    assert refused(op, _r(10, 4), indices, _i(0, 1), False, 2, False, None, False) == "indices is not a 1-d tensor"


@pytest.mark.parametrize("offsets,why", [
    ([0, 1], "offsets or indices is not a tensor"),
    (_i(0, 2, 1), "offsets decrease"),  # down, though not below the first
    (_i(0, 4), "offsets holds 4, outside [0, 4)"),
    (_i(-1, 2), "offsets holds -1, outside [0, 4)"),
])
def test_embedding_bag_offsets_must_be_a_tensor_of_positions_in_order(offsets, why):
    assert refused(aten._embedding_bag.default, _r(10, 4), _i(0, 1, 9), offsets) == why


def test_embedding_bag_indices_and_per_sample_weights_at_their_bounds():
    op = aten._embedding_bag.default
    assert refused(op, _r(10, 4), _i(0, 10), _i(0)) == "indices (num_weights 10) holds 10, outside [0, 10)"
    assert refused(op, _r(10, 4), _i(0, 1), _i(0), F, 0, F, _r(1)) == \
        "per_sample_weights has 1 elements where the input needs 2"
    runs_as_the_kernel(op, lambda: (_r(10, 4), _i(0, 9), _i(0), F, 0, F, _r(2)))


# ---------------------------------------------------------------------------------------
# _embedding_bag_dense_backward: offset2bag names each index's bag, a row of grad


DENSE = aten._embedding_bag_dense_backward.default


_KEEP = object()  # an argument left as the case's default


def _given(value, default):
    return default if value is _KEEP else value


def _dense_args(grad=_KEEP, indices=_KEEP, o2b=_KEEP, bag_size=_KEEP, max_idx=_KEEP, mode=0, psw=None):
    return (_given(grad, _r(2, 4)), _given(indices, _i(0, 1, 9)), _given(o2b, _i(0, 0, 1)),
            _given(bag_size, _i(2, 1)), _given(max_idx, _i()), 10, False, mode, psw, -1)


@pytest.mark.parametrize("mode,psw", [(0, False), (1, False), (0, True)])  # per-sample weights: mode sum's
def test_embedding_bag_dense_backward_of_bags_within_grad_runs_as_the_kernel(mode, psw):
    runs_as_the_kernel(DENSE, lambda: _dense_args(o2b=_i(0, 1, 1), mode=mode, psw=_r(3) if psw else None))


@pytest.mark.parametrize("grad,o2b,why", [
    (_r(2, 4), _i(0, 0, 2), "offset2bag (2 bags) holds 2, outside [0, 2)"),
    (_r(1, 4), _i(0, 0, 1), "offset2bag (1 bags) holds 1, outside [0, 1)"),
    # no bag: the kernel would read row 0 of a grad that has none
    (_r(0, 4), _i(0, 0, 0), "offset2bag (0 bags) holds 0, outside [0, 0)"),
    (_r(2, 4), _i(0, -1, 1), "offset2bag (2 bags) holds -1, outside [0, 2)"),
])
def test_embedding_bag_dense_backward_offset2bag_just_past_grads_rows_is_refused(grad, o2b, why):
    assert refused(DENSE, *_dense_args(grad=grad, o2b=o2b, bag_size=_i(*[1] * grad.shape[0]))) == why


def test_embedding_bag_dense_backward_lengths_each_its_own_line():
    assert refused(DENSE, *_dense_args(o2b=_i(0, 1))) == "offset2bag has 2 elements where the input needs 3"
    assert refused(DENSE, *_dense_args(bag_size=_i(1, 1, 1))) == "bag_size has 3 elements where the input needs 2"
    assert refused(DENSE, *_dense_args(psw=_r(2))) == "per_sample_weights has 2 elements where the input needs 3"
    assert refused(DENSE, *_dense_args(indices=_i(0, 1, 10))) == "indices (num_weights 10) holds 10, outside [0, 10)"


@pytest.mark.parametrize("grad", [_r(4), None, _r(2, 4, 1)], ids=["1-d", "None", "3-d"])
def test_embedding_bag_dense_backward_grad_is_bags_by_dim(grad):
    assert refused(DENSE, *_dense_args(grad=grad)) == "grad is not a [bags, dim] tensor"


def test_embedding_bag_dense_backward_max_mode_reads_the_maximum_indices_of_nonempty_bags():
    mx = _i(3, 9, 9, 0, 1, 2, 3, 4).view(2, 4)
    runs_as_the_kernel(DENSE, lambda: _dense_args(bag_size=_i(2, 1), max_idx=mx, mode=2))
    # an empty bag's row the kernel skips: whatever it holds
    runs_as_the_kernel(DENSE, lambda: _dense_args(bag_size=_i(0, 1), max_idx=_i(99, 99, 99, 99, 1, 2, 3, 4).view(2, 4),
                                                 mode=2))
    assert refused(DENSE, *_dense_args(bag_size=_i(1, 1), max_idx=_i(10, 0, 0, 0, 1, 2, 3, 4).view(2, 4), mode=2)) \
        == "maximum_indices (num_weights 10) holds 10, outside [0, 10)"
    for mx in (_i(0, 1, 2, 3), None):
        assert refused(DENSE, *_dense_args(bag_size=_i(1, 1), max_idx=mx, mode=2)) == \
            "maximum_indices does not have grad's shape"


def test_an_absent_offset2bag_is_left_to_the_kernels_own_argument_check():
    # (torch refuses None for a tensor argument itself: the check must not fail first)
    assert passes_its_check(DENSE, *_dense_args(o2b=None))
    assert passes_its_check(aten._embedding_bag_backward.default, *_back_args(o2b=None))


# ---------------------------------------------------------------------------------------
# _embedding_bag_backward: checks its offsets, rebuilds an empty offset2bag from them


BACK = aten._embedding_bag_backward.default


def _back_args(grad=_KEEP, indices=_KEEP, offsets=_KEEP, o2b=_KEEP, bag_size=_KEEP, sparse=False, mode=0):
    return (_given(grad, _r(2, 4)), _given(indices, _i(0, 1, 9)), _given(offsets, _i(0, 2)), _given(o2b, _i(0, 0, 1)),
            _given(bag_size, _i(2, 1)), _i(), 10, False, mode, sparse, None, -1)


@pytest.mark.parametrize("grad,offsets,o2b", [
    (_r(2, 4), _i(0, 2), _i(0, 0, 1)),
    (_r(2, 4), _i(0, 2), _i()),  # rebuilt: [0, 0, 1]
    (_r(1, 4), _i(0), _i()),  # rebuilt: [0, 0, 0], the one bag grad has
    (_r(2, 4), _i(0, 3), _i()),  # the last bag empty
])
def test_embedding_bag_backward_of_bags_within_grad_runs_as_the_kernel(grad, offsets, o2b):
    runs_as_the_kernel(BACK, lambda: _back_args(grad=grad, offsets=offsets, o2b=o2b,
                                                bag_size=_i(*[1] * grad.shape[0])))


def test_embedding_bag_backward_of_one_index_in_one_bag_runs_as_the_kernel():
    runs_as_the_kernel(BACK, lambda: _back_args(grad=_r(1, 4), indices=_i(3), offsets=_i(0), o2b=_i(),
                                                bag_size=_i(1)))


@pytest.mark.parametrize("grad,offsets,o2b,why", [
    (_r(2, 4), _i(0, 2), _i(0, 0, 2), "offset2bag (2 bags) holds 2, outside [0, 2)"),  # given, not rebuilt
    (_r(2, 4), _i(0, 1, 2), _i(), "offset2bag (2 bags) holds 2, outside [0, 2)"),  # rebuilt: 3 bags
    (_r(0, 4), _i(0), _i(), "offset2bag (0 bags) holds 0, outside [0, 0)"),
    (_r(2, 4), _i(1, 2), _i(), "offset2bag (2 bags) holds -1, outside [0, 2)"),  # before the first offset
    (_r(2, 4), _i(0, 4), _i(0, 0, 1), "offsets holds 4, outside [0, 4)"),
    (_r(2, 4), _i(2, 0), _i(0, 0, 1), "offsets decrease"),
])
def test_embedding_bag_backward_bags_just_past_grads_rows_are_refused(grad, offsets, o2b, why):
    assert refused(BACK, *_back_args(grad=grad, offsets=offsets, o2b=o2b, bag_size=_i(*[1] * grad.shape[0]))) == why


def test_embedding_bag_backward_refuses_the_sparse_gradient():
    assert refused(BACK, *_back_args(sparse=True)) == "sparse=True builds a sparse tensor"


# ---------------------------------------------------------------------------------------
# _embedding_bag_per_sample_weights_backward: grad's rows by each index's bag


PSW = aten._embedding_bag_per_sample_weights_backward.default


@pytest.mark.parametrize("grad,offsets,o2b", [
    (_r(2, 4), _i(0, 2), _i(0, 0, 1)),
    (_r(2, 4), _i(0, 2), _i()),  # rebuilt from the offsets
    (_r(1, 4), _i(0, 3), _i()),  # an offset at the end makes no bag the kernel reads
    (_r(1, 4), _i(0), _i()),
])
def test_per_sample_weights_backward_of_bags_within_grad_runs_as_the_kernel(grad, offsets, o2b):
    runs_as_the_kernel(PSW, lambda: (grad, _r(10, 4, seed=1), _i(0, 1, 9), offsets, o2b, 0, -1))


@pytest.mark.parametrize("grad,indices,offsets,o2b,why", [
    (_r(2, 4), _i(0, 1, 9), _i(0, 2), _i(0, 0, 2), "offset2bag (2 bags) holds 2, outside [0, 2)"),
    (_r(0, 4), _i(0, 1, 9), _i(0), _i(0, 0, 0), "offset2bag (0 bags) holds 0, outside [0, 0)"),
    (_r(2, 4), _i(0, 1, 9), _i(0, 2), _i(0, 1), "offset2bag has 2 elements where the input needs 3"),
    (_r(2, 4), _i(0, 1, 9), _i(0, 9), _i(0, 0, 1), "offsets holds 9, outside [0, 4)"),
    (_r(2, 4), _i(0, 1, 10), _i(0, 2), _i(0, 0, 1), "indices (num_weights 10) holds 10, outside [0, 10)"),
    (_r(2, 4), [0, 1, 9], _i(0, 2), _i(0, 0, 1), "indices (num_weights 10) is not a tensor"),
    # offset2bag empty: the kernel rebuilds it from the offsets
    (_r(2, 4), _i(0, 1, 9), _i(0, 9), _i(), "offsets holds 9, outside [0, 4)"),
    (_r(1, 4), _i(0, 1, 9), _i(0, 2), _i(), "grad has 1 rows for the 2 bags offsets make"),
    (_r(1, 4), _i(0, 1, 99), _i(0, 2), _i(), "indices (num_weights 10) holds 99, outside [0, 10)"),
    (_r(2, 4), _i(0, 1, 9), _i(1, 2), _i(), "offsets [1, 2] do not begin at 0, which puts the indices before them in "
                                            "bag -1"),
    (_r(2, 4), _i(0, 1, 9), _i(), _i(), "offsets [] do not begin at 0, which puts the indices before them in bag -1"),
    (_r(9, 4), _i(*range(10)), _i(*range(1, 10)), _i(), "offsets [1, 2, 3, 4, 5, 6, 7, 8] do not begin at 0, which "
                                                        "puts the indices before them in bag -1"),  # the first 8 shown
])
def test_per_sample_weights_backward_bags_just_past_grads_rows_are_refused(grad, indices, offsets, o2b, why):
    assert refused(PSW, grad, _r(10, 4, seed=1), indices, offsets, o2b, 0, -1) == why


@pytest.mark.parametrize("grad,weight", [(_r(4), _r(10, 4)), (_r(2, 4), _r(10)), (None, _r(10, 4)), (_r(2, 4), None)],
                         ids=["1-d grad", "1-d weight", "no grad", "no weight"])
def test_per_sample_weights_backward_grad_and_weight_are_matrices(grad, weight):
    assert refused(PSW, grad, weight, _i(0, 1, 9), _i(0, 2), _i(), 0, -1) == "grad or weight is not a 2-d tensor"


# ---------------------------------------------------------------------------------------
# layer norm: normalized_shape ends the input's; weight and bias are its elements, mean and
# rstd one per row (the dimensions before it), read densely


LN, LN_BACK = aten.native_layer_norm.default, aten.native_layer_norm_backward.default


@pytest.mark.parametrize("shape,normalized", [((4, 8), [8]), ((2, 3, 4), [3, 4]), ((2, 3, 4), [2, 3, 4]),
                                              ((4, 0), [0])])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_and_its_backward_run_as_the_kernel(shape, normalized, affine):
    n = torch.Size(normalized).numel()
    w, b = (_r(n, seed=1).view(normalized), _r(n, seed=2).view(normalized)) if affine else (None, None)
    runs_as_the_kernel(LN, lambda: (_r(*shape), normalized, w, b, 1e-5))
    _, mean, rstd = LN(_r(*shape), normalized, w, b, 1e-5)
    runs_as_the_kernel(LN_BACK, lambda: (_r(*shape, seed=3), _r(*shape), normalized, mean, rstd, w, b,
                                         [True, affine, affine]))


@pytest.mark.parametrize("x,normalized,why", [
    (_r(4, 8), 8, "input or normalized_shape is malformed"),
    ([[0.0] * 8] * 4, [8], "input or normalized_shape is malformed"),
    (_r(4, 8), [4], "normalized_shape [4] does not end input's shape [4, 8]"),
    (_r(4, 8), [], "normalized_shape [] does not end input's shape [4, 8]"),
    (_r(4, 8), [1, 4, 8], "normalized_shape [1, 4, 8] does not end input's shape [4, 8]"),
])
def test_layer_norm_normalized_shape_must_end_the_inputs_forward_and_backward(x, normalized, why):
    assert refused(LN, x, normalized, None, None, 1e-5) == why
    assert refused(LN_BACK, _r(4, 8), x, normalized, _r(4, 1), _r(4, 1), None, None, [T, T, T]) == why


def test_layer_norm_weight_and_bias_one_per_normalized_element():
    assert refused(LN, _r(4, 8), [8], _r(7), None, 1e-5) == "weight has 7 elements where the input needs 8"
    assert refused(LN, _r(4, 8), [8], None, _r(9), 1e-5) == "bias has 9 elements where the input needs 8"


def _ln_back(**change):
    args = {"grad_out": _r(4, 8), "input": _r(4, 8), "normalized_shape": [8], "mean": _r(4, 1), "rstd": _r(4, 1),
            "weight": _r(8), "bias": _r(8), "output_mask": [T, T, T]}
    return list({**args, **change}.values())


@pytest.mark.parametrize("change,why", [
    ({"grad_out": _r(4, 7)}, "grad_out has shape [4, 7], input [4, 8]"),
    ({"mean": _r(3, 1)}, "mean has 3 elements where the input needs 4"),
    ({"rstd": _r(5, 1)}, "rstd has 5 elements where the input needs 4"),
    ({"weight": _r(7)}, "weight has 7 elements where the input needs 8"),
    ({"bias": _r(9)}, "bias has 9 elements where the input needs 8"),
    # the kernel reads the statistics by their data pointer: expanded from one element, it
    # reads past its storage
    ({"mean": torch.ones(1, 1).expand(4, 1)}, "mean is not dense (sizes [4, 1], strides [0, 1]) where the kernel reads "
                                              "it so"),
    ({"rstd": torch.ones(1, 1).expand(4, 1)}, "rstd is not dense (sizes [4, 1], strides [0, 1]) where the kernel reads "
                                              "it so"),
    ({"rstd": _r(8)[::2]}, "rstd is not dense (sizes [4], strides [2]) where the kernel reads it so"),
])
def test_layer_norm_backward_statistics_and_parameters_just_outside_are_refused(change, why):
    assert refused(LN_BACK, *_ln_back(**change)) == why


def test_layer_norm_backward_of_a_grad_expanded_runs_as_the_kernel():
    # grad_out the kernel makes contiguous itself: an expanded one is read right
    x, w = _r(4, 8), _r(8, seed=1)
    _, mean, rstd = LN(x, [8], w, None, 1e-5)
    runs_as_the_kernel(LN_BACK, lambda: (torch.ones(1, 1).expand(4, 8), x, [8], mean, rstd, w, None, [T, T, F]))


# ---------------------------------------------------------------------------------------
# group norm: N, C, HxW and group describe the input; weight, bias, mean and rstd dense


GN, GN_BACK = aten.native_group_norm.default, aten.native_group_norm_backward.default


def _gn_back_args(x, w, n, c, hxw, group, grad=None):
    _, mean, rstd = GN(x, w, None, n, c, hxw, group, 1e-5)
    g = torch.ones_like(x) if grad is None else grad
    return (g, x, mean, rstd, w, n, c, hxw, group, [T, w is not None, w is not None])


@pytest.mark.parametrize("shape,group", [((2, 4, 3), 2), ((2, 4, 3), 1), ((2, 4, 3), 4), ((2, 4), 2),
                                         ((2, 4, 3, 3), 2), ((1, 4, 2, 2, 2), 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_and_its_backward_run_as_the_kernel(shape, group, affine):
    n, c, hxw = shape[0], shape[1], torch.Size(shape[2:]).numel()
    w, b = (_r(c, seed=1), _r(c, seed=2)) if affine else (None, None)
    runs_as_the_kernel(GN, lambda: (_r(*shape), w, b, n, c, hxw, group, 1e-5))
    runs_as_the_kernel(GN_BACK, lambda: _gn_back_args(_r(*shape), w, n, c, hxw, group))


@pytest.mark.parametrize("shape,layout", [((2, 4, 3, 3), torch.channels_last), ((2, 4, 2, 3, 3), torch.channels_last_3d),
                                          ((0, 4, 2, 2), torch.channels_last)])
def test_group_norm_backward_of_a_channels_last_input_runs_as_the_kernel(shape, layout):
    n, c, hxw = shape[0], shape[1], torch.Size(shape[2:]).numel()
    runs_as_the_kernel(GN_BACK, lambda: _gn_back_args(_r(*shape).to(memory_format=layout), _r(c), n, c, hxw, 2,
                                                      grad=_r(*shape, seed=1).to(memory_format=layout)))


def test_group_norm_backward_of_an_empty_channels_last_input_takes_grad_as_it_is():
    # empty, the input is contiguous as well as channels last: the kernel's layout is the
    # contiguous one, whatever grad_out's strides
    x = torch.empty(0, 4, 2, 2).to(memory_format=torch.channels_last)
    runs_as_the_kernel(GN_BACK, lambda: (torch.empty(0, 4, 2, 2), x, _i().float(), _i().float(), _r(4), 0, 4, 4, 2,
                                         [T, T, T]))


@pytest.mark.parametrize("x,n,c,hxw,group,why", [
    (_r(4), 1, 4, 1, 2, "input has fewer than 2 dimensions"),
    (None, 2, 4, 3, 2, "input has fewer than 2 dimensions"),
    (_r(2, 4, 3), 1, 4, 6, 2, "N=1, C=4, HxW=6 do not describe an input of shape [2, 4, 3]"),  # N alone wrong
    (_r(2, 4, 3), 2, 3, 4, 1, "N=2, C=3, HxW=4 do not describe an input of shape [2, 4, 3]"),  # C alone wrong
    (_r(2, 4, 3), 2, 4, 4, 2, "N=2, C=4, HxW=4 do not describe an input of shape [2, 4, 3]"),
    (_r(2, 4, 3), 2, 4, 3, 3, "group=3 does not divide C=4"),
    (_r(2, 4, 3), 2, 4, 3, 0, "group=0 does not divide C=4"),
    (_r(2, 4, 3), 2, 4, 3, 2.0, "group=2.0 does not divide C=4"),
])
def test_group_norm_geometry_just_outside_the_input_is_refused(x, n, c, hxw, group, why):
    assert refused(GN, x, None, None, n, c, hxw, group, 1e-5) == why
    assert refused(GN_BACK, x, x, _r(2), _r(2), None, n, c, hxw, group, [T, F, F]) == why


@pytest.mark.parametrize("w,b,why", [
    (_r(3), None, "weight has 3 elements where the input needs 4"),
    (None, _r(5), "bias has 5 elements where the input needs 4"),
    (_expanded(4), None, "weight is not dense (sizes [4], strides [0]) where the kernel reads it so"),
    (None, _expanded(4), "bias is not dense (sizes [4], strides [0]) where the kernel reads it so"),
])
def test_group_norm_weight_and_bias_one_per_channel_and_dense(w, b, why):
    assert refused(GN, _r(2, 4, 3), w, b, 2, 4, 3, 2, 1e-5) == why


@pytest.mark.parametrize("name,value,why", [
    (0, _r(2, 4, 2), "grad_out has shape [2, 4, 2], input [2, 4, 3]"),
    (2, _r(3), "mean has 3 elements where the input needs 4"),
    (3, _r(5), "rstd has 5 elements where the input needs 4"),
    (4, _r(3), "weight has 3 elements where the input needs 4"),
    (1, _r(2, 3, 4).transpose(1, 2), "input is not dense (sizes [2, 4, 3], strides [12, 1, 4]) where the kernel reads "
                                     "it so"),
    (0, torch.ones(1, 1, 1).expand(2, 4, 3), "grad_out is not dense (sizes [2, 4, 3], strides [0, 0, 0]) where the "
                                             "kernel reads it so"),
    (2, _expanded(4), "mean is not dense (sizes [4], strides [0]) where the kernel reads it so"),
    (3, _expanded(4), "rstd is not dense (sizes [4], strides [0]) where the kernel reads it so"),
    (4, _expanded(4), "weight is not dense (sizes [4], strides [0]) where the kernel reads it so"),
])
def test_group_norm_backward_lengths_and_layouts_just_outside_are_refused(name, value, why):
    args = list(_gn_back_args(_r(2, 4, 3), _r(4, seed=1), 2, 4, 3, 2))
    args[name] = value
    assert refused(GN_BACK, *args) == why


# ---------------------------------------------------------------------------------------
# batch norms: each statistic and parameter one per channel (the checks are made per op by
# _batch_norm_stats; each case below builds its own and holds the registered one to it)


X3 = (2, 3, 4)
BATCH_NORMS = {  # op: the tensors its check counts, and its arguments by name
    aten.native_batch_norm.default: (("weight", "bias", "running_mean", "running_var"), {"training": True}),
    aten._native_batch_norm_legit.default: (("weight", "bias", "running_mean", "running_var"), {"training": True}),
    aten._native_batch_norm_legit.no_stats: (("weight", "bias"), {"training": True}),
    aten._native_batch_norm_legit_functional.default: (("weight", "bias", "running_mean", "running_var"),
                                                       {"training": True}),
    aten._native_batch_norm_legit_no_training.default: (("weight", "bias", "running_mean", "running_var"), {}),
    aten._batch_norm_with_update_functional.default: (("weight", "bias", "running_mean", "running_var"), {}),
    aten._batch_norm_no_update.default: (("weight", "bias", "running_mean", "running_var"), {}),
    aten.native_batch_norm_backward.default: (("weight", "running_mean", "running_var", "save_mean", "save_invstd"),
                                              {"train": True}),
    aten.batch_norm_backward.default: (("weight", "running_mean", "running_var", "save_mean", "save_var"),
                                       {"update": True, "reserve": torch.empty(0, dtype=torch.uint8)}),
}


def _bn_args(op, **change):
    values = {"input": _r(*X3), "grad_out": _r(*X3, seed=1), "momentum": 0.1, "eps": 1e-5, "output_mask": [T, T, T],
              **{name: _r(3, seed=2 + k).abs() + 0.5 for k, name in enumerate(
                  ("weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd", "save_var"))},
              **BATCH_NORMS[op][1], **change}
    return [values[a.name] for a in op._schema.arguments]


def _bn_check(op):
    return checked._batch_norm_stats(*BATCH_NORMS[op][0])


@pytest.mark.parametrize("op", list(BATCH_NORMS), ids=lambda op: f"{op._schema.name}.{op._overloadname}")
def test_batch_norms_of_statistics_one_per_channel_run_as_the_kernel(op):
    assert checked.CHECKS[op](checked._bind(op, tuple(_bn_args(op)), {})) is None
    runs_as_the_kernel(op, lambda: _bn_args(op), check=_bn_check(op))


@pytest.mark.parametrize("op", list(BATCH_NORMS), ids=lambda op: f"{op._schema.name}.{op._overloadname}")
@pytest.mark.parametrize("count", [2, 4])
def test_batch_norms_of_a_statistic_one_off_the_channels_are_refused(op, count):
    for name in BATCH_NORMS[op][0]:
        args = _bn_args(op, **{name: _r(count)})
        assert refused(op, *args, check=_bn_check(op)) == f"{name} has {count} elements where the input needs 3"
        assert refused(op, *args) == f"{name} has {count} elements where the input needs 3"  # the registered check


@pytest.mark.parametrize("op", list(BATCH_NORMS), ids=lambda op: f"{op._schema.name}.{op._overloadname}")
def test_batch_norms_of_an_input_without_channels_are_refused(op):
    assert refused(op, *_bn_args(op, input=_r(3)), check=_bn_check(op)) == "input has fewer than 2 dimensions"


@pytest.mark.parametrize("op", [aten.native_batch_norm_backward.default, aten.batch_norm_backward.default],
                         ids=lambda op: op._schema.name)
def test_batch_norm_backwards_grad_out_is_the_inputs_shape_and_said_first(op):
    assert refused(op, *_bn_args(op, grad_out=_r(2, 3, 5)), check=_bn_check(op)) == \
        "grad_out has shape [2, 3, 5], input [2, 3, 4]"
    assert refused(op, *_bn_args(op, grad_out=_r(2, 3, 5), weight=_r(2)), check=_bn_check(op)) == \
        "grad_out has shape [2, 3, 5], input [2, 3, 4]"


def test_a_batch_norms_absent_parameters_pass_their_count():
    op = aten._native_batch_norm_legit_no_training.default
    runs_as_the_kernel(op, lambda: _bn_args(op, weight=None, bias=None), check=_bn_check(op))


# ---------------------------------------------------------------------------------------
# weight norm: dim a dimension of v; g (and the saved norms) one per slice along it, dense


WN, WN_BACK = aten._weight_norm_interface.default, aten._weight_norm_interface_backward.default


def _wn_back_args(v, g, dim):
    w, norms = WN(v, g, dim)
    return (torch.ones_like(w), v, g, norms, dim)


@pytest.mark.parametrize("shape,dim", [((4, 3), 0), ((4, 3), 1), ((2, 3, 4), 0), ((2, 3, 4), 2), ((5,), 0)])
def test_weight_norm_and_its_backward_along_the_first_or_last_dimension_run_as_the_kernel(shape, dim):
    gshape = [s if d == dim else 1 for d, s in enumerate(shape)]
    runs_as_the_kernel(WN, lambda: (_r(*shape), _r(*gshape, seed=1).abs() + 0.5, dim))
    runs_as_the_kernel(WN_BACK, lambda: _wn_back_args(_r(*shape), _r(*gshape, seed=1).abs() + 0.5, dim))


@pytest.mark.parametrize("dim", [-2, -1, 1])
def test_weight_norm_dims_within_v_pass_the_check(dim):
    # (the kernel itself takes only the first and the last, wrapped, and says so)
    g = _r(4, 1) if dim in (-2, 0) else _r(1, 3)
    assert passes_its_check(WN, _r(4, 3), g, dim)
    assert passes_its_check(WN_BACK, _r(4, 3), _r(4, 3), g, g, dim)


@pytest.mark.parametrize("v,dim", [(_r(4, 3), 2), (_r(4, 3), -3), (_r(4, 3), None), (_r(4, 3), 0.0), (None, 0)])
def test_weight_norm_dims_just_outside_v_are_refused(v, dim):
    assert refused(WN, v, _r(4, 1), dim) == "dim is not a dimension of v"
    assert refused(WN_BACK, _r(4, 3), v, _r(4, 1), _r(4, 1), dim) == "dim is not a dimension of v"


@pytest.mark.parametrize("v,g,why", [
    (_r(4, 3), _r(3, 1), "g has 3 elements where the input needs 4"),
    (_r(4, 3), _r(5), "g has 5 elements where the input needs 4"),
    (_r(3, 4).T, _r(4, 1), "v is not dense (sizes [4, 3], strides [1, 4]) where the kernel reads it so"),
    (_r(4, 3), torch.ones(1, 1).expand(4, 1), "g is not dense (sizes [4, 1], strides [0, 1]) where the kernel reads "
                                              "it so"),
])
def test_weight_norm_g_one_per_slice_and_both_dense(v, g, why):
    assert refused(WN, v, g, 0) == why


@pytest.mark.parametrize("k,value,why", [
    (0, _r(4, 2), "grad_w has shape [4, 2], saved_v [4, 3]"),
    (2, _r(3, 1), "saved_g has 3 elements where the input needs 4"),
    (3, _r(5, 1), "saved_norms has 5 elements where the input needs 4"),
    (0, torch.ones(1, 1).expand(4, 3), "grad_w is not dense (sizes [4, 3], strides [0, 0]) where the kernel reads it "
                                       "so"),
    (2, torch.ones(1, 1).expand(4, 1), "saved_g is not dense (sizes [4, 1], strides [0, 1]) where the kernel reads it "
                                       "so"),
    (3, torch.ones(1, 1).expand(4, 1), "saved_norms is not dense (sizes [4, 1], strides [0, 1]) where the kernel reads "
                                       "it so"),
])
def test_weight_norm_backward_lengths_and_layouts_just_outside_are_refused(k, value, why):
    args = list(_wn_back_args(_r(4, 3), _r(4, 1).abs() + 0.5, 0))
    args[k] = value
    assert refused(WN_BACK, *args) == why


def test_weight_norm_backward_saved_v_must_be_dense():
    v = _r(3, 4).T
    assert refused(WN_BACK, _r(4, 3), v, _r(4, 1), _r(4, 1), 0) == \
        "saved_v is not dense (sizes [4, 3], strides [1, 4]) where the kernel reads it so"
