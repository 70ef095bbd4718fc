"""tools/lint.py: the ruff and mypy ratchet.

Each test builds a small tree (this repository's pyproject.toml, a package `aotpipe` of two
modules and aotpipe/format/), records its baselines with `--update`, edits it and runs the
check: ruff and mypy run for real on the tree, with one mypy cache for the module. The slow
test runs the check on this repository (a cold mypy cache takes a minute or two: torch).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lint_tool", REPO / "tools" / "lint.py")
lint = importlib.util.module_from_spec(_spec)
sys.modules["lint_tool"] = lint
_spec.loader.exec_module(lint)

CORE = '''"""A module with findings of each tool; two name a line."""

import os


def half(n: int) -> int:
    return n / 2


def cwd() -> str:
    return "."


def cwd() -> str:
    return os.getcwd()
'''
# The same findings on other lines: a comment above, half() below the rest.
MOVED = CORE.replace("import os\n", "# moved\n\nimport os\n").replace(
    "def half(n: int) -> int:\n    return n / 2\n\n\n", "") + "\n\ndef half(n: int) -> int:\n    return n / 2\n"
RECORDS = '''"""A strictly checked module with no finding."""


def size(n: int) -> int:
    return n
'''


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mypy_cache")


@pytest.fixture
def tree(tmp_path, monkeypatch, mypy_cache):
    monkeypatch.setenv("MYPY_CACHE_DIR", str(mypy_cache))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "aotpipe" / "format").mkdir(parents=True)
    (tmp_path / "aotpipe" / "__init__.py").write_text('"""The package."""\n')
    (tmp_path / "aotpipe" / "core.py").write_text(CORE)
    (tmp_path / "aotpipe" / "format" / "__init__.py").write_text('"""Strict."""\n')
    (tmp_path / "aotpipe" / "format" / "records.py").write_text(RECORDS)
    assert lint.main(["--update"], root=tmp_path) == 0
    return tmp_path


def _check(root: Path, capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = lint.main(list(args), root=root)
    return rc, capsys.readouterr().out


def _baseline(root: Path, tool: str) -> dict:
    return json.loads((root / "tools" / "lint_baseline" / f"{tool}.json").read_text())


def test_the_baselines_count_each_finding_by_file_rule_and_message_without_its_line(tree, capsys):
    assert _baseline(tree, "mypy") == {"aotpipe/core.py": {
        "no-redef": {'Name "cwd" already defined on line N': 1},
        "return-value": {'Incompatible return value type (got "float", expected "int")': 1}}}
    assert _baseline(tree, "ruff") == {"aotpipe/core.py": {"F811": {
        "Redefinition of unused `cwd` from line N: `cwd` redefined here": 1}}}
    assert _check(tree, capsys) == (0, "python tools/lint.py: ruff and mypy find nothing beyond "
                                       "tools/lint_baseline/\n")


def test_a_planted_finding_fails_naming_file_rule_message_and_the_fix(tree, capsys):
    core = tree / "aotpipe" / "core.py"
    core.write_text(CORE.replace("import os\n", "import os\nimport sys\n") + "\n\ndef third(n: int) -> int:\n"
                    "    return n / 3\n")
    rc, out = _check(tree, capsys)
    assert rc == 1
    assert ("aotpipe/core.py (line 4): ruff F401: `sys` imported but unused\n"
            "    1 found, new: fix it (the baseline takes no new findings)\n") in out
    assert ('aotpipe/core.py (lines 8, 20): mypy return-value: Incompatible return value type (got "float", '
            'expected "int")\n    2 found, the baseline counts 1: fix it (the baseline takes no new findings)\n') in out
    assert out.endswith("python tools/lint.py: 2 problem(s)\n")


def test_a_fixed_finding_leaves_the_baseline_stale_until_update_rewrites_it(tree, capsys):
    core = tree / "aotpipe" / "core.py"
    core.write_text(CORE.replace("return n / 2", "return n // 2"))
    rc, out = _check(tree, capsys)
    assert rc == 1
    assert ('aotpipe/core.py: mypy return-value: Incompatible return value type (got "float", expected "int")\n'
            "    the baseline counts 1, 0 found: the baseline may only shrink: run python tools/lint.py --update "
            "and commit it\n") in out
    assert _check(tree, capsys)[0] == 1  # still, until the baseline is rewritten
    assert _check(tree, capsys, "--update")[0] == 0
    assert _baseline(tree, "mypy") == {"aotpipe/core.py": {"no-redef": {'Name "cwd" already defined on line N': 1}}}
    assert _check(tree, capsys)[0] == 0


def test_moving_the_findings_to_other_lines_changes_nothing(tree, capsys):
    before = lint.ruff_findings(tree) + lint.mypy_findings(tree)
    (tree / "aotpipe" / "core.py").write_text(MOVED)
    after = lint.ruff_findings(tree) + lint.mypy_findings(tree)
    assert sorted(key for key, _ in after) == sorted(key for key, _ in before)
    assert sorted(line for _, line in after) != sorted(line for _, line in before)
    assert _check(tree, capsys)[0] == 0


def test_a_finding_in_the_format_package_fails_even_with_the_baseline_listing_it(tree, capsys):
    records = tree / "aotpipe" / "format" / "records.py"
    records.write_text(RECORDS + "\n\ndef untyped(n):\n    return n\n")  # only --strict's flags refuse it
    rc, out = _check(tree, capsys, "--update")
    assert rc == 1
    assert "aotpipe/format/records.py" not in json.dumps(_baseline(tree, "mypy"))
    problem = ("aotpipe/format/records.py (line 8): mypy no-untyped-def: Function is missing a type annotation\n"
               "    aotpipe/format/ is checked strictly and has no baseline: fix it\n")
    assert problem in out
    path = tree / "tools" / "lint_baseline" / "mypy.json"
    path.write_text(json.dumps({**_baseline(tree, "mypy"), "aotpipe/format/records.py": {
        "no-untyped-def": {"Function is missing a type annotation": 1}}}))
    rc, out = _check(tree, capsys)
    assert rc == 1
    assert problem in out
    assert ("aotpipe/format/records.py: mypy no-untyped-def: Function is missing a type annotation\n"
            "    the mypy baseline lists aotpipe/format/, which may have none: remove it with "
            "python tools/lint.py --update and commit it\n") in out


def test_the_format_package_gets_every_flag_of_mypy_strict_and_a_missing_one_is_named(tmp_path):
    assert lint.strict_flags_missing(REPO) == []
    text = (REPO / "pyproject.toml").read_text()
    assert "warn_return_any = true\n" in text
    (tmp_path / "pyproject.toml").write_text(text.replace("warn_return_any = true\n", "", 1))
    assert lint.strict_flags_missing(tmp_path) == ["warn_return_any = True"]


def test_line_numbers_inside_messages_are_left_out_of_keys():
    assert lint._message('Name "x" already defined on line 12') == 'Name "x" already defined on line N'
    assert lint._message("Redefinition of unused `os` from line 3") == "Redefinition of unused `os` from line N"
    assert lint._message("See lines 3-9 of the file") == "See line N of the file"
    assert lint._message("multiline 12 stays") == "multiline 12 stays"


@pytest.mark.slow
def test_the_repository_has_nothing_beyond_its_baselines(capsys):
    rc, out = _check(REPO, capsys)
    assert rc == 0, out
