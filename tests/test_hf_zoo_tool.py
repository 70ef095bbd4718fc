"""tools/hf_zoo.py's generic shrinking rules (the zoo pipeline is generated from them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

_spec = importlib.util.spec_from_file_location("hf_zoo", Path(__file__).resolve().parent.parent / "tools" / "hf_zoo.py")
hf_zoo = importlib.util.module_from_spec(_spec)
sys.modules["hf_zoo"] = hf_zoo  # its dataclasses look their module up
_spec.loader.exec_module(hf_zoo)


def test_every_embedding_table_is_shrunk_not_only_the_vocabulary():
    cfg = hf_zoo.shrunk_config(transformers.BltConfig, "blt")
    assert cfg["encoder_hash_byte_group_vocab"] == hf_zoo.VOCAB  # 500002 rows by default: 8 GiB at capture


def test_text_stacks_of_a_multimodal_config_run_without_kv_cache():
    cfg = hf_zoo.shrunk_config(transformers.Qwen2VLConfig, "qwen2_vl")
    assert cfg["text_config"]["use_cache"] is False
    assert cfg["text_config"]["num_hidden_layers"] == hf_zoo.LAYERS


def test_an_audio_codec_is_offered_its_channels_dimension():
    """Mimi's encoder takes [batch, audio channels, samples]; [batch, samples] fails eagerly."""
    cfg = transformers.MimiConfig()
    shapes = [c[0]["shape"] for c in hf_zoo.candidate_inputs(transformers.MimiModel, cfg)]
    assert [hf_zoo.BATCH, cfg.audio_channels, hf_zoo.AUDIO_SAMPLES] in shapes, shapes
