"""The checked forms' bounds, each at the value just inside (the kernel runs, and gives what it
gives unchecked) and just outside (one line, the kernel never reached): index ranges, lengths,
sizes a value decides against the per-tensor limit, a view's reach at run time, an allocation
against its share; and the twin module that puts the checked forms in place. In-process."""

import pytest
import torch
import torch.fx

from aotpipe.artifact import checked
from aotpipe.errors import ArtifactError
from aotpipe.format import limits
from tests.helpers.checked_args import WHERE, _i, _r

aten = torch.ops.aten




@pytest.fixture()
def reached(monkeypatch):
    """The kernels the checked forms called (none run: each call is recorded instead)."""
    calls = []
    monkeypatch.setattr(checked, "call_kernel", lambda op, args, kwargs: calls.append(op) or "ran")
    return calls


def run(op, *args, **kwargs):
    return checked.CheckedOp(op, checked.CHECKS[op], WHERE)(*args, **kwargs)


def refused(op, *args, **kwargs):
    with pytest.raises(ArtifactError) as e:
        run(op, *args, **kwargs)
    text = str(e.value)
    prefix, suffix = f"{WHERE} ({op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}): ", \
        "; the kernel was not run"
    assert text.startswith(prefix) and text.endswith(suffix), text
    return text[len(prefix):-len(suffix)]


def test_a_checked_form_is_named_for_its_op_and_returns_the_kernels_result():
    form = checked.CheckedOp(aten.bincount.default, checked.CHECKS[aten.bincount.default], WHERE)
    assert form.__name__ == form.__qualname__ == "checked_bincount_default" and form.__module__ == checked.__name__
    assert form.checked_op is aten.bincount.default and form.where == WHERE
    assert torch.equal(form(_i(0, 2, 2)), torch.tensor([1, 0, 2]))
    assert torch.equal(form(_i(0, 2), minlength=4), torch.tensor([1, 0, 1, 0]))


def test_arguments_are_bound_by_name_position_and_default():
    bound = checked._bind(aten.bincount.default, (_i(1),), {"minlength": 3})
    assert set(bound) == {"self", "weights", "minlength"} and bound["minlength"] == 3 and bound["weights"] is None
    assert checked._bind(aten.bincount.default, (_i(1),), {})["minlength"] == 0
    assert checked._bind(aten.add.Tensor, (_i(1),), {})["other"] is None  # missing, no default


# ---------------------------------------------------------------------------------------
# index ranges: the last index in range runs, the first one out of it is refused


