"""Constants a recorded pass chain makes, recomputed from the base graph when an artefact is loaded.

With ``save_values: minimal`` an artefact does not store the constants its passes made
(folded weights): the loader recomputes them by running the manifest's chain again on the
base graph as saved (:func:`recompute_constants`), so they are not stored twice.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.artifact.blobs import encode
from aotpipe.artifact.graph_json import decode_dtype
from aotpipe.format.ir import GraphInput, GraphOutput, TensorMeta
from aotpipe.passes import PASSES, parse_pass_entry
from aotpipe.passes.base import GraphUnderPass
from aotpipe.passes.manager import run_chain
from aotpipe.runtime.execution import run_with_summaries


def recompute_constants(module: torch.fx.GraphModule, record: Any, values: list[Any],
                        steps: list[Any]) -> dict[str, torch.Tensor]:
    """The constants a recorded pass chain makes from a saved graph, by their blob digest.

    What the loader uses for constants an artefact does not store (save_values: minimal):
    folded weights are recomputed from the stored ones, not stored twice. `module` and
    `record` are the base graph and its inputs.json (a records.InputsRecord), `values` its
    saved inputs, `steps` the manifest's records.PassStep list.
    """
    chain = [parse_pass_entry({s.name: s.options})[1] for s in steps]
    # Only through the last pass that makes constants: the rest cannot change them.
    chain = chain[:1 + max((i for i, st in enumerate(chain) if PASSES[st.name].makes_constants), default=-1)]
    final, _ = run_chain(graph_under_pass(module, record, values), chain, check_each=False)
    out = {}
    for node in final.gm.graph.nodes:
        if node.op == "get_attr":
            value = final.gm.get_buffer(node.target) if "." in node.target else getattr(final.gm, node.target)
            out[encode(value.reshape(-1))[0]] = value
    return out


def graph_under_pass(module: torch.fx.GraphModule, record: Any, values: list[Any]) -> GraphUnderPass:
    """A saved graph as passes take it: a copy of `module` with node values' layouts, its
    inputs and outputs described from `record` (inputs.json, a records.InputsRecord), and
    its saved input `values`."""
    def meta(r: Any) -> Optional[TensorMeta]:
        if r.shape is None or r.dtype is None or r.stride is None:
            return None
        return TensorMeta(tuple(r.shape), tuple(r.stride), decode_dtype(r.dtype), torch.device(r.device or "cpu"),
                          r.storage_offset or 0, bool(r.requires_grad),
                          tuple(r.sym_shape) if r.sym_shape else None, tuple(r.sym_stride) if r.sym_stride else None)

    scalar = {"int": int, "float": float, "bool": bool}
    inputs = [GraphInput(r.name, r.role, r.target, meta(r) if r.type == "tensor" else None, scalar.get(r.type),
                         tuple(r.range) if r.range else None) for r in record.inputs]
    outputs = [GraphOutput(r.index, r.role, r.target, meta(r)) for r in record.outputs]
    gm = copy.deepcopy(module)
    _restore_meta(gm, values)
    return GraphUnderPass(gm, record.kind, inputs, outputs, list(values))


def _restore_meta(gm: torch.fx.GraphModule, values: list[Any]) -> None:
    """node.meta["val"] as meta tensors of each node's real layout (graph.json keeps none;
    passes read shapes from it). Not fake tensors: FakeTensorMode imports torch._inductor."""
    def as_meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    _, vals = run_with_summaries(gm, values, as_meta)
    for n in gm.graph.nodes:
        v = vals.get(n.name)
        if v is not None:
            n.meta["val"] = v  # a meta tensor, or a tuple of them (None for non-tensors)
