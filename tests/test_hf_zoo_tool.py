"""tools/hf_zoo.py's generic shrinking rules (the zoo pipeline is generated from them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
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


# ---------------------------------------------------------------------------------------
# the zoo's bounds: what the key rules missed, found from the model itself


class _ToyConfig(transformers.PretrainedConfig):
    """A config with sizes under keys the key rules do not know."""

    model_type = "aotpipe_toy"

    def __init__(self, hidden_size=48, proj_dim=3000, other_dim=2000, base_channels=0, num_blocks=0,
                 kernel_size=0, needs_multiple_of=1, layer_kinds=None, pad_token_id=3000, **kw):
        self.hidden_size, self.proj_dim, self.other_dim = hidden_size, proj_dim, other_dim
        self.layer_kinds = layer_kinds
        self.base_channels, self.num_blocks, self.kernel_size = base_channels, num_blocks, kernel_size
        self.needs_multiple_of = needs_multiple_of
        super().__init__(pad_token_id=pad_token_id, **kw)


class _ToyModel(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.proj_dim % cfg.needs_multiple_of:
            raise ValueError("proj_dim must be a multiple of needs_multiple_of")
        self.proj = torch.nn.Linear(cfg.hidden_size, cfg.proj_dim)
        self.other = torch.nn.Linear(cfg.hidden_size, cfg.other_dim)
        depth = len(cfg.layer_kinds) if cfg.layer_kinds else cfg.num_blocks
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(depth))
        c = cfg.base_channels  # a stage-doubling network: base, 2x, ... 32x the base
        self.stages = torch.nn.ModuleList(torch.nn.Linear(c << k, c << (k + 1)) for k in range(5)) if c else None


def _fit(monkeypatch, bound, config=None, **defaults):
    """fit_bounds on the toy with these class defaults (the pass changes only fields still at
    their default) and this `config:` mapping (what the key rules set)."""

    class Config(_ToyConfig):
        def __init__(self, **kw):
            super().__init__(**{**defaults, **kw})

    monkeypatch.setattr(hf_zoo, "PARAM_BOUND", bound)
    return hf_zoo.fit_bounds(_ToyModel, Config, dict(config or {}))



def test_a_width_under_an_unknown_key_is_found_from_the_parameters_and_ids_are_left(monkeypatch):
    config, notes, n = _fit(monkeypatch, 200_000)
    assert n <= 200_000 < hf_zoo._n_params(hf_zoo._meta_model(_ToyModel, _ToyConfig()))
    assert config["proj_dim"] == 72  # 3000 keeps its divisor 24: 64 rounded up to a multiple of it
    assert "pad_token_id" not in config  # 3000 too, but an id
    assert notes and "proj_dim: 3000 -> 72" in notes[0]


def test_a_model_within_the_bound_is_left_as_it_is(monkeypatch):
    config, notes, n = _fit(monkeypatch, 1_000_000)
    assert (config, notes) == ({}, []) and n == 3000 * 49 + 2000 * 49


def test_fields_the_key_rules_set_are_kept(monkeypatch):
    """proj_dim given (not the class default): the pass takes other_dim, the next heaviest."""
    config, notes, _ = _fit(monkeypatch, 150_000, {"proj_dim": 2500})
    assert config["proj_dim"] == 2500 and config["other_dim"] == 64, notes


def test_a_change_the_model_does_not_build_with_is_undone_and_the_next_is_tried(monkeypatch):
    config, notes, n = _fit(monkeypatch, 150_000, needs_multiple_of=1000)
    assert "proj_dim" not in config and config["other_dim"] == 64, notes
    assert n > 150_000  # nothing else to shrink: the zoo tool reports it over the bound


def test_a_depth_is_cut_in_fields_named_like_a_count_only(monkeypatch):
    config, notes, _ = _fit(monkeypatch, 10_000, proj_dim=8, other_dim=8, num_blocks=12, kernel_size=12)
    assert config["num_blocks"] == hf_zoo.LAYERS and "kernel_size" not in config, notes


def test_a_stage_count_of_four_or_less_is_not_a_depth(monkeypatch):
    config, notes, _ = _fit(monkeypatch, 1_000, proj_dim=8, other_dim=8, num_blocks=4)
    assert "num_blocks" not in config, notes


def test_a_stack_past_max_stack_blocks_is_cut_under_the_parameter_bound_too(monkeypatch):
    at = _fit(monkeypatch, 10**9, proj_dim=8, other_dim=8, num_blocks=hf_zoo.MAX_STACK)[0]
    past, notes, _ = _fit(monkeypatch, 10**9, proj_dim=8, other_dim=8, num_blocks=hf_zoo.MAX_STACK + 1)
    assert "num_blocks" not in at and past["num_blocks"] == hf_zoo.LAYERS, notes


def test_a_depth_named_by_a_list_of_layer_kinds_keeps_the_last_entries(monkeypatch):
    """Nemotron 3.5's 52 layers are the length of layers_block_type, a list of kinds."""
    kinds = ["mamba", "moe", "attention"] * 4
    config, notes, _ = _fit(monkeypatch, 10**9, proj_dim=8, other_dim=8, layer_kinds=kinds)
    assert config["layer_kinds"] == kinds[-hf_zoo.LAYERS:] and "[12 entries]" in notes[0], notes


def test_a_base_width_a_heavy_size_is_a_power_of_two_multiple_of_is_scaled(monkeypatch):
    """Stages of 32..1024 channels: no field is 1024, the base 32 is; it takes 1024 to WIDTH."""
    config, notes, n = _fit(monkeypatch, 100_000, proj_dim=8, other_dim=8, base_channels=32)
    assert config["base_channels"] == 8 and n <= 100_000, notes


