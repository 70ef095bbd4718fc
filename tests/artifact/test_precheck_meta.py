"""The precheck's first pass, on meta tensors: it may only accept what the fake-tensor pass
accepts, it allocates nothing real (every device argument on meta), and it hands the graph
to the fake-tensor pass for what it cannot say (sizes read from values, several devices, an
op it has no kernel for, any refusal)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx

from aotpipe.artifact import precheck
from aotpipe.artifact.graph_json import graph_from_json
from aotpipe.errors import ArtifactError, LimitError
from tests.artifact.hostile_calls import WHERE, _one_node_graph, cases, hostile_call, load_calls, make

aten = torch.ops.aten
CPU = torch.device("cpu")


class Graph:
    def __init__(self, *inputs):
        self.g = torch.fx.Graph()
        self.inputs = [self.g.placeholder(n) for n in inputs]

    def op(self, target, *args, **kwargs):
        return self.g.call_function(target, args, kwargs)

    def module(self, *outputs):
        self.g.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        return torch.fx.GraphModule(torch.nn.Module(), self.g)


@pytest.fixture(autouse=True)
def _fresh_device_args():
    """Each test reads ops' schemas afresh, not what an earlier one left in the cache."""
    precheck._DEVICE_ARGS.clear()
    yield
    precheck._DEVICE_ARGS.clear()


def _passes(monkeypatch):
    """The passes check_graph runs, in order: "meta" or "fake"."""
    seen = []
    real = precheck._propagate

    def spy(gm, inputs, where, on_meta):
        seen.append("fake" if on_meta is None else "meta")
        return real(gm, inputs, where, on_meta)
    monkeypatch.setattr(precheck, "_propagate", spy)
    return seen


def _mlp():
    g = Graph("x", "w")
    h = g.op(aten.mm.default, g.inputs[0], g.inputs[1])
    r = g.op(aten.relu.default, h)
    idx = g.op(aten.arange.default, 4, dtype=torch.int64)  # a factory: no device, the default
    return g.module(g.op(aten.index.Tensor, r, [idx])), [torch.randn(8, 16), torch.randn(16, 4)]


def test_a_plain_graph_is_accepted_on_meta_alone(monkeypatch):
    gm, inputs = _mlp()
    seen = _passes(monkeypatch)
    precheck.check_graph(gm, inputs, WHERE)
    assert seen == ["meta"]


def test_a_graph_with_a_size_read_from_values_goes_to_the_fake_pass_alone(monkeypatch):
    g = Graph("x")
    r = g.op(aten.relu.default, g.inputs[0])
    gm = g.module(r, g.op(aten.nonzero.default, r))
    seen = _passes(monkeypatch)
    precheck.check_graph(gm, [torch.ones(5)], WHERE)
    assert seen == ["fake"]


def test_an_index_by_a_mask_stops_the_meta_pass_where_it_is(monkeypatch):
    g = Graph("x", "m")
    gm = g.module(g.op(aten.index.Tensor, g.inputs[0], [g.inputs[1]]))
    seen = _passes(monkeypatch)
    precheck.check_graph(gm, [torch.ones(4), torch.ones(4, dtype=torch.bool)], WHERE)
    assert seen == ["meta", "fake"]


def test_a_refusal_on_meta_is_the_fake_pass_s_to_make(monkeypatch):
    g = Graph("x")
    gm = g.module(g.op(aten.as_strided.default, g.inputs[0], [4], [1], 3))  # reaches element 7 of 6
    seen = _passes(monkeypatch)
    with pytest.raises(ArtifactError, match="reaches byte 28 of a storage of 24 bytes"):
        precheck.check_graph(gm, [torch.ones(6)], WHERE)
    assert seen == ["meta", "fake"]


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_factory_s_literal_size_allocates_nothing_on_meta(device):
    # 8 TB: were it allocated for real, torch would fail to (a RuntimeError), not refuse it
    g = Graph("x")
    kwargs = {"dtype": torch.float64} | ({"device": torch.device(device)} if device else {})
    gm = g.module(g.op(aten.full.default, [10 ** 6, 10 ** 6], 1.0, **kwargs))
    with pytest.raises(LimitError, match="which needs 8 TB, over the limit"):
        precheck._propagate(gm, [torch.ones(1)], WHERE, on_meta=CPU)


