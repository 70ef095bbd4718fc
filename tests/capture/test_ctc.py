"""The CTC loss as static-shape ATen (capture/ctc.py): the same values and input gradients as
torch's own kernel over every argument form, installed only while capturing, captured whole."""

from __future__ import annotations

import contextlib
import itertools
import types

import pytest
import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher

from aotpipe.capture import capture_dynamo, ctc
from aotpipe.format.records import load_run
from aotpipe.pipeline.results import written_manifest
from tests.capture import partial_models
from tests.helpers.pipelines import run_yaml

KINDS = ["inference", "forward", "backward", "joint"]
T, N, C = 12, 3, 6


def _log_probs(steps=T, batch=N, classes=C, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, classes, generator=g, dtype=dtype).log_softmax(2)


def _both(log_probs, *args, **kwargs):
    """(torch's, the formulation's) loss and gradient for F.ctc_loss(log_probs, *args, **kwargs);
    the formulation runs as capture installs it (the kernel of aten.ctc_loss, through the
    Python dispatcher), so F.ctc_loss's own argument handling is part of what is compared."""
    out = []
    for formulated in (False, True):
        lp = log_probs.detach().clone().requires_grad_()
        notes: list[str] = []
        with ctc.ctc_loss_formulated(notes) if formulated else contextlib.nullcontext(), enable_python_dispatcher():
            loss = F.ctc_loss(lp, *args, **kwargs)
        assert notes == ([ctc.NOTE] if formulated else [])
        weights = (torch.arange(loss.numel(), dtype=loss.dtype) + 1).reshape(loss.shape) / loss.numel()
        (loss * weights).sum().backward()
        out.append((loss.detach(), lp.grad))
    return out


def _assert_same(log_probs, *args, **kwargs):
    (ref, ref_grad), (got, got_grad) = _both(log_probs, *args, **kwargs)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got_grad, ref_grad)
    return got, got_grad


TARGETS = torch.tensor([[1, 2, 2, 3, 4], [5, 5, 5, 1, 2], [3, 1, 3, 1, 3]])  # repeats and alternations
INPUT_LENGTHS = [12, 10, 7]
TARGET_LENGTHS = [5, 3, 0]


def _targets(form: str):
    """(targets, input_lengths, target_lengths) in one of torch's argument forms."""
    two_d, as_tensors = form.split("-")
    targets = TARGETS if two_d == "2d" else torch.cat([TARGETS[b, :n] for b, n in enumerate(TARGET_LENGTHS)])
    if as_tensors == "tensors":
        return targets.int(), torch.tensor(INPUT_LENGTHS, dtype=torch.int32), torch.tensor(TARGET_LENGTHS)
    return targets, INPUT_LENGTHS, tuple(TARGET_LENGTHS)


FORMS = ["2d-lists", "2d-tensors", "1d-lists", "1d-tensors"]


@pytest.mark.parametrize("form,reduction,zero_infinity",
                         list(itertools.product(FORMS, ["none", "mean", "sum"], [False, True])))
def test_values_and_gradients_match_torch_in_every_argument_form(form, reduction, zero_infinity):
    targets, il, tl = _targets(form)
    loss, _ = _assert_same(_log_probs(), targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)
    assert torch.isfinite(loss).all()


def test_padding_past_a_target_length_is_never_read():
    targets = TARGETS.clone()
    targets[1, 3:] = -1  # no class: torch never reads past a target's length
    targets[2, :] = 99
    _assert_same(_log_probs(), targets, INPUT_LENGTHS, TARGET_LENGTHS, reduction="none")
    _assert_same(_log_probs(), targets, torch.tensor(INPUT_LENGTHS), torch.tensor(TARGET_LENGTHS), reduction="none")


def test_a_blank_other_than_zero():
    targets = torch.tensor([[0, 1, 1, 4], [2, 3, 0, 0], [4, 4, 4, 4]])
    _assert_same(_log_probs(), targets, [12, 12, 9], [4, 4, 4], blank=C - 1, reduction="none")


