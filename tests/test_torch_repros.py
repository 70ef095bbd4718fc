"""Each reproduction under benchmarks/torch_repros/ still shows the torch behaviour it names (exit 0,
"reproduced"). One that fails here means torch changed: drop it from torch_corpus_bench.TORCH_CAUSES,
and look again at whatever aotpipe does because of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPROS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "torch_repros").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("repro", REPROS, ids=[p.stem for p in REPROS])
def test_the_torch_behaviour_is_still_there(repro):
    r = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("reproduced"), r.stdout + r.stderr[-2000:]


def test_there_are_reproductions():
    assert len(REPROS) >= 4
