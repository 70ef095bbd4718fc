"""A pipeline on the process executor: bad models are reported with their reasons, the
others finish, nothing half-written is left; a warm re-run imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from aotpipe.cli import main

BAD_MODELS = '''
import ctypes
import os
import time


def segfault():
    ctypes.string_at(0)


def hang():
    time.sleep(3600)


def hog():
    import torch

    keep = []
    while True:
        keep.append(torch.ones(2**24))  # 64 MiB each


def exits():
    os._exit(3)
'''

PIPELINE = """
version: 1
name: batch
executor: {kind: process, workers: 2, timeout_s: 120}
models:
  - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
  - {name: segfault, source: "bad_models:segfault", inputs: [{shape: [1]}]}
  - {name: hang, source: "bad_models:hang", inputs: [{shape: [1]}], resources: {timeout_s: 6}}
  - {name: hog, source: "bad_models:hog", inputs: [{shape: [1]}], resources: {memory_gb: 1}}
  - {name: exits, source: "bad_models:exits", inputs: [{shape: [1]}]}
  - {name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}]}
"""


def test_segfault_hang_and_memory_hog_are_reported_and_the_others_finish(tmp_path):
    (tmp_path / "bad_models.py").write_text(BAD_MODELS)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(PIPELINE))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 1, r.output
    run = json.loads(r.output)
    recycled = run["executor"].pop("recycled", [])
    assert run["executor"] == {"kind": "process", "workers": 2}
    # hog out of memory in a worker that ran a model first runs again in a fresh one (and fails there too)
    assert all(x["after"] == "hog" and x["reason"].endswith("hog runs again in a fresh worker") for x in recycled)
    by = {m["name"]: m for m in run["models"]}
    assert by["mlp"]["status"] == "ok" and by["cnn"]["status"] == "ok"
    for name in ("segfault", "hang", "hog", "exits"):
        assert by[name]["status"] == "failed" and by[name]["stage"] == "worker", by[name]
    assert "SIGSEGV" in by["segfault"]["error"]
    assert "timed out after 6 s" in by["hang"]["error"]
    assert "out of memory" in by["hog"]["error"] and "1.00 GiB" in by["hog"]["error"]
    assert "exited with status 3" in by["exits"]["error"]
    out = tmp_path / "out" / "batch"
    assert sorted(p.name for p in out.iterdir()) == ["cnn", "mlp", "report.html", "report.md", "run.json"]
    report = (out / "report.md").read_text()
    assert "SIGSEGV" in report and "timed out" in report


def test_a_warm_rerun_imports_neither_torch_nor_the_models(tmp_path):
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: warm
        models:
          - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8}, inputs: [{shape: [4, 8]}]}
          - {name: bert, source: "hf:BertModel", config: {num_hidden_layers: 1, hidden_size: 32,
             num_attention_heads: 2, intermediate_size: 37, vocab_size: 100},
             inputs: [{name: input_ids, shape: [1, 8], dtype: int64, high: 100}], graphs: [inference]}
    """))
    args = ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress", "--json"]
    cold = CliRunner().invoke(main, args)
    assert cold.exit_code == 0, cold.output
    code = ("import sys; from aotpipe.cli import main\n"
            "try:\n    main(%r)\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)" % (args,))
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert warm.stderr.split()[-3:] == ["0", "False", "False"], warm.stderr
    assert all(m["skipped"] for m in json.loads(warm.stdout)["models"])


def test_a_killed_run_leaves_no_worker_behind(tmp_path):
    import os
    import signal
    import time

    (tmp_path / "bad_models.py").write_text(BAD_MODELS)
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: k
        models:
          - {name: hang, source: "bad_models:hang", inputs: [{shape: [1]}]}
    """))
    parent = subprocess.Popen([sys.executable, "-m", "aotpipe.cli", "run", str(tmp_path / "p.yaml"), "-o",
                               str(tmp_path / "out"), "--no-progress"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def children():
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = open(f"/proc/{d}/stat").read()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent.pid:
                    out.append(int(d))
        return out

    deadline = time.monotonic() + 60
    workers = []
    while not workers and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = children()
    assert workers, "no worker started"
    time.sleep(3)  # the worker is in the model by now (or still importing torch)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{w}") for w in workers):
        time.sleep(0.1)
    alive = []
    for w in workers:
        try:
            state = open(f"/proc/{w}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(w)
    assert not alive, f"workers outlived their run: {alive}"
