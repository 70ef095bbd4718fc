"""aotpipe: ahead-of-time FX graph artefacts from PyTorch models."""

__version__ = "0.1.0"
