#!/usr/bin/env python3
"""Write a held-out transformers zoo: architectures aotpipe's own zoo does not build.

pipelines/hf-zoo.yaml builds one class per model_type (the base model where there is one) at
width 64, feed-forward 128, batch 2, 16 tokens. A held-out zoo takes, for model_types whose zoo
entry runs in eager, another class (a task head: causal LM, sequence / token / image / audio
classification, CTC, ...), drawn with a fixed seed, shrunk by tools/hf_zoo.py's rules to other
sizes (width 32, feed-forward 96, batch 3, 12 tokens), each checked in eager as hf_zoo.py checks
its own; the first N that run are written.

    .venv/bin/python tools/heldout_hf.py -o pipelines/heldout-hf.yaml            # seed 24, 40 models
    aotpipe run pipelines/heldout-hf.yaml --workers 1
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_zoo as hz  # noqa: E402

HEADS = ["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
         "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
         "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_CTC_MAPPING_NAMES",
         "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_BACKBONE_MAPPING_NAMES",
         "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES"]


def candidates() -> list[hz.Arch]:
    """Per eager-runnable zoo model_type, the first task-head class other than the zoo's."""
    import transformers
    import transformers.models.auto.modeling_auto as ma

    zoo = {r.model_type: r for r in hz.load_cache(hz.DEFAULT_CACHE).values() if r.status == "ok"}
    pool = []
    for mt, r in sorted(zoo.items()):
        for m in HEADS:
            cls = getattr(ma, m, {}).get(mt)
            cls = cls if isinstance(cls, str) or cls is None else cls[0]
            if cls and cls != r.class_name and hasattr(transformers, cls):
                pool.append(hz.Arch(mt, cls, m.removesuffix("_MAPPING_NAMES")))
                break
    return pool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("-n", type=int, default=40, help="models to write (default 40)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    hz.WIDTH, hz.FFN, hz.BATCH, hz.SEQ, hz.DECODER_SEQ = 32, 96, 3, 12, 6
    pool = candidates()
    random.Random(a.seed).shuffle(pool)
    ok = []
    for arch in pool:
        if len(ok) >= a.n:
            break
        plan, r = hz.plan_or_result(arch)
        if plan is not None:
            r = hz.check(arch, plan, 60, 8)
        print(f"{r.status:7s} {arch.model_type:28s} {arch.class_name:45s} {r.reason[:100]}", flush=True)
        if r.status == "ok":
            ok.append(r)
    entries = [hz._entry(f"{hz.safe_name(r.model_type)}__{r.class_name.lower()}", f"hf:{r.class_name}",
                         r.config or {}, r.inputs or []) for r in ok]
    header = (f"# Held-out transformers zoo, written by tools/heldout_hf.py --seed {a.seed} -n {a.n}: task-head classes\n"
              "# pipelines/hf-zoo.yaml does not build, at other sizes (width 32, ffn 96, batch 3, 12 tokens).\n")
    a.output.write_text(hz._pipeline_yaml(a.output.stem, entries, header))
    print(f"{len(ok)} of {len(pool)} candidates -> {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