def test_widths_keep_their_small_divisors():
    assert hf_zoo._target("embed_dim", 384, False) == 96      # CvT's stage of 6 heads
    assert hf_zoo._target("hidden_size", 2048, False) == hf_zoo.WIDTH
    assert hf_zoo._target("intermediate_size", 3712, False) == hf_zoo.FFN
    assert hf_zoo._target("entity_vocab_size", 500000, False) == hf_zoo.VOCAB
    assert hf_zoo._target("num_self_attends_per_block", 26, True) == hf_zoo.LAYERS


def _arch(model_type):
    return next(a for a in hf_zoo.enumerate_architectures() if a.model_type == model_type)


@pytest.mark.parametrize("model_type", ["perceiver", "xlm", "luke"])
def test_the_members_the_key_rules_left_at_full_size_come_within_the_bound(model_type):
    plan, cfg = hf_zoo.make_plan(_arch(model_type))
    model_cls = getattr(transformers, _arch(model_type).class_name)
    unbounded = hf_zoo.shrunk_config(type(cfg), model_type)
    assert hf_zoo._n_params(hf_zoo._meta_model(model_cls, type(cfg)(**unbounded))) > hf_zoo.PARAM_BOUND
    assert hf_zoo._n_params(hf_zoo._meta_model(model_cls, cfg)) <= hf_zoo.PARAM_BOUND
    assert plan.notes


@pytest.mark.parametrize("model_type,field", [("timesfm2_5", "context_length"),
                                              ("speech_to_text", "max_source_positions")])
def test_a_length_that_sizes_an_input_over_the_bounds_is_shrunk(model_type, field):
    plan, _ = hf_zoo.make_plan(_arch(model_type))
    assert plan.config[field] == hf_zoo.LENGTH
    assert all(hf_zoo.input_over_bound(c) == "" for c in plan.candidates), plan.candidates
    assert any(field in note for note in plan.notes)


def test_input_bounds_at_their_edges():
    at = {"name": "x", "shape": [2, hf_zoo.INPUT_BOUND // 2]}
    assert hf_zoo.input_over_bound([{"name": "x", "shape": [2, 64, hf_zoo.INPUT_BOUND // 128]}]) == ""
    assert "elements" in hf_zoo.input_over_bound([{"name": "x", "shape": [2, 64, hf_zoo.INPUT_BOUND // 128 + 1]}])
    assert "dimension over" in hf_zoo.input_over_bound([at])  # within the elements, one dimension too long
    assert hf_zoo.input_over_bound([{"name": "x", "shape": [2, hf_zoo.INPUT_LENGTH_BOUND]}]) == ""
    assert hf_zoo.input_over_bound([{"name": "x", "shape": [2, hf_zoo.INPUT_LENGTH_BOUND + 1]}])
    assert hf_zoo.input_over_bound([{"name": "x", "shape": [hf_zoo.INPUT_LENGTH_BOUND + 1, 2]}]) == ""  # a batch


def _result(status="ok", params=1000, inputs=None):
    return hf_zoo.Result("m", "MModel", "k", status, config={}, params=params,
                         inputs=inputs or [{"name": "input_ids", "shape": [2, 16]}])


def test_a_model_over_the_parameter_bound_is_not_written_to_the_zoo(tmp_path):
    import yaml

    at, over = _result(params=hf_zoo.PARAM_BOUND), _result(params=hf_zoo.PARAM_BOUND + 1)
    assert hf_zoo.enforce_bounds(at).status == "ok"
    bound = hf_zoo.enforce_bounds(over)
    assert bound.status == "bound" and f"{hf_zoo.PARAM_BOUND + 1:,} parameters" in bound.reason
    assert hf_zoo.enforce_bounds(_result("eager", params=hf_zoo.PARAM_BOUND + 1)).status == "eager"
    path = tmp_path / "zoo.yaml"
    assert hf_zoo.write_pipeline(path, [at, bound], "zoo") == 1
    assert len(yaml.safe_load(path.read_text())["models"]) == 1
    assert "bound 1" in hf_zoo.report([at, bound], 2) and "largest member: 16,000,000" in hf_zoo.report([at, bound], 2)


def test_a_model_over_the_input_bound_is_not_written_to_the_zoo():
    big = [{"name": "input_features", "shape": [2, 12000, 80]}]
    r = hf_zoo.enforce_bounds(_result(inputs=big))
    assert r.status == "bound" and "input_features[2, 12000, 80]" in r.reason


def test_the_notes_of_a_plan_do_not_change_its_key():
    """A cached check is reused when only the notes (which say what the config holds) differ."""
    arch = _arch("bert")
    plan, _ = hf_zoo.make_plan(arch)
    noted = hf_zoo.Plan(**{**plan.__dict__, "notes": ["x: 1 -> 2"]})
    assert hf_zoo.plan_key(arch, plan) == hf_zoo.plan_key(arch, noted)


def test_an_override_for_a_model_type_holds_in_a_sub_config_of_that_type():
    cfg = hf_zoo.shrunk_config(transformers.CONFIG_MAPPING["nemo_speechlm"], "nemo_speechlm")
    assert cfg["text_config"]["mamba_num_heads"] == hf_zoo.OVERRIDES["nemotron_h"]["config"]["mamba_num_heads"]


def test_a_depth_multiplier_is_one_and_a_width_multiplier_stays():
    cfg = hf_zoo.shrunk_config(transformers.AlignConfig, "align")
    assert cfg["vision_config"]["depth_coefficient"] == 1.0
    assert "width_coefficient" not in cfg["vision_config"]
