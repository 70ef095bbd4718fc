"""The precheck's bounds, each pinned at the value just inside and just outside it: a view's
reach (storage offset included) against its storage, a tensor against the per-tensor limit,
the peak of live bytes (inputs, constants, intermediates, outputs) against max_bytes, and the
share a tensor sized by values gets of the room left. Small graphs built in-process, checked
on their inputs directly (no artefact, no capture): fast enough to run against every mutant."""

import pytest
import torch
import torch.fx

from aotpipe.artifact import precheck
from aotpipe.errors import ArtifactError, LimitError
from aotpipe.format import limits

aten = torch.ops.aten
WHERE = "m/g/graph.json"
REFUSED = "; refused before running the graph"


class Graph:
    """A graph of named nodes over placeholders `inputs` and the constants `consts`."""

    def __init__(self, *inputs, **consts):
        self.g = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.inputs = [self.g.placeholder(n) for n in inputs]
        for name, value in consts.items():
            self.root.register_buffer(name, value)

    def const(self, name):
        return self.g.get_attr(name)

    def op(self, name, target, *args, **kwargs):
        return self.g.create_node("call_function", target, args, kwargs, name=name)

    def module(self, *outputs):
        self.g.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        return torch.fx.GraphModule(self.root, self.g)


def check(gm, inputs, max_bytes=1 << 30, max_tensor_bytes=None):
    with limits.override(max_bytes=max_bytes, max_tensor_bytes=max_tensor_bytes):
        precheck.check_graph(gm, inputs, WHERE)
    return gm


def refusal(gm, inputs, error=ArtifactError, **lim):
    with pytest.raises(error) as e:
        check(gm, inputs, **lim)
    assert type(e.value) is error, repr(e.value)
    return str(e.value)


# ---------------------------------------------------------------------------------------
# the peak of live bytes


def _add_const():
    g = Graph("x", w=torch.zeros(16))
    return g.module(g.op("s", aten.add.Tensor, g.inputs[0], g.const("w")))


def test_the_peak_counts_the_input_the_weight_and_the_output_exactly_at_the_limit():
    # x (64 bytes) + w (64) + s (64)
    check(_add_const(), [torch.zeros(16)], max_bytes=192)


def test_a_peak_one_byte_over_the_limit_is_refused_naming_the_node_and_the_fix():
    msg = refusal(_add_const(), [torch.zeros(16)], LimitError, max_bytes=191)
    assert msg == (f"{WHERE}: node 's' (aten.add.Tensor) would hold 192 bytes of tensors alive at once (inputs, "
                   "constants, values still to be used and outputs), over the limit of 191 bytes (raise it with "
                   f"AOTPIPE_MAX_BYTES or --max-bytes){REFUSED}")


def test_the_weights_count_in_the_peak_as_much_as_the_inputs():
    # a weight four times as large as the input: without it the peak would be 128 bytes
    g = Graph("x", w=torch.zeros(4, 16))
    gm = g.module(g.op("s", aten.add.Tensor, g.inputs[0], g.const("w")))  # 4x16 output, broadcast
    check(gm, [torch.zeros(16)], max_bytes=64 + 256 + 256)
    assert "would hold 576 bytes" in refusal(gm, [torch.zeros(16)], LimitError, max_bytes=575)


def test_a_nested_constant_is_read_from_its_submodule():
    g = Graph("x")
    g.root.sub = torch.nn.Module()
    g.root.sub.register_buffer("w", torch.zeros(32))
    gm = g.module(g.op("s", aten.add.Tensor, g.inputs[0], g.const("sub.w")))
    check(gm, [torch.zeros(32)], max_bytes=3 * 128)
    assert "would hold 384 bytes" in refusal(gm, [torch.zeros(32)], LimitError, max_bytes=383)


def test_an_input_counts_its_whole_storage_not_only_the_view_it_is():
    g = Graph("x")
    gm = g.module(g.op("s", aten.neg.default, g.inputs[0]))
    x = torch.zeros(100)[:16]  # 64 bytes seen, 400 held
    check(gm, [x], max_bytes=400 + 64)
    assert "would hold 464 bytes" in refusal(gm, [x], LimitError, max_bytes=463)


def test_inputs_sharing_one_storage_are_counted_once():
    g = Graph("a", "b")
    gm = g.module(g.op("s", aten.add.Tensor, *g.inputs))
    base = torch.zeros(8)
    check(gm, [base, base], max_bytes=32 + 32)  # one storage of 32 bytes, and s
    assert "would hold 96 bytes" in refusal(gm, [base, base.clone()], LimitError, max_bytes=95)


def _chain():
    # x -> a -> b -> c, each 64 bytes: a is dead once b is made
    g = Graph("x")
    a = g.op("a", aten.relu.default, g.inputs[0])
    b = g.op("b", aten.neg.default, a)
    return g.module(g.op("c", aten.neg.default, b))


def test_an_intermediate_is_freed_after_its_last_use():
    check(_chain(), [torch.zeros(16)], max_bytes=192)  # x and two of a, b, c at any time


def test_the_peak_of_a_chain_is_refused_at_the_first_node_that_passes_it():
    msg = refusal(_chain(), [torch.zeros(16)], LimitError, max_bytes=191)
    assert msg.startswith(f"{WHERE}: node 'b' (aten.neg.default) would hold 192 bytes"), msg


def test_a_view_keeps_its_base_alive_after_the_base_node_is_dead():
    g = Graph("x")
    a = g.op("a", aten.relu.default, g.inputs[0])
    v = g.op("v", aten.view.default, a, [4, 4])  # a's last use; v still holds a's storage
    b = g.op("b", aten.neg.default, g.inputs[0])
    gm = g.module(g.op("c", aten.add.Tensor, b, v))
    x = torch.zeros(4, 4)
    check(gm, [x], max_bytes=256)  # x, a's storage (through v), b and c: a view adds no bytes
    assert refusal(gm, [x], LimitError, max_bytes=255).startswith(f"{WHERE}: node 'c' (aten.add.Tensor) would "
                                                                   "hold 256 bytes")


def test_outputs_stay_alive_to_the_end():
    g = Graph("x")
    a = g.op("a", aten.relu.default, g.inputs[0])  # an output: alive to the end
    b = g.op("b", aten.neg.default, g.inputs[0])
    c = g.op("c", aten.neg.default, b)
    gm = g.module(a, g.op("d", aten.neg.default, c))
    check(gm, [torch.zeros(16)], max_bytes=256)  # at d: x, a, c and d (b died at c)
    assert "node 'c' (aten.neg.default) would hold 256 bytes" in refusal(gm, [torch.zeros(16)], LimitError,
                                                                          max_bytes=255)


# ---------------------------------------------------------------------------------------
# one tensor against the per-tensor limit


