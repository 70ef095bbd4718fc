"""Failure classes seen on zoos aotpipe had not met, each reproduced with a small model of our own."""

from __future__ import annotations

import json

import pytest
import torch

from aotpipe.artifact.load import load
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.runner import run_pipeline
from aotpipe.runtime.accuracy import digest


def _run(tmp_path, models_yaml, **defaults):
    d = {"mode": "export", "graphs": "[inference, forward, backward, joint]", "passes": "[]", **defaults}
    text = ("version: 1\nname: classes\nexecutor: {kind: local}\ndefaults: {"
            + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}\nmodels:\n" + models_yaml)
    run = run_pipeline(parse_pipeline(text, str(tmp_path / "p.yaml")), output=tmp_path / "out", progress=False)
    return {m.name: m for m in run.models}, run


# (a) The writer: "self.stride(-1) must be 1 to view Long as Byte". torch calls a tensor
# contiguous when only its size-1 dimensions have odd strides, so .contiguous() hands it back
# as it is and a byte view of it fails. Any dtype, any value saved or digested.

ODD_STRIDES = {
    "one element, step 2": lambda: torch.arange(10)[::2][:1],
    "1x1 of a transpose": lambda: torch.arange(12).view(3, 4)[1:2, 1:2].t(),
    "float 1x1 of a transpose": lambda: torch.arange(12.0).view(3, 4).t()[-1:, :1],
    "bfloat16 one element": lambda: torch.arange(8.0).to(torch.bfloat16)[::4][1:2],
    "bool one element": lambda: (torch.arange(6) > 2)[::3][1:],
}


@pytest.mark.parametrize("make", ODD_STRIDES.values(), ids=ODD_STRIDES.keys())
def test_a_digest_reads_odd_strided_tensors_like_their_dense_copy(make):
    t = make()
    assert t.is_contiguous() and t.numel() == 1 and t.reshape(-1).stride(-1) != 1  # the class itself
    dense = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    assert digest(t) == digest(dense)
    assert digest(t) != digest(dense + 1)


class OddStridedOutputs(torch.nn.Module):
    """Returns an int64 value with one element and a stride of 2, and a float one of shape
    [1, 1] with strides of a transposed slice, as a model's position ids or last-token logits do."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)
        self.register_buffer("positions", torch.arange(16))

    def forward(self, x):
        y = self.proj(x)  # [1, 4]
        last = y.t()[-1:, :]  # [1, 1], strides (1, 4)
        pos = self.positions[::2][:1] + x.shape[0]  # int64 [1]
        return y, last, pos[::1], self.positions[::2][:1]


def odd_strided_outputs():
    return OddStridedOutputs()


@pytest.mark.parametrize("save_values", ["minimal", "full"])
def test_a_model_with_odd_strided_int64_outputs_is_written_and_checked(tmp_path, save_values):
    models, run = _run(tmp_path, "  - {name: odd, source: 'tests.test_failure_classes:odd_strided_outputs', "
                                 "inputs: [{shape: [1, 8]}]}\n", save_values=save_values)
    m = models["odd"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run > 0
    assert {g.kind for g in m.graphs} == {"inference", "forward", "backward", "joint"}


# (b) AOTAutograd: "Expected native_dropout_N to be a tensor". A dropout whose result is
# thrown away (or read only for its shape, or taken in a branch not followed) stays in the
# joint as native_dropout, a two-output op with no users; torch's default_partition asserts
# that such a node is a tensor. Smallest reproduction, torch alone:
#   aot_function(lambda x: (F.dropout(x, 0.5, True), (x * 2).sum())[1], nop, nop,
#                partition_fn=default_partition)(torch.randn(4, requires_grad=True))


class Dropouts(torch.nn.Module):
    """A dropout thrown away, one read for its shape only, then one used: the used one must
    draw the mask eager draws, so the forward has to consume the generator for the others."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        y = self.lin(x)
        if self.how == "unused":
            self.drop(y)
        elif self.how == "shape":
            y = y * self.drop(y).shape[-1]
        elif self.how == "functional":
            torch.nn.functional.dropout(x, 0.3, training=True)
        return self.drop(y) + y


def dropouts(how):
    return Dropouts(how).train()


@pytest.mark.parametrize("how", ["unused", "shape", "functional"])
def test_a_dropout_whose_result_is_unused_is_captured_and_later_masks_match_eager(tmp_path, how):
    models, _ = _run(tmp_path, f"  - {{name: d, source: 'tests.test_failure_classes:dropouts', args: {{how: {how}}}, "
                               "inputs: [{shape: [4, 8]}]}\n", graphs="[forward, backward, joint]")
    m = models["d"]
    assert m.status == "ok", (m.stage, m.error)
    # Every output against eager, the used dropout's too: its mask is eager's only if the
    # forward drew the unused one first.
    assert m.checks.failed == 0 and m.checks.run >= 3 and not m.checks.skipped
    assert any("keeps 1 random draw(s) the model makes but never uses" in n for n in m.notes), m.notes


