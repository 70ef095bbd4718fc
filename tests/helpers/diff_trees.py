"""A tiny pipeline's output tree for the tests of aotpipe diff, built once per process."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from tests.helpers.pipelines import run_yaml

TINY = """
version: 1
name: tiny
seed: 0
defaults:
  mode: export
  graphs: [inference, forward, backward]
  passes: [freeze]
  verify: false
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 4, hidden: 8, depth: 1}
    inputs: [{shape: [2, 4], dtype: float32}]
  - name: norm
    source: aotpipe.zoo:running_norm
    args: {features: 4}
    inputs: [{shape: [2, 4]}]
"""

# The tiny tree, built once per process: mutation testing forks a child per mutant from a
# process that already ran these tests, and a child reusing the parent's build costs a copy,
# not a capture (a fixture of any pytest scope would capture again in every child).
_BUILT: dict[str, Path] = {}


def tiny_tree() -> Path:
    """The output tree of TINY (models mlp and norm, unsigned), built once per process: treat it
    as read-only, copy it to edit it."""
    if "tree" not in _BUILT:
        where = Path(tempfile.mkdtemp(prefix="aotpipe-diff-tiny-"))
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(where, ignore_errors=True))
        result, out = run_yaml(where, TINY, "--no-sign")
        assert result.exit_code == 0, result.output
        _BUILT["tree"] = out / "tiny"
    return _BUILT["tree"]
