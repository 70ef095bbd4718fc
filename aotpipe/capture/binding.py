"""The real values of every captured graph's inputs: what the writer stores and the checks run.

Export capture describes inputs (parameter names, user input names): their values come from
the model's state and its example inputs. Dynamo capture records them itself
(CapturedGraphs.inputs): a later subgraph's user inputs are activations the model computed;
so does a train_step's (its parameters and optimizer state are the warm start's).
A backward graph's inputs are its forward's saved outputs, then ones for the tangents.
"""

from __future__ import annotations

from typing import Any

from aotpipe.format.graph_keys import graph_key, parse_graph_key
from aotpipe.format.ir import CapturedGraph, CapturedGraphs
from aotpipe.runtime.execution import run_graph
from aotpipe.runtime.tensors import tangent


def graph_inputs(captured: CapturedGraphs, state: dict[str, Any], user: dict[str, Any], *,
                 with_backward: bool = False) -> dict[str, list[Any]]:
    """Each captured graph's real inputs by key; backward graphs only `with_backward`
    (save_values: full stores them; otherwise replay recomputes them from the forward).

    `state` holds the model's parameters, buffers and lifted constants by name
    (eager.model_state), `user` its example inputs by name; a dynamo capture needs neither.
    """
    # Recorded by capture where it saw them (dynamo's subgraphs, a train_step's warm start); the rest bound.
    inputs = {key: list(values) for key, values in captured.inputs.items()}
    inputs.update({key: bind_inputs(g, state, user) for key, g in captured.graphs.items()
                   if g.kind != "backward" and key not in inputs})
    if with_backward:
        for key, g in captured.graphs.items():
            parsed = parse_graph_key(key)
            forward = graph_key("forward", parsed.subgraph) if parsed is not None else None
            if g.kind == "backward" and forward in inputs:
                inputs[key] = backward_inputs(captured, key, inputs[forward])
    return inputs


def bind_inputs(g: CapturedGraph, state: dict[str, Any], user: dict[str, Any]) -> list[Any]:
    """A graph's real inputs: model tensors by target, user inputs by name, loss weights for
    tangents (tensors.tangent)."""
    vals: list[Any] = []
    for gi in g.inputs:
        if gi.role in ("param", "buffer", "constant"):
            vals.append(state[gi.target])
        elif gi.role == "user":
            vals.append(user[gi.target])
        elif gi.role == "tangent" and gi.meta is not None:
            vals.append(tangent(gi.meta.shape, gi.meta.stride, gi.meta.dtype))
        else:
            raise ValueError(f"cannot bind input {gi.name} with role {gi.role}")
    return vals


def backward_inputs(captured: CapturedGraphs, key: str, forward_inputs: list[Any]) -> list[Any]:
    """Backward graph `key`'s real inputs: its forward's saved outputs, then the tangents."""
    parsed = parse_graph_key(key)
    sub = parsed.subgraph if parsed is not None else 0
    contract = captured.contract_of(key)
    if contract is None:
        raise ValueError(f"{key} graph: no partition contract pairs it with a forward graph")
    fw_out = run_graph(captured.graphs[graph_key("forward", sub)].gm, forward_inputs)
    saved = fw_out[contract.num_forward_outputs:]
    bw = captured.graphs[key]
    tangents = [tangent(gi.meta.shape, gi.meta.stride, gi.meta.dtype) for gi in bw.inputs
                if gi.role == "tangent" and gi.meta is not None]
    return list(saved) + tangents
