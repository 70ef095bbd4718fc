"""torch's own linear-cross-entropy custom ops (torch_nn::_linear_cross_entropy_batch_chunked and
its reduction='none' twin, which F.linear_cross_entropy calls when given options) decomposed
into ATen at capture: the same loss, the same precomputed gradient outputs, the same gradients."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.linear_cross_entropy  # noqa: F401  (registers the torch_nn ops)
from click.testing import CliRunner
from torch.utils._python_dispatch import TorchDispatchMode

from aotpipe.capture import capture_export
from aotpipe.capture.custom_ops import DECOMPOSITIONS, library_ops
from aotpipe.cli import main
from aotpipe.models.eager import model_loss

REDUCED = "torch_nn::_linear_cross_entropy_batch_chunked"
UNREDUCED = "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction"
N, IN, C = 7, 5, 4


def _operands(bias: bool, class_weight: bool, ignore_index: int, seed: int = 0):
    """input [N, IN], linear_weight [C, IN], targets with ignore_index in rows 0, 3 and 6,
    bias [C] or None, class weights [C] or None."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, IN, generator=g, requires_grad=True)
    w = torch.randn(C, IN, generator=g, requires_grad=True)
    t = torch.randint(0, C, (N,), generator=g)
    t[::3] = ignore_index
    b = torch.randn(C, generator=g, requires_grad=True) if bias else None
    cw = torch.rand(C, generator=g) + 0.5 if class_weight else None
    return x, w, t, b, cw


def _reduced_args(x, w, t, b, cw, reduction, ignore_index, label_smoothing=0.0):
    # (..., batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_*_grad)
    return (x, w, t, b, cw, reduction, ignore_index, label_smoothing, 3, "compact", torch.float32, True,
            True, True, b is not None)


def _outputs_and_gradients(fn, args, differentiable):
    """fn's outputs, detached, and the gradients of a random weighting of all of them (the
    gradient outputs included: torch's op ignores their gradient, so must the decomposition)."""
    outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator().manual_seed(1)
    total = sum((o * torch.rand(o.shape, generator=g)).sum() for o in outs)
    return [o.detach() for o in outs], torch.autograd.grad(total, differentiable)


IGNORE = [-100, 1, 9]  # the default, a class in [0, C), and one outside it