def test_a_repeated_label_needs_a_blank_between_right_at_the_boundary():
    # [2, 2, 2] aligns in no fewer than 5 frames (2 _ 2 _ 2): finite at 5, infinite at 4
    targets = torch.tensor([[2, 2, 2]] * 2)
    loss, grad = _assert_same(_log_probs(batch=2), targets, [5, 4], [3, 3], reduction="none", zero_infinity=True)
    assert torch.isfinite(loss[0]) and loss[1] == 0 and (grad[:, 1] == 0).all()  # zero_infinity: no gradient
    distinct = torch.tensor([[2, 3, 2]] * 2)  # no blank needed: 3 frames are enough
    loss, _ = _assert_same(_log_probs(batch=2), distinct, [3, 2], [3, 3], reduction="none", zero_infinity=True)
    assert torch.isfinite(loss[0]) and loss[1] == 0


def test_unbatched_inputs_lengths_of_zero_and_float64():
    lp = _log_probs()
    _assert_same(lp[:, 0], TARGETS[0], [12], [5], reduction="none")
    _assert_same(lp[:, 0], TARGETS[0, :4], torch.tensor(9), torch.tensor(4), reduction="mean")
    loss, _ = _assert_same(lp, TARGETS, [0, 0, 12], [0, 2, 0], reduction="none")  # no frames: loss 0 or inf
    assert loss[0] == 0 and loss[1] == float("inf")
    _assert_same(lp[:, :, :], TARGETS[:, :0], [12, 5, 1], [0, 0, 0], reduction="mean")  # every target empty
    _assert_same(_log_probs(dtype=torch.float64), *_targets("1d-tensors"), reduction="sum")


def test_a_class_at_minus_infinity_gets_a_zero_gradient_where_torch_gives_nan():
    # Documented in docs/capture-modes.md: torch's kernel gives NaN for log_probs of -inf
    # (exp(-inf) less a term of -inf - -inf); the formulation gives 0, exp(-inf).
    lp = _log_probs()
    lp[:, :, 4] = float("-inf")  # a class no frame emits: the first target, which uses 4, is impossible
    (ref, ref_grad), (got, got_grad) = _both(lp, *_targets("2d-tensors"), reduction="none", zero_infinity=True)
    torch.testing.assert_close(got, ref)
    assert ref[0] == 0 and torch.isfinite(ref).all()
    running = (torch.arange(T).unsqueeze(1) < torch.tensor(INPUT_LENGTHS)).unsqueeze(2)
    torch_nan = running & (lp == float("-inf")) & (ref != 0).reshape(1, N, 1)  # finite, non-zeroed losses
    assert torch.equal(ref_grad.isnan(), torch_nan)
    assert (got_grad[torch_nan] == 0).all()
    torch.testing.assert_close(got_grad[~torch_nan], ref_grad[~torch_nan])


def test_an_infinite_loss_without_zero_infinity_has_a_finite_gradient_where_torch_gives_nan():
    # Documented in docs/capture-modes.md: the gradient of an infinite loss is undefined;
    # torch's kernel gives NaN on the frames within the input length, the formulation
    # exp(log_probs) there (the term that makes its gradients torch's elsewhere).
    lp = _log_probs(batch=1)
    (ref, ref_grad), (got, got_grad) = _both(lp, TARGETS[:1], [3], [5], reduction="sum")
    assert ref == got == float("inf")
    assert ref_grad[:3].isnan().all() and (ref_grad[3:] == 0).all()
    torch.testing.assert_close(got_grad[:3], lp[:3].exp())
    assert (got_grad[3:] == 0).all()


def test_torch_kernels_are_back_after_the_block_also_on_error():
    before = {op: dict(op.py_kernels) for op in ctc.FORMULATED}
    notes: list[str] = []
    with pytest.raises(RuntimeError, match="planted"):
        with ctc.ctc_loss_formulated(notes):
            assert all(op.py_kernels for op in ctc.FORMULATED)
            raise RuntimeError("planted")
    assert {op: dict(op.py_kernels) for op in ctc.FORMULATED} == before
    assert notes == []  # nothing traced a CTC loss: no note


