"""A run killed with SIGKILL at any moment leaves nothing that looks complete and is not."""

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from aotpipe.trust.verify import find_artifacts, verify_artifact
from tests.conftest import REPO

PIPELINE = textwrap.dedent("""
    version: 1
    name: killme
    models:
      - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 8, hidden: 8}, inputs: [{shape: [2, 8]}]}
      - {name: norm, source: aotpipe.zoo:running_norm, args: {features: 4}, inputs: [{shape: [2, 4]}]}
      - {name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 2}, inputs: [{shape: [2, 3, 8, 8]}]}
""")
MODELS = ["mlp", "norm", "cnn"]


def _run(k, pipeline, out, *options, timeout=120):
    return subprocess.run([sys.executable, "-m", "tests.helpers.killed_run", str(k), str(pipeline), str(out), *options],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _check_nothing_half_done(out):
    """Every folder under its final name verifies; nothing else looks like an artefact."""
    root = out / "killme"
    if not root.exists():
        return []
    models, unfinished = find_artifacts(root)
    assert not unfinished, f"incomplete folders under final names: {unfinished}"
    for m in models:
        assert verify_artifact(m) == [], m
    run_json = root / "run.json"
    if run_json.exists():
        json.loads(run_json.read_text())  # replaced atomically: never half a file
    return [m.name for m in models]


@pytest.mark.slow
def test_sigkill_at_many_moments_leaves_only_complete_artefacts(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(PIPELINE)
    t0 = time.perf_counter()
    full = _run(0, pipeline, tmp_path / "full")
    cold = time.perf_counter() - t0
    assert full.returncode == 0, full.stderr
    steps = int(re.search(r"STEPS (\d+)", full.stderr).group(1))
    assert steps > 40

    kill_points = 0
    # 1. At exact steps of the write phase, spread over the whole run.
    for i, k in enumerate(sorted({1, 2, 3, steps - 1, steps} | set(range(5, steps, max(1, steps // 12))))):
        out = tmp_path / f"k{k}"
        r = _run(k, pipeline, out)
        assert r.returncode == -signal.SIGKILL, (k, r.stderr[-2000:])
        done = _check_nothing_half_done(out)
        kill_points += 1
        if i % 4 == 0:
            # The next run keeps what was finished and completes the rest.
            r = _run(0, pipeline, out)
            assert r.returncode == 0, r.stderr
            assert sorted(_check_nothing_half_done(out)) == sorted(MODELS)
            run = json.loads((out / "killme" / "run.json").read_text())
            kept = {m["name"] for m in run["models"] if m["skipped"]}
            assert kept == set(done), (k, kept, done)

    # 2. At moments in time, during import, capture and writing alike.
    for i, frac in enumerate([0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]):
        out = tmp_path / f"t{i}"
        proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.killed_run", "0", str(pipeline), str(out)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(cold * frac)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _check_nothing_half_done(out)
        kill_points += 1
    assert kill_points >= 20

    # Killed between moving the old artefact aside and renaming the new one in (--force):
    # the next run puts the old one back, then finds it up to date.
    out = tmp_path / "full"
    r = _run(0, pipeline, out, "--force")
    # mlp's own rename: the runner orders models by the last run's times, so under load another
    # model may be renamed first.
    renames = [int(n) for n, src, dst in re.findall(r"STEP (\d+) rename (\S+) (\S+)", r.stderr)
               if src.startswith(".tmp-") and dst == "mlp"]
    before = (out / "killme" / "mlp" / "manifest.json").read_bytes()
    r = _run(renames[0], pipeline, out, "--force")
    assert r.returncode == -signal.SIGKILL
    assert not (out / "killme" / "mlp").exists()
    assert sorted(_check_nothing_half_done(out)) == ["cnn", "norm"]
    r = _run(0, pipeline, out)
    assert r.returncode == 0
    assert (out / "killme" / "mlp" / "manifest.json").read_bytes() == before
    run = json.loads((out / "killme" / "run.json").read_text())
    assert all(m["skipped"] for m in run["models"])
    assert "restored mlp" in (out / "killme" / "report.md").read_text()