@pytest.mark.parametrize("ignore_index", IGNORE)
@pytest.mark.parametrize("class_weight", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_reduced_op_s_decomposition_gives_torch_s_loss_gradient_outputs_and_gradients(
        reduction, bias, class_weight, ignore_index):
    x, w, t, b, cw = _operands(bias, class_weight, ignore_index)
    args = _reduced_args(x, w, t, b, cw, reduction, ignore_index)
    wrt = [x, w] + ([b] if bias else [])
    want, want_grads = _outputs_and_gradients(torch.ops.torch_nn._linear_cross_entropy_batch_chunked, args, wrt)
    got, got_grads = _outputs_and_gradients(DECOMPOSITIONS[REDUCED], args, wrt)
    assert len(got) == len(want) == 4
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    for a, e in zip(got_grads, want_grads):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("ignore_index", IGNORE)
@pytest.mark.parametrize("class_weight", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_the_unreduced_op_s_decomposition_gives_torch_s_per_row_loss_and_gradients(bias, class_weight, ignore_index):
    x, w, t, b, cw = _operands(bias, class_weight, ignore_index)
    args = (x, w, t, b, cw, ignore_index, 3, "compact", torch.float32)
    wrt = [x, w] + ([b] if bias else [])
    (want,), want_grads = _outputs_and_gradients(
        torch.ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction, args, wrt)
    (got,), got_grads = _outputs_and_gradients(DECOMPOSITIONS[UNREDUCED], args, wrt)
    assert got.shape == (N,) and (got[::3] == 0).all()  # ignored rows lose nothing
    torch.testing.assert_close(got, want)
    for a, e in zip(got_grads, want_grads):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_come_back_in_their_dtype_as_close_to_float64_as_torch_s_op(dtype):
    # The op and the decomposition round at different places: judge both against float64 (the
    # decomposition's own, checked above against the op in float32), the way torch's benchmark
    # runners judge a compiled model: no worse than twice the op's own error, plus an ulp.
    def cast(to):
        return [a.detach().to(to).requires_grad_(a.requires_grad) if a is not None and a.is_floating_point()
                else a for a in _operands(True, True, 1)]

    (x, w, t, b, cw), (x64, w64, t64, b64, cw64) = cast(dtype), cast(torch.float64)
    cases = [(REDUCED, _reduced_args(x, w, t, b, cw, "mean", 1), _reduced_args(x64, w64, t64, b64, cw64, "mean", 1)),
             (UNREDUCED, (x, w, t, b, cw, 1, 3, "accurate", torch.float32),
              (x64, w64, t64, b64, cw64, 1, 3, "accurate", torch.float64))]
    for op, args, args64 in cases:
        torch_op = getattr(torch.ops.torch_nn, op.split("::")[1])
        want, want_grads = _outputs_and_gradients(torch_op, args, [x, w, b])
        got, got_grads = _outputs_and_gradients(DECOMPOSITIONS[op], args, [x, w, b])
        exact, exact_grads = _outputs_and_gradients(DECOMPOSITIONS[op], args64, [x64, w64, b64])
        assert [o.dtype for o in got] == [o.dtype for o in want] == [dtype] * len(want)
        for a, e, r in zip([*got, *got_grads], [*want, *want_grads], [*exact, *exact_grads]):
            error = (a.double() - r).abs().max()
            assert error <= 2 * (e.double() - r).abs().max() + torch.finfo(dtype).eps * r.abs().max(), (op, error)


def test_gradient_outputs_the_op_was_not_asked_for_are_empty_as_torch_s_are():
    x, w, t, b, cw = _operands(True, False, -100)
    args = (x, w, t, b, cw, "sum", -100, 0.0, 3, "compact", torch.float32, True, False, False, False)
    want = torch.ops.torch_nn._linear_cross_entropy_batch_chunked(*args)
    got = DECOMPOSITIONS[REDUCED](*args)
    assert [(o.shape, o.dtype) for o in got] == [(o.shape, o.dtype) for o in want]
    assert [o.shape for o in got[1:]] == [(0, 0), (0, 0), (0,)]
    torch.testing.assert_close(got[0], want[0].detach())


def test_a_mean_over_only_ignored_rows_is_nan_as_torch_s():
    x, w, t, b, cw = _operands(False, True, 1)
    t.fill_(1)
    args = _reduced_args(x, w, t, b, cw, "mean", 1)
    want = torch.ops.torch_nn._linear_cross_entropy_batch_chunked(*args)
    got = DECOMPOSITIONS[REDUCED](*args)
    assert want[0].isnan() and got[0].isnan() and got[1].isnan().all() and want[1].isnan().all()


def test_label_smoothing_is_refused_as_torch_s_op_refuses_it():
    x, w, t, b, cw = _operands(False, False, -100)
    args = _reduced_args(x, w, t, b, cw, "mean", -100, label_smoothing=0.1)
    with pytest.raises(NotImplementedError, match="label smoothing"):
        torch.ops.torch_nn._linear_cross_entropy_batch_chunked(*args)
    with pytest.raises(NotImplementedError, match="label smoothing"):
        DECOMPOSITIONS[REDUCED](*args)
    # Without smoothing the same call runs: the refusal is the smoothing's.
    assert DECOMPOSITIONS[REDUCED](*_reduced_args(x, w, t, b, cw, "mean", -100))[0].isfinite()


class ChunkedLosses(torch.nn.Module):
    """Both ops: a weighted mean with bias and an in-range ignore_index, and per-row losses."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(C, IN))
        self.b = torch.nn.Parameter(torch.randn(C))
        self.register_buffer("cw", torch.rand(C) + 0.5)

    def forward(self, x, t):
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=3, allow_retain_graph=True)
        mean = F.linear_cross_entropy(x, self.w, t, linear_bias=self.b, weight=self.cw, ignore_index=1,
                                      options=options)
        rows = F.linear_cross_entropy(x, self.w, t, reduction="none", options=options)
        return mean, rows


def test_a_captured_joint_graph_holds_no_torch_nn_op_and_gives_torch_s_gradients():
    torch.manual_seed(0)
    model = ChunkedLosses()
    x = torch.randn(N, IN, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3, 1, 2, 0])
    calls = _library_calls(model, x, t)
    assert calls == {REDUCED, UNREDUCED}, calls  # eager calls torch's ops: what capture must replace
    cap = capture_export(model, (x, t), {}, name="m", graphs=["joint"], input_names=["x", "t"])
    joint = cap.graphs["joint"]
    assert library_ops(joint.gm) == []
    assert any(REDUCED in n and UNREDUCED in n for n in cap.notes), cap.notes
    values = {"w": model.w, "b": model.b, "cw": model.cw, "x": x, "t": t}
    primals = [values[i.target].detach() for i in joint.inputs if i.role != "tangent"]
    outs = joint.gm(*primals, torch.tensor(1.0))
    got = {o.target: v for o, v in zip(joint.outputs, outs) if o.role == "grad"}
    want = torch.autograd.grad(model_loss(model(x, t)), [model.w, model.b, x])
    assert set(got) == {"w", "b", "x"}
    for name, e in zip(["w", "b", "x"], want):
        torch.testing.assert_close(got[name], e)


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "torch_nn":
            self.seen.add(f"torch_nn::{func._schema.name.split('::')[-1]}")
        return func(*args, **(kwargs or {}))


def _library_calls(model, *args) -> set[str]:
    """The torch_nn ops an eager call of `model` runs."""
    with _Calls() as calls:
        model(*args)
    return calls.seen


def _corpus_samples_calling_the_ops() -> tuple[list[str], set[str]]:
    """Pipeline entries for every module_db sample of nn.LinearCrossEntropyLoss whose eager call
    runs one of the ops (those built with options), and the op_db entries of its chunked
    variants; and which ops they call."""
    import warnings

    from aotpipe.models import torch_corpus
    from aotpipe.spec import ModelSpec

    def spec(source, k):
        return ModelSpec(name="m", source=source, args={"sample": k}, config=None, inputs=[], mode="auto",
                         graphs=["inference", "forward", "backward", "joint"], passes=[], save_inputs=True,
                         verify=True, loss="weighted", seed=0)

    entries, ops = [], set()
    module = "torch-module:nn.LinearCrossEntropyLoss"
    sources = [(module, k) for k in range(torch_corpus.sample_count(module, torch_corpus.inputs_seed(spec(module, 0))))]
    sources += [(f"torch-op:nn.functional.linear_cross_entropy.{v}", 0) for v in ("chunked", "chunked_none")]
    for source, k in sources:
        s = spec(source, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch_corpus.build_model(s)
            args, kwargs = torch_corpus.example_inputs(s)
            called = _library_calls(lambda *a: model(*a, **kwargs), *args)
        if called:
            name = f"{source.split(':')[1]}.s{k}"
            entries.append(f"  - {{name: {name}, source: '{source}', args: {{sample: {k}}}}}")
            ops |= called
    return entries, ops


@pytest.mark.slow
def test_every_torch_corpus_sample_that_calls_the_ops_captures_whole_with_every_check_run(tmp_path):
    entries, ops = _corpus_samples_calling_the_ops()
    assert ops == {REDUCED, UNREDUCED}
    assert len(entries) > 100  # module_db's samples built with options
    assert sum("source: 'torch-op:" in e for e in entries) == 2, entries[-2:]  # and both op_db variants
    # A spread of the module samples (every eighth, so both ops and every reduction) and both op_db
    # variants: all 172 take ~8 minutes on 2 loaded cores; benchmarks/torch_corpus_bench.py runs them all.
    modules = [e for e in entries if "source: 'torch-op:" not in e]
    entries = modules[::8] + [e for e in entries if "source: 'torch-op:" in e]
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        version: 1
        name: lce
        seed: 0
        executor: {kind: process, workers: 2, timeout_s: 300, memory_gb: 4}
        defaults: {mode: auto, graphs: [inference, forward, backward, joint]}
        models:
    """) + "\n".join(entries) + "\n")
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    models = json.loads(r.stdout)["models"]
    bad = [(m["name"], m["status"], m.get("error")) for m in models
           if m["status"] != "ok" or m["checks"]["failed"] or m["checks"]["skipped"] or not m["checks"]["run"]
           or len(m["graphs"]) != 4]
    assert not bad and len(models) == len(entries), bad[:5]
    assert r.exit_code == 0, r.output[-2000:]
    assert all(any("decomposed into ATen: torch_nn::" in n for n in m["notes"]) for m in models)
    for gj in (tmp_path / "out" / "lce").rglob("graph.json"):
        targets = [n["target"] for n in json.loads(gj.read_text())["nodes"] if n["op"] == "call_function"]
        assert targets and not [t for t in targets if "torch_nn" in t], gj