def _zeros(n):
    g = Graph("x")
    return g.module(g.op("z", aten.zeros.default, [n // 2], dtype=torch.float64))  # n float32s' bytes


def test_a_tensor_of_exactly_the_per_tensor_limit_is_allowed():
    check(_zeros(100), [torch.zeros(1)], max_tensor_bytes=400)


def test_a_tensor_one_element_over_the_per_tensor_limit_is_refused_naming_its_variable():
    msg = refusal(_zeros(102), [torch.zeros(1)], LimitError, max_tensor_bytes=400)
    assert msg == (f"{WHERE}: node 'z' (aten.zeros.default) makes a float64[51] tensor, which needs 408 bytes, "
                   f"over the limit of 400 bytes (raise it with AOTPIPE_MAX_TENSOR_BYTES){REFUSED}")


def test_without_a_per_tensor_limit_max_bytes_bounds_one_tensor_and_says_so():
    check(_zeros(100), [torch.zeros(1)], max_bytes=404)  # z (400) and x (4)
    msg = refusal(_zeros(102), [torch.zeros(1)], LimitError, max_bytes=403)
    assert msg == (f"{WHERE}: node 'z' (aten.zeros.default) makes a float64[51] tensor, which needs 408 bytes, "
                   f"over the limit of 403 bytes (raise it with AOTPIPE_MAX_BYTES or --max-bytes){REFUSED}")


def test_a_tensor_of_many_dimensions_is_described_by_its_first_eight():
    g = Graph("x")
    gm = g.module(g.op("z", aten.zeros.default, [1] * 8 + [200], dtype=torch.float32))
    msg = refusal(gm, [torch.zeros(1)], LimitError, max_tensor_bytes=400)
    assert "makes a float32[1, 1, 1, 1, 1, 1, 1, 1]... tensor, which needs 800 bytes" in msg, msg


# ---------------------------------------------------------------------------------------
# a view's reach, storage offset included


def _as_strided(size, stride, offset=None):
    g = Graph("x")
    args = (g.inputs[0], size, stride) + (() if offset is None else (offset,))
    return g.module(g.op("v", aten.as_strided.default, *args))


def test_an_inputs_own_storage_offset_that_ends_the_view_at_its_storages_end_is_allowed():
    check(_as_strided([8], [1]), [torch.zeros(16)[8:]])  # as_strided keeps x's offset: elements 8..15 of 16


def test_an_inputs_own_storage_offset_one_element_further_is_refused():
    msg = refusal(_as_strided([8], [1]), [torch.zeros(16)[9:]])  # elements 9..16 of 16
    assert msg == (f"{WHERE}: node 'v' (aten.as_strided.default) gives a view (sizes [8], strides [1], storage "
                   f"offset 9) that reaches byte 68 of a storage of 64 bytes{REFUSED}")


def test_a_storage_offset_given_to_the_view_is_held_to_the_storage_just_inside_and_just_outside():
    check(_as_strided([4], [1], 12), [torch.zeros(16)])
    msg = refusal(_as_strided([4], [1], 13), [torch.zeros(16)])
    assert "(sizes [4], strides [1], storage offset 13) that reaches byte 68 of a storage of 64 bytes" in msg


def test_strides_count_in_the_reach():
    check(_as_strided([4, 4], [4, 1], 0), [torch.zeros(16)])
    msg = refusal(_as_strided([4, 4], [5, 1], 0), [torch.zeros(16)])
    assert "(sizes [4, 4], strides [5, 1], storage offset 0) that reaches byte 76 of a storage of 64 bytes" in msg


def test_an_empty_view_reaches_nothing_whatever_its_offset():
    check(_as_strided([0, 4], [4, 1], 1000), [torch.zeros(16)])


def test_a_view_of_a_constant_counts_the_constants_storage_offset():
    def gm():
        g = Graph("x", w=torch.zeros(31)[15:])  # 16 elements from offset 15 of 31
        return g.module(g.op("v", aten.as_strided.default, g.const("w"), [16], [1]))
    check(gm(), [torch.zeros(1)])
    g = Graph("x", w=torch.zeros(31)[15:])
    big = g.module(g.op("v", aten.as_strided.default, g.const("w"), [17], [1]))
    assert "storage offset 15) that reaches byte 128 of a storage of 124 bytes" in refusal(big, [torch.zeros(1)])


def test_a_view_of_an_intermediate_is_held_to_the_storage_the_node_made():
    def gm(n):
        g = Graph("x")
        a = g.op("a", aten.relu.default, g.inputs[0])
        return g.module(g.op("v", aten.as_strided.default, a, [n], [1], 0))
    check(gm(16), [torch.zeros(16)])
    assert "that reaches byte 68 of a storage of 64 bytes" in refusal(gm(17), [torch.zeros(16)])


# ---------------------------------------------------------------------------------------
# a tensor sized by values read while the graph runs: a share of the room left


def _sized_by_value(n_tensors=1, dtype=torch.float32):
    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    outs = [g.op(f"r{i}", aten.arange.start_step, 0, u, 1, dtype=dtype) for i in range(n_tensors)]
    return g.module(*outs)


def test_a_tensor_sized_by_values_gets_the_room_the_peak_leaves():
    gm = check(_sized_by_value(), [torch.tensor(5)], max_bytes=1000)  # n: 8 bytes
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 992}
    assert gm.meta[precheck.RUN_CHECKED_VIEWS] == set()
    assert precheck.data_dependent_outputs(gm) == {0: [0]}


def test_tensors_sized_by_values_share_the_room_left_equally():
    gm = check(_sized_by_value(3), [torch.tensor(5)], max_bytes=1000)
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 330, "r1": 330, "r2": 330}  # 992 // 3


def test_a_share_is_no_more_than_the_per_tensor_limit():
    gm = check(_sized_by_value(2), [torch.tensor(5)], max_bytes=1000, max_tensor_bytes=100)
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 100, "r1": 100}


def test_one_byte_of_room_is_a_share_of_one_byte():
    gm = check(_sized_by_value(), [torch.tensor(5)], max_bytes=9)
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 1}


def test_no_room_left_for_a_tensor_sized_by_values_is_refused_before_the_graph_runs():
    msg = refusal(_sized_by_value(2), [torch.tensor(5)], LimitError, max_bytes=8)
    assert msg == (f"{WHERE}: node 'r0' (aten.arange.start_step) makes a tensor whose size depends on values read "
                   "from tensors while the graph runs, and the graph leaves it no room under the limit of 8 bytes "
                   f"(raise it with AOTPIPE_MAX_BYTES or --max-bytes){REFUSED}")