def test_each_device_argument_is_made_meta_and_the_value_is_meta():
    g = Graph("x")
    a = g.op(aten.arange.start_step, 0, 6, 1, device=CPU)  # kwarg
    b = g.op(aten._to_copy.default, g.inputs[0], dtype=torch.float64, device=CPU)
    c = g.op(aten.empty_like.default, g.inputs[0])  # a *_like op's None: its input's device
    gm = g.module(a, b, c)
    env = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = precheck._call_on_meta(node, args, kwargs, CPU)
            assert env[node].device.type == "meta", node
        elif node.op == "placeholder":
            env[node] = torch.empty(3, device="meta")


@pytest.mark.parametrize("op", [aten.lstm.data, aten.gru.data, aten.rnn_tanh.data, aten.bincount.default,
                                aten.slice_inverse.default, aten._pack_padded_sequence.default, aten.nonzero.default])
def test_the_meta_pass_does_not_take_an_op_whose_sizes_or_checks_are_the_fake_pass_s(op):
    g = Graph("x")
    assert not precheck._meta_takes(g.op(op, g.inputs[0]))
    assert precheck._meta_takes(g.op(aten.index.Tensor, g.inputs[0], [g.inputs[0]]))  # a mask or not: at the node


@pytest.mark.parametrize("op,names", [(aten.full.default, ("device",)), (aten.arange.start_step, ("device",)),
                                      (aten._to_copy.default, ("device",)), (aten.add.Tensor, ()),
                                      (torch.ops.rngprims.philox_rand.default, None)])
def test_an_op_s_device_arguments_are_read_from_its_schema(op, names):
    assert precheck._device_args(op) == names


def test_an_op_that_may_take_its_device_by_position_is_left_to_fake_tensors():
    g = Graph("seed", "offset")
    node = g.op(torch.ops.rngprims.philox_rand.default, [2, 3], *g.inputs, None, CPU, torch.float32)
    assert not precheck._meta_takes(node)


def test_a_real_tensor_out_of_a_meta_kernel_stops_the_meta_pass():
    # philox_rand's meta kernel gives its offset as a real cpu scalar
    g = Graph("x")
    node = g.op(aten.relu.default, g.inputs[0])
    with pytest.raises(precheck._NotOnMeta):
        precheck._call_on_meta(node, (torch.ones(2),), {}, CPU)


def test_a_like_op_s_device_follows_its_input_on_any_graph_device():
    g = Graph("x")
    node = g.op(aten.empty_like.default, g.inputs[0])
    out = precheck._call_on_meta(node, (torch.empty(3, device="meta"),), {}, torch.device("cuda"))
    assert out.device.type == "meta" and out.shape == (3,)


@pytest.mark.parametrize("graph_device,given", [("cuda", None), ("cpu", "cuda"), ("cuda:0", "cuda:1"),
                                                ("cuda", "cpu"), ("cpu", "cuda:0")])
def test_a_device_other_than_the_graph_s_is_the_fake_pass_s(graph_device, given):
    g = Graph("x")
    kwargs = {"device": torch.device(given)} if given else {}
    node = g.op(aten.zeros.default, [3], **kwargs)
    with pytest.raises(precheck._NotOnMeta):
        precheck._call_on_meta(node, node.args, node.kwargs, torch.device(graph_device))


@pytest.mark.parametrize("graph_device,given", [("cuda", "cuda"), ("cuda:1", "cuda"), ("cuda", "cuda:1"),
                                                ("cuda:1", "cuda:1"), ("cpu", "cpu"), ("cpu", None)])
def test_the_graph_s_own_device_runs_on_meta(graph_device, given):
    g = Graph("x")
    kwargs = {"device": torch.device(given)} if given else {}
    node = g.op(aten.zeros.default, [3], **kwargs)
    out = precheck._call_on_meta(node, node.args, node.kwargs, torch.device(graph_device))
    assert out.device.type == "meta" and out.shape == (3,)


