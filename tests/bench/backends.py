"""Planted backends for the bench's tests: each breaks one thing a real backend might."""

from __future__ import annotations

import ctypes
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


def hang_on_relu_backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Never returns when the graph holds relu's backward (aten.le.Scalar)."""
    if aten.le.Scalar in _ops(gm):
        time.sleep(3600)
    return gm.forward


def fails_to_compile(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Raises while compiling, as a backend that cannot lower an op does."""
    raise NotImplementedError("no lowering for this graph")


NOT_CALLABLE = 42