def test_each_node_keeps_the_smallest_share_any_input_layout_gave():
    gm = _sized_by_value()
    check(gm, [torch.tensor(5)], max_bytes=1000)
    check(gm, [torch.zeros(10, dtype=torch.int64)[3]], max_bytes=1000)  # its storage: 80 bytes
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 920}
    check(gm, [torch.tensor(5)], max_bytes=1000)
    assert gm.meta[precheck.RUN_CHECKED_ALLOCS] == {"r0": 920}


def test_a_view_of_a_tensor_sized_by_values_is_checked_when_it_runs():
    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    r = g.op("r", aten.arange.start_step, 0, u, 1, dtype=torch.float32)
    gm = check(g.module(g.op("s", aten.slice.Tensor, r, 0, 0, 2)), [torch.tensor(5)])
    assert gm.meta[precheck.RUN_CHECKED_VIEWS] == {"s"}
    assert set(gm.meta[precheck.RUN_CHECKED_ALLOCS]) == {"r"}  # the view allocates nothing


def test_a_view_sized_by_values_over_a_known_storage_is_checked_when_it_runs():
    g = Graph("x", "n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[1])
    gm = check(g.module(g.op("v", aten.as_strided.default, g.inputs[0], [u], [1])), [torch.zeros(16), torch.tensor(4)])
    assert gm.meta[precheck.RUN_CHECKED_VIEWS] == {"v"}
    assert precheck.data_dependent_outputs(gm) == {0: [0]}


def test_a_size_read_from_values_is_a_data_dependent_output():
    g = Graph("n")
    gm = check(g.module(g.op("u", aten._local_scalar_dense.default, g.inputs[0]), g.inputs[0]), [torch.tensor(5)])
    assert precheck.data_dependent_outputs(gm) == {0: []}  # an int computed from values; n itself is not
    assert precheck.data_dependent_outputs(torch.nn.Linear(1, 1)) == {}


def _bincount(minlength):
    g = Graph("x")
    return g.module(g.op("b", aten.bincount.default, g.inputs[0], None, minlength))


def test_a_literal_minlength_at_the_per_tensor_limit_is_allowed():
    check(_bincount(125), [torch.tensor([1, 2])], max_tensor_bytes=1000)  # 125 int64s: 1000 bytes


def test_a_literal_minlength_one_element_over_the_per_tensor_limit_is_refused():
    msg = refusal(_bincount(125), [torch.tensor([1, 2])], LimitError, max_tensor_bytes=999)
    assert msg == (f"{WHERE}: node 'b' (aten.bincount.default) makes at least 125 elements of int64, over the limit "
                   f"of 999 bytes (raise it with AOTPIPE_MAX_TENSOR_BYTES){REFUSED}")


def test_a_literal_minlength_over_max_bytes_alone_says_max_bytes_raises_it():
    msg = refusal(_bincount(125), [torch.tensor([1, 2])], LimitError, max_bytes=999)
    assert msg.endswith("makes at least 125 elements of int64, over the limit of 999 bytes (raise it with "
                        f"AOTPIPE_MAX_BYTES or --max-bytes){REFUSED}"), msg


def test_a_size_bounded_by_the_limit_its_checked_form_enforces_is_counted_at_that_bound():
    # bincount's size comes from values; its checked form holds it to the per-tensor limit
    # (1000 bytes: 125 int64s), which the peak then counts: x (16) and b (1000)
    check(_bincount(0), [torch.tensor([1, 2])], max_bytes=1016, max_tensor_bytes=1000)
    assert "would hold 1.02 kB" in refusal(_bincount(0), [torch.tensor([1, 2])], LimitError, max_bytes=1015,
                                            max_tensor_bytes=1000)


# ---------------------------------------------------------------------------------------
# graphs that do not run, or cannot be checked


def test_a_graph_given_the_wrong_number_of_inputs_does_not_run():
    with pytest.raises(precheck.GraphWillNotRun) as e:
        check(_chain(), [torch.zeros(1), torch.zeros(1)])
    assert str(e.value) == f"{WHERE}: the graph takes 1 inputs, given 2"


def test_arguments_torch_rejects_make_a_graph_that_does_not_run():
    g = Graph("a", "b")
    gm = g.module(g.op("mm", aten.mm.default, *g.inputs))
    with pytest.raises(precheck.GraphWillNotRun) as e:
        check(gm, [torch.zeros(2, 3), torch.zeros(4, 5)])
    assert str(e.value).startswith(f"{WHERE}: node 'mm' (aten.mm.default) does not run on these inputs: "
                                   "RuntimeError: a and b must have same reduction dim"), str(e.value)


def test_a_packed_rnn_is_refused_before_its_decomposition_reads_values():
    g = Graph(*[f"x{i}" for i in range(8)])
    xs = g.inputs
    gm = g.module(g.op("lstm", aten.lstm.data, xs[0], xs[1], [xs[2], xs[3]], xs[4:], True, 1, 0.0, False, False))
    r = lambda *s: torch.zeros(*s)  # noqa: E731
    inputs = [r(6, 3), torch.tensor([3, 3]), r(1, 3, 4), r(1, 3, 4), r(16, 3), r(16, 4), r(16), r(16)]
    with pytest.raises(precheck.GraphWillNotRun) as e:
        check(gm, inputs)
    assert str(e.value) == (f"{WHERE}: node 'lstm' (aten.lstm.data) does not run on these inputs: it reads the "
                            "values of batch_sizes as it decomposes, which fake tensors do not have")


def test_a_sparse_input_cannot_be_checked():
    gm = _chain()
    with pytest.raises(ArtifactError) as e:
        check(gm, [torch.zeros(16).to_sparse()])
    assert str(e.value) == f"{WHERE}: an input or constant is not a dense tensor (torch.sparse_coo); it cannot be checked"


def test_a_node_that_makes_a_sparse_tensor_is_refused():
    g = Graph("i", "v")
    gm = g.module(g.op("sp", aten._sparse_coo_tensor_with_dims_and_tensors.default, 2, 0, [4, 4], *g.inputs,
                       layout=torch.sparse_coo))
    msg = refusal(gm, [torch.zeros(2, 3, dtype=torch.int64), torch.zeros(3)])
    assert msg == f"{WHERE}: node 'sp' (aten._sparse_coo_tensor_with_dims_and_tensors.default) makes a " \
                  f"torch.sparse_coo tensor{REFUSED}"


def test_a_method_call_node_cannot_be_checked():
    g = Graph("x")
    gm = g.module(g.g.call_method("neg", (g.inputs[0],)))
    assert refusal(gm, [torch.zeros(4)]) == f"{WHERE}: node 'neg' is a call_method node, which cannot be checked"


def _geqrf(record=None):
    g = Graph("x")
    q = g.op("q", aten.geqrf.default, g.inputs[0])
    if record is not None:
        q.meta["saved_val"] = record
    return g.module(q)


def test_an_op_without_a_fake_kernel_is_refused_in_a_graph_from_elsewhere():
    msg = refusal(_geqrf(), [torch.zeros(3, 3)])
    assert msg == (f"{WHERE}: node 'q' (aten.geqrf.default) has no fake-tensor kernel in this torch, so its arguments "
                   f"cannot be checked without running it{REFUSED}")


GEQRF_RECORD = [{"shape": [3, 3], "stride": [1, 3], "dtype": "float32"}, {"shape": [3], "stride": [1],
                                                                           "dtype": "float32"}]


def test_an_op_without_a_fake_kernel_in_our_own_capture_takes_the_outputs_it_recorded():
    gm = _geqrf(GEQRF_RECORD)
    precheck.mark(gm, WHERE, own_capture=True)
    check(gm, [torch.zeros(3, 3)], max_bytes=36 + 36 + 12)
    assert "would hold 84 bytes" in refusal(gm, [torch.zeros(3, 3)], LimitError, max_bytes=83)


@pytest.mark.parametrize("record", [None, GEQRF_RECORD[:1] + [{"shape": [3], "stride": [1], "dtype": "nonsense"}],
                                    {"shape": [3], "stride": ["1"], "dtype": "float32"}, "float32"])
def test_our_own_capture_with_no_usable_record_is_refused_all_the_same(record):
    gm = _geqrf(record)
    precheck.mark(gm, WHERE, own_capture=True)
    assert "has no fake-tensor kernel in this torch" in refusal(gm, [torch.zeros(3, 3)])


def test_a_recorded_output_is_laid_out_as_recorded():
    gm = _geqrf(GEQRF_RECORD)
    node = next(n for n in gm.graph.nodes if n.name == "q")
    a, tau = precheck._recorded_outputs(node)
    assert (a.shape, a.stride(), a.dtype, tau.shape) == ((3, 3), (1, 3), torch.float32, (3,))
    node.meta["saved_val"] = {"shape": [2], "stride": [1], "dtype": "int64", "device": "meta"}
    one = precheck._recorded_outputs(node)
    assert (one.shape, one.dtype, one.device.type) == ((2,), torch.int64, "meta")


def test_a_run_sized_tensor_whose_bound_is_exactly_the_per_tensor_limit_is_counted_not_deferred():
    # nonzero of 16 elements: at most [16, 1] int64s, 128 bytes, a bound counted in the peak
    def gm():
        g = Graph("x")
        return g.module(g.op("nz", aten.nonzero.default, g.inputs[0]))
    at = check(gm(), [torch.zeros(16)], max_tensor_bytes=128)
    assert "nz" not in at.meta.get(precheck.RUN_CHECKED_ALLOCS, {})
    assert "would hold 192 bytes" in refusal(gm(), [torch.zeros(16)], LimitError, max_bytes=191, max_tensor_bytes=128)
    over = check(gm(), [torch.zeros(16)], max_tensor_bytes=127)  # its bound past the limit: the run's size decides
    assert over.meta[precheck.RUN_CHECKED_ALLOCS] == {"nz": 127}


def _view_by_count(offset):
    # a view of x (16 elements) as long as x's count of nonzeros: at most 16, known only when it runs
    g = Graph("x")
    nz = g.op("nz", aten.nonzero.default, g.inputs[0])
    n = g.op("n", aten.sym_size.int, nz, 0)
    return g.module(g.op("v", aten.as_strided.default, g.inputs[0], [n], [1], offset))


def test_a_view_sized_by_values_whose_bound_fits_its_storage_needs_no_check_at_run():
    assert check(_view_by_count(0), [torch.zeros(16)]).meta[precheck.RUN_CHECKED_VIEWS] == set()


def test_a_view_sized_by_values_whose_bound_passes_its_storage_by_one_element_is_checked_at_run():
    assert check(_view_by_count(1), [torch.zeros(16)]).meta[precheck.RUN_CHECKED_VIEWS] == {"v"}


def test_a_view_of_many_dimensions_past_its_storage_shows_its_first_eight():
    g = Graph("x")
    gm = g.module(g.op("v", aten.as_strided.default, g.inputs[0], [1] * 8 + [17], [1] * 9, 0))
    assert "gives a view (sizes [1, 1, 1, 1, 1, 1, 1, 1], strides [1, 1, 1, 1, 1, 1, 1, 1], storage offset 0) that " \
           "reaches byte 68 of a storage of 64 bytes" in refusal(gm, [torch.zeros(16)])


def test_inputs_keep_their_dtype_and_device_on_the_fake_side():
    g = Graph("a", "b")
    gm = g.module(g.op("s", aten.add.Tensor, *g.inputs))
    check(gm, [torch.zeros(4, device="meta"), torch.zeros(4, device="meta")])
    with pytest.raises(precheck.GraphWillNotRun, match="node 's' \\(aten.add.Tensor\\) does not run on these inputs"):
        check(gm, [torch.zeros(4, device="meta"), torch.zeros(4)])  # as the real kernel: two devices


def test_the_kernels_keyword_arguments_are_propagated():
    g = Graph("x")
    gm = g.module(g.op("z", aten.zeros_like.default, g.inputs[0], dtype=torch.float64))  # 8 bytes, not x's 4
    check(gm, [torch.zeros(4)], max_bytes=48)
    assert "would hold 48 bytes" in refusal(gm, [torch.zeros(4)], LimitError, max_bytes=47)


def test_a_node_in_its_checked_form_is_checked_as_its_op():
    from aotpipe.artifact import checked

    g = Graph("x")
    form = checked.CheckedOp(aten.bincount.default, checked.CHECKS[aten.bincount.default], "w")
    gm = g.module(g.op("b", form, g.inputs[0], None, 126))
    msg = refusal(gm, [torch.tensor([1, 2])], LimitError, max_tensor_bytes=1000)
    assert msg.startswith(f"{WHERE}: node 'b' (aten.bincount.default) makes at least 126 elements of int64"), msg


def test_a_python_callable_is_named_by_its_name_in_a_refusal():
    g = Graph("a", "b")
    gm = g.module(g.op("m", torch.mm, *g.inputs))
    with pytest.raises(precheck.GraphWillNotRun) as e:
        check(gm, [torch.zeros(2, 3), torch.zeros(4, 5)])
    assert str(e.value).startswith(f"{WHERE}: node 'm' (mm) does not run on these inputs: "), str(e.value)


def test_torchs_tracebacks_for_a_failing_fake_kernel_are_kept_quiet_and_the_log_level_restored(caplog):
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    before = log.level
    g = Graph("a", "b")
    gm = g.module(g.op("mm", aten.mm.default, *g.inputs))
    with caplog.at_level(logging.DEBUG, logger="torch._subclasses.fake_tensor"), \
            pytest.raises(precheck.GraphWillNotRun):
        check(gm, [torch.zeros(2, 3), torch.zeros(4, 5)])
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses.fake_tensor")
                and (r.levelno >= logging.WARNING or r.exc_info)]
    assert log.level == before


