"""A model for the tests of mode meta's second process (aotpipe.pipeline.job.beside_kinds).

Built in whatever process builds it, it says so through environment variables the tests set
(a spawned process inherits them): it appends its process id to $AOTPIPE_TEST_PIDS; with
$AOTPIPE_TEST_DIE set it exits with that code in any process but $AOTPIPE_TEST_PARENT (with
$AOTPIPE_TEST_SLOW, sleeps that many seconds there instead); with
$AOTPIPE_TEST_EVAL_FAILS set its forward raises in eval mode (the inference capture).
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn


class Recorder(nn.Module):
    def __init__(self, blocks: int = 0) -> None:
        super().__init__()
        path = os.environ.get("AOTPIPE_TEST_PIDS")
        if path:
            with open(path, "a") as f:
                f.write(f"{os.getpid()}\n")
        elsewhere = str(os.getpid()) != os.environ.get("AOTPIPE_TEST_PARENT")
        if os.environ.get("AOTPIPE_TEST_DIE") and elsewhere:
            os._exit(int(os.environ["AOTPIPE_TEST_DIE"]))
        if os.environ.get("AOTPIPE_TEST_SLOW") and elsewhere:
            time.sleep(float(os.environ["AOTPIPE_TEST_SLOW"]))
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied: the training capture notes it
        # buffers outside the state dict (constants to a capture), one read in each mode: each
        # capture notes its own
        self.register_buffer("eval_scale", torch.full((16,), 0.5), persistent=False)
        self.register_buffer("train_scale", torch.full((16,), 2.0), persistent=False)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(blocks))  # a model of that many more modules

    def forward(self, ids):
        if not self.training and os.environ.get("AOTPIPE_TEST_EVAL_FAILS"):
            raise ValueError("this model refuses eval mode, on purpose")
        x = self.norm(self.lin(self.emb(ids))).relu()
        for block in self.blocks:
            x = block(x)
        return self.head(x * (self.train_scale if self.training else self.eval_scale))


def recorder(blocks: int = 0) -> Recorder:
    return Recorder(blocks)
