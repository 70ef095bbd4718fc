"""Model sources and example inputs: seeded, in range, the same in any process."""

import subprocess
import sys

import pytest
import torch

from aotpipe.errors import SourceError
from aotpipe.models.sources import build_model, make_example_inputs
from aotpipe.pipeline.config import parse_pipeline

YAML = """
version: 1
name: s
seed: 7
models:
  - name: cnn
    source: aotpipe.zoo:small_cnn
    args: {channels: 4}
    inputs:
      - {shape: [2, 3, 8, 8]}
  - name: ints
    source: aotpipe.zoo:mlp
    inputs:
      - {name: ids, shape: [1000], dtype: int64, low: 5, high: 9}
      - {name: mask, shape: [1000], dtype: bool}
      - {name: u, shape: [1000], dtype: float16, low: -1, high: 1}
      - {name: small, shape: [1000], dtype: int8}
"""


def _specs():
    return {m.name: m for m in parse_pipeline(YAML).models}


def test_weights_are_seeded_per_model():
    spec = _specs()["cnn"]
    a, b = build_model(spec), build_model(spec)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n
    other = spec.model_copy(update={"seed": 8})
    assert not torch.equal(build_model(other).conv1.weight, a.conv1.weight)


def test_inputs_respect_dtype_and_range():
    _, kw = make_example_inputs(_specs()["ints"])
    assert kw["ids"].dtype == torch.int64 and int(kw["ids"].min()) == 5 and int(kw["ids"].max()) == 8
    assert kw["mask"].dtype == torch.bool and 0 < int(kw["mask"].sum()) < 1000
    assert kw["u"].dtype == torch.float16 and float(kw["u"].min()) >= -1 and float(kw["u"].max()) <= 1
    assert kw["small"].dtype == torch.int8 and set(kw["small"].tolist()) == {0, 1}


def test_inputs_are_the_same_in_another_process():
    args, _ = make_example_inputs(_specs()["cnn"])
    code = (
        "import sys, torch; from aotpipe.pipeline.config import parse_pipeline; from aotpipe.models.sources import make_example_inputs;"
        "from tests.test_sources import YAML;"
        "a, _ = make_example_inputs([m for m in parse_pipeline(YAML).models if m.name == 'cnn'][0]);"
        "sys.stdout.write(repr(a[0].sum().item()) + ' ' + repr(a[0][0, 0, 0, :3].tolist()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == repr(args[0].sum().item()) + " " + repr(args[0][0, 0, 0, :3].tolist())


def test_callable_returning_non_module_is_a_source_error(tmp_path):
    spec = _specs()["cnn"].model_copy(update={"source": "collections:OrderedDict", "args": {}})
    with pytest.raises(SourceError, match="not a torch.nn.Module"):
        build_model(spec)


def test_bad_args_name_the_source():
    spec = _specs()["cnn"].model_copy(update={"args": {"colours": 3}})
    with pytest.raises(SourceError, match="aotpipe.zoo:small_cnn.*check args"):
        build_model(spec)


def test_hf_source_builds_from_config_with_random_weights():
    pytest.importorskip("transformers")
    spec = parse_pipeline("""
version: 1
name: h
models:
  - name: bert
    source: hf:BertModel
    config: {num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64, vocab_size: 100}
    inputs: [{name: input_ids, shape: [1, 4], dtype: int64, high: 100}]
""").models[0]
    m = build_model(spec)
    assert type(m).__name__ == "BertModel" and m.config.hidden_size == 32
    assert torch.equal(build_model(spec).embeddings.word_embeddings.weight, m.embeddings.word_embeddings.weight)


def test_hf_bad_config_is_a_source_error():
    pytest.importorskip("transformers")
    spec = parse_pipeline("""
version: 1
name: h
models:
  - name: bert
    source: hf:BertModel
    config: {hidden_size: 30, num_attention_heads: 4}
    inputs: [{name: input_ids, shape: [1, 4], dtype: int64}]
""", check_sources=False).models[0]  # validate refuses it too (tests/test_silent_mistakes.py)
    with pytest.raises(SourceError, match="building hf:BertModel from its config failed"):
        build_model(spec)
