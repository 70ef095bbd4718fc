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


# ---------------------------------------------------------------------------------------
# --dims: the dynamic zoo's named sizes and ranges


def _shapes(inputs):
    return {i["name"]: i["shape"] for i in inputs}


def test_token_inputs_get_a_dynamic_batch_and_sequence_and_a_decoder_its_own():
    inputs = [{"name": "input_ids", "shape": [2, 16]}, {"name": "attention_mask", "shape": [2, 16]},
              {"name": "decoder_input_ids", "shape": [2, 8]}]
    named, dims = hf_zoo.named_dims(inputs, transformers.T5Config())
    assert _shapes(named) == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"],
                              "decoder_input_ids": ["batch", "decoder_seq"]}
    assert dims == {"batch": [1, 4, 2], "seq": [4, 64, 16], "decoder_seq": [2, 32, 8]}


def test_an_image_keeps_its_size_and_gets_a_dynamic_batch_only():
    named, dims = hf_zoo.named_dims([{"name": "pixel_values", "shape": [2, 3, 64, 64]}], transformers.ViTConfig())
    assert _shapes(named) == {"pixel_values": ["batch", 3, 64, 64]}
    assert list(dims) == ["batch"]


def test_whisper_style_features_keep_their_frame_count_which_the_config_fixes():
    cfg = transformers.WhisperConfig(max_source_positions=32)
    named, _ = hf_zoo.named_dims([{"name": "input_features", "shape": [2, 80, 64]}], cfg)
    assert _shapes(named) == {"input_features": ["batch", 80, 64]}


def test_the_sequence_max_stops_at_the_text_position_table():
    _, dims = hf_zoo.named_dims([{"name": "input_ids", "shape": [2, 16]}],
                                transformers.BertConfig(max_position_embeddings=40))
    assert dims["seq"] == [4, 40, 16]


def test_a_vision_tower_position_table_does_not_bound_the_text_sequence():
    cfg = transformers.Florence2Config(text_config={"max_position_embeddings": 48},
                                       vision_config={"max_position_embeddings": 10})
    _, dims = hf_zoo.named_dims([{"name": "input_ids", "shape": [2, 16]}], cfg)
    assert dims["seq"] == [4, 48, 16]


class _Eager:
    """A stand-in for a model run in eager: fails where `bad(sizes)` says, and counts its runs."""

    def __init__(self, bad, example):
        self.bad, self.example, self.runs = bad, example, []

    def __call__(self, sizes):
        full = {**self.example, **sizes}
        self.runs.append(full)
        return "RuntimeError: does not run" if self.bad(full) else ""


RANGES = {"batch": [1, 4, 2], "seq": [4, 64, 16]}


def test_ranges_a_model_runs_at_both_corners_are_kept_after_two_runs():
    eager = _Eager(lambda s: False, {"batch": 2, "seq": 16})
    fitted, notes = hf_zoo.fit_ranges(RANGES, eager)
    assert fitted == RANGES and notes == []
    assert eager.runs == [{"batch": 1, "seq": 4}, {"batch": 4, "seq": 64}]


def test_a_max_the_model_cannot_take_is_halved_toward_the_example():
    fitted, notes = hf_zoo.fit_ranges(RANGES, _Eager(lambda s: s["seq"] > 40, {"batch": 2, "seq": 16}))
    assert fitted == {"batch": [1, 4, 2], "seq": [4, 32, 16]}
    assert notes == ["seq max 64: RuntimeError: does not run"]


def test_a_batch_of_one_a_batch_norm_refuses_in_training_raises_the_min_to_two():
    fitted, _ = hf_zoo.fit_ranges(RANGES, _Eager(lambda s: s["batch"] == 1, {"batch": 2, "seq": 16}))
    assert fitted["batch"] == [2, 4, 2]


def test_maxes_each_fine_alone_but_not_together_are_narrowed_together():
    fitted, notes = hf_zoo.fit_ranges(RANGES, _Eager(lambda s: s["batch"] * s["seq"] > 128, {"batch": 2, "seq": 16}))
    assert fitted == {"batch": [1, 2, 2], "seq": [4, 32, 16]}
    assert notes[-1].startswith("max together (batch=4, seq=64):")


def test_a_dimension_narrowed_to_its_example_is_written_as_a_number_again():
    inputs = [{"name": "input_ids", "shape": ["batch", "seq"]}]
    entry = hf_zoo.dims_entry("m", "hf:M", {}, inputs, {"batch": [1, 4, 2], "seq": [16, 16, 16]})
    assert entry["inputs"] == [{"name": "input_ids", "shape": ["batch", 16]}]
    assert "dims" not in entry  # batch's range is the defaults', seq is no longer a dimension


def test_a_narrowed_range_is_the_model_own_dims():
    entry = hf_zoo.dims_entry("m", "hf:M", {}, [{"name": "input_ids", "shape": ["batch", "seq"]}],
                              {"batch": [2, 4, 2], "seq": [4, 64, 16]})
    assert entry["dims"] == {"batch": {"min": 2, "max": 4, "example": 2}}


def test_the_dynamic_zoo_holds_the_static_zoo_models_at_their_example_sizes():
    """pipelines/hf-zoo-dynamic.yaml is stale when hf-zoo.yaml changed: rerun tools/hf_zoo.py --dims."""
    import yaml

    pipelines = Path(__file__).resolve().parent.parent / "pipelines"
    static = yaml.safe_load((pipelines / "hf-zoo.yaml").read_text())
    dynamic = yaml.safe_load((pipelines / "hf-zoo-dynamic.yaml").read_text())
    assert [m["name"] for m in dynamic["models"]] == [m["name"] for m in static["models"]]
    for s, d in zip(static["models"], dynamic["models"], strict=True):
        dims = {**dynamic["defaults"]["dims"], **d.get("dims", {})}
        at_example = [{**i, "shape": [dims[x]["example"] if isinstance(x, str) else x for x in i["shape"]]}
                      for i in d["inputs"]]
        assert (d["source"], d["config"], at_example) == (s["source"], s["config"], s["inputs"]), d["name"]
