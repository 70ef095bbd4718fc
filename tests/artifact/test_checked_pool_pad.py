"""The checked forms of the poolings' and paddings' backwards, the distances' backwards, the
segment reductions, bincount and repeat_interleave, and the solvers whose kernels trust their
pivots, each at its bounds: the arguments just inside run the kernel and give exactly what the
op gives unchecked; those just outside are refused in one line naming the argument, the kernel
never reached. The checks a factory makes (a pooling's, a padding's) are made afresh in each
test, so the test holds the factory's code and not a check built when the module was imported.
In-process."""

import pytest
import torch

from aotpipe.artifact import checked
from aotpipe.errors import ArtifactError
from aotpipe.format import limits
from tests.helpers.checked_args import WHERE, _i, _r

aten = torch.ops.aten




def _check(op, check):
    return check if check is not None else checked.CHECKS[op]


def runs(op, *args, check=None, kernel_refuses=False, **kwargs):
    """The checked form gives exactly what the op gives unchecked: the same tensors, or (where
    the kernel refuses the arguments itself) the same error of the kernel's own."""
    form = checked.CheckedOp(op, _check(op, check), WHERE)
    if kernel_refuses:
        with pytest.raises(RuntimeError) as want:
            op(*args, **kwargs)
        with pytest.raises(RuntimeError) as got:
            form(*args, **kwargs)
        assert not isinstance(got.value, ArtifactError) and str(got.value) == str(want.value)
        return None
    want = op(*args, **kwargs)
    got = form(*args, **kwargs)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want], strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
    return got


def refused(op, *args, check=None, **kwargs):
    """The refusal's reason (the line between the node's name and "; the kernel was not run")."""
    reached = []
    original = checked.call_kernel
    checked.call_kernel = lambda o, a, k: reached.append(o)
    try:
        with pytest.raises(ArtifactError) as e:
            checked.CheckedOp(op, _check(op, check), WHERE)(*args, **kwargs)
    finally:
        checked.call_kernel = original
    assert not reached
    text = str(e.value)
    prefix = f"{WHERE} ({op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}): "
    suffix = "; the kernel was not run"
    assert text.startswith(prefix) and text.endswith(suffix) and "\n" not in text, text
    return text[len(prefix):-len(suffix)]


# ---------------------------------------------------------------------------------------
# max-pool backwards: indices within the input's plane, of grad_output's shape, dense

MAX2 = aten.max_pool2d_with_indices_backward.default
MAX3 = aten.max_pool3d_with_indices_backward.default
ADAPTIVE2 = aten.adaptive_max_pool2d_backward.default


def _max2(g, x, idx):
    return (g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)


def _corners(shape, plane, memory_format=torch.contiguous_format):
    """Indices of `shape` holding the plane's first and last element, alternately."""
    idx = torch.zeros(shape, dtype=torch.int64).contiguous(memory_format=memory_format)
    idx.view(-1)[1::2] = plane - 1
    return idx


@pytest.mark.parametrize("batch", [[2, 3], [3]], ids=["batched", "unbatched"])
def test_max_pool2d_backward_indices_from_the_first_to_the_last_of_the_plane_run(batch):
    x = _r(*batch, 4, 5)  # a plane of 20: an unbatched input's leading 3 is not part of it
    runs(MAX2, *_max2(_r(*batch, 2, 2), x, _corners([*batch, 2, 2], 20)), check=checked._pool_backward(2))


@pytest.mark.parametrize("batch", [[2, 3], [3]], ids=["batched", "unbatched"])
@pytest.mark.parametrize("index", [-1, 20])
def test_max_pool2d_backward_indices_just_outside_the_plane_are_refused(batch, index):
    idx = _corners([*batch, 2, 2], 20)
    idx.view(-1)[2] = index
    assert refused(MAX2, *_max2(_r(*batch, 2, 2), _r(*batch, 4, 5), idx), check=checked._pool_backward(2)) == \
        f"indices holds {index}, outside [0, 20)"


def test_max_pool3d_backward_indices_span_a_three_dimensional_plane():
    check = checked._pool_backward(3)
    x, g = _r(2, 2, 3, 4, 5), _r(2, 2, 1, 2, 2)
    args = (g, x, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False)
    runs(MAX3, *args, _corners([2, 2, 1, 2, 2], 60), check=check)
    assert refused(MAX3, *args, _corners([2, 2, 1, 2, 2], 61), check=check) == "indices holds 60, outside [0, 60)"
    unbatched = (_r(2, 1, 2, 2), _r(2, 3, 4, 5), *args[2:])
    runs(MAX3, *unbatched, _corners([2, 1, 2, 2], 60), check=check)


