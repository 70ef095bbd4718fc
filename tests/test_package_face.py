"""The package face: `aotpipe.load`, `aotpipe.get_inputs` and `aotpipe.replay_sandboxed` are
the public entry points wherever their modules live, imported only when first used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import aotpipe


def test_the_face_names_the_functions_of_their_wings():
    from aotpipe.artifact.load import load
    from aotpipe.replay import get_inputs
    from aotpipe.trust.sandbox.replay import replay_sandboxed

    assert aotpipe.load is load and aotpipe.get_inputs is get_inputs
    assert aotpipe.replay_sandboxed is replay_sandboxed
    assert sorted(aotpipe.__all__) == ["__version__", "get_inputs", "load", "replay_sandboxed"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'aotpipe' has no attribute 'replay_sandbox'"):
        aotpipe.replay_sandbox  # noqa: B018


def test_importing_the_package_imports_no_torch():
    code = "import sys, aotpipe; aotpipe.__version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
