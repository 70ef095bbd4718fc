"""aotpipe: ahead-of-time FX graph artefacts from PyTorch models.

    import aotpipe
    art = aotpipe.load("artifacts/quickstart/small_cnn")      # safe: runs no artefact code
    inputs = aotpipe.get_inputs(art.graphs["forward"].input_file, seed=0)

    from aotpipe.replay import replay
    results = replay(art)              # compare with saved outputs, in this process: trusted artefacts only

    outcome = aotpipe.replay_sandboxed("artifacts/quickstart/small_cnn")   # any artefact: in a sandboxed worker
"""

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["get_inputs", "load", "replay_sandboxed", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `aotpipe --help` does not pay for importing torch.
    if name == "load":
        return importlib.import_module("aotpipe.artifact.load").load
    if name == "get_inputs":
        return importlib.import_module("aotpipe.replay").get_inputs
    if name == "replay_sandboxed":
        return importlib.import_module("aotpipe.trust.sandbox.replay").replay_sandboxed
    raise AttributeError(f"module 'aotpipe' has no attribute {name!r}")