def _pool(index):
    return (_r(1, 1, 2, 2), _r(1, 1, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False,
            torch.full((1, 1, 2, 2), index, dtype=torch.int64))


@pytest.mark.parametrize("index", [0, 15])
def test_pool_backward_indices_within_the_plane_run(reached, index):
    assert run(aten.max_pool2d_with_indices_backward.default, *_pool(index)) == "ran"


@pytest.mark.parametrize("index", [-1, 16])
def test_pool_backward_indices_just_outside_the_plane_are_refused(reached, index):
    assert refused(aten.max_pool2d_with_indices_backward.default, *_pool(index)) == \
        f"indices holds {index}, outside [0, 16)"
    assert not reached


def test_pool_backward_indices_must_be_integers_dense_and_of_grad_outputs_shape(reached):
    args = list(_pool(0))
    args[-1] = torch.zeros(1, 1, 2, 2)
    assert refused(aten.max_pool2d_with_indices_backward.default, *args) == "indices is not an integer tensor"
    args[-1] = torch.zeros(1, dtype=torch.int64).expand(1, 1, 2, 2)
    assert refused(aten.max_pool2d_with_indices_backward.default, *args) == (
        "indices is not dense (sizes [1, 1, 2, 2], strides [0, 0, 0, 0]) where the kernel reads it so")
    args[-1] = torch.zeros(1, 2, 2, 1, dtype=torch.int64).permute(0, 3, 1, 2)  # channels last: dense
    assert run(aten.max_pool2d_with_indices_backward.default, *args) == "ran"
    args[0] = _r(2, 1, 2, 2)
    assert refused(aten.max_pool2d_with_indices_backward.default, *args) == (
        "grad_output has shape [2, 1, 2, 2] for an input of shape [1, 1, 4, 4]")
    assert refused(aten.max_pool2d_with_indices_backward.default, _r(1, 1, 2, 2), _r(4), [2, 2], [2, 2], [0, 0],
                   [1, 1], False, _i(0)) == "its tensors do not have the dimensions of a pooling"
    assert reached == [aten.max_pool2d_with_indices_backward.default]  # the channels-last call only


@pytest.mark.parametrize("index,ok", [(0, True), (9, True), (10, False), (-1, False)])
def test_embedding_backward_indices_within_num_weights_run(reached, index, ok):
    args = (_r(2, 4), _i(0, index), 10, -1, False)
    if ok:
        assert run(aten.embedding_dense_backward.default, *args) == "ran"
    else:
        assert refused(aten.embedding_dense_backward.default, *args) == \
            f"indices (num_weights 10) holds {index}, outside [0, 10)"


def test_an_empty_index_tensor_holds_nothing_out_of_range(reached):
    assert run(aten.embedding_dense_backward.default, _r(0, 4), _i(), 10, -1, False) == "ran"


@pytest.mark.parametrize("offsets,why", [
    (_i(0, 3), None),  # the last offset may equal the count of indices (an empty last bag)
    (_i(0, 4), "offsets holds 4, outside [0, 4)"),
    (_i(2, 1), "offsets decrease"),
    (_i(1, 1), None),
])
def test_embedding_bag_offsets_within_the_indices_run(reached, offsets, why):
    args = (_r(10, 4), _i(0, 1, 9), offsets)
    if why is None:
        assert run(aten._embedding_bag.default, *args) == "ran"
    else:
        assert refused(aten._embedding_bag.default, *args) == why


def test_embedding_bag_weight_and_indices(reached):
    assert refused(aten._embedding_bag.default, _r(10), _i(0), _i(0)) == "weight is not a [num_weights, dim] tensor"
    assert refused(aten._embedding_bag.default, _r(10, 4), _i(10), _i(0)) == \
        "indices (num_weights 10) holds 10, outside [0, 10)"
    assert refused(aten._embedding_bag.default, _r(10, 4), _i(0, 1, 2, 3)[::2], _i(0)) == \
        "indices is not dense (sizes [2], strides [2]) where the kernel reads it so"
    assert refused(aten._embedding_bag.default, _r(10, 4), _i(0, 1), _i(0), False, 0, False, _r(3)) == \
        "per_sample_weights has 3 elements where the input needs 2"
    assert run(aten._embedding_bag.default, _r(10, 4), _i(0, 1), _i(0), False, 0, False, _r(2)) == "ran"


# ---------------------------------------------------------------------------------------
# lengths and shapes


@pytest.mark.parametrize("n,ok", [(4, True), (3, False), (5, False)])
def test_layer_norm_backward_statistics_one_per_row(reached, n, ok):
    args = (_r(4, 8), _r(4, 8), [8], _r(n, 1), _r(4, 1), _r(8), _r(8), [True] * 3)
    if ok:
        assert run(aten.native_layer_norm_backward.default, *args) == "ran"
    else:
        assert refused(aten.native_layer_norm_backward.default, *args) == \
            f"mean has {n} elements where the input needs 4"


@pytest.mark.parametrize("shape,why", [
    ([8], None), ([4, 8], None),
    ([], "normalized_shape [] does not end input's shape [4, 8]"),
    ([2, 4, 8], "normalized_shape [2, 4, 8] does not end input's shape [4, 8]"),
    ([4], "normalized_shape [4] does not end input's shape [4, 8]"),
])
def test_layer_norm_normalized_shape_must_end_the_inputs(reached, shape, why):
    n = 1
    for s in shape:
        n *= s
    args = (_r(4, 8), shape, _r(max(n, 1)), None, 1e-5)
    if why is None:
        assert run(aten.native_layer_norm.default, *args) == "ran"
    else:
        assert refused(aten.native_layer_norm.default, *args) == why


def test_batch_norm_statistics_one_per_channel(reached):
    op = aten._native_batch_norm_legit_no_training.default
    assert run(op, _r(2, 3, 4), _r(3), _r(3), _r(3), _r(3), 0.1, 1e-5) == "ran"
    assert refused(op, _r(2, 3, 4), _r(3), _r(3), _r(3), _r(4), 0.1, 1e-5) == \
        "running_var has 4 elements where the input needs 3"
    assert refused(op, _r(3), _r(3), _r(3), _r(3), _r(3), 0.1, 1e-5) == "input has fewer than 2 dimensions"
    assert refused(aten.native_batch_norm_backward.default, _r(2, 3, 5), _r(2, 3, 4), _r(3), None, None, _r(3),
                   _r(3), True, 1e-5, [True] * 3) == "grad_out has shape [2, 3, 5], input [2, 3, 4]"


@pytest.mark.parametrize("group,why", [(2, None), (4, None), (3, "group=3 does not divide C=4"),
                                       (0, "group=0 does not divide C=4")])
def test_group_norm_groups_must_divide_the_channels(reached, group, why):
    args = (_r(2, 4, 3), _r(4), _r(4), 2, 4, 3, group, 1e-5)
    if why is None:
        assert run(aten.native_group_norm.default, *args) == "ran"
    else:
        assert refused(aten.native_group_norm.default, *args) == why


def test_group_norm_geometry_must_describe_the_input(reached):
    assert refused(aten.native_group_norm.default, _r(2, 4, 3), _r(4), _r(4), 2, 4, 4, 2, 1e-5) == \
        "N=2, C=4, HxW=4 do not describe an input of shape [2, 4, 3]"
    assert refused(aten.native_group_norm.default, _r(2, 4, 3), _r(3), _r(4), 2, 4, 3, 2, 1e-5) == \
        "weight has 3 elements where the input needs 4"


# ---------------------------------------------------------------------------------------
# sizes a value decides, against the per-tensor limit


@pytest.mark.parametrize("top,ok", [(9, True), (10, False)])
def test_bincount_up_to_the_per_tensor_limit_runs(reached, top, ok):
    with limits.override(max_tensor_bytes=80):  # 10 int64 counts
        if ok:
            assert run(aten.bincount.default, _i(0, top)) == "ran"
        else:
            assert refused(aten.bincount.default, _i(0, top)) == (
                "its values makes 11 elements (88 bytes), over the limit of 80 bytes (raise it with "
                "AOTPIPE_MAX_TENSOR_BYTES)")


def test_bincount_minlength_counts_against_the_limit_too(reached):
    with limits.override(max_bytes=80):
        assert run(aten.bincount.default, _i(), None, 10) == "ran"
        assert refused(aten.bincount.default, _i(1), None, 11) == (
            "its values makes 11 elements (88 bytes), over the limit of 80 bytes (raise it with AOTPIPE_MAX_BYTES "
            "or --max-bytes)")
        assert refused(aten.bincount.default, _r(2)) == "self is not an integer tensor"


@pytest.mark.parametrize("repeats,given,why", [
    (_i(5, 5), None, None), (_i(5, 5), 10, None),
    (_i(5, 6), None, "its repeats makes 11 elements (88 bytes), over the limit of 80 bytes (raise it with "
                     "AOTPIPE_MAX_TENSOR_BYTES)"),
    (_i(5, -1), None, "repeats holds a negative count"),
    (_i(2, 3), 4, "output_size 4 differs from the repeats' sum 5"),
    (_i(), None, None),
])
def test_repeat_interleave_up_to_the_per_tensor_limit_runs(reached, repeats, given, why):
    with limits.override(max_tensor_bytes=80):
        if why is None:
            assert run(aten.repeat_interleave.Tensor, repeats, output_size=given) == "ran"
        else:
            assert refused(aten.repeat_interleave.Tensor, repeats, output_size=given) == why


@pytest.mark.parametrize("dims,norm,why", [
    ([0, 1], 0, None), ([1], 2, None),
    ([2], 0, "dim [2] names a dimension self (2-d) does not have (0 to 1)"),
    ([-1], 0, "dim [-1] names a dimension self (2-d) does not have (0 to 1)"),
    ([1, 1], 0, "dim [1, 1] names a dimension twice"),
    ([], 0, "dim is not a list of dimensions"),
    ([1], 3, "normalization 3 is not 0, 1 or 2"),
    ([1], -1, "normalization -1 is not 0, 1 or 2"),
])
def test_fft_dims_and_normalization_the_kernels_switch_on(reached, dims, norm, why):
    args = (_r(4, 8).to(torch.cfloat), dims, norm, False)
    if why is None:
        assert run(aten._fft_c2c.default, *args) == "ran"
    else:
        assert refused(aten._fft_c2c.default, *args) == why


@pytest.mark.parametrize("last,why", [
    (1, None), (10, None),  # 4 rows of 10 at the input's element size (8: complex64)
    (0, "last_dim_size 0 is not a positive size"),
    (11, "last_dim_size makes 44 elements (352 bytes), over the limit of 320 bytes (raise it with "
         "AOTPIPE_MAX_TENSOR_BYTES)"),
])
def test_fft_c2r_output_size_up_to_the_limit_runs(reached, last, why):
    with limits.override(max_tensor_bytes=320):
        args = (_r(4, 5).to(torch.cfloat), [1], 2, last)
        if why is None:
            assert run(aten._fft_c2r.default, *args) == "ran"
        else:
            assert refused(aten._fft_c2r.default, *args) == why


@pytest.mark.parametrize("interp,pad,why", [
    (0, 0, None), (2, 2, None),
    (3, 0, "interpolation_mode 3 is not 0, 1 or 2 (bilinear, nearest, bicubic)"),
    (-1, 0, "interpolation_mode -1 is not 0, 1 or 2 (bilinear, nearest, bicubic)"),
    (0, 3, "padding_mode 3 is not 0, 1 or 2 (zeros, border, reflection)"),
])
def test_grid_sampler_modes_the_kernels_switch_on(reached, interp, pad, why):
    args = (_r(1, 2, 4, 4), _r(1, 3, 3, 2), interp, pad, False)
    if why is None:
        assert run(aten.grid_sampler_2d.default, *args) == "ran"
    else:
        assert refused(aten.grid_sampler_2d.default, *args) == why


def test_segment_reduce_lengths_must_add_up_to_the_axis(reached):
    assert run(aten.segment_reduce.default, _r(6), "sum", lengths=_i(2, 4)) == "ran"
    assert refused(aten.segment_reduce.default, _r(6), "sum", lengths=_i(2, 5)) == \
        "lengths add up to 7, the data has 6 along the axis"
    assert refused(aten.segment_reduce.default, _r(6), "sum", lengths=_i(7, -1)) == "lengths holds a negative length"
    assert run(aten.segment_reduce.default, _r(6), "sum", offsets=_i(0, 2, 6)) == "ran"
    assert refused(aten.segment_reduce.default, _r(6), "sum", offsets=_i(0, 2, 7)) == "offsets holds 7, outside [0, 7)"
    assert refused(aten.segment_reduce.default, _r(6), "sum", offsets=_i(0, 4, 2, 6)) == "offsets decrease"
    assert refused(aten.segment_reduce.default, _r(6), "sum", offsets=_i(1, 6)) == "offsets do not run from 0 to 6"
    assert refused(aten.segment_reduce.default, _r(6), "sum", offsets=_i(0, 5)) == "offsets do not run from 0 to 6"
    assert refused(aten.segment_reduce.default, _r(6), "sum") == "neither lengths nor offsets is given"
    assert refused(aten.segment_reduce.default, _r(6), "sum", lengths=_i(6), axis=1) == \
        "axis is not a dimension of data"


# ---------------------------------------------------------------------------------------
# views and allocations whose size only the run decides


def test_reach_counts_the_storage_offset_and_strides_in_bytes():
    x = torch.zeros(16)
    assert checked.reach_bytes(x) == 64 and checked.reach_bytes(x[8:]) == 64 and checked.reach_bytes(x[3:5]) == 20
    assert checked.reach_bytes(x.as_strided([2, 2], [4, 1], 1)) == 4 * (1 + 4 + 1 + 1)
    assert checked.reach_bytes(x.as_strided([0, 2], [4, 1], 15)) == 0


def _view(op=aten.as_strided.default):
    return checked.ViewCheckedAtRun(op, WHERE)


def test_a_view_at_run_that_ends_at_its_storages_end_is_made():
    x = torch.arange(16.0)
    assert torch.equal(_view()(x, [4], [1], 12), x[12:])
    assert torch.equal(_view()(x[8:], [8], [1]), x[8:])


@pytest.mark.parametrize("args,shown", [
    (([4], [1], 13), "sizes [4], strides [1], storage offset 13) that reaches byte 68"),
    (([4, 4], [5, 1], 0), "sizes [4, 4], strides [5, 1], storage offset 0) that reaches byte 76"),
])
def test_a_view_at_run_one_element_past_its_storage_is_refused_before_its_kernel(monkeypatch, args, shown):
    view = _view()
    view.inner = lambda *a, **k: pytest.fail("the view was made")
    with pytest.raises(ArtifactError) as e:
        view(torch.zeros(16), *args)
    assert str(e.value) == f"{WHERE} (aten.as_strided.default): gives a view ({shown} of a storage of 64 bytes; " \
                           "the kernel was not run"


def test_a_view_at_run_of_an_inputs_offset_one_element_past_its_storage_is_refused():
    with pytest.raises(ArtifactError, match=r"storage offset 9\) that reaches byte 68 of a storage of 64 bytes"):
        _view()(torch.zeros(16)[9:], [8], [1])


def test_a_checked_view_wraps_a_checked_form_as_its_op():
    form = checked.CheckedOp(aten.as_strided.default, lambda a: None, "w")
    view = checked.ViewCheckedAtRun(form, WHERE)
    assert view.checked_op is aten.as_strided.default and view.inner is form
    assert view.__name__ == "run_checked_as_strided_default" and view.__module__ == checked.__name__


def _alloc(limit, expected=None, op=aten.arange.start_step):
    return checked.AllocationCheckedAtRun(op, limit, WHERE, expected)


def test_an_allocation_at_run_of_exactly_its_share_is_made():
    assert torch.equal(_alloc(40)(0, 10, 1, dtype=torch.float32), torch.arange(10.0))
    assert torch.equal(_alloc(None)(0, 10**3, 1, dtype=torch.float32), torch.arange(1000.0))  # no share: no bound


def test_an_allocation_at_run_one_element_over_its_share_is_refused_before_its_kernel():
    alloc = _alloc(40)
    alloc.inner = lambda *a, **k: pytest.fail("the tensor was made")
    with pytest.raises(ArtifactError) as e:
        alloc(0, 11, 1, dtype=torch.float32)
    assert str(e.value) == (f"{WHERE} (aten.arange.start_step): makes float32[11] (44 bytes) from values read while "
                            "the graph runs, over the 40 bytes the graph leaves it under the byte limit (raise it with "
                            "AOTPIPE_MAX_BYTES or --max-bytes); the kernel was not run")


def test_an_allocation_counts_only_the_storages_it_makes():
    x = torch.zeros(100)  # 400 bytes, the input's: not counted
    assert torch.equal(_alloc(16, op=aten.add.Tensor)(x[:4], 1.0), torch.ones(4))
    with pytest.raises(ArtifactError, match="makes float32\\[5\\] \\(20 bytes\\)"):
        _alloc(16, op=aten.add.Tensor)(x[:5], 1.0)
    assert torch.equal(_alloc(0, op=aten.add_.Tensor)(torch.zeros(4), 1.0), torch.ones(4))  # in place: nothing new


@pytest.mark.parametrize("expected,ok", [
    ((("float32", (2, None)),), True), ((("float32", (None, None)),), True), ((("float32", (2, 12)),), True),
    ((("float32", (2, 13)),), False), ((("float32", (3, None)),), False), ((("float64", (2, None)),), False),
    ((("float32", (2,)),), False), ((("float32", (2, None)), ("float32", (2, None))), False),
])
def test_outputs_the_precheck_assumed_must_be_the_runs(expected, ok):
    pad = _alloc(None, expected, op=aten.constant_pad_nd.default)
    if ok:
        assert pad(torch.zeros(2, 8), [0, 4]).shape == (2, 12)
        return
    pad.inner = lambda *a, **k: pytest.fail("the kernel ran")
    with pytest.raises(ArtifactError) as e:
        pad(torch.zeros(2, 8), [0, 4])
    assert str(e.value) == (f"{WHERE} (aten.constant_pad_nd.default): gives float32[2, 12] where the check before the "
                            f"run assumed {checked._shown(expected)}; the kernel was not run")


def test_the_outputs_assumed_are_shown_as_dtype_and_sizes():
    assert checked._shown((("float32", (2, None)), ("int64", ()))) == "float32[2, ?], int64[]"
    assert checked.expected_outputs((torch.zeros(2, 3), 4, [torch.zeros(1, dtype=torch.int64)])) == \
        (("float32", (2, 3)), ("int64", (1,)))


def test_an_op_sized_by_its_data_runs_as_is():
    nz = _alloc(1, op=aten.nonzero.default)  # its size: at most its input's, which passed its own check
    assert torch.equal(nz(torch.tensor([0.0, 1.0, 1.0])), torch.tensor([[1], [2]]))


def test_ops_whose_outputs_are_their_inputs_memory_alias_them():
    assert checked.aliases_inputs(aten.view.default) and checked.aliases_inputs(aten.add_.Tensor)
    assert checked.aliases_inputs(aten.as_strided.default)
    assert not checked.aliases_inputs(aten.add.Tensor) and checked.aliases_inputs(aten.split.Tensor) is not None
    assert not checked.aliases_inputs(operator_getitem())
    assert not checked.aliases_inputs(aten._assert_async.msg)  # returns nothing


def operator_getitem():
    import operator

    return operator.getitem


# ---------------------------------------------------------------------------------------
# the twin module a run uses


def _graph(*targets, meta=None):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    out = x
    for i, (target, args) in enumerate(targets):
        out = g.create_node("call_function", target, (out, *args), {}, name=f"n{i}")
    g.output(out)
    root = torch.nn.Module()
    root.register_buffer("w", torch.zeros(3))
    gm = torch.fx.GraphModule(root, g)
    gm.meta.update(meta or {})
    return gm


def test_a_graph_with_no_op_to_check_runs_as_it_is():
    gm = _graph((aten.neg.default, ()))
    assert checked.checked_twin(gm, "m/graph.json") is gm


def test_the_twin_puts_each_checked_op_in_its_checked_form_and_keeps_the_modules_own():
    gm = _graph((aten.neg.default, ()), (aten.bincount.default, ()), meta={"k": 1})
    twin = checked.checked_twin(gm, "m/graph.json")
    assert twin is not gm and twin.meta["k"] == 1
    n0, n1 = [n for n in twin.graph.nodes if n.op == "call_function"]
    assert n0.target is aten.neg.default and isinstance(n1.target, checked.CheckedOp)
    assert n1.target.where == "m/graph.json: node 'n1'"
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [aten.neg.default, aten.bincount.default]
    assert checked.checked_twin(gm, "m/graph.json") is twin  # made once
    assert torch.equal(twin(_i(-1, -3)), torch.tensor([0, 1, 0, 1]))


def test_the_twin_checks_at_run_the_views_and_allocations_the_precheck_named():
    gm = _graph((aten.neg.default, ()), (aten.view.default, ([-1],)),
                meta={checked.RUN_CHECKED_VIEWS: {"n1"}, checked.RUN_CHECKED_ALLOCS: {"n0": 64}})
    twin = checked.checked_twin(gm, "m/graph.json")
    n0, n1 = [n.target for n in twin.graph.nodes if n.op == "call_function"]
    assert isinstance(n0, checked.AllocationCheckedAtRun) and n0.limit == 64 and n0.expected is None
    assert isinstance(n1, checked.ViewCheckedAtRun) and n1.where == "m/graph.json: node 'n1'"
    assert torch.equal(twin(torch.ones(2, 2)), -torch.ones(4))
    with pytest.raises(ArtifactError, match="node 'n0' \\(aten.neg.default\\): makes float32\\[17\\] \\(68 bytes\\)"):
        twin(torch.ones(17))


def test_the_twin_holds_outputs_the_precheck_assumed():
    expected = (("float32", (3,)),)
    gm = _graph((aten.neg.default, ()), meta={checked.RUN_CHECKED_OUTPUTS: {"n0": expected}})
    twin = checked.checked_twin(gm, "m/graph.json")
    (n0,) = [n.target for n in twin.graph.nodes if n.op == "call_function"]
    assert isinstance(n0, checked.AllocationCheckedAtRun) and n0.limit is None and n0.expected == expected
    with pytest.raises(ArtifactError, match="gives float32\\[4\\] where the check before the run assumed float32\\[3\\]"):
        twin(torch.ones(4))


def test_a_new_finding_of_the_precheck_makes_a_new_twin():
    gm = _graph((aten.neg.default, ()), (aten.view.default, ([-1],)))
    first = checked.checked_twin(gm, "m/graph.json")
    assert first is gm
    gm.meta[checked.RUN_CHECKED_VIEWS] = {"n1"}
    second = checked.checked_twin(gm, "m/graph.json")
    assert second is not gm and isinstance([n for n in second.graph.nodes if n.name == "n1"][0].target,
                                           checked.ViewCheckedAtRun)
    gm.meta[checked.RUN_CHECKED_ALLOCS] = {"n0": 8}
    third = checked.checked_twin(gm, "m/graph.json")
    assert third is not second and checked.checked_twin(gm, "m/graph.json") is third


# ---------------------------------------------------------------------------------------
# collectives: the group must be one this process set up, of the size the node says


C10D = torch.ops._c10d_functional


def test_a_collective_in_a_process_without_a_process_group_says_it_needs_its_peers(reached):
    import torch.distributed as dist  # the process-group state these tests set up and tear down

    assert not dist.is_initialized()
    why = refused(C10D.all_reduce.default, torch.ones(2), "sum", "0")
    assert why == ("it calls process group '0' and this process has none: a distributed rank's graph runs with "
                   "its peer ranks (aotpipe replay ART --ranks)")
    assert reached == []


@pytest.fixture()
def world(monkeypatch):
    """This process as rank 0 of a world of 2 on torch's fake process group (its group '0')."""
    import torch.distributed as dist  # the process-group state these tests set up and tear down
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the fake backend

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def test_a_collective_on_a_group_of_the_size_it_says_reaches_the_kernel(world, reached):
    x = torch.ones(4, 3)
    assert run(C10D.all_reduce.default, x, "sum", world) == "ran"
    assert run(C10D.all_gather_into_tensor.default, x, 2, world) == "ran"
    assert run(C10D.reduce_scatter_tensor.default, x, "sum", 2, world) == "ran"
    assert len(reached) == 3


def test_a_collective_on_a_group_this_process_has_not_is_refused(world, reached):
    why = refused(C10D.all_reduce.default, torch.ones(2), "sum", "99")
    assert why == "process group '99' is not one this process set up (the ranks' mesh differs from the capture's)"
    assert reached == []


@pytest.mark.parametrize("size", [1, 3, 1 << 40])
def test_a_group_size_other_than_the_groups_is_refused(world, reached, size):
    for op, args in ((C10D.all_gather_into_tensor.default, (torch.ones(4, 3), size, world)),
                     (C10D.reduce_scatter_tensor.default, (torch.ones(4, 3), "sum", size, world))):
        assert refused(op, *args) == f"group_size {size} where process group {world!r} has 2 ranks"
    assert reached == []


@pytest.mark.parametrize("rows, ok", [(4, True), (2, True), (3, False), (0, True)])
def test_a_reduce_scatter_input_must_split_into_the_groups_parts(world, reached, rows, ok):
    x = torch.ones(rows, 3)
    if ok:
        assert run(C10D.reduce_scatter_tensor.default, x, "sum", 2, world) == "ran"
    else:
        assert refused(C10D.reduce_scatter_tensor.default, x, "sum", 2, world) == \
            f"input torch.float32 [{rows}, 3] does not split into 2 equal parts on its first dimension"
    zero_dim = refused(C10D.reduce_scatter_tensor.default, torch.tensor(1.0), "sum", 2, world)
    assert zero_dim.endswith("does not split into 2 equal parts on its first dimension")
