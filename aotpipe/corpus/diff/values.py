"""Two artefacts' graphs run on the same inputs, node by node: the first aligned node whose
value departs.

Each side runs with its own parameters, buffers and constants (a changed weight is what
such a comparison exists to find) and A's user inputs and tangents where B's have the same
layout; a backward's saved activations come from its own forward run on those inputs. Every
node's value is summarised as replay's node-by-node check does it (the float64 sums of a
strided sample of its elements, :func:`aotpipe.runtime.accuracy.sampled_summary`), and the nodes the
structural diff aligned are compared in A's order.

This runs graphs: the caller decides where (this process for artefacts the user trusts, a
sandboxed worker otherwise, as ``aotpipe replay`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pydantic
import torch
from pydantic import BaseModel, ConfigDict

from aotpipe.artifact.load import load
from aotpipe.corpus.diff.model import ValuesComparison
from aotpipe.errors import SandboxError, exception_line
from aotpipe.format.records import RawJson, updated
from aotpipe.runtime import accuracy
from aotpipe.runtime.execution import run_with_summaries
from aotpipe.trust.sandbox.launch import run_task

# How far two aligned nodes' sampled sums may lie apart (relative to A's absolute sum)
# before the node counts as diverging: a little over float32 noise from another order of
# summation, so two pass chains that compute the same function do not diverge.
RTOL = 1e-5


def _departs(a: Any, b: Any, rtol: float) -> Optional[str]:
    """How two aligned nodes' summaries depart (records.Summary, or a tuple of them for a
    tuple value), said as A against B; None if they agree or either has none."""
    if a is None or b is None:
        return None
    if isinstance(a, tuple) or isinstance(b, tuple):
        for i, (x, y) in enumerate(zip(a if isinstance(a, tuple) else (), b if isinstance(b, tuple) else ())):
            why = _departs(x, y, rtol)
            if why:
                return f"item {i}: {why}"
        return None
    why = accuracy.summary_departs(b, a, rtol, layout=("dtype", "shape"))  # the rule replay uses, A as reference
    if why is None:
        return None
    key = why.split()[0]  # the field that departs, said here as A against B
    if key in ("dtype", "shape"):
        return f"{key} {getattr(a, key)} in A, {getattr(b, key)} in B"
    if key in ("sum", "abs_sum"):
        what = "sum" if key == "sum" else "absolute sum"
        return f"{what} of its sampled elements {getattr(a, key):.9g} in A, {getattr(b, key):.9g} in B"
    return f"{a.nonfinite} non-finite values in A, {b.nonfinite} in B"


def _same_layout(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return x.shape == y.shape and x.dtype == y.dtype
    return type(x) is type(y)


def compare_values(a_path: str, b_path: str, aligned: dict[str, dict[str, str]], rtol: float = RTOL,
                   trust_ops: tuple[str, ...] = ()) -> dict[str, ValuesComparison]:
    """Per graph key both artefacts have (in `aligned`: A's node name -> B's), how their
    values compare."""
    art_a, art_b = load(a_path, trust_ops=trust_ops), load(b_path, trust_ops=trust_ops)
    outputs: dict[tuple[str, str], list[Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for key, ga in art_a.graphs.items():
        if key not in aligned or key not in art_b.graphs:
            continue
        gb = art_b.graphs[key]
        if not (ga.has_saved_values and gb.has_saved_values):
            out[key] = ValuesComparison(status="skipped", reason="no saved inputs (the model ran with save_inputs: false)")
            continue
        try:
            ups = ga.upstream.name if ga.upstream is not None else None
            if ups is not None and ((("a", ups) not in outputs) or (("b", ups) not in outputs)):
                out[key] = ValuesComparison(status="skipped", reason=f"its forward ({ups}) did not run in both")
                continue
            va = ga.saved_inputs(outputs.get(("a", ups)) if ups else None)
            vb = gb.saved_inputs(outputs.get(("b", ups)) if ups else None)
            if len(va) != len(vb):
                out[key] = ValuesComparison(status="skipped", reason=f"{len(va)} inputs in A, {len(vb)} in B")
                continue
            for i, (ra, rb) in enumerate(zip(ga.record.inputs, gb.record.inputs)):
                if rb.role in ("user", "tangent") and ra.role == rb.role and _same_layout(va[i], vb[i]):
                    vb[i] = va[i]
            outs_a, sums_a = run_with_summaries(ga.module, va, accuracy.sampled_summary)
            outs_b, sums_b = run_with_summaries(gb.module, vb, accuracy.sampled_summary)
        except Exception as e:  # a graph that cannot run here: said, and the others still compared
            out[key] = ValuesComparison(status="skipped", reason=f"running the graphs failed ({exception_line(e)})")
            continue
        if ga.kind == "forward":
            outputs[("a", key)], outputs[("b", key)] = outs_a, outs_b
        pairs = aligned[key]
        result = ValuesComparison(status="same", compared=0)
        for node in ga.module.graph.nodes:
            if node.op != "call_function" or node.name not in pairs:
                continue
            b_name = pairs[node.name]
            if node.name not in sums_a or b_name not in sums_b:
                continue
            result.compared = (result.compared or 0) + 1
            why = _departs(sums_a[node.name], sums_b[b_name], rtol)
            if why:
                result = updated(result, status="diverged", a_node=node.name, b_node=b_name, why=why)
                break
        out[key] = result
    return out


class ValuesTask(BaseModel):
    """The sandboxed worker's arguments for :func:`values_task`."""

    model_config = ConfigDict(extra="forbid")

    a: str
    b: str
    aligned: dict[str, dict[str, str]]
    rtol: float
    trust_ops: list[str]


def values_task(args: RawJson, worker: Any) -> dict[str, Any]:
    """The sandboxed worker's task: :func:`compare_values` as JSON."""
    t = ValuesTask.model_validate(args)
    return {k: v.model_dump() for k, v in compare_values(t.a, t.b, t.aligned, t.rtol, tuple(t.trust_ops)).items()}


def compare_values_sandboxed(a_path: str, b_path: str, aligned: dict[str, dict[str, str]], rtol: float = RTOL,
                             trust_ops: tuple[str, ...] = ()) -> dict[str, ValuesComparison]:
    """:func:`compare_values` in a sandboxed worker (no network, read-only filesystem,
    memory and CPU limits): for artefacts the user has not said they trust."""
    a, b = str(Path(a_path).resolve()), str(Path(b_path).resolve())
    result = run_task("aotpipe.corpus.diff.values:values_task",
                      ValuesTask(a=a, b=b, aligned=aligned, rtol=rtol, trust_ops=list(trust_ops)).model_dump(),
                      read_paths=[a, b])
    try:
        return pydantic.TypeAdapter(dict[str, ValuesComparison]).validate_python(result)
    except ValueError:  # pydantic's ValidationError is a ValueError

        raise SandboxError("the sandboxed worker sent back a malformed diff result", "malformed") from None
