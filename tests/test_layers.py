"""aotpipe's packages import only downward, with no cycles: import-linter's contracts
(pyproject.toml, [tool.importlinter]) hold on the tree, and each kind of breach planted in a
copy of it is caught and named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def lint(root: Path) -> tuple[int, str]:
    """lint-imports on the tree at `root` (its pyproject.toml's contracts): exit status, output."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture()
def tree(tmp_path):
    """A copy of the package and its contracts, to plant a breach in."""
    shutil.copytree(REPO / "aotpipe", tmp_path / "aotpipe", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def plant(path: Path, line: str, *, in_function: bool = False) -> None:
    """Append an import to a module: at module level, or inside a function (a lazy import)."""
    text = "\n\ndef _planted():\n    " + line + "\n" if in_function else "\n" + line + "\n"
    path.write_text(path.read_text() + text)


def test_the_packages_import_only_downward_with_no_cycles():
    status, out = lint(REPO)
    assert status == 0, out
    assert "Contracts: 4 kept, 0 broken." in out


def test_the_unchanged_copy_keeps_the_contracts(tree):
    status, out = lint(tree)
    assert status == 0 and "0 broken" in out, out


def test_an_upward_import_is_caught_even_inside_a_function(tree):
    plant(tree / "aotpipe/artifact/load.py", "from aotpipe.pipeline.runner import run_pipeline", in_function=True)
    status, out = lint(tree)
    assert status == 1
    assert "aotpipe's packages import only downward BROKEN" in out
    assert "aotpipe.artifact is not allowed to import aotpipe.pipeline" in out
    assert "aotpipe.artifact.load -> aotpipe.pipeline.runner" in out


def test_the_format_leaf_importing_a_package_is_caught(tree):
    plant(tree / "aotpipe/format/records.py", "from aotpipe.artifact.fsio import write_atomic", in_function=True)
    status, out = lint(tree)
    assert status == 1
    assert "aotpipe.format is not allowed to import aotpipe.artifact" in out


def test_a_leaf_importing_a_package_is_caught(tree):
    plant(tree / "aotpipe/spec/__init__.py", "from aotpipe.artifact.load import load")
    status, out = lint(tree)
    assert status == 1
    assert "aotpipe.spec is not allowed to import aotpipe.artifact" in out


def test_capture_importing_replay_is_caught(tree):
    plant(tree / "aotpipe/capture/hints.py", "from aotpipe.replay.run import expand_outputs", in_function=True)
    status, out = lint(tree)
    assert status == 1
    assert "capture and replay do not know each other BROKEN" in out
    assert "aotpipe.capture is not allowed to import aotpipe.replay" in out


def test_a_cycle_inside_a_package_is_caught(tree):
    # signing <- verify is allowed; signing -> verify closes a cycle (as sign_artifact once did)
    plant(tree / "aotpipe/trust/signing.py", "from aotpipe.trust.verify import verify_artifact",
          in_function=True)
    status, out = lint(tree)
    assert status == 1
    assert "no import cycles between the modules of any package BROKEN" in out
    assert "No cycles are allowed in aotpipe.trust" in out
    assert ".signing -> .verify" in out or ".verify -> .signing" in out


def test_a_new_package_must_be_given_a_layer(tree):
    (tree / "aotpipe/newwing").mkdir()
    (tree / "aotpipe/newwing/__init__.py").write_text('"""A package nobody placed in a layer."""\n')
    status, out = lint(tree)
    assert status == 1
    assert "aotpipe.newwing" in out


def test_inside_the_pipeline_wing_an_upward_import_is_caught(tree):
    plant(tree / "aotpipe/pipeline/results.py", "from aotpipe.pipeline.runner import run_pipeline", in_function=True)
    status, out = lint(tree)
    assert status == 1
    assert "inside the pipeline wing, too, imports go only downward BROKEN" in out
    assert "aotpipe.pipeline.results is not allowed to import aotpipe.pipeline.runner" in out


def test_the_top_of_the_package_is_a_dozen_wings_and_a_few_modules():
    # The wings are the layers contract's rows; a module that lands at the top belongs in one.
    top = REPO / "aotpipe"
    packages = sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.name for p in top.glob("*.py"))
    assert len(packages) <= 12, packages
    assert modules == ["__init__.py", "__main__.py", "cli.py", "errors.py"], modules
