"""The list that guards artefacts from elsewhere (tools/allowed_ops.py's rule over torch's
registry) covers every op aotpipe's capture emits, on a corpus nobody on the team wrote:
torch's own OpInfo database (op_db), each operator's first float32 CPU sample captured into
its inference graph and, where it supports autograd, its forward, backward and joint graphs
with its inputs' gradients. A capture that emits an op the rule does not cover fails here.

The quick test holds the 26 ops the issue's run found refused by the old hand-grown list; the
slow one holds every operator of op_db."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils._pytree as pytree

from aotpipe.artifact.ops import op_name, refused_elsewhere
from aotpipe.capture.export import capture_export
from aotpipe.errors import CaptureError


class _Sample(torch.nn.Module):
    """One OpInfo sample as a model: its tensors are the inputs, the rest is baked in."""

    def __init__(self, op, spec, leaves):
        super().__init__()
        self.op, self.spec, self.leaves = op, spec, leaves

    def forward(self, *tensors):
        given = iter(tensors)
        args, kwargs = pytree.tree_unflatten([next(given) if isinstance(v, torch.Tensor) else v
                                              for v in self.leaves], self.spec)
        return self.op(*args, **kwargs)


def _entries(names=None):
    from torch.testing._internal.common_methods_invocations import op_db

    for info in op_db:
        full = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if names is not None and full not in names:
            continue
        if torch.float32 in info.supported_dtypes("cpu"):
            yield full, info


def _captured_ops(info):
    """The ops of the sample's captured graphs; None where torch cannot sample or capture it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sample = list(info.sample_inputs("cpu", torch.float32, requires_grad=info.supports_autograd))[0]
        except Exception:
            return None
        leaves, spec = pytree.tree_flatten(((sample.input, *sample.args), sample.kwargs))
        tensors = tuple(v for v in leaves if isinstance(v, torch.Tensor))
        grad = info.supports_autograd and any(t.requires_grad for t in tensors)
        graphs = ["inference", "forward", "backward", "joint"] if grad else ["inference"]
        try:
            captured = capture_export(_Sample(info.op, spec, leaves), tensors, {}, name="op", graphs=graphs,
                                      input_names=[])
        except (CaptureError, Exception):
            return None
    return {op_name(n.target) or str(n.target) for g in captured.graphs.values() for n in g.gm.graph.nodes
            if n.op == "call_function"}


# The operators whose graphs the hand-grown list refused (issue 35's run), by op_db name.
ONCE_REFUSED = ("nn.functional.avg_pool3d", "nn.functional.adaptive_avg_pool3d", "nn.functional.bilinear",
                "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "median", "mode",
                "cummin", "logcumsumexp", "masked_select", "polygamma.polygamma_n_0", "index_reduce.prod",
                "linalg.svd", "linalg.qr", "linalg.lu_factor_ex", "linalg.lu_solve", "lu_unpack", "cholesky_solve",
                "linalg.solve_triangular", "linalg.pinv")


def test_the_ops_the_old_list_refused_are_covered_by_the_rule():
    captured, outside = 0, {}
    for name, info in _entries(set(ONCE_REFUSED)):
        ops = _captured_ops(info)
        if ops is None:
            continue
        captured += 1
        if refused_elsewhere(ops):
            outside[name] = refused_elsewhere(ops)
    assert captured >= len(ONCE_REFUSED) - 2, captured  # the corpus is really captured
    assert not outside, outside


def test_the_check_would_see_an_op_outside_the_rule(monkeypatch):
    # Planted: the rule loses an op every cummin graph holds.
    from aotpipe.artifact import ops

    (_, info), = _entries({"cummin"})
    got = _captured_ops(info)
    assert "aten.cummin.default" in got
    shrunk = ops.listed() - {"aten.cummin.default"}
    monkeypatch.setattr(ops, "listed", lambda: shrunk)
    ops._resolve.cache_clear()
    try:
        assert refused_elsewhere(got) == ["aten.cummin.default"]
    finally:
        ops._resolve.cache_clear()


@pytest.mark.slow
def test_every_op_db_capture_emits_only_ops_the_rule_covers():
    captured, outside = 0, {}
    for name, info in _entries():
        ops = _captured_ops(info)
        if ops is None:
            continue
        captured += 1
        if refused_elsewhere(ops):
            outside[name] = refused_elsewhere(ops)
    assert captured > 400, captured
    assert not outside, outside
