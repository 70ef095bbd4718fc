"""Reference values at capture: each graph run on real inputs, and compared with eager.

For every captured graph this gives the real input values (parameters, buffers and
constants from the model, the example inputs, ones for the loss tangent, and for the
backward graph the activations the forward graph saved), the graph's outputs on them,
a per-node value trace (for locating a later divergence), and how far the outputs are
from the eager model's own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx
import torch.utils._pytree as pytree

from aotpipe.capture.types import CapturedGraph, CapturedGraphs
from aotpipe.tensors import close, max_abs_error, stats, tolerance

# Seed set before every graph run, at capture and at replay: graphs with random ops
# (dropout) then draw the same numbers every time on the same machine.
RNG_SEED = 0

_RANDOM_OPS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
               "native_dropout", "normal", "uniform", "multinomial", "randperm", "exponential", "poisson"}


def uses_rng(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph draws random numbers."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            if n.target._schema.name.split("::")[-1].rstrip("_") in _RANDOM_OPS:
                return True
    return False


@dataclass
class EagerCheck:
    """One graph output compared with the eager model's value for it."""

    index: int
    what: str
    max_abs_error: float
    within_tolerance: bool
    rtol: float
    atol: float

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "what": self.what,
            "max_abs_error": self.max_abs_error if self.max_abs_error != float("inf") else "inf",
            "within_tolerance": self.within_tolerance,
            "rtol": self.rtol,
            "atol": self.atol,
        }


@dataclass
class GraphValues:
    inputs: list[Any]
    outputs: list[Any]
    trace: dict[str, Optional[dict]]
    eager: list[EagerCheck] = field(default_factory=list)
    eager_skipped: Optional[str] = None


class _TracingInterpreter(torch.fx.Interpreter):
    """Runs a graph node by node, keeping small statistics of each node's value."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.trace: dict[str, Optional[dict]] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        r = super().run_node(n)
        if n.op not in ("output",):
            if isinstance(r, torch.Tensor):
                self.trace[n.name] = stats(r)
            elif isinstance(r, (tuple, list)):
                self.trace[n.name] = {"items": [stats(x) for x in r]}
        return r


def run_traced(gm: torch.fx.GraphModule, inputs: list[Any]) -> tuple[list[Any], dict[str, Optional[dict]]]:
    """The graph's outputs on `inputs` (RNG seeded) and its per-node value trace."""
    interp = _TracingInterpreter(gm)
    torch.manual_seed(RNG_SEED)
    with torch.no_grad():
        out = interp.run(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out], interp.trace


def _state(model: torch.nn.Module, constants: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: b.detach() for n, b in model.named_buffers(remove_duplicate=False)})
    out.update({n: c.detach() for n, c in constants.items()})
    return out


def _bind(g: CapturedGraph, state: dict[str, torch.Tensor], user: dict[str, Any]) -> list[Any]:
    vals: list[Any] = []
    for gi in g.inputs:
        if gi.role in ("param", "buffer", "constant"):
            vals.append(state[gi.target])
        elif gi.role == "user":
            vals.append(user[gi.target])
        elif gi.role == "tangent":
            vals.append(torch.ones(gi.meta.shape, dtype=gi.meta.dtype))
        else:
            raise ValueError(f"cannot bind input {gi.name} with role {gi.role}")
    return vals


def _sum_loss(out: Any) -> torch.Tensor:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    loss = leaves[0].sum()
    for t in leaves[1:]:
        loss = loss + t.sum()
    return loss


def _check(index: int, what: str, actual: Any, expected: Any) -> EagerCheck:
    dt = expected.dtype if isinstance(expected, torch.Tensor) else torch.float64
    rtol, atol = tolerance(dt)
    return EagerCheck(index, what, max_abs_error(actual, expected), close(actual, expected), rtol, atol)


