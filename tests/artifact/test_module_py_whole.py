"""module.py is regenerated from graph.json and compared whole: code anywhere in it (module
level, the class body, __init__, _load_constants, an annotation) that graph.json does not
make fails verify, and `--trust-code` never imports such a file.

Each edit below is what a forger who can recompute hashes would do: module.py changed,
every sha256 and the manifest's checksum made to fit.
"""

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.trust.verify import verify_artifact
from tests.artifact.test_signing import _reseal

MARK = "PAYLOAD_RAN"
# name -> (text in module.py, text put in its place)
EDITS = {
    "module level": ('nan = float("nan")\n', f'nan = float("nan")\nimport os; os.environ["{MARK}"] = "1"\n'),
    "class body": ("class GraphModule(torch.nn.Module):\n",
                   f'class GraphModule(torch.nn.Module):\n    __import__("os").environ["{MARK}"] = "1"\n'),
    "__init__": ("        super().__init__()\n",
                 f'        super().__init__()\n        __import__("os").environ["{MARK}"] = "1"\n'),
    "annotation": ("def forward(self, x: ",
                   f'def forward(self, x: __import__("os").environ.__setitem__("{MARK}", "1") or '),
    "_load_constants": ("    import os\n", f'    import os; os.environ["{MARK}"] = "1"\n'),
    "after the class": ("\n\ndef _load_constants(module):\n",
                        f'\n\n__import__("os").environ["{MARK}"] = "1"\n\ndef _load_constants(module):\n'),
}


@pytest.fixture()
def cnn(quickstart_run, tmp_path):
    """small_cnn: its pass graph has constants, so module.py has __init__ and _load_constants."""
    import shutil

    root, _ = quickstart_run
    dst = tmp_path / "lib" / "small_cnn"
    shutil.copytree(root / "small_cnn", dst)
    return dst


def _edit(folder, name):
    g = next(folder.glob("small_cnn_inference_0.*"))
    old, new = EDITS[name]
    text = (g / "module.py").read_text()
    assert text.count(old) == 1, name
    (g / "module.py").write_text(text.replace(old, new))
    _reseal(folder)
    return g


@pytest.mark.parametrize("name", sorted(EDITS))
def test_code_anywhere_in_module_py_fails_verify(cnn, name, monkeypatch):
    monkeypatch.delenv(MARK, raising=False)
    g = _edit(cnn, name)
    (problem,) = verify_artifact(cnn)
    assert problem.startswith(f"{g / 'module.py'}:") and "module.py does not match graph.json" in problem, problem
    assert "__import__" in problem or "os.environ" in problem or "import os" in problem, problem
    r = CliRunner().invoke(main, ["verify", str(cnn)])
    assert r.exit_code == 1 and "module.py does not match graph.json" in r.output
    # --trust-code imports module.py: only one that matches graph.json
    with pytest.raises(ArtifactError, match="--trust-code imports only a module.py that matches graph.json"):
        aotpipe.load(cnn, trust_code=True)
    r = CliRunner().invoke(main, ["replay", str(cnn), "--trust-code"])
    assert r.exit_code == 2 and "module.py does not match graph.json" in r.output
    import os

    assert MARK not in os.environ  # nothing of it ran


def test_comments_docstrings_and_shape_annotations_are_not_code(cnn):
    g = next(cnn.glob("small_cnn_inference_0.*"))
    text = (g / "module.py").read_text()
    text = text.replace("class GraphModule(torch.nn.Module):\n",
                        'class GraphModule(torch.nn.Module):\n    """A docstring."""\n    # a comment\n')
    text = text.replace("def forward(self, x: \"", "def forward(self, x: \"edited shapes ")
    (g / "module.py").write_text(text)
    _reseal(cnn)
    assert verify_artifact(cnn) == []
    (r,) = [r for r in __import__("aotpipe.replay", fromlist=["replay"]).replay(
        aotpipe.load(cnn, trust_code=True), graphs=[g.name.replace("small_cnn_inference_0", "inference")])]
    assert r.status == "match"


def test_fixtures_of_every_format_version_verify_whole(quickstart_run):
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "data"
    fixtures = [f for f in sorted(data.glob("format_v*/*")) if f.is_dir()]  # not a fixture's README
    for folder in fixtures + [quickstart_run[0] / "small_cnn"]:
        assert verify_artifact(folder) == [], folder