def test_data_dependent_outputs_name_each_outputs_dimensions_read_from_values():
    g = Graph("n", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    r = g.op("r", aten.arange.start_step, 0, u, 1, dtype=torch.float32)
    e = g.op("e", aten.expand.default, r, [3, u])
    gm = check(g.module(g.inputs[1], e, u, r), [torch.tensor(5), torch.zeros(2)])
    assert precheck.data_dependent_outputs(gm) == {1: [1], 2: [], 3: [0]}
    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    single = check(g.module(g.op("r", aten.arange.start_step, 0, u, 1, dtype=torch.float32)), [torch.tensor(5)])
    assert precheck.data_dependent_outputs(single) == {0: [0]}
    assert precheck.data_dependent_outputs(_chain()) == {}  # not checked


# ---------------------------------------------------------------------------------------
# a run: checked once per input layout, each layout afresh


def _runnable(gm, inputs, **lim):
    with limits.override(**lim):
        return precheck.runnable(gm, inputs)


def test_a_module_not_built_from_an_artefact_runs_as_is():
    gm = _chain()
    assert not precheck.needs_check(gm) and not precheck.needs_check(torch.nn.Linear(1, 1))
    assert precheck.runnable(gm, [torch.zeros(16)]) is gm


def test_a_marked_graph_is_checked_once_per_layout_and_runs_through_the_execution_guard(monkeypatch):
    from aotpipe.runtime.execution import RUN_GUARD

    gm = _chain()
    precheck.mark(gm, WHERE)
    assert precheck.needs_check(gm) and gm.meta[RUN_GUARD] is precheck.runnable and precheck._OWN not in gm.meta
    calls = []
    real = precheck.check_graph
    monkeypatch.setattr(precheck, "check_graph", lambda *a: calls.append(a[2]) or real(*a))
    x = torch.zeros(16)
    assert _runnable(gm, [x]) is gm  # no op to check at run: the module itself
    _runnable(gm, [torch.zeros(16)])
    assert calls == [WHERE]
    _runnable(gm, [torch.zeros(8)])
    assert calls == [WHERE, WHERE]


def _refused_at_run(gm, inputs, **lim):
    with pytest.raises(ArtifactError) as e:
        _runnable(gm, inputs, **lim)
    return str(e.value)


def test_a_layout_that_differs_only_by_its_storage_offset_is_checked_afresh():
    gm = _as_strided([9], [1])
    precheck.mark(gm, WHERE)
    base = torch.zeros(17)
    _runnable(gm, [base[8:16]])  # elements 8..16 of 17
    assert "storage offset 9) that reaches byte 72 of a storage of 68 bytes" in _refused_at_run(gm, [base[9:17]])


def test_a_layout_that_differs_only_by_its_storage_size_is_checked_afresh():
    gm = _as_strided([12], [1], 0)
    precheck.mark(gm, WHERE)
    _runnable(gm, [torch.zeros(16)[:8]])
    assert "reaches byte 48 of a storage of 32 bytes" in _refused_at_run(gm, [torch.zeros(8)])


def test_inputs_that_stop_sharing_a_storage_are_checked_afresh():
    g = Graph("a", "b")
    gm = g.module(g.op("s", aten.add.Tensor, *g.inputs))
    precheck.mark(gm, WHERE)
    base = torch.zeros(8)
    _runnable(gm, [base, base], max_bytes=64)
    assert "would hold 96 bytes" in _refused_at_run(gm, [base, base.clone()], max_bytes=64)


def test_inputs_of_another_dtype_are_checked_afresh():
    gm = _chain()
    precheck.mark(gm, WHERE)
    _runnable(gm, [torch.zeros(16)], max_bytes=192)
    assert "node 'a' (aten.relu.default) would hold 256 bytes" in _refused_at_run(
        gm, [torch.zeros(16, dtype=torch.float64)], max_bytes=192)


def test_another_int_input_is_checked_afresh():
    g = Graph("n")
    gm = g.module(g.op("r", aten.arange.start_step, 0, g.inputs[0], 1, dtype=torch.float32))
    precheck.mark(gm, WHERE)
    _runnable(gm, [100], max_tensor_bytes=400)
    assert "makes a float32[101] tensor" in _refused_at_run(gm, [101], max_tensor_bytes=400)


def test_a_marked_graph_runs_its_checked_forms():
    from aotpipe.artifact import checked

    g = Graph("x")
    gm = g.module(g.op("b", aten.bincount.default, g.inputs[0]))
    precheck.mark(gm, WHERE)
    twin = _runnable(gm, [torch.tensor([1, 2])], max_tensor_bytes=1000)
    (b,) = [n for n in twin.graph.nodes if n.name == "b"]
    assert isinstance(b.target, checked.CheckedOp) and b.target.where == f"{WHERE}: node 'b'"
    assert torch.equal(twin(torch.tensor([1, 2])), torch.tensor([0, 1, 1]))


# ---------------------------------------------------------------------------------------
# ops whose fake kernel needs a plain int where the graph gives a size read from values


def _pad_by_value():
    g = Graph("n", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    return g.module(g.op("p", aten.constant_pad_nd.default, g.inputs[1], [0, u]))


def _pad_of_run_sized():
    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    r = g.op("r", aten.arange.start_step, 0, u, 1, dtype=torch.float32)
    return g.module(g.op("p", aten.constant_pad_nd.default, r, [2, 1]))


def test_an_op_whose_fake_kernel_wants_a_plain_pad_runs_with_the_outputs_the_probes_agree_on():
    gm = check(_pad_by_value(), [torch.tensor(3), torch.zeros(2, 8)])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (2, None)),)}  # 2 rows kept, width the run's
    assert set(gm.meta[precheck.RUN_CHECKED_ALLOCS]) == {"p"}


