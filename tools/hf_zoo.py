#!/usr/bin/env python3
"""Generate aotpipe pipelines for every transformers architecture that runs in eager.

For each architecture transformers lists (one model class per ``model_type``), this tool

1. builds the default config and *shrinks* it generically (layers -> 2, widths -> 64,
   feed-forward -> 128, vocabulary -> 1024, images -> 64x64, experts -> 4, recursively in
   sub-configs such as ``text_config`` / ``vision_config``), with model-specific
   overrides only where no generic rule works (:data:`OVERRIDES`); then by what the model
   built on the meta device shows (:func:`fit_bounds`: stacks of more than MAX_STACK blocks,
   and what keeps it over PARAM_BOUND parameters) and by the lengths that size its inputs
   (:func:`fit_input_lengths`); a model over PARAM_BOUND or the input bounds after that is
   left out (status ``bound``);
2. works out candidate example inputs from the model's main input name and ``forward``
   signature (``input_ids``, ``pixel_values``, ``input_features``, ``input_values``, ...);
3. checks each candidate in eager, in a forked subprocess per architecture with a time
   and memory limit, exactly as aotpipe will build it: a one-model pipeline YAML is
   written and read back with :func:`aotpipe.pipeline.config.load_pipeline`, the model is built with
   :func:`aotpipe.models.sources.build_model` and its inputs with
   :func:`aotpipe.models.sources.make_example_inputs`; then an eval forward (no grad) and a
   training forward + ``sum_loss(out).backward()``;
4. caches every result in ``tools/hf_zoo_eager.json`` (keyed by a digest of the plan and
   the transformers/torch versions, so a re-run only checks what changed), and writes a
   pipeline of the architectures that passed.

With ``--dims`` it writes the dynamic zoo instead (``pipelines/hf-zoo-dynamic.yaml``): the models
of ``pipelines/hf-zoo.yaml`` (the same configs and example inputs; the static checks are not
redone) with their batch and sequence sizes named dimensions (:func:`named_dims`), each range
narrowed to the model's position limits and then to what it runs in eager at its min and max
(:func:`fit_ranges`; cached in ``tools/hf_zoo_dims_eager.json``).

Examples::

    .venv/bin/python tools/hf_zoo.py                       # check all (cached), write pipelines/hf-zoo.yaml
    .venv/bin/python tools/hf_zoo.py --only bert llama -o /tmp/two.yaml
    .venv/bin/python tools/hf_zoo.py --limit 20 -o /tmp/first20.yaml
    .venv/bin/python tools/hf_zoo.py --shard 1/4 -o pipelines/hf-zoo-1.yaml
    .venv/bin/python tools/hf_zoo.py --report              # counts and failures grouped by cause
    .venv/bin/python tools/hf_zoo.py --dims                # pipelines/hf-zoo-dynamic.yaml (ranges checked, cached)
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO / "tools" / "hf_zoo_eager.json"
DEFAULT_OUTPUT = REPO / "pipelines" / "hf-zoo.yaml"
DEFAULT_DIMS_CACHE = REPO / "tools" / "hf_zoo_dims_eager.json"
DEFAULT_DIMS_OUTPUT = REPO / "pipelines" / "hf-zoo-dynamic.yaml"

# ---------------------------------------------------------------------------------------
# sizes the generic shrinking aims for

LAYERS = 2          # transformer layers per stack (2 keeps alternating layer patterns alive)
WIDTH = 64          # hidden size of every stack
MAX_HEADS = 4       # attention heads (head_dim = WIDTH // heads)
FFN = 128           # feed-forward / intermediate size
VOCAB = 1024        # vocabulary; special token ids above it are remapped just below it
IMAGE = 64          # image side in pixels
EXPERTS = 4         # routed experts of a mixture of experts
BATCH = 2
SEQ = 16            # text tokens
DECODER_SEQ = 8     # decoder tokens of an encoder-decoder
AUDIO_SAMPLES = 4000  # raw waveform samples (input_values)
AUDIO_FRAMES = 64   # spectrogram frames (input_features)
LENGTH = 64         # a config length that sizes an input (context, source positions, frames) over the bounds

# Bounds every member of the zoo keeps; the tool enforces them (a model over one is not written
# to the pipeline, and --report lists it with its figures). With every stack at LAYERS layers of
# width WIDTH the members sit at 0.3M parameters (median); stage-based vision backbones and audio
# codecs that keep their default channel widths at one block per stage reach 8M to 15M (resnet's
# [256, 512, 1024, 2048], hgnet_v2, encodec). Past 16M a model kept a width, depth or vocabulary
# the key rules did not know, and :func:`fit_bounds` finds it from the model itself.
PARAM_BOUND = 16_000_000
# The elements of one example input: a batch of two 64x64 RGB images is 24,576, of two 8-frame
# clips of them 196,608; 2 x 12,000 x 80 spectrogram features (Speech2Text's full source length)
# are not a shrunk input.
INPUT_BOUND = 262_144
INPUT_LENGTH_BOUND = 4_096  # any one dimension of an example input (4,000 raw audio samples fit)

# Config attributes (names as stored on the config object) the rules act on.
LAYER_KEYS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_encoder_layers", "num_decoder_layers",
    "encoder_layers", "decoder_layers", "num_text_layers", "num_vision_layers", "depth", "text_layers",
    "vision_layers", "num_blocks", "encoder_num_hidden_layers", "decoder_num_hidden_layers",
    "num_cross_layers", "num_single_layers", "num_global_layers", "num_local_layers",
}
HEAD_KEYS = {
    "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
    "attention_heads", "encoder_num_attention_heads", "decoder_num_attention_heads",
}
KV_HEAD_KEYS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "kv_heads"}
WIDTH_KEYS = {"hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "n_embed", "hidden_dim",
              "encoder_hidden_size", "decoder_hidden_size", "width"}
FFN_KEYS = {
    "intermediate_size", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "ffn_hidden_size",
    "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_dim", "dim_feedforward",
    "encoder_intermediate_size", "decoder_intermediate_size", "expert_intermediate_size", "inner_dim",
}
EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"}
TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "top_k", "router_top_k"}
IMAGE_KEYS = {"image_size", "img_size", "input_size"}
STAGE_DEPTH_KEYS = {"depths", "num_layers_per_stage", "stage_depths", "block_depths"}
# Substrings that mark an attribute as *not* a width even when its value equals one.
NOT_A_WIDTH = ("vocab", "position", "image", "patch", "window", "length", "seq", "bucket", "chunk", "context",
               "sample", "token", "max", "num_", "layers", "rate", "freq", "codebook", "label", "stride")
SPECIAL_TOKENS = ("pad", "bos", "eos", "unk", "sep", "cls", "mask", "decoder_start", "forced_")

# ---------------------------------------------------------------------------------------
# model-specific overrides: only where a generic rule cannot work. Each entry is
#   model_type: {"config": {...fields applied after the generic rules...},
#                "inputs": [...InputSpec dicts replacing the generated candidates...],
#                "skip": "why this architecture is not attempted"}
# A config field written "a.b" sets field b of sub-config a.

OVERRIDES: dict[str, dict[str, Any]] = {
    # Mamba-2: num_heads * head_dim must equal expand * hidden_size.
    "mamba2": {"config": {"num_heads": 8, "head_dim": 16, "expand": 2, "n_groups": 1}},
    "bamba": {"config": {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_expand": 2, "mamba_n_groups": 1}},
    "nemotron_h": {"config": {"mamba_num_heads": 8, "mamba_head_dim": 16, "expand": 2, "n_groups": 1}},
    "granitemoehybrid": {"config": {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_expand": 2,
                                    "mamba_n_groups": 1}},
    "falcon_h1": {"config": {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_expand": 2, "mamba_n_groups": 1}},
    "zamba2": {"config": {"n_mamba_heads": 8, "mamba_headdim": 16, "mamba_expand": 2, "mamba_ngroups": 1}},
}


# ---------------------------------------------------------------------------------------
# enumeration


@dataclass
class Arch:
    """One architecture: a model_type and the class the pipeline builds for it."""

    model_type: str
    class_name: str
    mapping: str  # the auto mapping the class came from


# Mappings tried, in order, for a model_type: the base model first, then heads that take
# the most common inputs. The first mapping that lists the type wins.
MAPPING_ORDER = [
    "MODEL_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_BACKBONE_MAPPING_NAMES",
    "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
    "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
]


def enumerate_architectures() -> list[Arch]:
    """Every model_type of any transformers auto model mapping, with one class each."""
    import transformers.models.auto.modeling_auto as ma

    names = [n for n in MAPPING_ORDER if hasattr(ma, n)]
    names += sorted(n for n in dir(ma) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES") and n not in names)
    out: dict[str, Arch] = {}
    for mapping in names:
        for model_type, cls in getattr(ma, mapping).items():
            if model_type in out:
                continue
            cls_name = cls if isinstance(cls, str) else cls[0]
            out[model_type] = Arch(model_type, cls_name, mapping.removesuffix("_MAPPING_NAMES"))
    return sorted(out.values(), key=lambda a: a.model_type)


def safe_name(model_type: str) -> str:
    """model_type as an aotpipe model name: letters, digits, '_', '.', '-'."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", model_type)
    return name if re.match(r"^[A-Za-z0-9_]", name) else "_" + name


