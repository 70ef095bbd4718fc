"""Planted backends for the bench's tests: each breaks one thing a real backend might."""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import sys
import time
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten


def _ops(gm: torch.fx.GraphModule) -> set[Any]:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def gelu_as_relu(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Computes every gelu as relu."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.gelu.default:
            n.target, n.kwargs = aten.relu.default, {}
    gm.recompile()
    return gm.forward


def first_add_off(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Adds 1e-2 to the result of the graph's first aten.add.Tensor."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.add.Tensor:
            with gm.graph.inserting_after(n):
                off = gm.graph.call_function(aten.add.Tensor, (n, 1e-2))
            n.replace_all_uses_with(off, delete_user_cb=lambda u: u is not off)
            break
    gm.recompile()
    return gm.forward


def segfault_on_relu_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Dereferences a null pointer when the graph holds relu's backward (aten.le.Scalar)."""
    if aten.le.Scalar in _ops(gm):
        ctypes.string_at(0)
    return gm.forward


def exits_on_relu_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Says why on stderr and ends its process with status 3, as a backend that calls exit() does,
    when the graph holds relu's backward (aten.le.Scalar)."""
    if aten.le.Scalar in _ops(gm):
        sys.stderr.write("backend: cannot go on\n")
        sys.stderr.flush()
        os._exit(3)
    return gm.forward


def hang_on_relu_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Never returns when the graph holds relu's backward (aten.le.Scalar)."""
    if aten.le.Scalar in _ops(gm):
        time.sleep(3600)
    return gm.forward


def fails_to_compile(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Raises while compiling, as a backend that cannot lower an op does."""
    raise NotImplementedError("no lowering for this graph")


NOT_CALLABLE = 42


def sums_sequential(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Sums every sum and mean reduction left to right in float32, one accumulator per output
    element: what inductor's outer reductions do where its layout optimization made a
    training graph's convolutions channels-last (a valid order, less accurate than ATen's)."""
    from aotpipe.corpus.bench.noise import REORDERED

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in REORDERED:
            n.target = REORDERED[n.target]
    gm.recompile()
    return gm.forward


def _output_off(gm: torch.fx.GraphModule, index: int, rel: float) -> Any:
    """Multiplies the graph's output `index` by (1 + rel)."""
    out = gm.graph.output_node()
    values = list(out.args[0])
    with gm.graph.inserting_before(out):
        values[index] = gm.graph.call_function(aten.mul.Tensor, (values[index], 1.0 + rel))
    out.args = (type(out.args[0])(values),)
    gm.recompile()
    return gm.forward


# small_cnn's joint graph returns its gradients as outputs 7 (conv1.weight), 8 (bn1.weight),
# 10 (conv2.weight) and 13 (fc.weight).
def bn1_weight_grad_off_1e_4(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An extra 1e-4 relative error on the batch norm's weight gradient (a sum over 8192 terms)."""
    return _output_off(gm, 8, 1e-4)


def conv2_weight_grad_off_1e_4(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An extra 1e-4 relative error on conv2's weight gradient."""
    return _output_off(gm, 10, 1e-4)


def fc_weight_grad_off_1e_4(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An extra 1e-4 relative error on the linear layer's weight gradient (a matrix product)."""
    return _output_off(gm, 13, 1e-4)


def sums_sequential_and_conv2_weight_grad_off_1e_4(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """sums_sequential, plus an extra 1e-4 relative error on conv2's weight gradient."""
    sums_sequential(gm, example_inputs)
    return _output_off(gm, 10, 1e-4)


def conv_bias_grad_plus_1e_2(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Adds 1e-2 to the graph's output 1: in tests/bench/test_zero_values.py's conv -> batch norm
    backward, the conv's bias gradient, zero in exact arithmetic (eager float32 is off by about
    2e-4 RMS there: the bound is 10x that)."""
    out = gm.graph.output_node()
    values = list(out.args[0])
    with gm.graph.inserting_before(out):
        values[1] = gm.graph.call_function(aten.add.Tensor, (values[1], 1e-2))
    out.args = (type(out.args[0])(values),)
    gm.recompile()
    return gm.forward


def _first_scaled(gm: torch.fx.GraphModule, target: Any, factor: float) -> Any:
    """Multiplies the result of the graph's first `target` node by `factor`."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is target:
            with gm.graph.inserting_after(n):
                off = gm.graph.call_function(aten.mul.Tensor, (n, factor))
            n.replace_all_uses_with(off, delete_user_cb=lambda u: u is not off)
            break
    gm.recompile()
    return gm.forward


def first_mul_doubled(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Doubles the result of the graph's first aten.mul.Tensor (100% off, whatever its scale)."""
    return _first_scaled(gm, aten.mul.Tensor, 2.0)


def first_mul_off_2e_5(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An extra 2e-5 relative error on the graph's first aten.mul.Tensor: twice the float32 floor."""
    return _first_scaled(gm, aten.mul.Tensor, 1.0 + 2e-5)


def first_mul_off_5e_6(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """An extra 5e-6 relative error on the graph's first aten.mul.Tensor: half the float32 floor."""
    return _first_scaled(gm, aten.mul.Tensor, 1.0 + 5e-6)


def fewer_outputs(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Returns the graph's outputs but the last (a backend that drops an output)."""
    out = gm.graph.output_node()
    values = out.args[0]
    if isinstance(values, (tuple, list)) and len(values) > 1:
        out.args = (type(values)(values[:-1]),)
        gm.recompile()
    return gm.forward


def first_relu_doubled(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Doubles the result of the graph's first relu."""
    return _first_scaled(gm, aten.relu.default, 2.0)


def specialises_sizes(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Reads every size of its inputs as a number, as a backend that compiles only static shapes
    does: each symbolic size is then guarded to its value, so dynamo recompiles at every new one."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            [int(s) for s in x.shape]
        elif isinstance(x, torch.SymInt):
            int(x)
    return gm.forward


def relu_of_addmm_doubled(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Doubles a relu whose input an addmm of the same graph computes (a fault of a fused pair:
    the relu alone, on any input, is right)."""
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is aten.relu.default and isinstance(n.args[0], torch.fx.Node) \
                and n.args[0].target is aten.addmm.default:
            with gm.graph.inserting_after(n):
                off = gm.graph.call_function(aten.mul.Tensor, (n, 2.0))
            n.replace_all_uses_with(off, delete_user_cb=functools.partial(operator.is_not, off))
    gm.recompile()
    return gm.forward


def gelu_as_relu_and_segfault_on_relu_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Two bugs at once: every gelu computed as relu, and a crash on a graph holding relu's backward."""
    segfault_on_relu_backward(gm, example_inputs)
    return gelu_as_relu(gm, example_inputs)


def off_from_1024_elements(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Adds 1 to every output when the graph's first input holds 1024 elements or more (a kernel
    wrong only past a size: shrinking must stop just inside it)."""
    first = example_inputs[0] if example_inputs else None
    if not (isinstance(first, torch.Tensor) and first.numel() >= 1024):
        return gm.forward

    def run(*args: Any) -> Any:
        return tuple(o + 1 if isinstance(o, torch.Tensor) else o for o in gm.forward(*args))
    return run


def segfault_on_erf(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Dereferences a null pointer when the graph holds an erf (gelu's backward, decomposed, in a
    transformer's joint graph)."""
    if aten.erf.default in _ops(gm):
        ctypes.string_at(0)
    return gm.forward
