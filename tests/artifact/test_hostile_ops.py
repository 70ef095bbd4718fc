"""Allow-listed ops called with hostile shapes, strides and auxiliary sizes: what the
loader's path admits (graph.json data, the allow-list, the fake-tensor precheck, the
checked forms) must stay within its storages when its kernel runs.

The sweep (tests/artifact/hostile_calls.py) runs each case in guarded memory, in forked
children, so that a fault is a finding, not a dead test run; a read past a storage shows
as a fault at a guard page or as results that change with the bytes there.
"""

import pytest
import torch

from aotpipe.artifact.ops import allowed_ops, resolve_op
from tests.artifact.hostile_calls import FAILURES, cases, load_calls, make, sweep

THE_THREE = ("aten._batch_norm_with_update_functional.default", "aten._batch_norm_no_update.default",
             "aten._scaled_dot_product_flash_attention_for_cpu.default")

# Allow-listed ops of two or more tensor arguments that have no base call in the sweep
# because no call of them runs on CPU: by rule (:func:`_no_cpu_kernel`), and these by hand,
# whose CPU kernel exists but only raises.
UNCOVERED = {
    "aten._philox_normal.default": "its CompositeExplicitAutograd kernel calls _philox_normal_, which has no CPU "
                                   "kernel (NotImplementedError)",
    "aten._philox_uniform.default": "its CompositeExplicitAutograd kernel calls _philox_uniform_, which has no CPU "
                                    "kernel (NotImplementedError)",
    "aten._scaled_dot_product_fused_attention_overrideable.default":
        "its CompositeExplicitAutograd kernel only raises: it is for out-of-tree (privateuse1) backends",
    "aten._scaled_dot_product_fused_attention_overrideable_backward.default":
        "its CompositeExplicitAutograd kernel only raises: it is for out-of-tree (privateuse1) backends",
    "aten.convolution_overrideable.default":
        "its CompositeExplicitAutograd kernel only raises: it is for out-of-tree (privateuse1) backends",
    "aten.convolution_backward_overrideable.default":
        "its CompositeExplicitAutograd kernel only raises: it is for out-of-tree (privateuse1) backends",
    "rngprims.philox_rand.default": "not on CPU (cpu does not use Philox RNG)",
}

# The dispatch keys a CPU tensor's call can end at: a kernel under none of them means the op
# raises NotImplementedError on CPU in this torch (its kernels are CUDA's, or a nested or
# sparse tensor's), so the sweep has nothing to run.
CPU_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd")


def _no_cpu_kernel(name):
    """Why the op `name` ("aten.mm.dtype") has no base call (no kernel a CPU call reaches), or None."""
    ns, op, overload = name.split(".")
    full = f"{ns}::{op}" + ("" if overload == "default" else f".{overload}")
    if any(torch._C._dispatch_has_kernel_for_dispatch_key(full, key) for key in CPU_KEYS):
        return None
    return f"no CPU kernel in this torch (no {', '.join(CPU_KEYS)} kernel: NotImplementedError)"


def uncovered(names):
    """Of the op names `names`, those the sweep has no base call for, each with why."""
    return {name: UNCOVERED.get(name) or _no_cpu_kernel(name) for name in names
            if name in UNCOVERED or _no_cpu_kernel(name)}


def _outcomes(path, results):
    calls = load_calls(str(path))
    return calls, [(case, results[case.index]) for case in cases(calls) if case.index in results]


def _failures(path, results):
    calls, outcomes = _outcomes(path, results)
    return [f"{case.describe(calls)}: {r['outcome']}, {r['detail']}" for case, r in outcomes
            if r["outcome"] in FAILURES]


@pytest.fixture(scope="module")
def quick_calls(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "calls.pt"
    make(path, hand_only=True)
    return path


def test_the_red_teams_three_and_their_siblings_stay_within_their_storages(quick_calls):
    results = sweep(quick_calls)
    calls, outcomes = _outcomes(quick_calls, results)
    assert len(outcomes) == len(cases(calls)) > 250
    assert not _failures(quick_calls, results), "\n".join(_failures(quick_calls, results))
    refused = {calls[case.call][0] for case, r in outcomes if r["outcome"] == "refused at run"}
    ran = {calls[case.call][0] for case, r in outcomes if r["outcome"] == "ran" and case.leaf is None}
    assert set(THE_THREE) <= refused and set(THE_THREE) <= ran  # hostile calls refused, honest ones run


def test_without_their_checked_forms_the_sweep_finds_the_red_teams_three(quick_calls):
    # Planted fault: the three ops' checked forms taken out of the worker.
    results = sweep(quick_calls, without=THE_THREE, ops=THE_THREE)
    calls, outcomes = _outcomes(quick_calls, results)
    found = {calls[case.call][0] for case, r in outcomes if r["outcome"] in FAILURES}
    assert found == set(THE_THREE), "\n".join(_failures(quick_calls, results))
    flash = [f for f in _failures(quick_calls, results) if f.startswith(THE_THREE[2] + ", key: one element expanded")]
    assert flash and "killed by SIGSEGV" in flash[0]  # the red team's: key expanded from a 4-byte buffer


def _multi_tensor_ops():
    """Allow-listed ops with two or more tensor arguments (a statistic, weight, index, mask...)."""
    out = set()
    for name in allowed_ops():
        op = resolve_op(name)
        if isinstance(op, torch._ops.OpOverload) and sum("Tensor" in str(a.type) for a in op._schema.arguments) >= 2:
            out.add(name)
    return out


@pytest.mark.slow
def test_no_call_the_checks_admit_reaches_past_its_storages(tmp_path):
    path = tmp_path / "calls.pt"
    counts = make(path, hand_only=False)
    calls = load_calls(str(path))
    swept = {c[0] for c in calls}
    multi = _multi_tensor_ops()
    missing = multi - swept - set(uncovered(multi))
    assert not missing, sorted(missing)
    assert not swept & set(uncovered(multi)), sorted(swept & set(uncovered(multi)))  # said uncovered, yet swept
    assert {"aten.scaled_dot_product_attention.default", *THE_THREE} <= swept
    results = sweep(path)
    assert len(results) == counts["cases"]
    failures = _failures(path, results)
    assert not failures, f"{len(failures)} of {counts['cases']} cases:\n" + "\n".join(failures)