def test_an_op_whose_fake_kernel_wants_a_plain_input_size_runs_with_the_outputs_the_probes_agree_on():
    gm = check(_pad_of_run_sized(), [torch.tensor(3)])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (None,)),)}
    assert set(gm.meta[precheck.RUN_CHECKED_ALLOCS]) == {"r", "p"}


def test_with_fewer_than_two_probes_that_run_the_op_is_refused(monkeypatch):
    monkeypatch.setattr(precheck, "_PROBES", ((lambda i: 7),))
    with pytest.raises(precheck.GraphWillNotRun) as e:
        check(_pad_by_value(), [torch.tensor(3), torch.zeros(2, 8)])
    assert str(e.value).startswith(f"{WHERE}: node 'p' (aten.constant_pad_nd.default) does not run on these inputs: "
                                   "RuntimeError: "), str(e.value)
    msg = refusal(_pad_of_run_sized(), [torch.tensor(3)])
    assert msg.startswith(f"{WHERE}: node 'p' (aten.constant_pad_nd.default) has a size that depends on the values "
                          "of tensors (GuardOnDataDependentSymNode: "), msg
    assert msg.endswith(f"), which cannot be checked before it runs{REFUSED}")


def test_a_probe_the_op_refuses_is_passed_over(monkeypatch):
    # a pad of -9 columns from 8: torch refuses it; the other two probes agree on 2 rows
    monkeypatch.setattr(precheck, "_PROBES", ((lambda i: -9), (lambda i: 1), (lambda i: 2)))
    gm = check(_pad_by_value(), [torch.tensor(3), torch.zeros(2, 8)])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (2, None)),)}
    monkeypatch.setattr(precheck, "_PROBES", ((lambda i: -9), (lambda i: 1), (lambda i: -10)))
    with pytest.raises(precheck.GraphWillNotRun):
        check(_pad_by_value(), [torch.tensor(3), torch.zeros(2, 8)])