# ---------------------------------------------------------------------------------------
# shrinking configs


def _is_config(x: Any) -> bool:
    from transformers import PreTrainedConfig

    return isinstance(x, PreTrainedConfig)


def _public(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def _jsonable(v: Any) -> Any:
    """A config value as YAML-safe plain data (tuples -> lists, dtypes -> names)."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if _is_config(v):
        return _jsonable(v.to_dict())
    return str(v)


class _Shrinker:
    """Computes the overrides that shrink one config tree; all ids remapped consistently."""

    def __init__(self, mrope_default: list[int] | None = None) -> None:
        self.mrope_default = mrope_default  # rope_parameters["mrope_section"] the model's code falls back to
        self.widths: set[int] = set()  # widths and feed-forward sizes of every config of the tree
        self.ffns: set[int] = set()
        self.token_map: dict[int, int] = {}
        self.notes: list[str] = []

    def _token(self, old: int) -> int:
        if old not in self.token_map:
            self.token_map[old] = VOCAB - 1 - len(self.token_map)
        return self.token_map[old]

    def collect(self, cfg: Any) -> None:
        """Note the widths and feed-forward sizes of `cfg` and its sub-configs (of configs with
        attention heads), so a field of one config that equals another's width shrinks too."""
        attrs = _public(cfg)
        if any(isinstance(attrs.get(k), int) for k in HEAD_KEYS):
            self.widths |= {v for k, v in attrs.items() if k in WIDTH_KEYS and isinstance(v, int) and v >= 256}
            self.ffns |= {v for k, v in attrs.items() if k in FFN_KEYS and isinstance(v, int) and v >= 256}
        for v in attrs.values():
            if _is_config(v):
                self.collect(v)

    def overrides(self, cfg: Any) -> dict[str, Any]:
        """The fields of `cfg` to change (sub-configs as nested dicts of their own changes)."""
        attrs = _public(cfg)
        new: dict[str, Any] = {}

        # layers (and lists with one entry per layer); a hierarchical model's stage count
        # (len(depths), often stored as num_layers) is kept, its per-stage depths go to 1
        stages = {len(attrs[k]) for k in STAGE_DEPTH_KEYS if isinstance(attrs.get(k), (list, tuple))}
        old_layers = [v for k, v in attrs.items()
                      if k in LAYER_KEYS and isinstance(v, int) and not isinstance(v, bool) and v not in stages]
        for k, v in attrs.items():
            if (k in LAYER_KEYS and isinstance(v, int) and not isinstance(v, bool) and v > LAYERS
                    and v not in stages):
                new[k] = LAYERS
        if old_layers:
            n_old = max(old_layers)
            for k, v in attrs.items():
                if isinstance(v, (list, tuple)) and len(v) == n_old and n_old > LAYERS and k not in new:
                    new[k] = list(v[-LAYERS:])
            for k in ("first_k_dense_replace", "num_dense_layers"):
                if isinstance(attrs.get(k), int) and attrs[k] > 1:
                    new[k] = 1
            for k in ("mlp_only_layers", "global_attn_layers", "full_attn_idxs", "attn_layer_indices"):
                v = attrs.get(k)
                if isinstance(v, (list, tuple)) and all(isinstance(i, int) for i in v):
                    kept = [i for i in v if i < LAYERS]
                    if kept != list(v):
                        new[k] = kept or [LAYERS - 1]
        # a backbone whose outputs name layers: keep as many layers as it has outputs, and
        # point the outputs at the last ones
        outs = getattr(cfg, "out_indices", None)
        n_layers = new.get("num_hidden_layers")
        if n_layers is not None and isinstance(outs, (list, tuple)) and outs and not stages:
            k_out = len(outs)
            n_layers = max(LAYERS, k_out)
            new["num_hidden_layers"] = n_layers
            new["out_indices"] = list(range(n_layers - k_out + 1, n_layers + 1))
            new["out_features"] = [f"stage{i}" for i in new["out_indices"]]
        for k in STAGE_DEPTH_KEYS:
            v = attrs.get(k)
            if isinstance(v, (list, tuple)) and v and all(isinstance(i, int) for i in v) and max(v) > 1:
                new[k] = [1] * len(v)

        # attention heads and widths
        heads = next((attrs[k] for k in HEAD_KEYS if isinstance(attrs.get(k), int) and attrs[k] > 0), None)
        widths = {k: v for k, v in attrs.items() if k in WIDTH_KEYS and isinstance(v, int) and not isinstance(v, bool)}
        old_width = max(widths.values()) if widths else None
        if heads is not None:
            h = MAX_HEADS if heads >= MAX_HEADS else (2 if heads >= 2 else 1)
            for k in HEAD_KEYS:
                if isinstance(attrs.get(k), int) and attrs[k] > 0:
                    new[k] = h
            for k in KV_HEAD_KEYS:
                kv = attrs.get(k)
                if isinstance(kv, int) and kv > 0:
                    kv_new = max(1, h * kv // heads)
                    new[k] = kv_new if h % kv_new == 0 else 1
            head_dim = WIDTH // h
            if isinstance(attrs.get("head_dim"), int):
                new["head_dim"] = head_dim
            if isinstance(attrs.get("rotary_dim"), int):
                new["rotary_dim"] = min(attrs["rotary_dim"], head_dim)
            if isinstance(attrs.get("qk_rope_head_dim"), int):  # multi-head latent attention
                new.update(qk_rope_head_dim=head_dim, qk_nope_head_dim=head_dim, v_head_dim=head_dim,
                           kv_lora_rank=32)
                if isinstance(attrs.get("q_lora_rank"), int):
                    new["q_lora_rank"] = 32
                if isinstance(attrs.get("qk_head_dim"), int):
                    new["qk_head_dim"] = 2 * head_dim
                if isinstance(attrs.get("head_dim"), int):
                    new["head_dim"] = head_dim
        per_stage_heads = any(isinstance(attrs.get(k), (list, tuple)) for k in HEAD_KEYS)
        if old_width is not None and (heads is not None or (old_width > 2 * WIDTH and not per_stage_heads)):
            for k in widths:
                new[k] = WIDTH
        old_ffn = {v for k, v in attrs.items() if k in FFN_KEYS and isinstance(v, int) and not isinstance(v, bool)}
        for k, v in attrs.items():
            if k in FFN_KEYS and isinstance(v, int) and not isinstance(v, bool) and v > FFN:
                new[k] = FFN if "moe" not in k and "expert" not in k else FFN // 2
        # other fields that carry the old width or feed-forward size (projections, ...)
        for k, v in attrs.items():
            if k in new or not isinstance(v, int) or isinstance(v, bool) or any(s in k for s in NOT_A_WIDTH):
                continue
            if not any(s in k for s in ("dim", "size", "hidden", "channels")):
                continue
            if v >= 256 and (v == old_width or v in self.widths):
                new[k] = WIDTH
            elif v >= 256 and (v in old_ffn or v in self.ffns):
                new[k] = FFN

        # rope sections that must add up to head_dim / 2
        for rk in ("rope_parameters", "rope_scaling"):
            rp = attrs.get(rk)
            fallback = _mrope_for_type(getattr(cfg, "model_type", "")) or self.mrope_default
            if (isinstance(rp, dict) and heads is not None and fallback and "mrope_section" not in rp
                    and "vocab_size" in attrs):
                rp = {**rp, "mrope_section": list(fallback)}
            if isinstance(rp, dict) and isinstance(rp.get("mrope_section"), (list, tuple)) and heads is not None:
                sec = list(rp["mrope_section"])
                new_hd = WIDTH // new.get(next(iter(sorted(HEAD_KEYS & new.keys()))), heads)
                total = sum(sec)
                target = max(len(sec), new_hd // 2)
                scaled = [max(1, x * target // total) for x in sec]
                scaled[0] += target - sum(scaled)
                new[rk] = {**rp, "mrope_section": scaled}

        # mixture of experts
        for k in EXPERT_KEYS:
            v = attrs.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > EXPERTS:
                new[k] = EXPERTS
        for k in TOPK_KEYS:
            v = attrs.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 2:
                new[k] = 2
        for k in ("n_group", "topk_group", "num_expert_group"):
            if isinstance(attrs.get(k), int) and attrs[k] > 1:
                new[k] = 1

        # vocabulary and special token ids
        vocab = attrs.get("vocab_size")
        if isinstance(vocab, int) and vocab > VOCAB:
            new["vocab_size"] = VOCAB
        for k, v in attrs.items():  # other embedding tables (BLT's hash n-gram vocabulary: 500002 rows)
            if k != "vocab_size" and k.endswith("_vocab") and isinstance(v, int) and not isinstance(v, bool) \
                    and v > VOCAB:
                new[k] = VOCAB
        for k, v in attrs.items():
            if not (k.endswith("token_id") or k.endswith("token_index") or k.endswith("token_ids")):
                continue
            if isinstance(v, int) and not isinstance(v, bool) and v >= VOCAB:
                new[k] = self._token(v)
            elif isinstance(v, (list, tuple)) and any(isinstance(i, int) and i >= VOCAB for i in v):
                new[k] = [self._token(i) if isinstance(i, int) and i >= VOCAB else i for i in v]

        # images
        for k in IMAGE_KEYS:
            v = attrs.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > IMAGE:
                new[k] = IMAGE
            elif isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(i, int) for i in v) and max(v) > IMAGE:
                new[k] = [IMAGE, IMAGE]

        # audio: whisper-style encoders expect exactly 2 * max_source_positions frames
        if isinstance(attrs.get("max_source_positions"), int) and attrs["max_source_positions"] > AUDIO_FRAMES // 2:
            if "num_mel_bins" in attrs:
                new["max_source_positions"] = AUDIO_FRAMES // 2

        # a network's depth multiplier (EfficientNet's depth_coefficient 3.1 makes ALIGN's vision
        # tower 55 blocks; its width multiplier stays: the projection sizes are computed from it)
        for k, v in attrs.items():
            if isinstance(v, float) and v > 1.0 and "depth" in k and ("coefficient" in k or "multiplier" in k):
                new[k] = 1.0

        # nested sub-configs, recursively; a sub-config of a model_type with an override gets it
        # too (nemotron_h's mamba sizes hold in Nemotron 3.5 Transcribe's text_config)
        for k, v in attrs.items():
            if _is_config(v):
                sub = self.overrides(v)
                sub.update({f: x for f, x in OVERRIDES.get(getattr(v, "model_type", ""), {}).get("config", {}).items()
                            if "." not in f})
                if sub:
                    new[k] = sub
        return new


def _apply(d: dict[str, Any], dotted: dict[str, Any]) -> None:
    for key, value in dotted.items():
        parts = key.split(".")
        cur = d
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value


def _sub_config_dict(default_sub: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """A sub-config as the dict its parent config is given: its differences from its class's
    defaults (so a parent's customised default survives), the overrides, and model_type."""
    try:
        class_default = type(default_sub)().to_dict()
    except Exception:
        class_default = {}
    full = default_sub.to_dict()
    out = {k: v for k, v in full.items()
           if k not in ("transformers_version", "_name_or_path", "architectures")
           and (k not in class_default or class_default[k] != v)}
    out["model_type"] = full.get("model_type", getattr(default_sub, "model_type", ""))
    for k, v in overrides.items():
        if isinstance(v, dict) and _is_config(getattr(default_sub, k, None)):
            out[k] = _sub_config_dict(getattr(default_sub, k), v)
        else:
            out[k] = v
    if "use_cache" in _public(default_sub):
        out["use_cache"] = False   # a text stack's KV cache is not part of a training graph
    return _jsonable(out)


def shrunk_config(config_cls: type, model_type: str, mrope_default: list[int] | None = None) -> dict[str, Any]:
    """The `config:` mapping of a pipeline entry: the fields to pass to `config_cls(**...)`."""
    default = config_cls()
    shrinker = _Shrinker(mrope_default)
    shrinker.collect(default)
    over = shrinker.overrides(default)
    extra = OVERRIDES.get(model_type, {}).get("config", {})
    out: dict[str, Any] = {}
    for k, v in over.items():
        sub = getattr(default, k, None)
        out[k] = _sub_config_dict(sub, v) if isinstance(v, dict) and _is_config(sub) else _jsonable(v)
    _apply(out, extra)
    if "use_cache" in _public(default):
        out["use_cache"] = False
    # Only fields the config class takes: it would keep any other as an attribute its model
    # never reads, and `aotpipe validate` refuses such a key as a typo.
    from aotpipe.models.sources import config_fields  # torch: as the eager check imports it

    known = config_fields(config_cls)
    return out if known is None else {k: v for k, v in out.items() if k in known}


# ---------------------------------------------------------------------------------------
# bounds: what the key rules missed, found from the model itself

# Fields the model-driven pass leaves alone: ids and indices (a value equal to a width by chance).
NOT_A_SIZE = ("token_id", "token_index", "token_ids", "_id", "_idx", "index")
# ... and, as a depth (a count of repeated blocks) or a base width that others are multiples of,
# fields whose name says they are something else (RGB's 3 channels equal a 3-stage list's length).
NOT_A_DEPTH = ("kernel", "patch", "channel", "head", "window", "stride", "size", "dim", "position", "length",
               "rate", "ratio", "bins", "label", "group", "frames", "sample", "filter")
# A base width: named like one, and not like the sizes above, a state, a chunk or a factor.
BASE_WIDTH_WORDS = ("dim", "size", "channel", "filter", "width", "hidden", "embed")
NOT_A_BASE_WIDTH = tuple(s for s in NOT_A_DEPTH if s not in ("size", "dim", "channel", "filter")) + (
    "state", "chunk", "factor", "feature", "vocab")


def _int_fields(cfg: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], int | None, int]]:
    """(path, list index or None, value) of every int field of `cfg` and its sub-configs, and of
    every int in a list field (per-stage widths and depths)."""
    for k, v in _public(cfg).items():
        if any(k.endswith(s) for s in NOT_A_SIZE):
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            yield (*path, k), None, v
        elif isinstance(v, (list, tuple)) and v and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
            for i, x in enumerate(v):
                yield (*path, k), i, x
        elif _is_config(v):
            yield from _int_fields(v, (*path, k))


def _meta_model(model_cls: type, cfg: Any) -> Any:
    """The model built on the meta device (no memory, no initialisation arithmetic)."""
    import torch

    with torch.device("meta"):
        return model_cls(cfg)


def _n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _with_field(config: dict[str, Any], cfg: Any, path: tuple[str, ...], index: int | None,
                value: Any) -> dict[str, Any]:
    """A copy of the `config:` mapping with the field at `path` (element `index` of a list) set;
    a sub-config the mapping does not hold yet is added as its differences from its defaults."""
    import copy

    out = copy.deepcopy(config)
    cur, obj = out, cfg
    for p in path[:-1]:
        obj = getattr(obj, p)
        if not isinstance(cur.get(p), dict):
            cur[p] = _sub_config_dict(obj, {})
        cur = cur[p]
    leaf = path[-1]
    if index is None:
        cur[leaf] = value
    else:
        old = list(getattr(obj, leaf))
        cur[leaf] = old[:index] + [value] + old[index + 1:]
    return out


def _target(name: str, value: int, depth: bool) -> int:
    """What a field the pass changes becomes: a depth LAYERS, a vocabulary VOCAB, a feed-forward
    size FFN, any other width WIDTH; a width or feed-forward size rounded up to keep the small
    divisors the old value had (CvT's 384 wide stage has 6 heads: it becomes 96, not 64)."""
    if depth:
        return LAYERS
    if "vocab" in name:
        return VOCAB
    target = FFN if any(s in name for s in ("inter", "ffn", "ff_", "mlp", "feedforward", "expansion")) else WIDTH
    keep = math.gcd(value, 96)  # 96 = 2^5 * 3: head counts of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32
    return -(-target // keep) * keep


def fit_bounds(model_cls: type, config_cls: type, config: dict[str, Any],
               rounds: int = 12) -> tuple[dict[str, Any], list[str], int | None]:
    """Shrink what the key rules missed: every repeated stack to LAYERS blocks, and the widths,
    depths and vocabularies that hold the model over PARAM_BOUND parameters. Returns the config,
    one note per change, and the parameter count (None when the model does not build on the meta
    device; the eager check counts it then).

    Built on the meta device, the model shows what is left large: a stack (an nn.ModuleList of
    more than MAX_STACK blocks of one class: perceiver's 26 self-attention blocks, Nemotron
    3.5's 52 layers named by a list of layer kinds) is cut in the fields that hold its length,
    whatever the model's size; over the parameter bound, each dimension size over FFN and each
    stack longer than LAYERS is weighed by the parameters it spans, and the heaviest one that
    some field holds (a width or vocabulary under a key the rules do not know: XLM's emb_dim,
    LUKE's entity_vocab_size; or a base width it is a power-of-two multiple of) is shrunk. Only
    fields the key rules left at their defaults are changed. A change the model does not build
    with, or that saves nothing, is undone and the next one tried."""
    try:
        n = _n_params(_meta_model(model_cls, config_cls(**config)))
    except Exception:
        return config, [], None
    notes: list[str] = []
    tried: set[tuple[str, int]] = set()
    try:  # the fields as the class's defaults have them: the pass changes only those still there
        default = {(p, i): x for p, i, x in _int_fields(config_cls())}
        default_lists = {p: list(v) for p, v in _list_fields(config_cls())}
    except Exception:
        default, default_lists = {}, {}
    for _ in range(rounds):
        cfg = config_cls(**config)
        model = _meta_model(model_cls, cfg)
        weight = _weights(model, over=n > PARAM_BOUND)
        if not weight:
            break
        fields = [(p, i, x) for p, i, x in _int_fields(cfg) if default.get((p, i), x) == x]
        lists = [(p, v) for p, v in _list_fields(cfg) if default_lists.get(p, list(v)) == list(v)]
        for (kind, v), _w in weight.most_common():
            if (kind, v) in tried:
                continue
            tried.add((kind, v))
            changes = _changes_for(kind, v, fields, lists)
            if not changes:
                continue
            trial = config
            for path, i, _old, new_value in changes:
                trial = _with_field(trial, cfg, path, i, new_value)
            try:
                n_new = _n_params(_meta_model(model_cls, config_cls(**trial)))
            except Exception:
                continue
            if n_new >= n:
                continue
            config, n = trial, n_new
            notes.append(", ".join(f"{'.'.join(p)}{f'[{i}]' if i is not None else ''}: {_short(x)} -> {_short(y)}"
                                   for p, i, x, y in changes)
                         + f" ({'a depth' if kind == 'depth' else 'a width'} of {v})")
            break
        else:
            break
    return config, notes, n


MAX_STACK = 8  # blocks of one class in one nn.ModuleList: past this, a depth the key rules missed


def _weights(model: Any, over: bool) -> Counter:
    """What to shrink, weighed by the parameters it spans: ("depth", L) for each stack of more
    than MAX_STACK blocks of one class; and, when the model is `over` the parameter bound,
    ("dim", d) for each dimension size over FFN and ("depth", L) for every stack over LAYERS."""
    import torch

    weight: Counter = Counter()
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > LAYERS:
            long = len(m) > MAX_STACK and len({type(c) for c in m}) == 1
            if over or long:
                weight[("depth", len(m))] += _n_params(m) + 1  # a stack without parameters still counts
    if over:
        for p in model.parameters():
            for d in set(p.shape):
                if d > FFN:
                    weight[("dim", d)] += p.numel()
    return weight


def _short(v: Any) -> str:
    """A value as a note shows it: a list by its length."""
    return f"[{len(v)} entries]" if isinstance(v, list) and len(v) > 4 else str(v)


def _list_fields(cfg: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], list[Any]]]:
    """(path, value) of every non-empty list field of `cfg` and its sub-configs."""
    for k, v in _public(cfg).items():
        if isinstance(v, (list, tuple)) and v:
            yield (*path, k), list(v)
        elif _is_config(v):
            yield from _list_fields(v, (*path, k))


def _changes_for(kind: str, v: int, fields: list[tuple[tuple[str, ...], int | None, int]],
                 lists: list[tuple[tuple[str, ...], list[Any]]]) -> list[tuple[tuple[str, ...], int | None, Any, Any]]:
    """(path, index, old value, new value) of the fields (those the key rules left at their
    defaults) that hold the size `v`. A depth: the ints equal to it named like a count, and the
    lists of that length (one entry per layer, kept: the last LAYERS). A width: the fields equal
    to it; where none is, those it is a power-of-two multiple of (a stage-doubling network's base
    width: VibeVoice's tokenizer, 32 filters doubled six times), scaled by the factor that takes
    `v` to WIDTH."""
    if kind == "depth":
        if v <= 4:  # a 3- or 4-stage network: its stage count is its shape, not a depth to cut
            return []
        counts = [(p, i, x, LAYERS) for p, i, x in fields if x == v and not any(s in p[-1] for s in NOT_A_DEPTH)]
        per_layer = [(p, None, x, x[-LAYERS:]) for p, x in lists
                     if len(x) == v and not any(s in p[-1] for s in NOT_A_DEPTH if s != "size")]
        return counts + per_layer
    equal = [(p, i, x, _target(p[-1], v, False)) for p, i, x in fields if x == v and _target(p[-1], v, False) < x]
    if equal:
        return equal
    for k in range(1, 7):
        base, new = v >> k, max(8, (v >> k) * WIDTH // v)
        if v % (1 << k) or new >= base:
            break
        hits = [(p, i, x) for p, i, x in fields if x == base and any(s in p[-1] for s in BASE_WIDTH_WORDS)
                and not any(s in p[-1] for s in NOT_A_BASE_WIDTH)]
        if hits:
            return [(p, i, x, new) for p, i, x in hits]
    return []


def _input_elements(inp: dict[str, Any]) -> int:
    return math.prod(int(d) for d in inp["shape"])


def input_over_bound(inputs: list[dict[str, Any]]) -> str:
    """Why one of the example inputs is over the bounds ('' when none is)."""
    for inp in inputs:
        n = _input_elements(inp)
        if n > INPUT_BOUND:
            return f"{inp['name']}{list(inp['shape'])}: {n:,} elements (bound {INPUT_BOUND:,})"
        if any(int(d) > INPUT_LENGTH_BOUND for d in inp["shape"][1:]):
            return f"{inp['name']}{list(inp['shape'])}: a dimension over {INPUT_LENGTH_BOUND:,}"
    return ""


def fit_input_lengths(config: dict[str, Any], cfg: Any, inputs: list[dict[str, Any]]
                      ) -> tuple[dict[str, Any], list[str]]:
    """The config with each length that sizes an input over the bounds set to LENGTH: for the
    input's dimensions, largest first, the fields equal to the dimension or to half of it (a
    whisper-style encoder takes twice its source positions in frames). Timesfm 2.5's
    context_length (16,384 steps), Speech2Text's max_source_positions (12,000 frames), the
    audio spectrogram transformer's max_length (1,024 frames)."""
    notes: list[str] = []
    fields = list(_int_fields(cfg))
    done: set[tuple[tuple[str, ...], int | None]] = set()
    for inp in inputs:
        if not input_over_bound([inp]):
            continue
        for d in sorted({int(x) for x in inp["shape"][1:]}, reverse=True):
            hits = [(path, i, x) for path, i, x in fields if x > LENGTH and (x == d or 2 * x == d)]
            if hits:
                for path, i, x in hits:
                    if (path, i) not in done:
                        done.add((path, i))
                        config = _with_field(config, cfg, path, i, LENGTH)
                        notes.append(f"{'.'.join(path)}: {x} -> {LENGTH} (sizes {inp['name']}{list(inp['shape'])})")
                break
    return config, notes


# ---------------------------------------------------------------------------------------
# example inputs


def _find(cfg: Any, key: str) -> Any:
    """`key` on the config or the first sub-config that has it (depth first)."""
    v = getattr(cfg, key, None)
    if v is not None:
        return v
    for sub in _public(cfg).values():
        if _is_config(sub):
            v = _find(sub, key)
            if v is not None:
                return v
    return None


def _token_high(cfg: Any) -> int:
    """Upper bound for random token ids: the vocabulary, below every multimodal special token."""
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        text = getattr(cfg, "text_config", None) or getattr(cfg, "decoder", None)
        vocab = getattr(text, "vocab_size", None) if text is not None else None
    if not isinstance(vocab, int):
        vocab = _find(cfg, "vocab_size")
    high = vocab if isinstance(vocab, int) and vocab > 1 else VOCAB

    def walk(c: Any) -> Iterable[int]:
        for k, v in _public(c).items():
            if (k.endswith("token_id") or k.endswith("token_index")) and not any(k.startswith(s) for s in SPECIAL_TOKENS):
                if isinstance(v, int) and not isinstance(v, bool) and v >= 2:
                    yield v
            elif _is_config(v):
                yield from walk(v)

    specials = [v for v in walk(cfg) if v < high]
    if specials:
        high = min(specials)
    return max(2, min(high, VOCAB))


def _image_shape(cfg: Any) -> tuple[int, int, int]:
    channels = _find(cfg, "num_channels") or _find(cfg, "in_channels") or 3
    size = _find(cfg, "image_size") or IMAGE
    if isinstance(size, (list, tuple)):
        h, w = int(size[0]), int(size[-1])
    elif isinstance(size, dict):
        h, w = int(size.get("height", IMAGE)), int(size.get("width", IMAGE))
    else:
        h = w = int(size)
    return int(channels) if isinstance(channels, int) else 3, h, w


def candidate_inputs(model_cls: type, cfg: Any) -> list[list[dict[str, Any]]]:
    """Candidate `inputs:` lists for a model, most likely first; the eager check picks one."""
    try:
        params = inspect.signature(model_cls.forward).parameters
    except (TypeError, ValueError):
        params = {}
    main = getattr(model_cls, "main_input_name", "input_ids")
    if main not in params and "input_ids" in params:
        main = "input_ids"
    high = _token_high(cfg)
    ids = {"name": "input_ids", "shape": [BATCH, SEQ], "dtype": "int64", "high": high}
    mask = {"name": "attention_mask", "shape": [BATCH, SEQ], "dtype": "int64", "low": 1, "high": 2}
    extras: list[dict[str, Any]] = []
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        extras.append({"name": "decoder_input_ids", "shape": [BATCH, DECODER_SEQ], "dtype": "int64", "high": high})

    cands: list[list[dict[str, Any]]] = []
    c, h, w = _image_shape(cfg)
    px = {"name": "pixel_values", "shape": [BATCH, c, h, w]}
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"}
    if main == "input_ids":
        with_mask = [ids, mask] if "attention_mask" in params else [ids]
        if "pixel_values" in required:
            cands.append(with_mask + [px] + extras)
        cands += [with_mask + extras, [ids] + extras]
        if "pixel_values" in params and "pixel_values" not in required:
            cands.append(with_mask + [px] + extras)
    elif main in ("pixel_values", "pixel_values_videos"):
        px = {"name": main, "shape": [BATCH, c, h, w]}
        if "input_ids" in required:
            cands.append([px, ids] + extras)
        cands.append([px] + extras)
        frames = _find(cfg, "num_frames")
        if isinstance(frames, int):  # video models: [B, T, C, H, W]
            cands.append([{"name": main, "shape": [BATCH, min(frames, 8), c, h, w]}] + extras)
        if "input_ids" in params:  # image-text models needing both
            cands.append([px, ids] + extras)
    elif main == "input_values":
        cands.append([{"name": "input_values", "shape": [BATCH, AUDIO_SAMPLES]}] + extras)
        chans = _find(cfg, "audio_channels")
        if isinstance(chans, int):  # audio codecs (Mimi, EnCodec, DAC): [B, channels, samples]
            cands.append([{"name": "input_values", "shape": [BATCH, chans, AUDIO_SAMPLES]}] + extras)
        mel = _find(cfg, "num_mel_bins")
        if isinstance(mel, int):  # spectrogram transformers: [B, frames, mel]
            frames = _find(cfg, "max_length")
            cands.append([{"name": "input_values", "shape": [BATCH, frames if isinstance(frames, int) else 128, mel]}]
                         + extras)
    elif main == "input_features":
        mel = _find(cfg, "num_mel_bins") or _find(cfg, "feature_size") or 80
        src = getattr(cfg, "max_source_positions", None)
        frames = 2 * src if isinstance(src, int) else AUDIO_FRAMES
        feat = _find(cfg, "input_feat_per_channel")
        chans = _find(cfg, "input_channels") or 1
        cands.append([{"name": "input_features", "shape": [BATCH, int(mel), frames]}] + extras)
        cands.append([{"name": "input_features", "shape": [BATCH, frames, int(feat or mel) * int(chans)]}] + extras)
    elif main == "past_values":
        ctx = getattr(cfg, "context_length", None) or 32
        ch = getattr(cfg, "num_input_channels", None) or 1
        cands.append([{"name": "past_values", "shape": [BATCH, int(ctx), int(ch)]}])
        cands.append([{"name": "past_values", "shape": [BATCH, int(ctx)]}])
    else:
        cands.append([{"name": main, "shape": [BATCH, SEQ, _find(cfg, "hidden_size") or WIDTH]}])
    # drop duplicates, keep order
    seen, out = set(), []
    for c in cands:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------
# dynamic sizes (--dims)

# The dynamic zoo's named dimensions: name -> (min, max, example). The example is the size the
# static zoo's eager check ran at, so a model's example inputs are the static zoo's; min and max
# are sizes every shrunk model should take (a short sentence, a few clips, a batch of one), then
# narrowed per model by its config's position limits (max_position_embeddings, ...) and by the
# eager check of the range (:func:`fit_ranges`).
DIM_RANGES: dict[str, tuple[int, int, int]] = {
    "batch": (1, 4, BATCH),
    "seq": (4, 64, SEQ),                        # text tokens
    "decoder_seq": (2, 32, DECODER_SEQ),        # decoder tokens of an encoder-decoder
    "samples": (2000, 8000, AUDIO_SAMPLES),     # raw waveform samples
    "frames": (32, 128, AUDIO_FRAMES),          # spectrogram frames, where no fixed count is configured
}
TOKEN_INPUTS = {"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "inputs"}
DECODER_INPUTS = {"decoder_input_ids", "decoder_attention_mask"}
# Config fields that bound a text sequence (position tables), and those of a decoder's.
TEXT_LIMIT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_seq_length",
                   "max_sequence_length", "max_text_len")
DECODER_LIMIT_KEYS = ("max_target_positions",) + TEXT_LIMIT_KEYS
# Sub-configs whose position limits are not the text's (an audio encoder's source positions, ...).
NOT_TEXT = ("vision", "audio", "image", "speech", "visual", "depth", "codec", "vq", "video", "speaker")


def _text_limit(cfg: Any, keys: tuple[str, ...]) -> int | None:
    """The smallest of `keys` on the config and its text sub-configs (not vision, audio, ...)."""
    found = [v for k, v in _public(cfg).items() if k in keys and isinstance(v, int) and not isinstance(v, bool)
             and v > 0]
    for k, v in _public(cfg).items():
        if _is_config(v) and not any(w in k for w in NOT_TEXT):
            sub = _text_limit(v, keys)
            if sub is not None:
                found.append(sub)
    return min(found) if found else None


def named_dims(inputs: list[dict[str, Any]], cfg: Any) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The inputs with their batch and sequence sizes named (`shape: [batch, seq]`), and each
    named dimension's [min, max, example]: a batch for every input; token ids, masks and
    positions a sequence; a decoder's its own; raw audio its samples; spectrogram features their
    frames where the config fixes no count (whisper-style encoders take exactly
    2 * max_source_positions); images, video and time series keep their other sizes (a vision
    transformer's position table is sized for one image size)."""
    ranges = {k: list(v) for k, v in DIM_RANGES.items()}
    limits = {"seq": _text_limit(cfg, TEXT_LIMIT_KEYS), "decoder_seq": _text_limit(cfg, DECODER_LIMIT_KEYS)}
    for k, limit in limits.items():
        if limit is not None:
            ranges[k][1] = max(ranges[k][2], min(ranges[k][1], limit))
    out, used = [], set()
    for inp in inputs:
        shape: list[Any] = list(inp["shape"])
        name = inp.get("name", "")
        names: dict[int, str] = {}
        if shape and shape[0] == BATCH:
            names[0] = "batch"
        if name in TOKEN_INPUTS and len(shape) >= 2 and shape[1] == SEQ:
            names[1] = "seq"
        elif name in DECODER_INPUTS and len(shape) == 2 and shape[1] == DECODER_SEQ:
            names[1] = "decoder_seq"
        elif name == "input_values" and len(shape) == 2 and shape[1] == AUDIO_SAMPLES:
            names[1] = "samples"
        elif name == "input_features" and _find(cfg, "max_source_positions") is None:
            axes = [d for d in range(1, len(shape)) if shape[d] == AUDIO_FRAMES]
            if len(axes) == 1:  # the frames' axis, where the features' is another size
                names[axes[0]] = "frames"
        for d, dim in names.items():
            shape[d] = dim
            used.add(dim)
        out.append({**inp, "shape": shape})
    return out, {k: ranges[k] for k in DIM_RANGES if k in used}


def _halfway(v: int, example: int) -> int:
    """The next bound to try from `v` toward the example: half a max, twice a min."""
    return max(example, v // 2) if v > example else min(example, v * 2)


def fit_ranges(dims: dict[str, list[int]], fails: Any) -> tuple[dict[str, list[int]], list[str]]:
    """The ranges narrowed to what the model runs at in eager, and one line per narrowing.

    `fails(sizes)` runs the model with each named dimension at `sizes`' size (the others at
    their example) and says why it does not run ('' when it does). Both corners of the ranges
    (every dimension at its min; every one at its max) are tried first; where one fails, each
    dimension's max is halved and its min doubled toward its example until the model runs with
    the others at their examples, and then the corners are narrowed together until they run. A
    dimension left at its example alone is static (min = max = example)."""
    lo = {k: d[0] for k, d in dims.items()}
    hi = {k: d[1] for k, d in dims.items()}
    ex = {k: d[2] for k, d in dims.items()}
    notes: list[str] = []
    if not fails(lo) and not fails(hi):
        return {k: list(d) for k, d in dims.items()}, notes
    for k in dims:
        for bound, ends in (("max", hi), ("min", lo)):
            v = ends[k]
            while v != ex[k]:
                why = fails({**ex, k: v})
                if not why:
                    break
                notes.append(f"{k} {bound} {v}: {why}")
                v = _halfway(v, ex[k])
            ends[k] = v
    for ends, name in ((lo, "min"), (hi, "max")):
        while any(ends[k] != ex[k] for k in dims):
            why = fails(ends)
            if not why:
                break
            notes.append(f"{name} together ({', '.join(f'{k}={v}' for k, v in ends.items())}): {why}")
            for k in dims:
                ends[k] = _halfway(ends[k], ex[k])
    return {k: [lo[k], hi[k], ex[k]] for k in dims}, notes


def dims_inputs(inputs: list[dict[str, Any]], dims: dict[str, list[int]]) -> list[dict[str, Any]]:
    """The inputs with a static dimension (min = max) written as its size again."""
    static = {k: d[2] for k, d in dims.items() if d[0] == d[1]}
    return [{**inp, "shape": [static.get(s, s) if isinstance(s, str) else s for s in inp["shape"]]} for inp in inputs]


def dims_entry(name: str, source: str, config: dict[str, Any], inputs: list[dict[str, Any]],
               dims: dict[str, list[int]]) -> dict[str, Any]:
    """A dynamic zoo model: its inputs' named sizes, and `dims:` for each range that is not the
    defaults' (the defaults declare every name of DIM_RANGES)."""
    entry = _entry(name, source, config, dims_inputs(inputs, dims))
    own = {k: {"min": d[0], "max": d[1], "example": d[2]} for k, d in dims.items()
           if d[0] != d[1] and tuple(d) != DIM_RANGES[k]}
    if own:
        entry["dims"] = own
    return entry


# ---------------------------------------------------------------------------------------
# plans and the eager check


@dataclass
class Plan:
    """What the pipeline entry for one architecture would be, with candidate inputs."""

    model_type: str
    name: str
    source: str
    config: dict[str, Any]
    candidates: list[list[dict[str, Any]]]
    notes: list[str] = field(default_factory=list)  # what fit_bounds / fit_input_lengths changed


@dataclass
class Result:
    """The eager check of one architecture (one entry of the JSON cache)."""

    model_type: str
    class_name: str
    key: str                       # digest of what was checked; a changed plan is re-checked
    status: str                    # ok | bound | skip | plan | build | eager | timeout | crash
    reason: str = ""               # one line; empty when ok
    config: dict[str, Any] | None = None
    inputs: list[dict[str, Any]] | None = None  # the candidate that passed
    params: int | None = None
    seconds: float = 0.0
    tried: list[str] = field(default_factory=list)  # one line per failed candidate
    notes: list[str] = field(default_factory=list)  # fields the bounds pass changed (Plan.notes)


def bound_problem(params: int | None, inputs: list[dict[str, Any]] | None) -> str:
    """Why a checked model is over the zoo's bounds ('' when it is within them)."""
    if params is not None and params > PARAM_BOUND:
        return f"{params:,} parameters (bound {PARAM_BOUND:,})"
    over = input_over_bound(inputs or [])
    return f"example input {over}" if over else ""


def enforce_bounds(r: Result) -> Result:
    """`r`, or where it passed eager over a bound, the same result with status 'bound' (not
    written to the pipeline; --report lists it)."""
    problem = bound_problem(r.params, r.inputs) if r.status == "ok" else ""
    if not problem:
        return r
    return Result(**{**asdict(r), "status": "bound", "reason": OVER_BOUNDS + problem})


OVER_BOUNDS = "over the zoo's bounds: "


def _line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:300]


def _mrope_default(model_cls: type) -> list[int] | None:
    """The mrope_section the model's code falls back to when the config has none (read from
    its module and the transformers modules it imports from), or None."""
    mod = sys.modules.get(model_cls.__module__)
    if mod is None:
        return None
    related = [mod] + [sys.modules[m] for m in sorted({getattr(v, "__module__", "") for v in vars(mod).values()})
                       if m.startswith("transformers.models.") and m in sys.modules and m != mod.__name__]
    for m in related:
        try:
            found = re.search(r"mrope_section[\"']\s*,\s*\[([\d,\s]+)\]", inspect.getsource(m))
        except (OSError, TypeError):
            continue
        if found:
            return [int(x) for x in found.group(1).split(",") if x.strip()]
    return None


_MROPE_CACHE: dict[str, list[int] | None] = {}


def _mrope_for_type(model_type: str) -> list[int] | None:
    """The mrope_section fallback of the model class that a model_type maps to, if any."""
    if model_type not in _MROPE_CACHE:
        import transformers

        arch = next((a for a in _all_archs() if a.model_type == model_type), None)
        cls = getattr(transformers, arch.class_name, None) if arch else None
        _MROPE_CACHE[model_type] = _mrope_default(cls) if isinstance(cls, type) else None
    return _MROPE_CACHE[model_type]


_ARCHS: list[Arch] = []


def _all_archs() -> list[Arch]:
    if not _ARCHS:
        _ARCHS.extend(enumerate_architectures())
    return _ARCHS


def make_plan(arch: Arch) -> tuple[Plan, Any]:
    """The plan for an architecture, and the config object it was derived from."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_cls = getattr(transformers, arch.class_name)
    config_cls = CONFIG_MAPPING[arch.model_type]
    config = shrunk_config(config_cls, arch.model_type, _mrope_default(model_cls))
    config, notes, _ = fit_bounds(model_cls, config_cls, config)
    cfg_obj = config_cls(**config)
    over = OVERRIDES.get(arch.model_type, {})
    if "inputs" in over:
        cands = [over["inputs"]]
    else:
        cands = candidate_inputs(model_cls, cfg_obj)
        if any(input_over_bound(c) for c in cands):
            config, more = fit_input_lengths(config, cfg_obj, [i for c in cands if input_over_bound(c) for i in c])
            if more:
                notes += more
                cfg_obj = config_cls(**config)
                cands = candidate_inputs(model_cls, cfg_obj)
    plan = Plan(arch.model_type, safe_name(arch.model_type), f"hf:{arch.class_name}", config, cands, notes)
    return plan, cfg_obj


def _pipeline_yaml(name: str, entries: list[dict[str, Any]], header: str = "",
                   dims: dict[str, list[int]] | None = None) -> str:
    import yaml

    defaults: dict[str, Any] = {"mode": "auto", "graphs": ["inference", "forward", "backward", "joint"]}
    if dims:
        defaults["dims"] = {k: {"min": d[0], "max": d[1], "example": d[2]} for k, d in dims.items()}
    doc = {"version": 1, "name": name, "output": "artifacts", "seed": 0, "executor": {"kind": "process", "workers": 2, "timeout_s": 600, "memory_gb": 8},
           # auto: torch.export, and where it refuses a model (data-dependent control flow), dynamo
           "defaults": defaults}
    text = header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    body = yaml.safe_dump({"models": entries}, sort_keys=False, default_flow_style=None, width=120)
    return text + body


def _entry(name: str, source: str, config: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "source": source, "config": config, "inputs": inputs}


def _build(path: Path) -> tuple[Any, Any]:
    """(the spec, the model) of the one-model pipeline at `path`, as aotpipe builds them."""
    from aotpipe.models.sources import build_model
    from aotpipe.pipeline.config import load_pipeline

    spec = load_pipeline(path).models[0]
    return spec, build_model(spec)


def _eager_problem(spec: Any, model: Any) -> str:
    """Why the model does not run an eval forward and a training forward + backward on the
    spec's example inputs ('' when it does)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aotpipe.models.eager import sum_loss
    from aotpipe.models.sources import make_example_inputs

    try:
        args, kwargs = make_example_inputs(spec)
    except Exception as e:
        return f"inputs: {_line(e)}"
    try:
        model.eval()
        with torch.no_grad():
            model(*args, **kwargs)
        model.train()
        with sdpa_kernel([SDPBackend.MATH]):
            out = model(*args, **kwargs)
            sum_loss(out).backward()
    except Exception as e:
        return _line(e)
    finally:
        model.zero_grad(set_to_none=True)
    return ""


def _check_candidate(plan: Plan, inputs: list[dict[str, Any]], tmp: Path) -> tuple[str, str, int | None]:
    """(status, reason, parameter count) of one candidate, built exactly as aotpipe builds it."""
    path = tmp / f"{plan.name}.yaml"
    path.write_text(_pipeline_yaml("hf-zoo-check", [_entry(plan.name, plan.source, plan.config, inputs)]))
    try:
        spec, model = _build(path)
        from aotpipe.models.sources import make_example_inputs

        make_example_inputs(spec)
    except Exception as e:
        return "build", _line(e), None
    n_params = sum(p.numel() for p in model.parameters())
    problem = _eager_problem(spec, model)
    return ("eager", problem, n_params) if problem else ("ok", "", n_params)


def _child(plan: Plan, conn: Any, mem_bytes: int) -> None:
    """Runs in the forked subprocess: build and check each candidate until one passes."""
    try:
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        import warnings

        warnings.filterwarnings("ignore")
        tried: list[str] = []
        status, n = "eager", None
        with tempfile.TemporaryDirectory() as tmp:
            for inputs in plan.candidates:
                status, reason, n = _check_candidate(plan, inputs, Path(tmp))
                if status == "ok":
                    conn.send({"status": "ok", "inputs": inputs, "params": n, "tried": tried})
                    return
                tried.append(f"{[i['name'] + str(i['shape']) for i in inputs]}: {reason}")
                if status == "build" and "input" not in reason:
                    break  # the model itself does not build: other inputs will not help
        reason = tried[0].split(": ", 1)[1] if tried else "no candidate inputs"
        conn.send({"status": status, "reason": reason, "params": n, "tried": tried})
    except BaseException as e:  # MemoryError, anything: report, never hang the parent
        try:
            conn.send({"status": "crash", "reason": _line(e)})
        except Exception:
            pass
    finally:
        conn.close()
        os._exit(0)


def plan_key(arch: Arch, plan: Plan | None) -> str:
    """Digest of everything that decides a check's outcome: the class, the plan (config and
    candidate inputs) and the library versions. A cached result with the same key is reused."""
    import torch
    import transformers

    # notes only say what the config (in the key) holds
    what = {k: v for k, v in asdict(plan).items() if k != "notes"} if plan else None
    blob = json.dumps([arch.model_type, arch.class_name, transformers.__version__, torch.__version__, what],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _in_subprocess(target: Any, args: tuple, timeout: float, mem_gb: float) -> tuple[dict[str, Any] | None, str, float]:
    """Run `target(*args, conn, mem_bytes)` in a forked subprocess with a time and memory limit:
    (the message it sent or None, why none came: '' | 'timeout' | 'crash', seconds)."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    p = ctx.Process(target=target, args=(*args, child, int(mem_gb * (1 << 30))))
    p.start()
    child.close()
    msg: dict[str, Any] | None = None
    if parent.poll(timeout):
        try:
            msg = parent.recv()
        except EOFError:
            msg = None
    seconds = round(time.perf_counter() - start, 2)
    if p.is_alive() and msg is None:
        p.kill()
        p.join()
        return None, f"over {timeout:.0f} s", seconds
    p.join(10)
    if p.is_alive():
        p.kill()
        p.join()
    return msg, "" if msg is not None else f"subprocess died with exit code {p.exitcode}", seconds


def check(arch: Arch, plan: Plan, timeout: float, mem_gb: float) -> Result:
    """Check one architecture's plan in a forked subprocess with a time and memory limit."""
    key = plan_key(arch, plan)
    msg, died, seconds = _in_subprocess(_child, (plan,), timeout, mem_gb)
    if msg is None and died.startswith("over"):
        return Result(arch.model_type, arch.class_name, key, "timeout", died, plan.config,
                      plan.candidates[0] if plan.candidates else None, seconds=seconds)
    if msg is None:
        msg = {"status": "crash", "reason": died}
    return enforce_bounds(Result(arch.model_type, arch.class_name, key, msg["status"], msg.get("reason", ""),
                                 plan.config, msg.get("inputs") or (plan.candidates[0] if plan.candidates else None),
                                 msg.get("params"), seconds, msg.get("tried", []), plan.notes))


@dataclass
class RangeResult:
    """The eager check of one model's dynamic sizes (one entry of the --dims cache)."""

    name: str                      # the model's name in the static zoo (its model_type, made safe)
    key: str                       # digest of the entry, the named inputs, the ranges and the versions
    status: str                    # ok | build | timeout | crash | unchecked
    reason: str = ""               # one line; empty when ok
    inputs: list[dict[str, Any]] | None = None  # with the dynamic sizes named
    dims: dict[str, list[int]] = field(default_factory=dict)  # name -> [min, max, example], as fitted
    narrowed: list[str] = field(default_factory=list)  # one line per bound the eager check moved
    seconds: float = 0.0


def dims_plan(entry: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The named inputs and the ranges to check of a static zoo entry (pipelines/hf-zoo.yaml)."""
    import transformers

    model_cls = getattr(transformers, entry["source"].removeprefix("hf:"))
    return named_dims(entry.get("inputs") or [], model_cls.config_class(**(entry.get("config") or {})))


def _range_child(entry: dict[str, Any], inputs: list[dict[str, Any]], dims: dict[str, list[int]], conn: Any,
                 mem_bytes: int) -> None:
    """Runs in the forked subprocess: build the model once, fit its ranges in eager."""
    try:
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        import warnings

        warnings.filterwarnings("ignore")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{entry['name']}.yaml"
            path.write_text(_pipeline_yaml("hf-zoo-dims-check", [{**entry, "inputs": inputs}], dims=dims))
            try:
                spec, model = _build(path)
            except Exception as e:
                conn.send({"status": "build", "reason": _line(e)})
                return
        fitted, notes = fit_ranges(dims, lambda sizes: _eager_problem(spec.at(sizes), model))
        conn.send({"status": "ok", "dims": fitted, "narrowed": notes})
    except BaseException as e:  # MemoryError, anything: report, never hang the parent
        try:
            conn.send({"status": "crash", "reason": _line(e)})
        except Exception:
            pass
    finally:
        conn.close()
        os._exit(0)


def range_key(entry: dict[str, Any], inputs: list[dict[str, Any]], dims: dict[str, list[int]]) -> str:
    """Digest of what decides a range check: the static entry (class, config, inputs), the named
    inputs, the ranges to fit and the library versions. A cached result with the same key is reused."""
    import torch
    import transformers

    blob = json.dumps([entry, inputs, dims, transformers.__version__, torch.__version__], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_ranges(entry: dict[str, Any], inputs: list[dict[str, Any]], dims: dict[str, list[int]], timeout: float,
                 mem_gb: float) -> RangeResult:
    """A static zoo model's dynamic sizes, their ranges fitted in eager in a forked subprocess."""
    key = range_key(entry, inputs, dims)
    if not dims:
        return RangeResult(entry["name"], key, "ok", inputs=inputs)
    msg, died, seconds = _in_subprocess(_range_child, (entry, inputs, dims), timeout, mem_gb)
    if msg is None:
        return RangeResult(entry["name"], key, "timeout" if died.startswith("over") else "crash", died, inputs,
                           dims, seconds=seconds)
    return RangeResult(entry["name"], key, msg["status"], msg.get("reason", ""), inputs, msg.get("dims", dims),
                       msg.get("narrowed", []), seconds)


def plan_or_result(arch: Arch) -> tuple[Plan | None, Result | None]:
    """The plan of an architecture, or the Result saying why none could be made."""
    skip = OVERRIDES.get(arch.model_type, {}).get("skip")
    if skip:
        return None, Result(arch.model_type, arch.class_name, plan_key(arch, None), "skip", skip)
    try:
        return make_plan(arch)[0], None
    except Exception as e:
        return None, Result(arch.model_type, arch.class_name, plan_key(arch, None), "plan", _line(e))


# ---------------------------------------------------------------------------------------
# cache, selection, output


def load_cache(path: Path, kind: type = Result) -> dict[str, Any]:
    """The cached results at `path` (Result, or RangeResult for --dims), by model_type."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {k: kind(**v) for k, v in data.get("results", {}).items()}


def save_cache(path: Path, cache: dict[str, Any]) -> None:
    import torch
    import transformers

    data = {"transformers": transformers.__version__, "torch": torch.__version__,
            "results": {k: asdict(cache[k]) for k in sorted(cache)}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def select(archs: list[Arch], only: list[str], shard: str | None, limit: int | None) -> list[Arch]:
    if only:
        known = {a.model_type for a in archs}
        missing = [t for t in only if t not in known]
        if missing:
            sys.exit(f"unknown model_type(s): {', '.join(missing)}")
        archs = [a for a in archs if a.model_type in only]
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        if not 1 <= i <= n:
            sys.exit("--shard is I/N with 1 <= I <= N")
        archs = archs[i - 1::n]
    if limit is not None:
        archs = archs[:limit]
    return archs


def cause(r: Result) -> str:
    """A short failure cause for grouping: the exception type and message, numbers elided."""
    reason = re.sub(r"\d+", "N", r.reason)
    reason = re.sub(r"'[^']*'", "'…'", reason)
    return f"{r.status}: {reason[:110]}"


def report(results: list[Result], listed: int) -> str:
    by = Counter(r.status for r in results)
    lines = [f"listed {listed}, checked {len(results)}: " + ", ".join(f"{k} {v}" for k, v in by.most_common())]
    groups: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.status != "ok":
            groups[cause(r)].append(r.model_type)
    for c, types in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(types):4d}  {c}\n      e.g. {', '.join(types[:6])}")
    return "\n".join([lines[0], bounds_summary(results), *lines[1:]])


def bounds_summary(results: list[Result]) -> str:
    """The zoo's bounds and where its members stand: the largest member by parameters and by
    example input, and the models left out for being over a bound."""
    ok = [r for r in results if r.status == "ok"]
    by_params = max(ok, key=lambda r: r.params or 0, default=None)
    by_input = max(ok, key=lambda r: max((_input_elements(i) for i in r.inputs or []), default=0), default=None)
    out = []
    if by_params is not None and by_input is not None:
        big = max(by_input.inputs or [], key=_input_elements)
        out.append(f"largest member: {by_params.params or 0:,} parameters ({by_params.model_type}; bound "
                   f"{PARAM_BOUND:,}); largest example input: {_input_elements(big):,} elements "
                   f"({by_input.model_type} {big['name']}{list(big['shape'])}; bound {INPUT_BOUND:,}, and "
                   f"{INPUT_LENGTH_BOUND:,} along any dimension but the batch)")
    over = [r for r in results if r.status == "bound"]
    if over:
        out.append("over a bound, not in the zoo: " + "; ".join(
            f"{r.model_type}: {r.reason.removeprefix(OVER_BOUNDS)}" for r in over))
    return "\n".join(out)


def write_pipeline(path: Path, results: list[Result], name: str) -> int:
    ok = [r for r in results if r.status == "ok" and r.inputs is not None]
    header = (
        "# Generated by tools/hf_zoo.py: every transformers architecture whose shrunk default config\n"
        "# (random weights, no hub access) ran forward + backward in eager. Do not edit by hand:\n"
        "#   .venv/bin/python tools/hf_zoo.py            (re-checks only what changed)\n"
        "# Two models at once, each in an isolated worker (a crash, hang or blow-up costs one model):\n"
        "#   aotpipe run pipelines/hf-zoo.yaml            (--workers N for more)\n"
    )
    entries = [_entry(safe_name(r.model_type), f"hf:{r.class_name}", r.config or {}, r.inputs or []) for r in ok]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_pipeline_yaml(name, entries, header))
    return len(entries)


def dims_header(ranges: list[RangeResult]) -> str:
    """The dynamic zoo's YAML header: what is dynamic, how the ranges were chosen, what the eager
    check changed (counted from `ranges`)."""
    import textwrap

    defaults = ", ".join(f"{k} {lo}..{hi} (example {ex})" for k, (lo, hi, ex) in DIM_RANGES.items())
    narrowed = sum(1 for r in ranges if r.narrowed)
    static = sum(1 for r in ranges if any(d[0] == d[1] for d in r.dims.values()))
    unchecked = [r.name for r in ranges if r.status != "ok"]
    paragraphs = [
        "Generated by tools/hf_zoo.py --dims: the models of pipelines/hf-zoo.yaml (the same configs and "
        "example inputs) with their batch and sequence sizes dynamic. Do not edit by hand:",
        "  .venv/bin/python tools/hf_zoo.py --dims     (re-checks only what changed)",
        "  aotpipe run pipelines/hf-zoo-dynamic.yaml",
        "Dynamic sizes, by input: token ids, masks and positions [batch, seq]; a decoder's tokens "
        "[batch, decoder_seq]; raw audio [batch, samples]; spectrogram features their frames too where the "
        "config fixes no frame count (whisper-style encoders take exactly 2 * max_source_positions); images, "
        "video and time series their batch only (a position table is sized for one image size).",
        f"Ranges: the defaults below, {defaults}; each example is the size the static zoo ran at. A model's "
        "own dims: narrow them: a sequence's max to its config's position limit (max_position_embeddings, "
        "n_positions, ... of the text configs), then each bound to what the model runs in eager (an eval "
        "forward and a training forward + backward with every dimension at its min, and at its max; where "
        "one fails, each failing bound is halved (max) or doubled (min) toward the example, one dimension "
        "at a time, until it runs).",
        f"The eager check narrowed {narrowed} of {len(ranges)} models' ranges, {static} to a static size.",
    ]
    if unchecked:
        paragraphs.append(f"Not checked in eager (their ranges as derived): {', '.join(unchecked)}.")
    lines = [line for para in paragraphs
             for line in (textwrap.wrap(para, 96) if not para.startswith("  ") else [para])]
    return "".join(f"# {line}\n" for line in lines)


def write_dims_pipeline(path: Path, entries: list[dict[str, Any]], ranges: dict[str, RangeResult], name: str) -> int:
    """The dynamic zoo: each static zoo entry with its named sizes and fitted ranges."""
    used = [ranges[e["name"]] for e in entries]
    out = [dims_entry(e["name"], e["source"], e.get("config") or {}, r.inputs or [], r.dims) for e, r in zip(entries, used, strict=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_pipeline_yaml(name, out, dims_header(used), dims={k: list(v) for k, v in DIM_RANGES.items()}))
    return len(out)


def dims_report(ranges: list[RangeResult]) -> str:
    """Each model whose ranges the eager check narrowed or could not check, and why."""
    lines = [f"ranges: {len(ranges)} models, {sum(1 for r in ranges if r.narrowed)} narrowed, "
             f"{sum(1 for r in ranges if r.status != 'ok')} not checked"]
    for r in ranges:
        if r.status != "ok":
            lines.append(f"  {r.name}: {r.status}: {r.reason[:140]}")
        elif r.narrowed:
            fitted = ", ".join(f"{k} {d[0]}..{d[1]}" for k, d in r.dims.items())
            lines.append(f"  {r.name}: {fitted}; {r.narrowed[0][:140]}")
    return "\n".join(lines)


def select_entries(entries: list[dict[str, Any]], only: list[str], shard: str | None,
                   limit: int | None) -> list[dict[str, Any]]:
    """The static zoo's entries --only, --shard and --limit pick (by model_type, as for the static zoo)."""
    if only:
        names = {safe_name(t): t for t in only}
        missing = [t for n, t in names.items() if n not in {e["name"] for e in entries}]
        if missing:
            sys.exit(f"not in the static zoo: {', '.join(missing)}; run tools/hf_zoo.py --only {' '.join(missing)} "
                     "first, or check the spelling")
        entries = [e for e in entries if e["name"] in names]
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        if not 1 <= i <= n:
            sys.exit("--shard is I/N with 1 <= I <= N")
        entries = entries[i - 1::n]
    return entries[:limit] if limit is not None else entries


def dims_main(a: argparse.Namespace, output: Path) -> int:
    """--dims: the static zoo's entries with named sizes, their ranges fitted in eager (cached)."""
    import yaml

    start = time.perf_counter()
    entries = select_entries(yaml.safe_load(a.static.read_text())["models"], a.only, a.shard, a.limit)
    cache: dict[str, RangeResult] = load_cache(a.dims_cache, RangeResult)
    ranges: dict[str, RangeResult] = {}
    for i, entry in enumerate(entries):
        name = entry["name"]
        inputs, dims = dims_plan(entry)
        cached = cache.get(name)
        fresh = not a.recheck and not (a.recheck_failed and cached is not None and cached.status != "ok")
        if cached is not None and cached.key == range_key(entry, inputs, dims) and fresh:
            ranges[name] = cached
            continue
        if a.no_check:
            ranges[name] = RangeResult(name, "", "unchecked", "--no-check", inputs, dims)
            continue
        r = ranges[name] = cache[name] = check_ranges(entry, inputs, dims, a.timeout, a.mem_gb)
        save_cache(a.dims_cache, cache)
        fitted = ", ".join(f"{k} {d[0]}..{d[1]}" for k, d in r.dims.items())
        print(f"[{i + 1}/{len(entries)}] {r.status:8s} {r.seconds:6.1f}s {name:32s} {fitted}"
              f"{'; ' + r.narrowed[0][:100] if r.narrowed else r.reason[:100]}", flush=True)
    n = write_dims_pipeline(output, entries, ranges, a.name or safe_name(output.stem))
    print(f"{n} models -> {output} ({time.perf_counter() - start:.0f} s)")
    if a.report:
        print(dims_report(list(ranges.values())))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("Examples::")[1])
    ap.add_argument("--only", nargs="+", default=[], metavar="TYPE", help="only these model_types")
    ap.add_argument("--limit", type=int, help="only the first N model_types (alphabetical)")
    ap.add_argument("--shard", metavar="I/N", help="every N-th model_type starting at the I-th (1-based)")
    ap.add_argument("-o", "--output", type=Path, help="pipeline YAML to write (default pipelines/hf-zoo.yaml; "
                    "with --dims pipelines/hf-zoo-dynamic.yaml)")
    ap.add_argument("--name", help="pipeline name (default: the output file's stem)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="eager results cache (JSON)")
    ap.add_argument("--recheck", action="store_true", help="ignore cached results for the selection")
    ap.add_argument("--recheck-failed", action="store_true", help="ignore cached failures (keep cached passes)")
    ap.add_argument("--no-check", action="store_true", help="write from the cache only; check nothing")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per architecture (default 60)")
    ap.add_argument("--mem-gb", type=float, default=8.0, help="address-space cap per check in GiB (default 8)")
    ap.add_argument("--report", action="store_true", help="print counts and failures grouped by cause")
    ap.add_argument("--list", action="store_true", help="print model_type, class and mapping, then exit")
    ap.add_argument("--dims", action="store_true", help="write the dynamic zoo: the static zoo's models (--static) "
                    "with batch and sequence sizes named, their ranges fitted in eager (see DIM_RANGES)")
    ap.add_argument("--static", type=Path, default=DEFAULT_OUTPUT, help="--dims: the static zoo whose models it "
                    "makes dynamic (default pipelines/hf-zoo.yaml)")
    ap.add_argument("--dims-cache", type=Path, default=DEFAULT_DIMS_CACHE, help="--dims: eager range results cache")
    a = ap.parse_args(argv)
    output = a.output or (DEFAULT_DIMS_OUTPUT if a.dims else DEFAULT_OUTPUT)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401  (imported once here, inherited by every forked check)

    if a.dims:
        return dims_main(a, output)
    all_archs = enumerate_architectures()
    archs = select(all_archs, a.only, a.shard, a.limit)
    if a.list:
        for arch in archs:
            print(f"{arch.model_type:40s} {arch.class_name:50s} {arch.mapping}")
        return 0
    cache = load_cache(a.cache)
    start = time.perf_counter()
    results: list[Result] = []
    for i, arch in enumerate(archs):
        cached = cache.get(arch.model_type)
        if a.no_check:
            if cached:
                results.append(enforce_bounds(cached))
            continue
        plan, r = plan_or_result(arch)
        if plan is not None:
            key = plan_key(arch, plan)
            fresh = not a.recheck and not (a.recheck_failed and cached and cached.status != "ok")
            if cached and fresh and cached.key == key:
                if cached.notes != plan.notes:  # said otherwise since (the key holds the config only)
                    cached.notes = plan.notes
                    save_cache(a.cache, cache)
                results.append(enforce_bounds(cached))
                continue
            r = check(arch, plan, a.timeout, a.mem_gb)
        assert r is not None
        cache[arch.model_type] = r
        results.append(r)
        save_cache(a.cache, cache)
        print(f"[{i + 1}/{len(archs)}] {r.status:8s} {r.seconds:6.1f}s {arch.model_type:32s} {r.reason[:140]}",
              flush=True)
    n = write_pipeline(output, results, a.name or safe_name(output.stem))
    print(f"{n} architectures -> {output} ({time.perf_counter() - start:.0f} s)")
    if a.report:
        print(report(results, len(all_archs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
