"""``python -m aotpipe`` is the same command line as the ``aotpipe`` script."""

import subprocess
import sys


def test_python_dash_m_aotpipe_runs_the_cli_under_its_own_name():
    r = subprocess.run([sys.executable, "-m", "aotpipe", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: aotpipe "), r.stdout[:200]
    assert "replay" in r.stdout and "run" in r.stdout
