"""A second sample of a graph's float32 rounding noise: the graph run with its sums in another order.

The project's rule (aotpipe.runtime.accuracy) scales a backend's allowed error by one sample of float32
noise: eager float32's own error against float64. ATen sums a reduction by cascade (pairwise-
like) summation, whose rounding error grows about as log(n); a compiler may sum the same
reduction in plain sequential order, one accumulator per output element, whose error grows
about as n. Both are valid float32 evaluations of the graph (torch promises no summation
order), and the bench must not call the second one wrong. So the bench takes a second sample:
the loaded graph run in float32 with every sum and mean reduction accumulated sequentially,
left to right along the reduced elements (numpy's ``add.accumulate`` along the leading axis of
the reduced elements laid out as rows: a running sum, one float32 rounding per element). An
output passes the bench when it passes the project's rule with either sample as the scale.

Only ``aten.sum`` and ``aten.mean`` reductions are re-ordered; matrix products, convolutions
and the batch norm's own statistics keep ATen's kernels.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.fx

from aotpipe.runtime.execution import run_graph, runnable

aten = torch.ops.aten

# The dtypes whose sums are re-ordered, and the dtype each is accumulated in: a half type in
# float32, as ATen accumulates it.
_ACCUMULATE = {torch.float32: torch.float32, torch.float64: torch.float64, torch.float16: torch.float32,
               torch.bfloat16: torch.float32}


def sequential_sum(x: torch.Tensor, dims: Optional[Sequence[int]], keepdim: bool = False,
                   dtype: Optional[torch.dtype] = None, mean: bool = False) -> torch.Tensor:
    """``x.sum(dims)`` (or ``.mean``) with each output element accumulated left to right in
    the accumulation dtype, one rounding per element added."""
    out_dtype = dtype or x.dtype
    if x.device.type != "cpu" or out_dtype not in _ACCUMULATE or not x.is_floating_point() or x.dim() == 0:
        return _aten(x, dims, keepdim, dtype, mean)
    nd = x.dim()
    reduced = sorted({d % nd for d in dims}) if dims else list(range(nd))
    kept = [d for d in range(nd) if d not in reduced]
    n = 1
    for d in reduced:
        n *= x.shape[d]
    kept_shape = [x.shape[d] for d in kept]
    if n == 0:
        return _aten(x, dims, keepdim, dtype, mean)
    rows = x.detach().permute(reduced + kept).reshape(n, -1).to(_ACCUMULATE[out_dtype]).numpy()
    total = np.add.accumulate(rows, axis=0, dtype=rows.dtype)[-1]
    out = torch.from_numpy(np.ascontiguousarray(total)).to(out_dtype).reshape(kept_shape)
    if mean:
        out = out / n
    if keepdim:
        out = out.reshape([1 if d in reduced else x.shape[d] for d in range(nd)])
    return out


def _aten(x: torch.Tensor, dims: Optional[Sequence[int]], keepdim: bool, dtype: Optional[torch.dtype],
          mean: bool) -> torch.Tensor:
    op = torch.mean if mean else torch.sum
    return op(x, dim=list(dims) if dims else list(range(x.dim())), keepdim=keepdim, dtype=dtype)


def _sum_dim(x: torch.Tensor, dim: Optional[Sequence[int]] = None, keepdim: bool = False, *,
             dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return sequential_sum(x, dim, keepdim, dtype)


def _sum_all(x: torch.Tensor, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return sequential_sum(x, None, False, dtype)


def _mean_dim(x: torch.Tensor, dim: Optional[Sequence[int]] = None, keepdim: bool = False, *,
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return sequential_sum(x, dim, keepdim, dtype, mean=True)


def _mean_all(x: torch.Tensor, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return sequential_sum(x, None, False, dtype, mean=True)


REORDERED = {aten.sum.dim_IntList: _sum_dim, aten.sum.default: _sum_all, aten.mean.dim: _mean_dim,
             aten.mean.default: _mean_all}


def sequential_twin(gm: torch.fx.GraphModule) -> Optional[torch.fx.GraphModule]:
    """A copy of `gm` (sharing its parameters) whose sum and mean reductions accumulate
    sequentially; None when it has none (its second sample would be eager's own)."""
    if not any(n.op == "call_function" and n.target in REORDERED for n in gm.graph.nodes):
        return None
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        new = g.node_copy(n, lambda a: env[a])
        if n.op == "call_function" and n.target in REORDERED:
            new.target = REORDERED[n.target]
        env[n] = new
    return torch.fx.GraphModule(gm, g)


def sequential_run(gm: Any, inputs: list[Any]) -> Optional[list[Any]]:
    """The graph's outputs with its sums accumulated sequentially (float32 as loaded), run as
    the loaded graph is (its run guard's checked forms, seeded, without autograd); None where
    there is no second sample (no reduction to re-order, not an FX graph, or it does not run)."""
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    try:
        twin = sequential_twin(runnable(gm, inputs))
        return None if twin is None else run_graph(twin, inputs)
    except Exception:
        return None