@pytest.mark.slow
def test_dynamo_captures_a_linear_then_ctc_loss_whole():
    # the model tests/capture/test_partial.py pinned as partial before capture/ctc.py
    cap = capture_dynamo(partial_models.ctc_head(), partial_models.ctc_inputs(), {}, name="ctc", graphs=KINDS,
                         input_names=["x", "targets", "input_lengths", "target_lengths"])
    assert not cap.partial and not cap.outside_graphs and ctc.NOTE in cap.notes
    for kind in KINDS:
        ops = {str(n.target) for n in cap.graphs[kind].gm.graph.nodes}
        assert not any("ctc" in op for op in ops), kind
    out = cap.graphs["inference"].gm.graph.find_nodes(op="output")[0].args[0][0]
    assert out.meta["val"].shape == ()  # the loss, not the log-probabilities


def _corpus_samples():
    from aotpipe.models import torch_corpus

    for source in ("torch-module:nn.CTCLoss", "torch-op:nn.functional.ctc_loss"):
        spec = types.SimpleNamespace(source=source, seed=0, args={"sample": 0}, graphs=KINDS)
        for k in range(torch_corpus.sample_count(source, torch_corpus.inputs_seed(spec))):
            spec = types.SimpleNamespace(source=source, seed=0, args={"sample": k}, graphs=KINDS)
            yield f"{source}:{k}", torch_corpus.build_model(spec), torch_corpus.example_inputs(spec)[0]


CORPUS_PIPELINE = """\
version: 1
name: ctc
models:
  - {name: lists_2d, source: 'torch-module:nn.CTCLoss', args: {sample: 0}}
  - {name: tensors_1d, source: 'torch-module:nn.CTCLoss', args: {sample: 3}}
  - {name: op, source: 'torch-op:nn.functional.ctc_loss', args: {sample: 0}}
"""


@pytest.mark.slow
def test_corpus_samples_capture_whole_with_every_check_passing(tmp_path):
    # pipelines/torch-modules.yaml's 40 CTCLoss samples and torch-ops.yaml's ctc_loss sample were
    # all failed or partial before capture/ctc.py; here one of each argument form
    pytest.importorskip("expecttest")
    result, out = run_yaml(tmp_path, CORPUS_PIPELINE, "--no-sign")
    assert result.exit_code == 0, result.output
    run = load_run(out / "ctc")
    for m in run.models:
        assert m.status == "ok" and m.checks.run == 3 and m.checks.skipped == 0 and not m.outside_graphs, m.name
        assert ctc.NOTE in written_manifest(out / "ctc" / m.name).capture.notes


@pytest.mark.slow
def test_every_torch_corpus_sample_gives_torchs_values_and_gradients():
    # Judged as aotpipe's checks judge: against torch in float64, within a small multiple of
    # torch's own float32 error (a sum over 3 sequences of 50 frames: torch's float32 gradient
    # is up to 6e-5 off its float64 one, the formulation's 3e-6).
    pytest.importorskip("expecttest")  # torch's test databases import it (the corpus extra)
    seen = 0
    for name, model, inputs in _corpus_samples():
        results = {}
        for kind, formulated, dtype in (("eager", False, torch.float32), ("fp64", False, torch.float64),
                                        ("formulated", True, torch.float32)):
            args = [t.detach().to(dtype if t.is_floating_point() else t.dtype).requires_grad_(t.requires_grad)
                    for t in inputs]
            notes: list[str] = []
            with ctc.ctc_loss_formulated(notes) if formulated else contextlib.nullcontext(), \
                    enable_python_dispatcher():
                loss = model(*args)
            assert notes == ([ctc.NOTE] if formulated else []), name
            loss.sum().backward()
            grads = [a.grad for a in args if a.requires_grad]
            assert len(grads) == 1, name
            results[kind] = (loss.detach().double(), grads[0].double())
        for i, what in enumerate(("loss", "gradient")):
            exact = results["fp64"][i]
            eager_error = (results["eager"][i] - exact).abs().max().item()
            error = (results["formulated"][i] - exact).abs().max().item()
            floor = 1e-6 * max(1.0, exact.abs().max().item())
            assert error <= 2 * eager_error + floor, (name, what, error, eager_error)
        seen += 1
    assert seen == 52  # 40 module samples, 12 op samples
