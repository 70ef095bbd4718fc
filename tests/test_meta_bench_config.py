"""benchmarks/meta_bench.py's Llama-3-70B-size config: every key one LlamaConfig takes, so the
70B meta target is measured on the model it names (a stale key failed the whole benchmark)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parent.parent


def _meta_bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("meta_bench", REPO / "benchmarks" / "meta_bench.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_the_70b_config_has_only_keys_llama_takes_and_builds_on_meta():
    import torch
    import transformers

    from aotpipe.models.sources import config_key_problems

    config = _meta_bench().llama70b_config(1)
    assert config_key_problems("hf:LlamaForCausalLM", config) == []
    cfg = transformers.LlamaConfig(**config)
    assert cfg.rope_parameters["rope_theta"] == 500000.0 and cfg.hidden_size == 8192
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) > 2e9  # one 70B-wide layer and the 128k vocabulary
