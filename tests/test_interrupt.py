"""Ctrl-C during `aotpipe run`: exit 130 with what finished, what stopped part way and what
did not run; what finished is kept, nothing half-written looks finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.pipelines import run_yaml

STOPPING = textwrap.dedent("""\
    import time

    from aotpipe.models import zoo


    def interrupted():
        raise KeyboardInterrupt  # as Ctrl-C arrives while the model builds


    def slow():
        time.sleep(300)
        return zoo.mlp()
    """)


def test_ctrl_c_in_a_run_says_what_finished_and_exits_130(tmp_path):
    (tmp_path / "stopping.py").write_text(STOPPING)
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference]}
        models:
          - {name: bad, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32], dtype: int64, high: 3}]}
          - {name: stop, source: "stopping:interrupted", inputs: [{shape: [4, 32]}]}
          - {name: after, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32]}]}
        """))
    assert result.exit_code == 130, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("FAILED  bad                      source: input 'inputs[0]' is int64"), lines
    assert lines[1:] == [
        "interrupted: 1/3 models finished (1 failed); stopped part way: stop; not run: after. What finished is kept "
        "(run.json and the reports are not rewritten); run the same command again to finish: finished models are "
        "up to date and kept"]
    assert "Aborted" not in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in (out / "p").iterdir()) == []  # nothing that looks finished


@pytest.mark.slow
def test_sigint_to_a_real_run_keeps_the_finished_model_and_exits_130(tmp_path):
    (tmp_path / "stopping.py").write_text(STOPPING)
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference]}
        models:
          - {name: first, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32]}]}
          - {name: slow, source: "stopping:slow", inputs: [{shape: [4, 32]}]}
          - {name: after, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32]}]}
        """))
    code = "import sys; from aotpipe.cli import main; sys.argv[0] = 'aotpipe'; main()"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                       os.environ.get("PYTHONPATH", "")]),
               PYTHONFAULTHANDLER="1")  # SIGABRT then prints every thread's stack: a hang says where
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "p.yaml", "-o", "out", "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    finished = tmp_path / "out" / "p" / "first" / "manifest.json"
    while not finished.exists():  # the process executor: `slow` starts in a worker after `first`
        assert proc.poll() is None and time.monotonic() - start < 240, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # seen twice on a loaded machine: say where it hangs
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"no exit 120 s after SIGINT; the run's threads at SIGABRT:\n{err[-8000:]}\n"
                        f"its output:\n{out[-2000:]}")
        ps = subprocess.run(["ps", "-eo", "pid,ppid,pgid,etimes,args"], capture_output=True, text=True).stdout
        pytest.fail(f"the run exited ({proc.returncode}) 120 s after SIGINT, but its output pipes are still held "
                    f"open, by one of:\n{ps[-6000:]}")
    assert proc.returncode == 130, (out, err)
    assert out.splitlines()[0].startswith("ok      first "), out
    assert out.splitlines()[-1].startswith("interrupted: 1/3 models finished (1 ok); stopped part way: slow; not "
                                           "run: after. "), out
    assert "Aborted" not in out + err and "Traceback" not in out + err
    assert finished.exists() and sorted(p.name for p in (tmp_path / "out" / "p").iterdir()) == ["first"]
