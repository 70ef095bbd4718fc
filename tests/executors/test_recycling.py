"""Recycled workers in a pipeline: a model that leaks memory costs nothing to the models after it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main

LEAKY_MODELS = '''
import os

import torch

_KEPT = []  # grows with every model built in this process, as a careless model's cache would


def leaky(mib, log):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    block = torch.ones(mib << 18)  # mib MiB of float32, written
    _KEPT.append(block)
    return torch.nn.Linear(8, 8)
'''

PIPELINE = """
version: 1
name: leaks
executor: {{kind: process, workers: 1, memory_gb: {limit}, recycle_memory_gb: 0.25}}
defaults: {{mode: export, graphs: [inference], passes: [], verify: false}}
models:
  - {{name: leak_1, source: "leaky_models:leaky", args: {{mib: 400, log: "{log}"}}, inputs: [{{shape: [2, 8]}}]}}
  - {{name: leak_2, source: "leaky_models:leaky", args: {{mib: 400, log: "{log}"}}, inputs: [{{shape: [2, 8]}}]}}
  - {{name: leak_3, source: "leaky_models:leaky", args: {{mib: 400, log: "{log}"}}, inputs: [{{shape: [2, 8]}}]}}
"""


@pytest.mark.slow  # four workers start, each importing torch: about a minute on 2 busy cores
def test_a_leaking_model_gets_its_worker_recycled_and_later_models_succeed(tmp_path):
    """Three models each leave 400 MiB behind; the limit (1.3 GiB) holds a worker with one leak
    (about 0.75 GiB) but not with three: with recycling off, leak_3's worker is killed out of
    memory (checked by hand; leak_3 then runs again in a fresh worker). Each leak recycles its worker, so every model runs in a fresh one (the
    last one's worker is not recycled: it retires at the end anyway)."""
    (tmp_path / "leaky_models.py").write_text(LEAKY_MODELS)
    log = tmp_path / "pids.txt"
    (tmp_path / "p.yaml").write_text(PIPELINE.format(limit=1.3, log=log))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    pids = [int(x) for x in log.read_text().split()]
    assert len(pids) == 3 and len(set(pids)) == 3  # a different worker for each model
    rec = json.loads((tmp_path / "out" / "leaks" / "run.json").read_text())
    assert [m["status"] for m in rec["models"]] == ["ok", "ok", "ok"]
    recycled = rec["executor"]["recycled"]
    assert [(x["pid"], x["after"], x["models"]) for x in recycled] == [
        (pids[0], "leak_1", 1), (pids[1], "leak_2", 1)]
    assert all("past recycle_memory_gb (0.25 GiB)" in x["reason"] for x in recycled)
    assert "## Recycled workers" in (tmp_path / "out" / "leaks" / "report.md").read_text()