def test_pool_backward_indices_laid_out_channels_last_run():
    x = _r(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    _, idx = aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])
    assert not idx.is_contiguous() and idx.is_contiguous(memory_format=torch.channels_last)
    runs(MAX2, *_max2(torch.ones(1, 3, 2, 2), x, idx), check=checked._pool_backward(2))
    x3 = _r(1, 3, 2, 4, 4).contiguous(memory_format=torch.channels_last_3d)
    _, idx3 = aten.max_pool3d_with_indices.default(x3, [2, 2, 2], [2, 2, 2])
    assert not idx3.is_contiguous() and idx3.is_contiguous(memory_format=torch.channels_last_3d)
    runs(MAX3, torch.ones(1, 3, 1, 2, 2), x3, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, idx3,
         check=checked._pool_backward(3))
    # a pooling's forward of an unbatched input gives contiguous indices: they run as they are
    x = _r(3, 4, 4)
    _, idx = aten.adaptive_max_pool2d.default(x, [2, 2])
    runs(ADAPTIVE2, torch.ones(3, 2, 2), x, idx, check=checked._pool_backward(2))


def test_pool_backward_indices_not_dense_in_either_layout_are_refused():
    idx = _corners([1, 2, 2, 4], 16)[..., ::2]  # every other column: a gap
    assert refused(MAX2, *_max2(_r(1, 2, 2, 2), _r(1, 2, 4, 4), idx), check=checked._pool_backward(2)) == \
        "indices is not dense (sizes [1, 2, 2, 2], strides [16, 8, 4, 2]) where the kernel reads it so"
    idx3 = torch.zeros(1, dtype=torch.int64).expand(1, 2, 1, 2, 2)
    assert refused(MAX3, _r(1, 2, 1, 2, 2), _r(1, 2, 2, 4, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False,
                   idx3, check=checked._pool_backward(3)) == \
        "indices is not dense (sizes [1, 2, 1, 2, 2], strides [0, 0, 0, 0, 0]) where the kernel reads it so"


def test_pool_backward_indices_of_another_shape_than_grad_output_are_refused():
    assert refused(MAX2, *_max2(_r(1, 2, 2, 2), _r(1, 2, 4, 4), _i(0, 15)), check=checked._pool_backward(2)) == \
        "indices has shape [2], grad_output [1, 2, 2, 2]"


@pytest.mark.parametrize("g", [[2, 2, 2, 2], [1, 3, 2, 2], [2, 2, 2]], ids=str)
def test_pool_backward_grad_output_of_other_batch_dimensions_than_self_is_refused(g):
    assert refused(MAX2, *_max2(_r(*g), _r(1, 2, 4, 4), _corners(g, 16)), check=checked._pool_backward(2)) == \
        f"grad_output has shape {g} for an input of shape [1, 2, 4, 4]"


@pytest.mark.parametrize("which", ["grad_output", "self", "indices"])
def test_pool_backward_arguments_that_are_not_tensors_are_refused(which):
    args = dict(zip(["grad_output", "self", "indices"], [_r(1, 2, 2, 2), _r(1, 2, 4, 4), _corners([1, 2, 2, 2], 16)],
                    strict=True))
    args[which] = None
    assert refused(ADAPTIVE2, args["grad_output"], args["self"], args["indices"],
                   check=checked._pool_backward(2)) == "its tensors do not have the dimensions of a pooling"


def test_pool_backward_self_of_fewer_dimensions_than_its_plane_is_refused():
    assert refused(ADAPTIVE2, _r(2), _r(4), _i(0, 3), check=checked._pool_backward(2)) == \
        "its tensors do not have the dimensions of a pooling"
    # just the plane's dimensions: no batch, no channels; the kernel's own error, as unchecked
    runs(ADAPTIVE2, _r(2, 2), _r(4, 4), _corners([2, 2], 16), check=checked._pool_backward(2), kernel_refuses=True)


def test_fractional_max_pool_backward_takes_the_pooling_check():
    x = _r(1, 2, 6, 6)
    _, idx = aten.fractional_max_pool2d.default(x, [2, 2], [3, 3], torch.rand(1, 2, 2))
    runs(aten.fractional_max_pool2d_backward.default, torch.ones(1, 2, 3, 3), x, [2, 2], [3, 3], idx,
         check=checked._pool_backward(2))
    assert refused(aten.fractional_max_pool2d_backward.default, torch.ones(1, 2, 3, 3), x, [2, 2], [3, 3],
                   torch.full((1, 2, 3, 3), 36), check=checked._pool_backward(2)) == "indices holds 36, outside [0, 36)"


# ---------------------------------------------------------------------------------------
# average-pool backwards: grad_output has self's dimensions but the plane's


def test_avg_pool_backward_grad_output_of_selfs_batch_dimensions_runs():
    check = checked._pool_planes(2)
    runs(aten.avg_pool2d_backward.default, _r(2, 3, 2, 2), _r(2, 3, 4, 5), [2, 2], [2, 2], [0, 0], False, True, None,
         check=check)
    runs(aten._adaptive_avg_pool2d_backward.default, _r(3, 2, 3), _r(3, 4, 5), check=check)
    runs(aten._adaptive_avg_pool3d_backward.default, _r(2, 3, 1, 2, 3), _r(2, 3, 2, 4, 5),
         check=checked._pool_planes(3))


@pytest.mark.parametrize("g,x", [([2, 4, 2, 2], [2, 3, 4, 5]), ([3, 2, 2, 2], [2, 3, 4, 5]), ([3, 2, 2], [2, 3, 4, 5]),
                                 ([2, 2], [3, 4, 5])], ids=str)
def test_avg_pool_backward_grad_output_of_other_batch_dimensions_is_refused(g, x):
    assert refused(aten._adaptive_avg_pool2d_backward.default, _r(*g), _r(*x), check=checked._pool_planes(2)) == \
        f"grad_output has shape {g} for an input of shape {x}"


def test_avg_pool3d_backward_counts_three_dimensions_as_the_plane():
    op = aten._adaptive_avg_pool3d_backward.default
    assert refused(op, _r(2, 3, 4), _r(2, 3, 4), check=checked._pool_planes(3)) == \
        "grad_output or self is not a tensor of more than 3 dimensions"
    assert refused(op, _r(3, 1, 1, 1), _r(2, 4, 4, 4), check=checked._pool_planes(3)) == \
        "grad_output has shape [3, 1, 1, 1] for an input of shape [2, 4, 4, 4]"
    runs(op, _r(2, 1, 1, 1), _r(2, 4, 4, 4), check=checked._pool_planes(3))


@pytest.mark.parametrize("which", [0, 1])
def test_avg_pool_backward_arguments_that_are_not_tensors_are_refused(which):
    args = [_r(2, 3, 2, 2), _r(2, 3, 4, 4)]
    args[which] = [1.0]
    assert refused(aten._adaptive_avg_pool2d_backward.default, *args, check=checked._pool_planes(2)) == \
        "grad_output or self is not a tensor of more than 2 dimensions"


# ---------------------------------------------------------------------------------------
# padding backwards: grad_output is self padded; a reflection's pads less than self's sizes

PADS = {1: ([2, 3, 5], [1, 2]),
        2: ([2, 4, 5], [1, 2, 0, 3]),
        3: ([2, 3, 4, 5], [1, 2, 0, 3, 2, 1])}  # unbatched: self's batch dimensions are not the plane's count


def _padded(shape, pad):
    spatial = len(pad) // 2
    return shape[:-spatial] + [shape[-1 - d] + pad[2 * d] + pad[2 * d + 1] for d in reversed(range(spatial))]


def _pad_op(kind, spatial):
    return getattr(aten, f"{kind}_pad{spatial}d_backward").default


@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_pad_backward_grad_output_of_self_padded_runs(kind, spatial):
    shape, pad = PADS[spatial]
    check = checked._pad_backward(spatial, reflects=kind == "reflection")
    runs(_pad_op(kind, spatial), _r(*_padded(shape, pad)), _r(*shape), pad, check=check)
    batched = [3, *shape][-spatial - 2:]  # the most dimensions the kernel takes
    runs(_pad_op(kind, spatial), _r(*_padded(batched, pad)), _r(*batched), pad, check=check)


@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize("spatial,at", [(s, at) for s in PADS for at in range(len(PADS[s][0]))])
@pytest.mark.parametrize("by", [-1, 1])
def test_pad_backward_grad_output_one_off_in_any_dimension_is_refused(kind, spatial, at, by):
    shape, pad = PADS[spatial]
    want = _padded(shape, pad)
    g = list(want)
    g[at] += by
    if at < len(shape) - spatial:  # a batch dimension: the batch's check
        why = f"grad_output has shape {g} for an input of shape {shape}"
    else:
        why = f"grad_output has shape {g} where self {shape} padded by {pad} gives {want}"
    assert refused(_pad_op(kind, spatial), _r(*g), _r(*shape), pad,
                   check=checked._pad_backward(spatial, reflects=kind == "reflection")) == why


def test_pad_backward_grad_output_of_fewer_dimensions_is_refused_by_the_batch_check():
    assert refused(_pad_op("replication", 2), _r(4, 9), _r(2, 4, 5), [1, 2, 0, 3],
                   check=checked._pad_backward(2, reflects=False)) == \
        "grad_output has shape [4, 9] for an input of shape [2, 4, 5]"


@pytest.mark.parametrize("which", [0, 1])
def test_pad_backward_arguments_that_are_not_tensors_are_refused(which):
    args = [_r(2, 7, 8), _r(2, 4, 5)]
    args[which] = None
    assert refused(_pad_op("reflection", 2), *args, [1, 2, 0, 3], check=checked._pad_backward(2, reflects=True)) == \
        "grad_output or self is not a tensor of more than 2 dimensions"


@pytest.mark.parametrize("pad", [[1, 2, 0], [1, 2, 0, 3, 4], 1, [1, 2, 0, 3.0], None], ids=str)
def test_pad_backward_padding_not_two_ints_a_dimension_is_refused(pad):
    assert refused(_pad_op("replication", 2), _r(2, 7, 8), _r(2, 4, 5), pad,
                   check=checked._pad_backward(2, reflects=False)) == f"padding {pad!r} is not a list of 4 ints"


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_a_reflections_pads_up_to_one_less_than_selfs_size_run(spatial):
    shape = {1: [2, 5], 2: [2, 4, 5], 3: [2, 3, 4, 5]}[spatial]
    check = checked._pad_backward(spatial, reflects=True)
    for at in range(2 * spatial):  # each pad in turn at its largest: the size less one
        pad = [0] * (2 * spatial)
        pad[at] = shape[-1 - at // 2] - 1
        runs(_pad_op("reflection", spatial), _r(*_padded(shape, pad)), _r(*shape), pad, check=check)
    # negative pads crop: as small as leaves one element
    pad = [0] * (2 * spatial)
    pad[0], pad[1] = -4, 0
    runs(_pad_op("reflection", spatial), _r(*_padded(shape, pad)), _r(*shape), pad, check=check)


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_a_reflections_pad_of_selfs_size_is_refused_in_each_dimension(spatial):
    shape = {1: [2, 5], 2: [2, 4, 5], 3: [2, 3, 4, 5]}[spatial]
    check = checked._pad_backward(spatial, reflects=True)
    for at in range(2 * spatial):
        pad = [0] * (2 * spatial)
        size = shape[-1 - at // 2]
        pad[at] = size
        assert refused(_pad_op("reflection", spatial), _r(*_padded(shape, pad)), _r(*shape), pad, check=check) == (
            f"padding {pad} reflects a pad of {size} in dimension {len(shape) - 1 - at // 2} of self {shape}, where "
            "a pad must be less than the size")


def test_a_replications_pads_of_any_size_run():
    shape, pad = [2, 4, 5], [5, 9, 4, -3]
    runs(_pad_op("replication", 2), _r(*_padded(shape, pad)), _r(*shape), pad,
         check=checked._pad_backward(2, reflects=False))


def test_the_module_holds_reflections_to_their_sizes_and_not_replications():
    shape, pad = [2, 4, 5], [5, 0, 0, 0]
    args = (_r(*_padded(shape, pad)), _r(*shape), pad)
    assert refused(_pad_op("reflection", 2), *args).startswith("padding [5, 0, 0, 0] reflects a pad of 5")
    runs(_pad_op("replication", 2), *args)


# ---------------------------------------------------------------------------------------
# distances' backwards


def _pdist(rows):
    x = _r(rows, 3)
    return x, aten._pdist_forward.default(x, 2.0)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_pdist_backward_grad_and_pdist_one_per_pair_of_rows_run(rows):
    x, d = _pdist(rows)
    runs(aten._pdist_backward.default, _r(rows * (rows - 1) // 2), x, 2.0, d)
    runs(aten._pdist_backward.default, _r(2 * rows * (rows - 1) // 2)[::2], x, 2.0, d)  # any stride: its own


@pytest.mark.parametrize("which,n", [("grad", 9), ("grad", 11), ("pdist", 9), ("pdist", 11)])
def test_pdist_backward_one_element_more_or_fewer_than_the_pairs_is_refused(which, n):
    x, d = _pdist(5)
    args = {"grad": _r(10), "pdist": d}
    args[which] = _r(n)
    assert refused(aten._pdist_backward.default, args["grad"], x, 2.0, args["pdist"]) == \
        f"{which} has {n} elements where the input needs 10"


@pytest.mark.parametrize("shape", [[1, 10], [10, 1], [2, 5]], ids=str)
def test_pdist_backward_a_grad_of_more_than_one_dimension_is_refused(shape):
    x, d = _pdist(5)
    assert refused(aten._pdist_backward.default, _r(*shape), x, 2.0, d) == \
        f"grad has shape {shape} where the kernel reads [10]"


def test_pdist_backward_self_must_be_rows():
    op = aten._pdist_backward.default
    assert refused(op, _r(0), _r(0, 3), 2.0, _r(0)) == "self has no rows"
    assert refused(op, _r(10), _r(5), 2.0, _r(10)) == "self is not a 2-d tensor"
    assert refused(op, _r(10), _r(1, 5, 3), 2.0, _r(10)) == "self is not a 2-d tensor"
    assert refused(op, _r(10), None, 2.0, _r(10)) == "self is not a 2-d tensor"
    assert refused(op, [1.0] * 10, _r(5, 3), 2.0, _r(10)) == "grad is not a tensor"


CDIST = aten._cdist_backward.default


def _cdist(b1=(2,), b2=(2,), r1=3, r2=5, c=4):
    x1, x2 = _r(*b1, r1, c), _r(*b2, r2, c) + 1
    return x1, x2, aten._cdist_forward.default(x1, x2, 2.0, None)


def test_cdist_backward_of_its_forwards_shapes_runs():
    x1, x2, d = _cdist()
    runs(CDIST, _r(*d.shape), x1, x2, 2.0, d)
    x1, x2, d = _cdist(b1=(2, 1), b2=(2, 1))
    runs(CDIST, _r(*d.shape), x1, x2, 2.0, d)
    x1, x2, d = _cdist(b1=(), b2=())
    runs(CDIST, _r(*d.shape), x1, x2, 2.0, d)


@pytest.mark.parametrize("b1,b2", [((1,), (3,)), ((3,), (1,)), ((), (3,)), ((2, 1), (1, 3)), ((4, 1, 2), (3, 1))],
                         ids=str)
def test_cdist_backward_of_batches_its_forward_broadcast_runs_as_autograd_does(b1, b2):
    # an honest graph: cdist broadcasts x1's and x2's batch dimensions, and autograd sums the
    # kernel's gradient (of the broadcast shape) back to x1's
    x1, x2, d = _cdist(b1=b1, b2=b2)
    assert list(d.shape[:-2]) == list(torch.broadcast_shapes(b1, b2))
    g = _r(*d.shape)
    runs(CDIST, g, x1, x2, 2.0, d)
    leaf = x1.clone().requires_grad_()
    (torch.cdist(leaf, x2) * g).sum().backward()
    summed = CDIST(g, x1, x2, 2.0, d).sum_to_size(x1.shape)
    torch.testing.assert_close(summed, leaf.grad)


@pytest.mark.parametrize("x1,x2,d", [
    ([2, 3, 5], [2, 5, 4], [2, 3, 5]),  # columns differ
    ([2, 3, 4], [2, 5, 4], [2, 4, 5]), ([2, 3, 4], [2, 5, 4], [2, 3, 6]),  # cdist not [rows of x1, rows of x2]
    ([3, 3, 4], [2, 5, 4], [2, 3, 5]), ([2, 3, 4], [3, 5, 4], [2, 3, 5]),  # batches that do not broadcast
    ([3, 3, 4], [2, 5, 4], [3, 5]),  # ... and a cdist with no batch at all
    ([2, 3, 4], [2, 5, 4], [1, 2, 3, 5]),  # cdist with a batch dimension more
    ([1, 3, 4], [3, 5, 4], [2, 3, 5]),  # broadcast to [3], cdist has [2]: the kernel would read past it
    ([1, 3, 4], [3, 5, 4], [1, 3, 5]),  # cdist with x1's batch, not the broadcast one
], ids=str)
def test_cdist_backward_shapes_its_forward_does_not_give_are_refused(x1, x2, d):
    assert refused(CDIST, _r(*d), _r(*x1), _r(*x2), 2.0, _r(*d)) == \
        f"cdist has shape {d} for x1 {x1} and x2 {x2} (not their batch dimensions broadcast, then [rows of x1, rows of x2])"


def test_cdist_backward_grad_of_another_shape_than_cdist_is_refused():
    x1, x2, d = _cdist()
    assert refused(CDIST, _r(2, 3, 6), x1, x2, 2.0, d) == "grad has shape [2, 3, 6], cdist [2, 3, 5]"


@pytest.mark.parametrize("which,bad", [(w, "none") for w in range(4)] + [(w, "one dimension") for w in (1, 2, 3)])
def test_cdist_backward_tensors_that_are_not_batches_of_matrices_are_refused(which, bad):
    x1, x2, d = _cdist(b1=(), b2=())
    args = [_r(3, 5), x1, x2, d]
    args[which] = None if bad == "none" else args[which][0]
    assert refused(CDIST, args[0], args[1], args[2], 2.0, args[3]) == "its tensors are not batches of matrices"


# ---------------------------------------------------------------------------------------
# segment reductions


def test_segment_reduce_axis_from_minus_its_dimensions_to_one_less_runs():
    data = _r(6, 3)
    runs(aten.segment_reduce.default, data, "sum", lengths=_i(2, 4), axis=-2)
    runs(aten.segment_reduce.default, data, "sum", lengths=_i(1, 2).expand(6, 2), axis=1)  # a row of lengths a row


@pytest.mark.parametrize("axis", [-3, 2, 1.0])
def test_segment_reduce_axis_that_is_not_a_dimension_is_refused(axis):
    assert refused(aten.segment_reduce.default, _r(6, 3), "sum", lengths=_i(2, 4), axis=axis) == \
        "axis is not a dimension of data"


def test_segment_reduce_unsafe_and_data_that_is_not_a_tensor_are_refused():
    assert refused(aten.segment_reduce.default, _r(6), "sum", lengths=_i(2, 4), unsafe=True) == \
        "unsafe=True skips the kernel's own checks"
    assert refused(aten.segment_reduce.default, [1.0] * 6, "sum", lengths=_i(2, 4)) == "axis is not a dimension of data"


SEG_BACK = aten._segment_reduce_backward.default


def _segments(lengths=None, offsets=None, axis=0, data=None):
    data = _r(6, 3) if data is None else data
    out = aten.segment_reduce.default(data, "sum", lengths=lengths, offsets=offsets, axis=axis)
    return data, out


@pytest.mark.parametrize("given", ["lengths", "offsets"])
@pytest.mark.parametrize("axis", [0, -2, 1, -1])
def test_segment_reduce_backward_of_its_forwards_output_runs(given, axis):
    size, rows = (6, ()) if axis in (0, -2) else (3, (6,))  # along the last axis: a row of them for each of data's
    kw = {"lengths": _i(1, size - 1).expand(*rows, 2)} if given == "lengths" else \
        {"offsets": _i(0, 1, size).expand(*rows, 3)}
    data, out = _segments(axis=axis, **kw)
    runs(SEG_BACK, _r(*out.shape), out, data, "sum", axis=axis, **kw)


@pytest.mark.parametrize("given", ["lengths", "offsets"])
def test_segment_reduce_backward_output_of_a_segment_more_or_fewer_is_refused(given):
    data = _r(6, 3)
    kw = {"lengths": _i(2, 4)} if given == "lengths" else {"offsets": _i(0, 2, 6)}
    for rows in (1, 3):
        assert refused(SEG_BACK, _r(rows, 3), _r(rows, 3), data, "sum", **kw) == \
            f"output has shape [{rows}, 3] where 2 segments of data give [2, 3]"


def test_segment_reduce_backward_grad_of_another_shape_than_output_is_refused():
    data, out = _segments(lengths=_i(2, 4))
    assert refused(SEG_BACK, _r(2, 4), out, data, "sum", lengths=_i(2, 4)) == "grad has shape [2, 4], output [2, 3]"


def test_segment_reduce_backward_lengths_and_offsets_must_cover_the_axis():
    data, out = _segments(lengths=_i(2, 4))
    assert refused(SEG_BACK, out, out, data, "sum", lengths=_i(2, 5)) == \
        "lengths add up to 7, the data has 6 along the axis"
    assert refused(SEG_BACK, out, out, data, "sum", offsets=_i(0, 2, 5)) == "offsets do not run from 0 to 6"
    assert refused(SEG_BACK, out, out, data, "sum") == "neither lengths nor offsets is given"


@pytest.mark.parametrize("axis", [-3, 2])
def test_segment_reduce_backward_axis_just_outside_data_is_refused(axis):
    data, out = _segments(lengths=_i(2, 4))
    assert refused(SEG_BACK, out, out, data, "sum", lengths=_i(2, 4), axis=axis) == "axis is not a dimension of data"


@pytest.mark.parametrize("which", range(3))
def test_segment_reduce_backward_arguments_that_are_not_tensors_are_refused(which):
    data, out = _segments(lengths=_i(2, 4))
    args = [out, out, data]
    args[which] = None
    assert refused(SEG_BACK, *args, "sum", lengths=_i(2, 4)) == "axis is not a dimension of data"
    assert refused(SEG_BACK, out, out, data, "sum", lengths=_i(2, 4), axis=0.0) == "axis is not a dimension of data"


# ---------------------------------------------------------------------------------------
# sizes a value decides: an empty input makes none


def test_bincount_of_nothing_makes_no_counts_under_any_limit():
    with limits.override(max_tensor_bytes=4):
        runs(aten.bincount.default, _i())
        runs(aten.bincount.default, _i(), None, 0)
        assert refused(aten.bincount.default, _i(), None, 1) == (
            "its values makes 1 elements (8 bytes), over the limit of 4 bytes (raise it with "
            "AOTPIPE_MAX_TENSOR_BYTES)")


def test_repeat_interleave_of_no_repeats_makes_nothing_under_any_limit():
    with limits.override(max_tensor_bytes=4):
        runs(aten.repeat_interleave.Tensor, _i())
        runs(aten.repeat_interleave.Tensor, _i(), output_size=0)
        runs(aten.repeat_interleave.Tensor, _i(0, 0), output_size=0)  # a repeat of 0: allowed, not negative
        assert refused(aten.repeat_interleave.Tensor, _i(0, 1)) == (
            "its repeats makes 1 elements (8 bytes), over the limit of 4 bytes (raise it with "
            "AOTPIPE_MAX_TENSOR_BYTES)")


def test_repeat_interleave_reads_no_value_of_empty_repeats():
    r = torch.empty(0, dtype=torch.int64, device="meta")  # a tensor with no values to read
    form = checked.CheckedOp(aten.repeat_interleave.Tensor, checked.CHECKS[aten.repeat_interleave.Tensor], WHERE)
    got, want = form(r, output_size=0), aten.repeat_interleave.Tensor(r, output_size=0)
    assert got.device == want.device and got.shape == want.shape == (0,) and got.dtype == want.dtype


def test_repeat_interleave_repeats_of_zero_run_and_of_minus_one_are_refused():
    runs(aten.repeat_interleave.Tensor, _i(0, 2, 0, 1))
    assert refused(aten.repeat_interleave.Tensor, _i(0, 2, -1, 1)) == "repeats holds a negative count"


@pytest.mark.parametrize("repeats", [None, _r(2)], ids=["none", "floats"])
def test_repeat_interleave_repeats_that_are_not_integers_are_refused(repeats):
    assert refused(aten.repeat_interleave.Tensor, repeats) == "repeats is not an integer tensor"


# ---------------------------------------------------------------------------------------
# solvers: pivots and shapes their LAPACK routines trust

LDL = aten.linalg_ldl_solve.default


def _ld(n, batch=()):
    m = _r(*batch, n, n)
    return aten.linalg_ldl_factor_ex.default(m + m.mT + 2 * n * torch.eye(n))[0]


@pytest.mark.parametrize("pivots", [
    [1, 2, 3, 4, 5],  # all 1x1
    [1, -4, -4, 4, 5],  # a 2x2 block after a 1x1
    [-2, -2, 3, -5, -5],  # a 2x2 block at each end
    [-3, -3, -5, -5, 5],
], ids=str)
def test_ldl_solve_pivots_as_its_factor_gives_them_run(pivots):
    runs(LDL, _ld(5), _i(*pivots, dtype=torch.int32), _r(5, 2))


def test_ldl_solve_batched_pivots_each_row_checked():
    runs(LDL, _ld(3, (2,)), _i(1, 2, 3, -2, -2, 3, dtype=torch.int32).reshape(2, 3), _r(2, 3, 2))
    assert refused(LDL, _ld(3, (2,)), _i(1, 2, 3, 1, 2, -3, dtype=torch.int32).reshape(2, 3), _r(2, 3, 2)) == \
        "pivots [1, 2, -3] has a 2x2 block (negative pivots, in equal pairs) cut at row 2, as linalg_ldl_factor " \
        "never gives"


def test_ldl_solve_of_nothing_runs():
    runs(LDL, torch.zeros(0, 0), torch.zeros(0, dtype=torch.int32), _r(0, 2))


@pytest.mark.parametrize("pivots,k", [
    ([1, 2, 3, 4, -5], 4),  # a block begun at the last row
    ([1, -4, 3, 4, 5], 1),  # a negative pivot alone
    ([1, -4, -3, 4, 5], 1),  # a pair unequal
    ([-2, -2, 3, -5, 5], 3),
    ([0, 2, 3, 4, 5], 0), ([0, 0, 3, 4, 5], 0),  # 0 is no pivot (LAPACK's count from 1)
    ([1, -2, -2, -2, 5], 3),
], ids=str)
def test_ldl_solve_pivots_with_a_block_cut_are_refused(pivots, k):
    assert refused(LDL, _ld(5), _i(*pivots, dtype=torch.int32), _r(5, 2)) == \
        f"pivots {pivots} has a 2x2 block (negative pivots, in equal pairs) cut at row {k}, as linalg_ldl_factor " \
        "never gives"


def test_ldl_solve_a_long_row_of_pivots_is_shown_by_its_first_eight():
    pivots = list(range(1, 10)) + [-10]
    assert refused(LDL, _ld(10), _i(*pivots, dtype=torch.int32), _r(10, 1)) == \
        "pivots [1, 2, 3, 4, 5, 6, 7, 8] has a 2x2 block (negative pivots, in equal pairs) cut at row 9, as " \
        "linalg_ldl_factor never gives"


@pytest.mark.parametrize("pivots", [None, torch.tensor(1, dtype=torch.int32), torch.ones(3)],
                         ids=["none", "0-d", "floats"])
def test_ldl_solve_pivots_that_are_not_an_integer_tensor_are_refused(pivots):
    assert refused(LDL, _ld(3), pivots, _r(3, 1)) == "pivots is not an integer tensor"


CHOLESKY = aten._cholesky_solve_helper.default


def _cholesky(batch, n=3):
    m = _r(*batch, n, n)
    return torch.linalg.cholesky(m @ m.mT + n * torch.eye(n))


@pytest.mark.parametrize("batch", [(), (2,), (2, 1)], ids=str)
def test_cholesky_solve_helper_of_a_square_a_and_self_of_its_rows_runs(batch):
    runs(CHOLESKY, _r(*batch, 3, 2), _cholesky(batch), False)


@pytest.mark.parametrize("b,a", [
    ([2, 4, 2], [2, 3, 4]),  # A not square, self of its columns
    ([2, 3, 2], [2, 3, 4]),  # A not square, self of its rows
    ([2, 4, 2], [2, 3, 3]), ([2, 2, 2], [2, 3, 3]),  # self of a row more or fewer
    ([1, 3, 2], [2, 3, 3]), ([3, 2], [2, 3, 3]),  # batches differ
], ids=str)
def test_cholesky_solve_helper_shapes_cholesky_solve_does_not_give_are_refused(b, a):
    assert refused(CHOLESKY, _r(*b), _r(*a), False) == (
        f"self has shape {b} for A of shape {a} (A square, self of its rows, batch dimensions broadcast)")


@pytest.mark.parametrize("b,a", [(None, [3, 3]), ([3, 1], None), ([3], [3, 3]), ([3, 1], [3])], ids=str)
def test_cholesky_solve_helper_self_or_a_not_a_matrix_is_refused(b, a):
    args = [None if s is None else _r(*s) for s in (b, a)]
    assert refused(CHOLESKY, *args, False) == "self or A is not a batch of matrices"


def test_lu_unpack_pivots_one_per_row_or_column_run():
    for shape in ([4, 3], [2, 3, 4], [3, 3]):
        runs(aten.lu_unpack.default, *torch.linalg.lu_factor(_r(*shape)))


@pytest.mark.parametrize("pivots", [[3], [2, 2], [2, 4], [1, 2, 3]], ids=str)
def test_lu_unpack_pivots_of_another_shape_are_refused(pivots):
    assert refused(aten.lu_unpack.default, _r(2, 3, 4), torch.ones(pivots, dtype=torch.int32)) == \
        f"LU_pivots has shape {pivots} where LU_data [2, 3, 4] needs [2, 3]"


@pytest.mark.parametrize("lu,pivots", [(None, [4]), ([4, 4], None), ([4], [4])], ids=str)
def test_lu_unpack_lu_not_matrices_or_pivots_not_a_tensor_is_refused(lu, pivots):
    args = [None if lu is None else _r(*lu), None if pivots is None else torch.ones(pivots, dtype=torch.int32)]
    assert refused(aten.lu_unpack.default, *args) == "LU_data is not a batch of matrices or LU_pivots is not a tensor"
