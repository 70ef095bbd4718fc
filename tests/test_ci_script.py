""".ci/run names test files: one that moved would make CI fail on a path, not on a test."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_test_path_ci_names_exists():
    text = (REPO / ".ci" / "run").read_text()
    named = re.findall(r"\btests/[\w/.-]+\.py\b", text)
    assert named, "the CI script names no test file: this test reads the wrong script"
    assert [p for p in named if not (REPO / p).is_file()] == []