def test_probes_that_agree_on_a_size_keep_it():
    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setattr(precheck, "_PROBES", ((lambda i: 4), (lambda i: 4)))
        gm = check(_pad_by_value(), [torch.tensor(3), torch.zeros(2, 8)])
    finally:
        monkeypatch.undo()
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (2, 12)),)}


# ---------------------------------------------------------------------------------------
# a node's outputs laid out as graph.json records them, where that is a dense layout


def _recorded(shape, stride):
    g = torch.fx.Graph()
    node = g.placeholder("n")
    node.meta["saved_val"] = {"shape": shape, "stride": stride}
    return node


def test_a_dense_layout_recorded_for_a_node_is_taken():
    value = torch.empty(2, 3, 4, 5)
    out = precheck._as_recorded(_recorded([2, 3, 4, 5], [60, 1, 15, 3]), value)  # channels last
    assert out.shape == value.shape and out.stride() == (60, 1, 15, 3) and out.dtype == value.dtype
    out = precheck._as_recorded(_recorded([2, 1, 4], [4, 99, 1]), torch.empty(2, 1, 4))  # a size-1 dim's stride
    assert out.stride() == (4, 99, 1)
    out = precheck._as_recorded(_recorded([2, 1, 4], [4, 0, 1]), torch.empty(2, 1, 4))  # a stride of 0 there too
    assert out.stride() == (4, 0, 1)


@pytest.mark.parametrize("shape,stride", [
    ([2, 3, 4, 5], [60, 20, 5, 1]),  # the value's own layout: the value itself
    ([2, 3, 4, 5], [120, 1, 30, 6]),  # gaps: not dense
    ([2, 3, 4, 5], [60, 1, 15, 2]),  # overlapping
    ([2, 3, 4, 6], [72, 1, 18, 3]),  # another shape
    ([2, 3, 4, 5], [60, 1, 15]),  # a stride missing
    ([2, 3, 4, 5], [60, 1, 15, -3]),
    ([2, 3, 4, 5], [60, 1, 15, "3"]),
    ("[2, 3]", [60, 1, 15, 3]),
])
def test_a_recorded_layout_that_is_not_a_dense_one_of_the_same_shape_is_ignored(shape, stride):
    value = torch.empty(2, 3, 4, 5)
    assert precheck._as_recorded(_recorded(shape, stride), value) is value


def test_no_record_leaves_the_value():
    value = torch.empty(2)
    g = torch.fx.Graph()
    assert precheck._as_recorded(g.placeholder("n"), value) is value


def test_a_tensor_of_exactly_eight_dimensions_is_described_whole():
    g = Graph("x")
    gm = g.module(g.op("z", aten.zeros.default, [1] * 7 + [200], dtype=torch.float32))
    msg = refusal(gm, [torch.zeros(1)], LimitError, max_tensor_bytes=400)
    assert "makes a float32[1, 1, 1, 1, 1, 1, 1, 200] tensor, which needs 800 bytes" in msg, msg


def test_inputs_viewing_one_storage_through_two_tensors_count_it_once_and_a_copy_is_checked_afresh():
    g = Graph("a", "b")
    gm = g.module(g.op("s", aten.add.Tensor, *g.inputs))
    precheck.mark(gm, WHERE)
    base = torch.zeros(8)
    _runnable(gm, [base, base[:]], max_bytes=64)
    assert "would hold 96 bytes" in _refused_at_run(gm, [base, base.clone()], max_bytes=64)


def test_a_layout_that_differs_only_by_its_strides_is_checked_afresh():
    g = Graph("x")
    gm = g.module(g.op("v", aten.view.default, g.inputs[0], [16]))
    precheck.mark(gm, WHERE)
    _runnable(gm, [torch.zeros(4, 4)])
    with pytest.raises(precheck.GraphWillNotRun, match="node 'v' \\(aten.view.default\\) does not run"):
        _runnable(gm, [torch.zeros(4, 4).t()])


def test_a_sparse_input_to_a_marked_graph_is_refused_in_one_line():
    gm = _chain()
    precheck.mark(gm, WHERE)
    with pytest.raises(ArtifactError, match="an input or constant is not a dense tensor"):
        _runnable(gm, [torch.zeros(16).to_sparse()])


def test_the_outputs_assumed_keep_the_ops_dtype_and_device():
    g = Graph("n", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    p = g.op("p", aten.constant_pad_nd.default, g.inputs[1], pad=[0, u])  # the pad given by keyword
    gm = check(g.module(g.op("s", aten.add.Tensor, p, 1.0)), [torch.tensor(3), torch.zeros(2, 8, dtype=torch.float64)])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float64", (2, None)),)}
    g = Graph("n", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    p = g.op("p", aten.constant_pad_nd.default, g.inputs[1], [0, u])
    meta = g.module(g.op("s", aten.add.Tensor, p, g.op("y", aten.sum.default, g.inputs[1])))
    check(meta, [torch.tensor(3), torch.zeros(2, 8, device="meta")])  # p on meta, as the pad of a meta tensor


def test_the_outputs_assumed_of_a_run_sized_input_keep_its_dtype_device_and_strides():
    g = Graph("n", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    z = g.op("z", aten.zeros.default, [2, u], dtype=torch.float64, device=torch.device("meta"))
    p = g.op("p", aten.constant_pad_nd.default, z, [1, 1])
    gm = check(g.module(g.op("s", aten.add.Tensor, p, g.op("y", aten.sum.default, g.inputs[1]))),
               [torch.tensor(3), torch.zeros(2, device="meta")])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float64", (2, None)),)}


def test_sizes_of_two_symbols_read_from_values_are_probed_together():
    g = Graph("n", "m", "x")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    v = g.op("v", aten._local_scalar_dense.default, g.inputs[1])
    gm = check(g.module(g.op("p", aten.constant_pad_nd.default, g.inputs[2], [u, v])),
               [torch.tensor(3), torch.tensor(4), torch.zeros(2, 8)])
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (2, None)),)}