def test_inputs_on_several_devices_go_to_the_fake_pass():
    assert precheck._meta_pass_device([torch.ones(1), 3, torch.ones(1, device="meta")]) is None
    assert precheck._meta_pass_device([torch.ones(1), 3, torch.ones(2)]) == CPU
    assert precheck._meta_pass_device([3]) == CPU


def test_a_constant_on_another_device_than_the_inputs_stops_the_meta_pass():
    g = Graph("x")
    root = torch.nn.Module()
    root.register_buffer("c", torch.ones(3))
    c = g.g.get_attr("c")
    gm = torch.fx.GraphModule(root, g.g)
    g.g.output(g.op(aten.add.Tensor, g.inputs[0], c))
    gm.recompile()
    precheck._propagate(gm, [torch.ones(3)], WHERE, on_meta=CPU)
    # (meta stands for a second device here: inputs on it, the constant on cpu)
    with pytest.raises(precheck._NotOnMeta, match="a tensor on cpu, the inputs on meta"):
        precheck._propagate(gm, [torch.ones(3, device="meta")], WHERE, on_meta=torch.device("meta"))


@pytest.mark.parametrize("index,on_meta", [
    (torch.tensor([0, 2]), True), (torch.tensor([0, 2], dtype=torch.int32), True),
    (torch.tensor([True, False, True, False]), False), (torch.tensor([1, 0, 1, 0], dtype=torch.uint8), False),
])
def test_index_by_positions_runs_on_meta_and_by_a_mask_does_not(index, on_meta):
    g = Graph("x", "i")
    node = g.op(aten.index.Tensor, g.inputs[0], [g.inputs[1]])
    args = (torch.empty(4, device="meta"), [index.to("meta")])
    if on_meta:
        assert precheck._call_on_meta(node, args, {}, CPU).shape == (2,)
    else:
        with pytest.raises(precheck._NotOnMeta):
            precheck._call_on_meta(node, args, {}, CPU)


@pytest.mark.parametrize("on_meta", [None, CPU], ids=["fake", "meta"])
def test_size_arithmetic_on_a_list_is_refused_by_both_passes_without_computing_it(on_meta):
    data = {"format_version": 1, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x"},
        {"name": "n", "op": "call_function", "target": "operator.mul", "args": [[0], 10 ** 12], "kwargs": {}},
        {"name": "output", "op": "output", "args": [[{"node": "x"}, {"node": "n"}]], "kwargs": {}},
    ]}
    gm = graph_from_json(data)
    with pytest.raises(ArtifactError, match=r"operator.mul takes \(int, int\).*; not computed"):
        precheck._propagate(gm, [torch.zeros(1)], WHERE, on_meta=on_meta)


def _verdict(call, case, on_meta):
    tensors, make_call = hostile_call(call, case)
    gm, _ = _one_node_graph(make_call(tensors))
    try:
        precheck._propagate(gm, tensors, WHERE, on_meta=on_meta)
        return "accepted"
    except Exception as e:  # any other outcome
        return type(e).__name__


def _differential(path):
    calls = load_calls(str(path))
    on_meta, wrong = 0, []
    for case in cases(calls):
        meta = _verdict(calls[case.call], case, CPU)
        if meta == "accepted":
            on_meta += 1
            fake = _verdict(calls[case.call], case, None)
            if fake != "accepted":
                wrong.append(f"{case.describe(calls)}: accepted on meta, {fake} on fake tensors")
    return len(cases(calls)), on_meta, wrong


def _honest_calls_left_to_fake(path):
    """The sweep's honest calls (as recorded, none mutated) that fake tensors accept and the
    meta pass does not, though it takes their op: what would make the meta pass slow."""
    calls = load_calls(str(path))
    left = []
    for case in cases(calls):
        if case.leaf is not None:
            continue
        gm, _ = _one_node_graph(calls[case.call])
        if not all(precheck._meta_takes(n) for n in gm.graph.nodes):
            continue
        meta = _verdict(calls[case.call], case, CPU)
        if meta != "accepted" and _verdict(calls[case.call], case, None) == "accepted":
            left.append(f"{case.describe(calls)}: {meta} on meta")
    return left


