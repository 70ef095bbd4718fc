"""A model for the tests of mode meta's second process (aotpipe.job.beside_kinds).

Built in whatever process builds it, it says so through environment variables the tests set
(a spawned process inherits them): it appends its process id to $AOTPIPE_TEST_PIDS; with
$AOTPIPE_TEST_DIE set it exits with that code in any process but $AOTPIPE_TEST_PARENT; with
$AOTPIPE_TEST_EVAL_FAILS set its forward raises in eval mode (the inference capture).
"""

from __future__ import annotations

import os

from torch import nn


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        path = os.environ.get("AOTPIPE_TEST_PIDS")
        if path:
            with open(path, "a") as f:
                f.write(f"{os.getpid()}\n")
        die = os.environ.get("AOTPIPE_TEST_DIE")
        if die and str(os.getpid()) != os.environ.get("AOTPIPE_TEST_PARENT"):
            os._exit(int(die))
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids):
        if not self.training and os.environ.get("AOTPIPE_TEST_EVAL_FAILS"):
            raise ValueError("this model refuses eval mode, on purpose")
        return self.norm(self.lin(self.emb(ids))).relu()


def recorder() -> Recorder:
    return Recorder()
