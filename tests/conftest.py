import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

# aotpipe run signs with the user's own key, made on first use in their config folder: the
# suite's runs get a key of their own, never the developer's (subprocesses inherit it).
os.environ["AOTPIPE_CONFIG_DIR"] = tempfile.mkdtemp(prefix="aotpipe-test-config-")


def pytest_unconfigure(config):
    """The suite's key folder goes with the suite (it was left behind, one per run)."""
    folder = os.environ.get("AOTPIPE_CONFIG_DIR", "")
    if "aotpipe-test-config-" in folder:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_finish(session):
    """tools/mutation.py: a group's warm-up builders ("module:function"), called once collection
    is done, in mutmut's fork server, so that each mutant's child inherits what they cached
    (see WARMUP_ENV there). Unset in any other run."""
    import importlib

    for spec in filter(None, os.environ.get("AOTPIPE_MUTATION_WARMUP", "").split(",")):
        module, _, function = spec.partition(":")
        getattr(importlib.import_module(module), function)()


REPO = Path(__file__).resolve().parent.parent
PIPELINES = REPO / "pipelines"

# Deep-copying pytree-codegen graphs trips a torch-internal FutureWarning; it is noise here.
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


@pytest.fixture(autouse=True)
def _replay_in_process(monkeypatch):
    """The suite replays its own artefacts in-process (as `--no-sandbox` does): each sandboxed
    replay starts a worker that imports torch. tests/sandbox/ covers the sandbox itself."""
    monkeypatch.setenv("AOTPIPE_NO_SANDBOX", "1")


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory):
    """The quickstart pipeline, run once per test session through the real CLI; unsigned
    (--no-sign), as an artefact from elsewhere is: tests that sign, verify or attack it say
    which key. tests/test_provenance.py runs it signed, as a user does."""
    from click.testing import CliRunner

    from aotpipe.cli import main

    out = tmp_path_factory.mktemp("qs")
    result = CliRunner().invoke(main, ["run", str(PIPELINES / "quickstart.yaml"), "--output", str(out), "--no-progress",
                                       "--no-sign"])
    assert result.exit_code == 0, result.output
    return out / "quickstart", result


def _run_shipped(tmp_path_factory, name: str, folder: str):
    """pipelines/<name>.yaml run through the real CLI, in this process (executor local),
    unsigned: (its output root, the CLI result)."""
    from click.testing import CliRunner

    from aotpipe.cli import main

    out = tmp_path_factory.mktemp(folder)
    result = CliRunner().invoke(main, ["run", str(PIPELINES / f"{name}.yaml"), "--output", str(out),
                                       "--no-progress", "--no-sign", "--executor", "local"])
    assert result.exit_code == 0, result.output
    return out / name, result


@pytest.fixture(scope="session")
def dynamic_run(tmp_path_factory):
    """pipelines/quickstart-dynamic.yaml (a dynamic batch, and sequence for the transformer), once per session."""
    return _run_shipped(tmp_path_factory, "quickstart-dynamic", "qsd")


@pytest.fixture(scope="session")
def train_run(tmp_path_factory):
    """pipelines/quickstart-train.yaml (the quickstart's models' train_step, AdamW and SGD), once per session."""
    return _run_shipped(tmp_path_factory, "quickstart-train", "qst")


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory):
    """pipelines/zoo-hf.yaml, run once per test session through the real CLI (process executor)."""
    from click.testing import CliRunner

    from aotpipe.cli import main

    out = tmp_path_factory.mktemp("zoo")
    r = CliRunner().invoke(main, ["run", str(PIPELINES / "zoo-hf.yaml"), "-o", str(out), "--no-progress"])
    return out / "zoo-hf", r


@pytest.fixture()
def mlp_copy(quickstart_run, tmp_path):
    """A copy of the quickstart's mlp artefact, in a folder of its own, to edit or attack."""

    root, _ = quickstart_run
    dst = tmp_path / "lib" / "mlp"
    shutil.copytree(root / "mlp", dst)
    return dst