def _differential_in_child(tmp_path, hand_only):
    """The honest calls in this process (none crashes), then _differential over all of the
    sweep's calls in a child: a kernel that crashes on meta tensors fails the test instead of
    ending the test run. (The child runs whichever mutant a mutation run has set.)"""
    path = tmp_path / "calls.pt"
    make(path, hand_only=hand_only)
    left = _honest_calls_left_to_fake(path)
    assert not left, "\n".join(left)
    code = ("import json, sys, warnings; warnings.simplefilter('ignore'); "
            "from tests.artifact.test_precheck_meta import _differential; "
            "print(json.dumps(_differential(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=1800,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, f"the child ended with {r.returncode}: {r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_over_the_hostile_sweep_s_hand_calls_the_meta_pass_accepts_only_what_the_fake_pass_does(tmp_path):
    total, on_meta, wrong = _differential_in_child(tmp_path, hand_only=True)
    assert not wrong, "\n".join(wrong)
    assert total > 250 and on_meta > total // 3  # the meta pass does take most honest and many hostile calls


@pytest.mark.parametrize("op,args", [
    (aten.nonzero.default, (torch.empty(4),)), (aten.bincount.default, (torch.empty(4, dtype=torch.int64),)),
    (aten.repeat_interleave.Tensor, (torch.empty(4, dtype=torch.int64),)),
    (aten._local_scalar_dense.default, (torch.empty(()),)), (aten.one_hot.default, (torch.empty(4, dtype=torch.int64), 5)),
    (aten.slice_inverse.default, (torch.empty(4), torch.empty(2), 0, 0, 2, 1)),
], ids=lambda v: str(v) if isinstance(v, torch._ops.OpOverload) else "")
def test_an_op_sized_by_values_or_refused_by_fake_tensors_is_never_run_on_meta(op, args):
    g = Graph("x")
    node = g.op(op, *args)
    meta_args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(precheck._NotOnMeta):
        precheck._call_on_meta(node, meta_args, {}, CPU)


def test_a_composite_decomposes_through_torch_s_python_decomposition_on_meta():
    # The C++ LSTM on meta tensors crashes the process on a cell state of no layers (read
    # past its end); the Python decomposition fake tensors use raises first. In a child, so
    # that a crash is this test's failure, not the test run's end.
    code = textwrap.dedent("""
        import torch, torch.fx
        from aotpipe.artifact import precheck
        g = torch.fx.Graph()
        x, h, c, *weights = [g.placeholder(n) for n in ("x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh")]
        node = g.call_function(torch.ops.aten.lstm.input, (x, [h, c], weights, True, 1, 0.0, False, False, False))
        m = lambda *s: torch.empty(*s, device="meta")
        args = (m(5, 2, 3), [m(1, 2, 4), m(0, 2, 4)], [m(16, 3), m(16, 4), m(16), m(16)], True, 1, 0.0, False, False, False)
        try:
            precheck._call_on_meta(node, args, {}, torch.device("cpu"))
        except IndexError as e:
            print("raised IndexError")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and r.stdout.strip() == "raised IndexError", (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("op,args,error", [
    (aten.convolution.default, (torch.empty(1, 3, 4), torch.empty(1, 1, 1), None, [1], [0], [1], True, [0], 1),
     "expected input.1, 3, 4. to have 1 channels, but got 3"),
    (aten.convolution.default, (torch.empty(1, 3, 4), torch.empty(2, 3, 1, dtype=torch.float64), None, [1], [0], [1],
                                False, [0], 1), "Input type .torch.float32. and weight type .torch.float64."),
    (aten.convolution_backward.default, (torch.empty(1, 3, 4), torch.empty(1, 1, 1), torch.empty(3, 3, 3), None, [1],
                                         [0], [1], True, [0], 1, [True, True, False]), "expected input.1, 1, 1. to have 3"),
    (aten.convolution.default, (torch.empty(1, 3, 4), torch.empty(2, 3, 1), torch.empty(3), [1], [0], [1], False, [0], 1),
     "expected bias to be 1-dimensional with 2 elements"),
    (aten.convolution.default, (torch.empty(1, 3, 4), torch.empty(2, 3, 1), torch.empty(2), [1], [0], [1], False, [0], 1), None),
    (aten.convolution.default, (torch.empty(1, 3, 4), torch.empty(2, 3, 1), torch.empty(2), [1], [0], [1], False, [0],
                                {"groups": 1}), None),
    (aten.convolution_backward.default, (torch.empty(1, 2, 4), torch.empty(1, 3, 4), torch.empty(2, 3, 1), [2], [1],
                                         [0], [1], False, [0], 1, [True, True, True]), None),
], ids=["transposed channels", "dtypes", "backward channels", "bias", "forward ok", "forward ok by keyword",
      "backward ok"])
def test_a_convolution_on_meta_runs_torch_s_argument_checks_first(op, args, error):
    kwargs = args[-1] if isinstance(args[-1], dict) else {}
    args = args[:-1] if kwargs else args
    g = Graph("x")
    node = g.op(op, *args, **kwargs)
    meta_args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    if error:
        with pytest.raises(RuntimeError, match=error):
            precheck._call_on_meta(node, meta_args, kwargs, CPU)
    else:
        out = precheck._call_on_meta(node, meta_args, kwargs, CPU)
        assert all(t.device.type == "meta" for t in precheck._tensors(out))


_BINARY = getattr(getattr(torch.ops.mkldnn, "_convolution_pointwise", None), "binary", None)


@pytest.mark.skipif(_BINARY is None, reason="this torch has no oneDNN residual convolution")
@pytest.mark.parametrize("padding,stride,dilation,out", [
    ([1, 1], [1, 1], [1, 1], [1, 4, 8, 8]),
    ([1, 0], [2, 1], [1, 2], [1, 4, 4, 4]),  # each spatial dimension its own arguments
])
def test_oneDNN_s_residual_convolution_is_checked_on_fake_tensors_by_its_own_form(padding, stride, dilation, out):
    """torch has no fake kernel for it: the precheck's own gives the convolution's output and
    holds the residual, which the kernel reads as that shape unchecked, to it."""
    def graph(other_shape):
        g = Graph("x", "other", "w", "b")
        x, other, w, b = g.inputs
        gm = g.module(g.op(_BINARY, x, other, w, b, padding, stride, dilation, 1, "add", None, "relu", [], None))
        cl = torch.channels_last
        return gm, [torch.randn(1, 3, 8, 8).contiguous(memory_format=cl), torch.randn(other_shape).contiguous(memory_format=cl),
                    torch.randn(4, 3, 3, 3).contiguous(memory_format=cl), torch.randn(4)]

    gm, inputs = graph(out)
    precheck.check_graph(gm, inputs, WHERE)  # accepted
    precheck._propagate(gm, inputs, WHERE, on_meta=CPU)  # and by the meta pass (no slow fake pass for cpu-fast CNNs)
    for wrong in ([out[0], out[1], out[2] - 1, out[3]], [out[0], out[1], out[2], out[3] + 1], [2, *out[1:]]):
        gm, inputs = graph(wrong)
        with pytest.raises(ArtifactError, match=rf"adds a residual of shape \[{', '.join(map(str, wrong))}\] to a "
                                                 rf"convolution whose output has shape \[{', '.join(map(str, out))}\]"):
            precheck.check_graph(gm, inputs, WHERE)
        with pytest.raises(precheck._NotOnMeta) as left:  # the meta pass leaves it to the fake pass, which names why
            precheck._propagate(gm, inputs, WHERE, on_meta=CPU)
        assert str(left.value) == next(n.name for n in gm.graph.nodes if n.target is _BINARY)
    gm, inputs = graph(out)
    inputs[1] = inputs[1].double()
    with pytest.raises(ArtifactError, match="adds a residual"):
        precheck.check_graph(gm, inputs, WHERE)


@pytest.mark.skipif(_BINARY is None, reason="this torch has no oneDNN residual convolution")
@pytest.mark.parametrize("which", ["x", "w"])
def test_a_residual_convolution_whose_plain_convolution_does_not_run_is_refused_in_one_line(which):
    """The plain convolution's own checks (channels, a one-element input or weight: the hostile
    sweep's) refuse it as a graph that does not run, on both passes; the kernel never runs."""
    cl = torch.channels_last
    inputs = {"x": torch.randn(1, 3, 8, 8), "other": torch.randn(1, 4, 8, 8), "w": torch.randn(4, 3, 3, 3),
              "b": torch.randn(4)}
    inputs[which] = torch.randn(1, 1, 1, 1)
    g = Graph("x", "other", "w", "b")
    gm = g.module(g.op(_BINARY, *g.inputs, [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [], None))
    values = [t.contiguous(memory_format=cl) if t.dim() == 4 else t for t in inputs.values()]
    with pytest.raises(precheck.GraphWillNotRun, match=r"does not run on these inputs: .*(channel|weight)"):
        precheck.check_graph(gm, values, WHERE)
    with pytest.raises(RuntimeError):  # the meta pass raises too: the fake pass decides
        precheck._propagate(gm, values, WHERE, on_meta=CPU)


@pytest.mark.skipif(_BINARY is None, reason="this torch has no oneDNN residual convolution")
def test_the_residual_convolution_s_fake_form_reads_keyword_arguments_and_what_fits_no_schema_never_reaches_it():
    cl = torch.channels_last
    inputs = [torch.randn(1, 3, 8, 8).contiguous(memory_format=cl), torch.randn(1, 4, 8, 8).contiguous(memory_format=cl),
              torch.randn(4, 3, 3, 3).contiguous(memory_format=cl), torch.randn(4)]

    def check(*args, **kwargs):
        g = Graph("x", "other", "w", "b")
        precheck.check_graph(g.module(g.op(_BINARY, *g.inputs, *args, **kwargs)), inputs, WHERE)

    check([1, 1], [1, 1], [1, 1], groups=1, binary_attr="add", alpha=None, unary_attr="relu", unary_scalars=[],
          unary_algorithm=None)  # accepted: keywords are arguments too
    g = Graph("x", "other", "w", "b")
    whole = g.op(_BINARY, *g.inputs, [1, 1], [1, 1], [1, 1], groups=1, binary_attr="add", alpha=None,
                 unary_attr="relu", unary_scalars=[], unary_algorithm=None)
    precheck._propagate(g.module(whole), inputs, WHERE, on_meta=CPU)  # and on meta
    for extra in ({"bogus": 1}, {"unary_algorithm": None, "other_too": 2}):  # what no schema binds: not on meta
        g = Graph("x", "other", "w", "b")
        gm = g.module(g.op(_BINARY, *g.inputs, [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [],
                           **({"unary_algorithm": None} | extra)))
        with pytest.raises(precheck._NotOnMeta):
            precheck._propagate(gm, inputs, WHERE, on_meta=CPU)
        with pytest.raises(precheck.GraphWillNotRun):
            precheck.check_graph(gm, inputs, WHERE)
    g = Graph("x", "other", "w", "b")
    gm = g.module(g.op(_BINARY, *g.inputs, [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [], None, 5))
    with pytest.raises(precheck._NotOnMeta) as left:  # one positional argument too many
        precheck._propagate(gm, inputs, WHERE, on_meta=CPU)
    assert str(left.value) == next(n.name for n in gm.graph.nodes if n.target is _BINARY)
    with pytest.raises(precheck.GraphWillNotRun, match="is missing value for argument 'dilation'"):
        check([1, 1], [1, 1])  # no dilation, groups, ...: the call's own binding refuses it
    g = Graph("x", "w", "b")
    x, w, b = g.inputs
    gm = g.module(g.op(_BINARY, x, 1.5, w, b, [1, 1], [1, 1], [1, 1], 1, "add", None, "relu", [], None))
    with pytest.raises(precheck.GraphWillNotRun, match="Expected a value of type 'Tensor' for argument 'other'"):
        precheck.check_graph(gm, [inputs[0], inputs[2], inputs[3]], WHERE)