def record_values(
    model: torch.nn.Module, args: tuple, kwargs: dict, captured: CapturedGraphs, user_names: list[str]
) -> dict[str, GraphValues]:
    """Run every captured graph on real inputs and compare it with the eager model."""
    user_values = pytree.tree_leaves((args, kwargs))
    user = dict(zip(user_names, user_values))
    state = _state(model, captured.constants)
    values: dict[str, GraphValues] = {}
    graphs = captured.graphs

    if "inference" in graphs:
        g = graphs["inference"]
        inputs = _bind(g, state, user)
        outs, trace = run_traced(g.gm, inputs)
        gv = GraphValues(inputs, outs, trace)
        eager = copy.deepcopy(model).eval()
        with torch.no_grad():
            # copies: a model may mutate its inputs, and the graphs must see the originals
            e_args, e_kwargs = copy.deepcopy((args, kwargs))
            expected = [t for t in pytree.tree_leaves(eager(*e_args, **e_kwargs)) if isinstance(t, torch.Tensor)]
        eager_state = _state(eager, captured.constants)
        _compare(gv, g, outs, expected, eager_state, grads=None)
        values["inference"] = gv

    training = [k for k in ("joint", "forward", "backward") if k in graphs]
    if not training:
        return values
    eager = copy.deepcopy(model).train()
    eager.zero_grad(set_to_none=True)
    e_args, e_kwargs = copy.deepcopy((args, kwargs))
    loss = _sum_loss(eager(*e_args, **e_kwargs))
    loss.backward()
    eager_grads = {n: p.grad for n, p in eager.named_parameters(remove_duplicate=False)}
    eager_state = _state(eager, captured.constants)
    c = captured.contract

    if "joint" in graphs:
        g = graphs["joint"]
        inputs = _bind(g, state, user)
        outs, trace = run_traced(g.gm, inputs)
        gv = GraphValues(inputs, outs, trace)
        _compare(gv, g, outs, [loss.detach()], eager_state, grads=eager_grads)
        values["joint"] = gv

    if "forward" in graphs or "backward" in graphs:
        fw = graphs.get("forward")
        if fw is None:
            raise ValueError("the backward graph's reference inputs need the forward graph")
        inputs = _bind(fw, state, user)
        fw_outs, fw_trace = run_traced(fw.gm, inputs)
        if "forward" in graphs:
            gv = GraphValues(inputs, fw_outs, fw_trace)
            _compare(gv, fw, fw_outs, [loss.detach()], eager_state, grads=None)
            values["forward"] = gv
        if "backward" in graphs and c is not None:
            bw = graphs["backward"]
            saved = list(fw_outs[c.num_forward_outputs:])
            tangents = [torch.ones(gi.meta.shape, dtype=gi.meta.dtype) for gi in bw.inputs if gi.role == "tangent"]
            bw_inputs = saved + tangents
            bw_outs, bw_trace = run_traced(bw.gm, bw_inputs)
            gv = GraphValues(bw_inputs, bw_outs, bw_trace)
            _compare(gv, bw, bw_outs, [], eager_state, grads=eager_grads)
            values["backward"] = gv
    return values


def _compare(
    gv: GraphValues,
    g: CapturedGraph,
    outs: list[Any],
    expected_user: list[torch.Tensor],
    eager_state: dict[str, torch.Tensor],
    grads: Optional[dict[str, Optional[torch.Tensor]]],
) -> None:
    if uses_rng(g.gm):
        gv.eager_skipped = "the graph draws random numbers (dropout?); eager draws them differently"
        return
    user_i = 0
    for go, actual in zip(g.outputs, outs):
        if go.role == "user":
            if user_i < len(expected_user):
                gv.eager.append(_check(go.index, f"output {user_i}", actual, expected_user[user_i]))
            user_i += 1
        elif go.role == "mutation" and go.target in eager_state:
            gv.eager.append(_check(go.index, f"new value of {go.target}", actual, eager_state[go.target]))
        elif go.role == "grad" and grads is not None and go.target in grads:
            expected = grads[go.target]
            if expected is not None and actual is not None:
                gv.eager.append(_check(go.index, f"gradient of {go.target}", actual, expected))
