"""Mode auto falls back to dynamo only when export's tracing failed: a model that raises on its
inputs, or a config setting a hint names, gets export's error alone, once."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from aotpipe.capture import capture_auto
from aotpipe.capture import dynamo as capture_dynamo_module
from aotpipe.capture.export import is_tracing_failure
from aotpipe.capture.hints import capture_hint
from aotpipe.errors import CaptureError
from aotpipe.models import zoo

CACHE_ERROR = ("Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a known type. If this "
               "type holds tensors, you need to register a pytree for it.")


def _export_error(raised: BaseException, what: str = "torch.export (inference) failed") -> CaptureError:
    try:
        try:
            raise raised
        except Exception as e:
            raise CaptureError(f"{what}: {type(e).__name__}: {e}") from e
    except CaptureError as wrapped:
        return wrapped


@pytest.mark.parametrize("raised, what, tracing", [
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x17 and 32x64)"), None, False),
    (ValueError("expected 4D input (got 3D input)"), None, False),
    (GuardOnDataDependentSymNode("Could not guard on data-dependent expression u0 > 0"), None, True),
    (RuntimeError("Cannot access data pointer of Tensor (e.g. FakeTensor)"), None, True),
    (RuntimeError(CACHE_ERROR), None, True),  # pytree's: a tracing failure, which the config hint settles
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "decomposing the inference graph failed", True),
])
def test_export_failures_are_told_apart_by_what_torch_export_raised(raised, what, tracing):
    e = _export_error(raised, what or "torch.export (inference) failed")
    assert is_tracing_failure(e) is tracing


def test_a_plain_shape_error_is_export_s_alone_and_dynamo_is_not_tried(monkeypatch):
    tried = []
    monkeypatch.setattr(capture_dynamo_module, "capture_dynamo", lambda *a, **k: tried.append(1))
    with pytest.raises(CaptureError) as info:
        capture_auto(zoo.mlp(in_features=32), (torch.randn(4, 17),), {}, name="m", graphs=["inference"],
                     input_names=["x"])
    msg = str(info.value)
    assert msg.startswith("export failed: torch.export (inference) failed: RuntimeError: ") and "dynamo" not in msg
    assert tried == []


def test_a_tracing_failure_still_falls_back_to_dynamo(monkeypatch):
    def export(*a, **k):
        raise _export_error(GuardOnDataDependentSymNode("Could not guard on data-dependent expression"))

    cap = capture_auto(zoo.mlp(in_features=8), (torch.randn(2, 8),), {}, name="m", graphs=["inference"],
                       input_names=["x"], export=export)
    assert cap.mode == "dynamo" and "GuardOnDataDependentSymNode" in cap.fallback


def _with_config(**config):
    model = zoo.mlp(in_features=8)
    model.config = SimpleNamespace(**config)  # as a transformers model carries its config
    return model


def test_a_cache_object_in_the_output_is_export_s_error_with_the_use_cache_hint(monkeypatch):
    tried = []
    monkeypatch.setattr(capture_dynamo_module, "capture_dynamo", lambda *a, **k: tried.append(1))

    def export(*a, **k):
        raise _export_error(RuntimeError(CACHE_ERROR))

    with pytest.raises(CaptureError) as info:
        capture_auto(_with_config(use_cache=True), (torch.randn(2, 8),), {}, name="m", graphs=["inference"],
                     input_names=["x"], export=export)
    assert tried == [] and "dynamo" not in str(info.value)
    hint = capture_hint("auto", str(info.value))
    assert hint == ("the model returns a transformers cache object (its config's use_cache is on), which capture "
                    "cannot flatten: set use_cache: false under config")
    assert "use_cache" not in capture_hint("auto", "export failed: torch.export (inference) failed: RuntimeError: "
                                                   "Found <class 'mymodel.Thing'> in output")


@pytest.mark.parametrize("model", [_with_config(use_cache=False), _with_config(), zoo.mlp(in_features=8)],
                         ids=["use_cache off", "no use_cache", "no config"])
def test_a_cache_object_whose_config_has_no_use_cache_on_falls_back_to_dynamo(monkeypatch, model):
    """T5Gemma returns its cache though its stacks' use_cache is off and its own config has
    none: the hint cannot be followed, so auto tries dynamo (which captured it)."""
    tried = []

    def dynamo(*a, **k):
        tried.append(1)
        raise CaptureError("dynamo's own failure")

    monkeypatch.setattr(capture_dynamo_module, "capture_dynamo", dynamo)

    def export(*a, **k):
        raise _export_error(RuntimeError(CACHE_ERROR))

    with pytest.raises(CaptureError, match="dynamo failed: dynamo's own failure"):
        capture_auto(model, (torch.randn(2, 8),), {}, name="m", graphs=["inference"], input_names=["x"],
                     export=export)
    assert tried == [1]


@pytest.mark.slow
def test_gpt2_s_default_config_fails_in_one_line_that_says_use_cache_false(tmp_path):
    pytest.importorskip("transformers")
    from tests.helpers.pipelines import run_yaml

    result, _ = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference]}
        models:
          - name: gpt2
            source: hf:GPT2Model
            config: {n_layer: 1, n_embd: 32, n_head: 2, vocab_size: 100, n_positions: 32}
            inputs: [{name: input_ids, shape: [2, 8], dtype: int64, high: 100}]
        """))
    (line,) = [x for x in result.output.splitlines() if x.startswith("FAILED")]
    assert "dynamo failed" not in line and line.endswith("set use_cache: false under config"), line