def test_a_float_input_equal_to_an_int_input_is_another_layout():
    # arange to 100.0 makes 100 float32s (400 bytes), to 100 makes 100 int64s (800)
    g = Graph("n")
    gm = g.module(g.op("r", aten.arange.start_step, 0, g.inputs[0], 1))
    precheck.mark(gm, WHERE)
    _runnable(gm, [100.0], max_tensor_bytes=400)
    assert "makes a int64[100] tensor, which needs 800 bytes" in _refused_at_run(gm, [100], max_tensor_bytes=400)


# ---------------------------------------------------------------------------------------
# further boundaries: the default source name, freed bytes, records, probes, layouts


def test_a_refusal_names_graph_json_when_no_other_source_is_given():
    with limits.override(max_bytes=191):
        with pytest.raises(LimitError) as e:
            precheck.check_graph(_add_const(), [torch.zeros(16)])
    assert str(e.value).startswith("graph.json: node 's' (aten.add.Tensor) would hold 192 bytes"), str(e.value)


def test_a_freed_intermediate_takes_only_its_own_bytes_off_the_live_count():
    # a (400 bytes) lives to the end; b (4) dies at c; d (400) then joins a, c and x: 808 bytes
    g = Graph("x")
    a = g.op("a", aten.zeros.default, [100])
    b = g.op("b", aten.zeros.default, [1])
    c = g.op("c", aten.neg.default, b)
    gm = g.module(a, c, g.op("d", aten.zeros.default, [100]))
    check(gm, [torch.zeros(1)], max_bytes=808)
    msg = refusal(gm, [torch.zeros(1)], LimitError, max_bytes=807)
    assert msg.startswith(f"{WHERE}: node 'd' (aten.zeros.default) would hold 808 bytes"), msg


def test_an_empty_view_of_an_empty_storage_is_allowed():
    check(_as_strided([0], [1], 0), [torch.zeros(0)])


def test_every_tensor_a_node_makes_is_held_to_the_limit_after_one_sized_by_the_run():
    # _unique2's values (at most 16 float64s: 128 bytes) are deferred to the run; its inverse
    # indices (16 int64s, 128 bytes, sized by the input) are over the limit now
    g = Graph("x")
    gm = g.module(g.op("u", aten._unique2.default, g.inputs[0], True, True, True))
    msg = refusal(gm, [torch.zeros(16, dtype=torch.float64)], LimitError, max_tensor_bytes=127)
    assert msg == (f"{WHERE}: node 'u' (aten._unique2.default) makes a int64[16] tensor, which needs 128 bytes, "
                   f"over the limit of 127 bytes (raise it with AOTPIPE_MAX_TENSOR_BYTES){REFUSED}")


def test_a_graph_from_elsewhere_is_refused_at_an_op_without_a_fake_kernel_whatever_it_records():
    msg = refusal(_geqrf(GEQRF_RECORD), [torch.zeros(3, 3)])
    assert "has no fake-tensor kernel in this torch" in msg, msg


def test_the_reason_a_size_read_from_values_cannot_be_checked_is_cut_to_120_characters(monkeypatch):
    import operator

    monkeypatch.setattr(precheck, "_PROBES", ((lambda i: 7),))
    g = Graph("a", "b", "c")
    u = [g.op(f"u{i}", aten._local_scalar_dense.default, x) for i, x in enumerate(g.inputs)]
    n = g.op("n", operator.mul, g.op("m", operator.mul, u[0], u[1]), u[2])  # a longer expression: u0*u1*u2
    r = g.op("r", aten.arange.start_step, 0, n, 1, dtype=torch.float32)
    gm = g.module(g.op("p", aten.constant_pad_nd.default, r, [2, 1]))
    msg = refusal(gm, [torch.tensor(3), torch.tensor(4), torch.tensor(5)])
    head = f"{WHERE}: node 'p' (aten.constant_pad_nd.default) has a size that depends on the values of tensors ("
    tail = f"), which cannot be checked before it runs{REFUSED}"
    assert msg.startswith(head) and msg.endswith(tail), msg
    reason = msg[len(head):-len(tail)]
    assert reason.startswith("GuardOnDataDependentSymNode: ") and reason.endswith("..."), reason
    assert len(reason) == len("GuardOnDataDependentSymNode: ") + 120 + len("..."), reason


def test_a_critical_record_of_torchs_fake_tensors_is_kept_quiet_too(caplog):
    import logging

    def loud(x):
        logging.getLogger("torch._subclasses.fake_tensor").critical("a fake kernel failed")
        raise RuntimeError("refused")

    g = Graph("x")
    gm = g.module(g.op("l", loud, g.inputs[0]))
    with caplog.at_level(logging.DEBUG, logger="torch._subclasses.fake_tensor"), \
            pytest.raises(precheck.GraphWillNotRun):
        check(gm, [torch.zeros(1)])
    assert "a fake kernel failed" not in caplog.text


def test_a_nodes_recorded_dense_layout_is_what_a_later_view_sees():
    # clone keeps x's transposed strides on the fake side; graph.json records the contiguous
    # layout the real kernel gave, which a view to one dimension needs
    def gm(record):
        g = Graph("x")
        c = g.op("c", aten.clone.default, g.inputs[0])
        if record:
            c.meta["saved_val"] = {"shape": [4, 4], "stride": [4, 1]}
        return g.module(g.op("v", aten.view.default, c, [16]))
    check(gm(True), [torch.zeros(4, 4).t()])
    with pytest.raises(precheck.GraphWillNotRun, match=r"node 'v' \(aten\.view\.default\) does not run"):
        check(gm(False), [torch.zeros(4, 4).t()])


def test_a_view_keeps_its_own_layout_whatever_graph_json_records_for_it():
    # a record on a view is not taken: a fresh tensor would be a storage of its own, 64 more bytes
    g = Graph("x")
    t = g.op("t", aten.t.default, g.inputs[0])
    t.meta["saved_val"] = {"shape": [4, 4], "stride": [4, 1]}
    gm = check(g.module(t), [torch.zeros(4, 4)], max_bytes=64)
    assert gm.meta[precheck.RUN_CHECKED_OUTPUTS] == {}


