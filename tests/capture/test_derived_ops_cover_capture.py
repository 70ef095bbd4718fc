"""The list that guards artefacts from elsewhere (tools/allowed_ops.py's rule over torch's
registry) covers every op aotpipe's capture emits, on a corpus nobody on the team wrote:
torch's own OpInfo database (op_db), each operator's first float32 CPU sample captured into
its inference graph and, where it supports autograd, its forward, backward and joint graphs
with its inputs' gradients. A capture that emits an op the rule does not cover fails here.

The quick test holds the 26 ops the issue's run found refused by the old hand-grown list; the
slow one holds every operator of op_db."""

from __future__ import annotations

import pytest

from aotpipe.artifact.ops import refused_elsewhere
from tests.capture.opdb_capture import captured_ops, entries, run_all


# The operators whose graphs the hand-grown list refused (issue 35's run), by op_db name.
ONCE_REFUSED = ("nn.functional.avg_pool3d", "nn.functional.adaptive_avg_pool3d", "nn.functional.bilinear",
                "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "median", "mode",
                "cummin", "logcumsumexp", "masked_select", "polygamma.polygamma_n_0", "index_reduce.prod",
                "linalg.svd", "linalg.qr", "linalg.lu_factor_ex", "linalg.lu_solve", "lu_unpack", "cholesky_solve",
                "linalg.solve_triangular", "linalg.pinv")


def test_the_ops_the_old_list_refused_are_covered_by_the_rule():
    captured, outside = 0, {}
    for name, info in entries(set(ONCE_REFUSED)):
        ops = captured_ops(info)
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

    (_, info), = entries({"cummin"})
    got = captured_ops(info)
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
    results = run_all()
    captured = {name: ops for name, ops in results.items() if isinstance(ops, list)}
    outside = {name: [op for op in refused_elsewhere(ops) if not _refused_by_design(op)]
               for name, ops in captured.items()}
    assert len(captured) > 600, (len(captured), len(results))
    assert not {name: ops for name, ops in outside.items() if ops}, outside


def _refused_by_design(name):
    """An op the list refuses on purpose: one of a DENIED category (``resize_as_`` captures
    ``aten.resize``), or of a library namespace, which capture itself refuses unless the
    pipeline trusts it (custom_ops.trust): never in an artefact unnoticed."""
    from aotpipe.artifact import ops

    ns, _, rest = name.partition(".")
    if ns not in ops.ALLOWED_NAMESPACES:
        return True
    op, _, overload = rest.partition(".")
    return ops._denied(op, overload) is not None