# (c) Data-dependent sizes that are not: EnCodec/Mimi convolutions compute their padding from
# integer scalar buffers and pass 0-dim tensors to F.pad; torch.export reads them with
# .item() (unbacked: the padded length becomes "u0 + u1 + 64"), and the training graphs then
# compute sizes with Python operators graph.json cannot store. Folded to numbers, they export
# static. A size that really depends on the input (nonzero) must stay data-dependent.


class BufferPaddedConv(torch.nn.Module):
    def __init__(self, kernel=7, stride=2):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 4, kernel, stride)
        self.stride = torch.nn.Buffer(torch.tensor(stride), persistent=False)
        self.kernel_size = torch.nn.Buffer(torch.tensor(kernel), persistent=False)
        self.padding_total = torch.nn.Buffer(torch.tensor(kernel - stride), persistent=False)

    def forward(self, x):
        length = x.shape[-1]
        n_frames = (length - self.kernel_size + self.padding_total) / self.stride + 1
        n_frames = torch.ceil(n_frames).to(torch.int64) - 1
        extra = n_frames * self.stride + self.kernel_size - self.padding_total - length
        return self.conv(torch.nn.functional.pad(x, (self.padding_total, extra)))


def buffer_padded_conv():
    return BufferPaddedConv()


@pytest.mark.parametrize("mode", ["export", "auto"])
def test_sizes_computed_from_integer_buffers_are_captured_static(tmp_path, mode):
    models, _ = _run(tmp_path, "  - {name: pad, source: 'tests.test_failure_classes:buffer_padded_conv', "
                               "inputs: [{shape: [1, 2, 61]}]}\n", mode=mode)
    m = models["pad"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and not m.checks.skipped
    assert [g.kind for g in m.graphs] == ["inference", "forward", "backward", "joint"]  # one export, no fallback
    inference = json.loads((tmp_path / "out" / "classes" / "pad" / "pad_inference_0" / "graph.json").read_text())
    pad = next(n for n in inference["nodes"] if n.get("target", "").startswith("aten.constant_pad_nd")
               or n.get("target", "").startswith("aten.pad"))
    assert pad["args"][1] == [5, 1]  # padding_total 5; extra: ceil((61 - 7 + 5) / 2 + 1) - 1 = 30 frames, 62 - 61


def test_a_size_that_depends_on_the_input_stays_data_dependent():
    from aotpipe.capture.unbacked import constant_sizes_folded

    class Picks(torch.nn.Module):
        def forward(self, x):
            k = (x > 1).sum().item()  # an item of the input's values: really data-dependent
            torch._check_is_size(k)
            return x[x > 0], x.new_zeros(k)

    ep = torch.export.export(Picks(), (torch.randn(16),), strict=False)
    assert constant_sizes_folded(ep) is None


# (d) The same sizes compared before they can be folded: Mimi's encoder pads with integer
# buffers, then SDPA asks whether the padded length is over 1, and torch.export stops on that
# guard ("u0 + u1 + 7680 > 1") before any fold runs. Export again deciding guards on the example's
# values, fold, and export static; a guard on the input's values is a branch on data and must
# not be decided so.


class GuardedBufferPaddedConv(BufferPaddedConv):
    """BufferPaddedConv whose padded length is then compared (as SDPA compares a sequence
    length); with `on_input`, also a branch on the input's values."""

    def __init__(self, on_input: bool = False):
        super().__init__()
        self.on_input = on_input

    def forward(self, x):
        y = super().forward(x)
        if y.shape[-1] > 1:  # a guard on the buffer-computed size
            y = y * 2
        if self.on_input and (x > 0).sum().item() > 3:  # a guard on the input's values
            y = y + 1
        return y


def guarded_buffer_padded_conv(on_input: bool = False):
    return GuardedBufferPaddedConv(on_input)


def test_a_guard_on_sizes_from_integer_buffers_is_decided_and_the_sizes_captured_static(tmp_path):
    with pytest.raises(Exception, match="Could not guard on data-dependent expression"):
        torch.export.export(GuardedBufferPaddedConv().train(), (torch.randn(1, 2, 61),), strict=False)
    models, _ = _run(tmp_path, "  - {name: pad, source: 'tests.test_failure_classes:guarded_buffer_padded_conv', "
                               "inputs: [{shape: [1, 2, 61]}]}\n")
    m = models["pad"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run >= 4 and not m.checks.skipped
    assert [g.kind for g in m.graphs] == ["inference", "forward", "backward", "joint"]
    assert ("data-dependent sizes computed from the model's own integer buffers (kernel_size, padding_total, "
            "stride) captured static, after a guard on them stopped torch.export") in m.notes, m.notes
    inference = json.loads((tmp_path / "out" / "classes" / "pad" / "pad_inference_0" / "graph.json").read_text())
    assert not any("u0" in json.dumps(n) for n in inference["nodes"])
    pad = next(n for n in inference["nodes"] if n.get("target", "").startswith("aten.constant_pad_nd"))
    assert pad["args"][1] == [5, 1]


@pytest.mark.parametrize("mode", ["export", "auto"])
def test_a_guard_on_the_inputs_values_is_not_decided_on_the_example(tmp_path, mode):
    models, _ = _run(tmp_path, "  - {name: pad, source: 'tests.test_failure_classes:guarded_buffer_padded_conv', "
                               "args: {on_input: true}, inputs: [{shape: [1, 2, 61]}]}\n", mode=mode)
    m = models["pad"]
    if mode == "export":  # the branch on x is torch.export's error, as without the fold
        assert m.status == "failed" and "GuardOnDataDependentSymNode" in m.error, (m.status, m.error)
    else:  # auto falls back to dynamo, which breaks the graph at the data-dependent pad: the pad
        # runs outside every graph, so the capture is partial (issue 35), not ok
        assert m.status == "partial", (m.stage, m.error)
        assert any("aten.constant_pad_nd.default" in o for o in m.outside_graphs), m.outside_graphs
        assert any(n.startswith("mode auto") or "dynamo" in n for n in m.notes), m.notes
    assert not any("captured static" in n for n in m.notes), m.notes


STEPS_TAKEN = [0]  # DecodesUntilStop's steps, by any trace or run


class DecodesUntilStop(torch.nn.Module):
    """A decoder loop that stops when its output says so (SLANet's table structure, a text
    decoder's end token): each step's guard is on the data, one per step."""

    def __init__(self, steps: int = 100):
        super().__init__()
        self.cell = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        self.steps = steps

    def forward(self, x):
        for _ in range(self.steps):
            STEPS_TAKEN[0] += 1  # outside the module: torch.export restores the module's attributes
            x = self.cell(x)
            if (x.sum(-1) > 1e9).all():  # never true: every step runs
                break
        return x


def decodes_until_stop():
    return DecodesUntilStop()


def test_deciding_guards_stops_at_its_limit_on_a_loop_over_data():
    from aotpipe.capture.export import MAX_DECIDED_GUARDS, _export_deciding_guards

    model, x = DecodesUntilStop(100), torch.randn(2, 4)
    STEPS_TAKEN[0] = 0
    assert _export_deciding_guards(model, (x,), {}) is None
    assert STEPS_TAKEN == [MAX_DECIDED_GUARDS + 1]  # the trace stopped at the guard over the limit
    # Planted fault (no limit worth the name): the same trace decides all 100 and unrolls the loop.
    STEPS_TAKEN[0] = 0
    ep = _export_deciding_guards(model, (x,), {}, max_guards=1000)
    assert ep is not None and STEPS_TAKEN == [100]
    assert sum(n.target is torch.ops.aten._assert_scalar.default for n in ep.graph.nodes) >= 100  # one per step, at least


def test_a_loop_over_data_fails_export_on_its_first_guard_without_unrolling(tmp_path):
    from aotpipe.capture.export import MAX_DECIDED_GUARDS

    STEPS_TAKEN[0] = 0
    models, _ = _run(tmp_path, "  - {name: loop, source: 'tests.test_failure_classes:decodes_until_stop', "
                               "inputs: [{shape: [2, 4]}]}\n")
    m = models["loop"]
    assert m.status == "failed" and m.stage == "capture", (m.status, m.stage)
    assert m.error.startswith("torch.export (inference) failed: GuardOnDataDependentSymNode: Could not guard "
                              "on data-dependent expression Eq(u0, 1)"), m.error  # the first export's guard
    # The eager try of the inputs before capture runs every step; the first export stops at
    # step 1, the deciding one past its limit: no trace unrolled the loop.
    assert STEPS_TAKEN == [DecodesUntilStop().steps + 1 + MAX_DECIDED_GUARDS + 1], STEPS_TAKEN


@pytest.mark.slow
def test_the_mimi_encoder_captures_in_export_mode_with_every_check_passing(tmp_path):
    pytest.importorskip("transformers")
    models, _ = _run(tmp_path, "  - name: mimi_encoder\n    source: hf:MimiEncoderModel\n"
                               "    config: {num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 4, "
                               "head_dim: 16, hidden_size: 64, intermediate_size: 128, use_cache: false}\n"
                               "    inputs: [{name: input_values, shape: [2, 1, 4000]}]\n")
    m = models["mimi_encoder"]
    assert m.status == "ok", (m.stage, m.error)
    assert m.checks.failed == 0 and m.checks.run >= 50 and not m.checks.skipped
    assert [g.kind for g in m.graphs] == ["inference", "forward", "backward", "joint"]
    assert any(n.startswith("data-dependent sizes computed from the model's own integer buffers (downsample.kernel_size")
               and n.endswith("after a guard on them stopped torch.export") for n in m.notes), m.notes


# (e) A layer drop: in training, wav2vec2, HuBERT, WavLM, SEW and their kind skip a layer when
# `torch.rand([]) < layerdrop`. torch.export stops on that guard; deciding it on the example's
# draw would capture one draw's branch as if it were the model, and dynamo's subgraphs run in
# sequence do not reproduce it either. The failure says so and what to change, not "use
# torch.cond".


class LayerDrop(torch.nn.Module):
    def __init__(self, layerdrop: float = 0.5):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.layerdrop = layerdrop

    def forward(self, x):
        x = self.a(x)
        skip = self.training and torch.rand([]) < self.layerdrop
        if not skip:
            x = self.b(x).relu()
        return x


def layer_drop(layerdrop: float = 0.5):
    return LayerDrop(layerdrop)


def test_a_branch_on_a_random_draw_fails_naming_the_layer_drop_and_the_setting(tmp_path):
    models, _ = _run(tmp_path, "  - {name: drop, source: 'tests.test_failure_classes:layer_drop', "
                               "inputs: [{shape: [4, 8]}]}\n")
    m = models["drop"]
    assert m.status == "failed" and m.stage == "capture", (m.status, m.error)
    assert "torch.export (training) failed: RandomBranch: the model branches on a random number it draws: Could " \
           "not guard on data-dependent expression" in m.error, m.error
    assert m.error.endswith("turn the random skip off in its config (layerdrop: 0.0, or the model's own name for "
                            "it), or capture graphs: [inference] only (eval mode draws nothing)"), m.error
    assert "torch.cond" not in m.error
    # mode auto falls back to dynamo, whose subgraphs, run in sequence on the same seed, draw the
    # same number and take the same branch here (transformers' layer drops also draw dropout
    # masks between, and fail that check with this hint)
    models, _ = _run(tmp_path / "auto", "  - {name: drop, source: 'tests.test_failure_classes:layer_drop', "
                                        "inputs: [{shape: [4, 8]}]}\n", mode="auto")
    assert models["drop"].status == "ok", models["drop"].error
    assert any(n.startswith("mode auto") or "dynamo" in n for n in models["drop"].notes), models["drop"].notes


def test_the_layer_drop_model_captures_with_its_drop_off_or_for_inference_only(tmp_path):
    models, _ = _run(tmp_path, "  - {name: drop_off, source: 'tests.test_failure_classes:layer_drop', args: {layerdrop: 0.0}, "
                               "inputs: [{shape: [4, 8]}]}\n"
                               "  - {name: inference_only, source: 'tests.test_failure_classes:layer_drop', graphs: [inference], "
                               "inputs: [{shape: [4, 8]}]}\n", mode="auto")
    assert {n: (m.status, m.error) for n, m in models.items()} == {"drop_off": ("ok", None), "inference_only": ("ok", None)}


class DropoutThenCheck(torch.nn.Module):
    """Mask2Former's shape: a branch on values dropout made (`if not isfinite(h).all()`),
    which is an ordinary data-dependent branch, not a random skip."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.nn.functional.dropout(self.a(x), 0.1, self.training)
        if not torch.isfinite(h).all():
            h = h.nan_to_num()
        return self.b(h)


def dropout_then_check():
    return DropoutThenCheck()


def test_a_branch_on_values_dropout_made_is_not_called_a_random_skip(tmp_path):
    models, _ = _run(tmp_path, "  - {name: check, source: 'tests.test_failure_classes:dropout_then_check', "
                               "inputs: [{shape: [4, 8]}]}\n"
                               "  - {name: drop, source: 'tests.test_failure_classes:layer_drop', "
                               "inputs: [{shape: [4, 8]}]}\n")
    check, drop = models["check"], models["drop"]
    assert check.status == "failed" and "Could not guard on data-dependent expression" in check.error, check.error
    assert "RandomBranch" not in check.error and "layerdrop" not in check.error, check.error
    assert "RandomBranch: the model branches on a random number it draws" in drop.error, drop.error  # still told apart


def test_hints_and_export_name_a_random_branch_the_same_way():
    from aotpipe.capture import export, hints

    assert hints._RANDOM_BRANCH == export.RANDOM_BRANCH


# (f) A custom torch.autograd.Function: YOSO's attention, straight-through estimators, gradient
# reversal. torch.export traces its forward and AOTAutograd differentiates that, so export's
# backward is not the model's (YOSO: gradients off by 1e3x the bound). dynamo keeps the
# Function's own backward; auto falls back to it when the checks find the difference.


class _ApproxSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x  # not cos(x): a backward of its own, as YOSO's expectation gradient is


class _ExactSin(_ApproxSin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)  # the forward's own derivative


class CustomBackward(torch.nn.Module):
    def __init__(self, exact: bool = False):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.fn = _ExactSin if exact else _ApproxSin

    def forward(self, x):
        return self.fn.apply(self.fc(x)).sum(1)


BUILT: list[CustomBackward] = []  # every model custom_backward built, in order


def custom_backward(exact: bool = False):
    BUILT.append(CustomBackward(exact))
    return BUILT[-1]


_CUSTOM = "tests.test_failure_classes:custom_backward"


def test_a_custom_backward_export_drops_fails_export_naming_the_function_and_auto_keeps_it(tmp_path):
    models, _ = _run(tmp_path, f"  - {{name: export, source: '{_CUSTOM}', inputs: [{{shape: [4, 8]}}]}}\n"
                               f"  - {{name: auto, source: '{_CUSTOM}', mode: auto, inputs: [{{shape: [4, 8]}}]}}\n"
                               f"  - {{name: exact, source: '{_CUSTOM}', args: {{exact: true}}, inputs: [{{shape: [4, 8]}}]}}\n")
    export, auto, exact = models["export"], models["auto"], models["exact"]
    assert export.status == "failed" and export.stage == "verify", (export.status, export.error)
    assert export.error.startswith("backward graph differs from the eager model"), export.error
    assert export.error.endswith("; why: the model's torch.autograd.Function(s) tests.test_failure_classes._ApproxSin "
                                 "have a backward of their own, which torch.export does not keep (it traces their "
                                 "forward, and AOTAutograd differentiates that instead): capture with mode: dynamo "
                                 "(or auto), which keeps it"), export.error
    assert auto.status == "ok", auto.error
    manifest = load(tmp_path / "out" / "classes" / "auto").manifest
    assert manifest.capture.mode == "dynamo" and "tests.test_failure_classes._ApproxSin" in manifest.capture.fallback
    assert auto.notes[0].startswith("export's training graphs failed their gradient checks (the model's "
                                    "torch.autograd.Function(s) tests.test_failure_classes._ApproxSin"), auto.notes
    backward = (tmp_path / "out" / "classes" / "auto" / "auto_backward_0" / "module.py").read_text()
    assert "aten.cos" not in backward and "aten.mul" in backward  # the Function's own 2 * x
    # A Function whose backward is its forward's derivative: export's graphs pass, export is kept.
    assert exact.status == "ok" and load(tmp_path / "out" / "classes" / "exact").manifest.capture.mode == "export"


def test_auto_captures_with_dynamo_a_model_built_afresh(tmp_path):
    # export's checks ran the model (eager runs in train mode change what a model holds):
    # dynamo's capture starts from a model as the source builds it, not the one export used.
    BUILT.clear()
    models, _ = _run(tmp_path, f"  - {{name: auto, source: '{_CUSTOM}', mode: auto, inputs: [{{shape: [4, 8]}}]}}\n")
    assert models["auto"].status == "ok", models["auto"].error
    assert len(BUILT) == 2 and BUILT[0] is not BUILT[1]


def test_without_the_custom_backward_finding_auto_keeps_export_and_fails(tmp_path, monkeypatch):
    # The fault planted: the eager run's list of custom backwards left empty.
    from aotpipe.models import eager

    monkeypatch.setattr(eager, "custom_backwards", lambda loss: [])
    models, _ = _run(tmp_path, f"  - {{name: auto, source: '{_CUSTOM}', mode: auto, inputs: [{{shape: [4, 8]}}]}}\n")
    assert models["auto"].status == "failed" and "why:" not in models["auto"].error, models["auto"].error


def test_the_eager_run_names_each_custom_backward_once():
    from aotpipe.models.eager import custom_backwards

    x = torch.randn(3, requires_grad=True)
    loss = (_ApproxSin.apply(x) + _ApproxSin.apply(x * 2) + _ExactSin.apply(x)).sum()
    assert sorted(custom_backwards(loss)) == ["tests.test_failure_classes._ApproxSin", "tests.test_failure_classes._ExactSin"]
    assert custom_backwards((x * 2).sum()) == []


# (g) A worker's history: torch.compile turns torch.distributions' argument checks off for the
# rest of the process the first time dynamo runs. GroupViT builds a Gumbel distribution; with the
# checks on, torch.export stops on their data-dependent guard. So GroupViT failed in a fresh
# worker and captured by export in one that had run a dynamo capture before. Every job now runs
# with the checks off, whatever ran before it.


class GumbelNoise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        logits = self.fc(x)
        gumbel = torch.distributions.Gumbel(torch.full((), 0.0), torch.full((), 1.0))
        return (logits + gumbel.sample(logits.shape)).softmax(-1)


def gumbel_noise():
    return GumbelNoise()


_GUMBEL = "  - {name: gumbel, source: 'tests.test_failure_classes:gumbel_noise', inputs: [{shape: [4, 8]}]}\n"


@pytest.mark.parametrize("checks_before", [True, False], ids=["fresh worker", "after a dynamo capture"])
def test_a_distribution_captures_alike_whatever_the_worker_ran_before(tmp_path, checks_before):
    from torch.distributions import Distribution

    was = Distribution._validate_args
    Distribution.set_default_validate_args(checks_before)
    try:
        models, _ = _run(tmp_path, _GUMBEL)
        assert Distribution._validate_args is checks_before  # the job's setting does not leak out
    finally:
        Distribution.set_default_validate_args(was)
    m = models["gumbel"]
    assert m.status == "ok" and m.checks.failed == 0, (m.status, m.error)
    assert load(tmp_path / "out" / "classes" / "gumbel").manifest.capture.mode == "export"


def test_with_the_checks_left_on_export_stops_on_their_guard(tmp_path, monkeypatch):
    # The fault planted: the job leaves the process's setting alone, in a fresh worker.
    import contextlib

    from torch.distributions import Distribution

    from aotpipe.pipeline import job

    monkeypatch.setattr(job, "_distribution_checks_off", contextlib.nullcontext)
    was = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    try:
        models, _ = _run(tmp_path, _GUMBEL)
    finally:
        Distribution.set_default_validate_args(was)
    m = models["gumbel"]
    assert m.status == "failed" and m.stage == "capture", (m.status, m.error)
    assert "Could not guard on data-dependent expression" in m.error, m.error


# (h) Python int arithmetic on data-dependent sizes: export leaves ``u0 + 2`` as
# operator.add, ``max(u0, u1)`` as torch.sym_max (JetMoE's routing, SAM3, SuperPoint).
# graph.json stores them; a loaded graph runs them in a form that takes ints only.


class SizeArithmetic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        kept = h[h > 0]  # a size that depends on values: u0
        dropped = h[h <= 0]  # u1
        n = torch.sym_max(kept.shape[0], dropped.shape[0])
        pad = torch.zeros(n + 2 - kept.shape[0], dtype=h.dtype)
        return torch.cat([kept, pad]).sum() * h.mean()


def size_arithmetic():
    return SizeArithmetic()


def test_int_arithmetic_on_data_dependent_sizes_is_stored_and_replays(tmp_path):
    from aotpipe.replay import replay

    models, _ = _run(tmp_path, "  - {name: sizes, source: 'tests.test_failure_classes:size_arithmetic', "
                               "inputs: [{shape: [4, 8]}]}\n")
    m = models["sizes"]
    assert m.status == "ok", (m.stage, m.error)
    folder = tmp_path / "out" / "classes" / "sizes"
    targets = {n["target"] for g in folder.glob("sizes_*_0/graph.json") for n in json.loads(g.read_text())["nodes"]
               if n["op"] == "call_function"}
    assert {"operator.add", "operator.sub", "torch.sym_max"} <= targets, sorted(t for t in targets if "." in t[:9])
    assert {r.status for r in replay(folder)} == {"match"}


def test_where_dynamo_then_fails_too_the_error_keeps_both_reasons(tmp_path, monkeypatch):
    import aotpipe.capture
    from aotpipe.errors import CaptureError

    def no_dynamo(*args, **kwargs):
        raise CaptureError("dynamo cannot here")

    monkeypatch.setattr(aotpipe.capture, "capture_dynamo", no_dynamo)
    models, _ = _run(tmp_path, f"  - {{name: auto, source: '{_CUSTOM}', mode: auto, inputs: [{{shape: [4, 8]}}]}}\n")
    m = models["auto"]
    assert m.status == "failed" and m.stage == "capture", (m.stage, m.error)
    assert m.error.startswith("export's training graphs failed their gradient checks (the model's "
                              "torch.autograd.Function(s) tests.test_failure_classes._ApproxSin have a backward of "
                              "their own"), m.error
    assert "; dynamo failed: dynamo cannot here" in m.error, m.error


# (h) A graph that runs subgraphs of its own (torch.cond, a higher-order op): graph.json has
# no place for them. The writer died on an AttributeError ('<lambda>' object has no attribute
# 'reshape': a branch's module taken for a tensor); now one line naming the op and the node.


class CondBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a(x).relu(), lambda x: self.b(x).tanh(), (x,))


def cond_branch():
    return CondBranch()


def test_a_graph_with_torch_cond_is_refused_in_one_line_at_write(tmp_path):
    models, _ = _run(tmp_path, "  - {name: cond, source: 'tests.test_failure_classes:cond_branch', "
                               "inputs: [{shape: [4, 8]}]}\n", mode="auto")
    m = models["cond"]
    assert m.status == "failed" and m.stage == "write", (m.status, m.stage, m.error)
    assert m.error.startswith("graph calls torch.ops.higher_order.cond (node 'cond'), an op that runs subgraphs of "
                              "its own, which graph.json cannot store"), m.error
    assert "\n" not in m.error
    assert not list((tmp_path / "out" / "classes").glob("cond/cond_*"))  # no graph folder left half-written


# (i) A model that caches a tensor on its first forward (x-transformers' ALiBi bias:
# register_buffer when the cache is missing or too short). torch.export left its fake tensor in
# the model, and the training capture then mixed two fake modes.


class _Alibi(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("slopes", torch.full((1,), 0.5), persistent=False)
        self.register_buffer("bias", None, persistent=False)

    def forward(self, n):
        if self.bias is not None and self.bias.shape[-1] >= n:
            return self.bias[:n, :n]
        pos = torch.arange(n, device=self.slopes.device)
        self.register_buffer("bias", -(pos[:, None] - pos[None, :]).abs() * self.slopes, persistent=False)
        return self.bias


class CachesABias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.rel = _Alibi()

    def forward(self, x):
        return torch.softmax(self.proj(x) @ self.proj(x).transpose(-1, -2) + self.rel(x.shape[-2]), -1) @ x


def caches_a_bias():
    return CachesABias()


def test_a_model_that_caches_a_tensor_in_forward_is_left_with_no_fake_tensor(tmp_path):
    from aotpipe.capture.export import capture_export

    model = CachesABias()
    cap = capture_export(model, (torch.randn(2, 5, 8),), {}, name="c", graphs=["inference", "forward", "joint"],
                         input_names=["x"])
    assert list(cap.graphs) == ["inference", "forward", "joint"]
    assert model.rel.bias is None  # as before the capture: not the trace's fake tensor
    models, _ = _run(tmp_path, "  - {name: cache, source: 'tests.test_failure_classes:caches_a_bias', "
                               "inputs: [{shape: [2, 5, 8]}]}\n")
    assert models["cache"].status == "ok", (models["cache"].stage, models["cache"].error)


def test_planted_a_fake_tensor_left_in_the_model_breaks_the_next_trace(monkeypatch):
    import contextlib

    from aotpipe.capture import export
    from aotpipe.errors import CaptureError

    monkeypatch.setattr(export, "_no_fake_state_left", lambda model: contextlib.nullcontext())
    model = CachesABias()
    with pytest.raises(CaptureError, match="AOTAutograd joint capture failed: AssertionError: fake mode .* from fake "
                                           "tensor input .* doesn't match mode"):
        export.capture_export(model, (torch.randn(2, 5, 8),), {}, name="c", graphs=["inference", "forward"],
                              input_names=["x"])
    assert isinstance(model.rel.bias, torch._subclasses.fake_tensor.FakeTensor)


# (j) A size-1 dimension whose stride the CPU kernel and the trace disagree on, read by the
# CPU group norm to pick its memory format (diffusers' VAE: its attention output reshaped to
# [1, C, H, W], then a group norm). Eager's group_norm copies its input into that format first;
# the trace, whose fake input was canonical channels-last, kept no copy.


def _group_norm_graph():
    """A graph group-norming its channels-last [1, 8, 4, 4] input, as traced (no copy)."""
    x = torch.randn(1, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    w, b = torch.ones(8), torch.zeros(8)
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, w, b: torch.ops.aten.native_group_norm.default(x, w, b, 1, 8, 16, 2, 1e-5)[0],
        tracing_mode="fake")(x, w, b)
    odd = torch.empty_strided((1, 8, 4, 4), (8, 1, 32, 8))  # channels-last but the batch stride: as the CPU view left it
    odd.copy_(x)
    return gm, (odd, w, b), torch.group_norm(x, 2, w, b, 1e-5)


def test_a_group_norm_input_gets_the_channels_last_layout_the_trace_saw():
    from aotpipe.capture.layouts import pin_group_norm_layouts

    gm, args, want = _group_norm_graph()
    # channels-last in every dimension of size > 1, yet the kernel's choice of format reads the batch stride too
    assert args[0].is_contiguous(memory_format=torch.channels_last) and not args[0].is_contiguous()
    with pytest.raises(RuntimeError, match=r"Expected X.is_contiguous\(memory_format\) to be true"):
        gm(*args)  # the class itself: as traced, the CPU kernel refuses the input
    assert pin_group_norm_layouts(gm) == 1
    assert torch.allclose(gm(*args), want, atol=1e-6)
    assert [n.kwargs.get("memory_format") for n in gm.graph.nodes
            if n.target is torch.ops.aten.clone.default] == [torch.channels_last]


def test_a_contiguous_group_norm_input_is_left_as_it_is():
    from aotpipe.capture.layouts import pin_group_norm_layouts

    x, w, b = torch.randn(1, 8, 4, 4), torch.ones(8), torch.zeros(8)
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x, w, b: torch.ops.aten.native_group_norm.default(x, w, b, 1, 8, 16, 2, 1e-5)[0],
        tracing_mode="fake")(x, w, b)
    assert pin_group_norm_layouts(gm) == 0


# (k) torch's: the CPU batch norm returns its output contiguous, its meta kernel keeps a permuted
# input's strides (PatchTST: BatchNorm1d over a transposed [batch, time, channels]). The ops after
# it were traced on the meta layout (a view where eager's reshape copied) and failed on the CPU's.
# aotpipe lays the output out as the trace saw it (capture/layouts.py).


class NormsTransposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)

    def forward(self, x):  # [batch, time, 8]
        y = self.bn(self.lin(x).transpose(1, 2)).transpose(1, 2)
        return y.reshape(y.shape[0], -1)


def norms_transposed():
    return NormsTransposed()


def test_the_cpu_and_meta_batch_norm_layouts_differ_torchs_class_itself():
    x = torch.randn(3, 10, 16).transpose(1, 2)
    args = (x, torch.ones(16), torch.zeros(16), torch.zeros(16), torch.ones(16), 0.1, 1e-5)
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))[0].stride()
    assert op(*args)[0].stride() == (160, 10, 1) and fake == (160, 1, 16)  # if this changes, torch fixed it


@pytest.mark.parametrize("planted", [False, True])
def test_a_batch_norm_over_a_transposed_input_runs_in_every_graph(tmp_path, monkeypatch, planted):
    from aotpipe.capture import export

    if planted:  # without the relayout: the class as it was
        monkeypatch.setattr(export, "pin_batch_norm_layouts", lambda gm: 0)
    models, _ = _run(tmp_path, "  - {name: bn, source: 'tests.test_failure_classes:norms_transposed', "
                               "inputs: [{shape: [3, 10, 8]}]}\n")
    m = models["bn"]
    if planted:
        assert m.status == "failed" and m.stage == "verify", (m.status, m.stage)
        assert "view size is not compatible with input tensor's size and stride" in m.error, m.error
    else:
        assert m.status == "ok", (m.stage, m.error)
        assert m.checks.failed == 0 and m.checks.run >= 4 and not m.checks.skipped


# (g) A check on a tensor's values (transformers' torch_compilable_check, VITS's
# `torch.all(discriminant >= 0)`): torch._check_tensor_all_with calls `cond._is_all_true()`,
# so the graphs hold aten._is_all_true, which the loader's reviewed list lacked: VITS
# failed at verify once it no longer ran out of memory.


class CheckedValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        torch._check_tensor_all(h * h >= 0, lambda: "a square is never negative")
        return h.relu()


def checked_values():
    return CheckedValues()


def test_a_check_on_a_tensors_values_is_captured_loaded_and_replayed(tmp_path):
    models, run = _run(tmp_path, "  - {name: checked, source: 'tests.test_failure_classes:checked_values', "
                                 "inputs: [{shape: [4, 8]}]}\n")
    m = models["checked"]
    assert m.status == "ok", m.error
    art = load(run.output / "checked")
    calls = {str(n.target) for g in art.build_all().graphs.values() for n in g.module.graph.nodes
             if n.op == "call_function"}
    assert "aten._is_all_true.default" in calls, sorted(calls)


def test_the_value_range_of_a_wide_unsigned_tensor_is_read():
    # torch's min and max do not take uint16/32/64 (aten.hash_tensor returns uint64): the checks
    # recording an integer output's range failed with "min_all not implemented for 'UInt64'"
    from aotpipe.runtime.tensors import value_range

    big = torch.tensor([3, 2 ** 63 + 5], dtype=torch.uint64)
    assert value_range(big) == (3, 2 ** 63 + 6)
    assert value_range(torch.tensor([7, 9], dtype=torch.uint32)) == (7, 10)
    assert value_range(torch.tensor([-2, 4])) == (-2, 5)
    assert value_range(torch.ones(2)) is None and value_range(torch.empty(0, dtype=torch.int64)) is None


def test_a_model_with_a_uint64_output_is_checked(tmp_path):
    models, _ = _run(tmp_path, "  - {name: h, source: 'torch-op:hash_tensor', args: {sample: 0}, "
                               "graphs: [inference]}\n")
    assert models["h"].status == "ok", models["h"].error
    assert models["h"].checks.failed == 0 and models["h"].checks.run > 0