def test_a_size_pinned_by_a_runtime_assert_is_not_a_data_dependent_output():
    import operator

    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    g.op("a", aten._assert_scalar.default, g.op("e", operator.eq, u, 5), "u is 5")
    gm = check(g.module(g.op("r", aten.arange.start_step, 0, u, 1, dtype=torch.float32), u), [torch.tensor(5)])
    assert precheck.data_dependent_outputs(gm) == {}


def test_a_view_past_its_storage_by_a_size_pinned_by_a_runtime_assert_is_refused_now():
    import operator

    g = Graph("x", "n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[1])
    g.op("a", aten._assert_scalar.default, g.op("e", operator.eq, u, 5), "u is 5")
    gm = g.module(g.op("v", aten.as_strided.default, g.inputs[0], [u], [1]))
    msg = refusal(gm, [torch.zeros(4), torch.tensor(5)])
    assert "(sizes [5], strides [1], storage offset 0) that reaches byte 20 of a storage of 16 bytes" in msg, msg


def test_an_output_that_is_a_literal_is_no_data_dependent_output():
    g = Graph("n")
    u = g.op("u", aten._local_scalar_dense.default, g.inputs[0])
    g.g.output((u, slice(0, 2)))  # a literal (unhashable in this Python), not a node
    gm = check(torch.fx.GraphModule(g.root, g.g), [torch.tensor(5)])
    assert precheck.data_dependent_outputs(gm) == {0: []}


def test_a_dense_layout_recorded_keeps_the_values_dtype_and_device():
    value = torch.empty(2, 3, 4, 5, dtype=torch.float64, device="meta")
    out = precheck._as_recorded(_recorded([2, 3, 4, 5], [60, 1, 15, 3]), value)
    assert (out.stride(), out.dtype, out.device.type) == ((60, 1, 15, 3), torch.float64, "meta")


# ---------------------------------------------------------------------------------------
# the inputs' signature: which inputs share a check


def test_equal_scalar_inputs_made_apart_share_one_check(monkeypatch):
    g = Graph("n")
    gm = g.module(g.op("r", aten.arange.start_step, 0, g.inputs[0], 1, dtype=torch.float32))
    precheck.mark(gm, WHERE)
    calls = []
    real = precheck.check_graph
    monkeypatch.setattr(precheck, "check_graph", lambda *a: calls.append(a[1]) or real(*a))
    _runnable(gm, [int("100000")])
    _runnable(gm, [int("100000")])  # an equal int, another object
    assert calls == [[100000]]


def test_a_dtype_input_of_another_value_is_checked_afresh():
    g = Graph("d")
    gm = g.module(g.op("z", aten.zeros.default, [100], dtype=g.inputs[0]))
    precheck.mark(gm, WHERE)
    _runnable(gm, [torch.float32], max_tensor_bytes=400)
    assert "makes a float64[100] tensor" in _refused_at_run(gm, [torch.float64], max_tensor_bytes=400)


def test_a_list_input_is_checked_and_then_reused():
    g = Graph("s")
    gm = g.module(g.op("z", aten.zeros.default, g.inputs[0]))
    precheck.mark(gm, WHERE)
    size = [100]
    _runnable(gm, [size], max_tensor_bytes=400)
    _runnable(gm, [size], max_tensor_bytes=400)
    assert "makes a float32[101] tensor" in _refused_at_run(gm, [[101]], max_tensor_bytes=400)


# ---------------------------------------------------------------------------------------
# outputs assumed from probes, called directly on fake tensors


def _assumed(target, *args, symbol=None):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env, allow_fallback_kernels=False, static_shapes=True):
        u = shape_env.create_unbacked_symint()
        made = args[0](u) if callable(args[0]) else args
        return precheck._assumed_outputs(target, made, {}, shape_env), shape_env


def test_views_in_place_ops_and_data_sized_ops_are_not_assumed():
    assert _assumed(aten.narrow.default, lambda u: (torch.empty(10000), 0, 0, u))[0] is None  # a view
    assert _assumed(aten.nonzero.default, lambda u: (torch.empty(u),))[0] is None  # sized by the data
    # mutable (it updates the running stats) though its outputs are fresh tensors
    bn = _assumed(aten._native_batch_norm_legit.default,
                  lambda u: (torch.empty(u, 3), None, None, torch.empty(3), torch.empty(3), True, 0.1, 1e-5))[0]
    assert bn is None


def test_a_flag_read_from_values_is_probed_as_a_bool():
    out, _ = _assumed(aten.sum.dim_IntList, lambda u: (torch.empty(3, 4), [0], u > 0))  # keepdim: true in each probe
    assert out.shape == (1, 4)


def test_probes_that_disagree_on_the_number_of_dimensions_assume_nothing():
    # keepdim true for the probes 1031 and 4099, false for 7: (1, 4) against (4,)
    assert _assumed(aten.sum.dim_IntList, lambda u: (torch.empty(3, 4), [0], u > 1000))[0] is None


def test_a_float_read_from_values_is_probed_as_a_float():
    out, _ = _assumed(aten.full.default, lambda u: ([2], torch.sym_float(u)))
    assert (out.shape, out.dtype) == ((2,), torch.float32)


def test_a_size_the_probes_disagree_on_may_be_any_size_from_zero():
    out, shape_env = _assumed(aten.constant_pad_nd.default, lambda u: (torch.empty(2, 8), [0, u]))
    width = out.shape[1]
    assert out.shape[0] == 2 and isinstance(width, torch.SymInt)
    assert shape_env.bound_sympy(width.node.expr).lower == 0


def test_a_size_bounded_by_the_per_tensor_limit_may_be_any_size_from_zero_to_it():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    node = next(n for n in _bincount(0).graph.nodes if n.name == "b")
    with FakeTensorMode(shape_env=shape_env, allow_fallback_kernels=False, static_shapes=True):
        u = shape_env.create_unbacked_symint()
        value = torch.empty(u, dtype=torch.int64)
        precheck._bound_by_limit(node, value, shape_env, 1000, precheck._Refusal(WHERE), "AOTPIPE_MAX_TENSOR_BYTES")
    bound = shape_env.bound_sympy(u.node.expr)
    assert (bound.lower, bound.upper) == (0, 125)


def test_a_node_after_the_output_is_checked_as_every_other():
    # torch.fx lints a graph with a node after its output (the code returns before it):
    # the check does not skip it, so a graph.json holding one over the limit is refused
    g = Graph("x")
    g.g.output(g.inputs[0])
    g.op("z", aten.zeros.default, [102])
    gm = torch.fx.GraphModule(g.root, g.g)
    msg = refusal(gm, [torch.zeros(1)], LimitError, max_tensor_bytes=400)
    assert msg.startswith(f"{WHERE}: node 'z' (aten.zeros.default) makes a float32[102] tensor"), msg
