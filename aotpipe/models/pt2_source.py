"""A `source: pt2:path` model: an exported program (a torch.export archive) read back as a
model to capture. (Writing an artefact's graph as one is aotpipe/corpus/pt2_program.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from aotpipe.errors import SourceError, exception_line
from aotpipe.models.pt2 import pt2_path, pt2_problem


class ExportedModel(torch.nn.Module):
    """An exported program's module as a model to capture. Its train/eval mode was fixed when
    it was exported (dropout, batch norm), and torch refuses .train()/.eval() on it: the mode
    set here is this wrapper's alone."""

    def __init__(self, program: torch.nn.Module) -> None:
        super().__init__()
        self.program = program

    def train(self, mode: bool = True) -> "ExportedModel":
        self.training = mode
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)


def load_pt2_module(source: str, base_dir: Optional[Path]) -> torch.nn.Module:
    """The module of the exported program a `pt2:` source names (torch.export.load, then
    .module()): a trusted source, as any module:callable (loading runs torch's deserializer)."""
    if torch.get_default_device().type == "meta":
        # torch.export.load fills its tensors from the archive: nothing to build without values.
        raise SourceError(f"{source}: an exported program is loaded with its weights; it cannot be built on the "
                          "meta device (mode meta)")
    problem = pt2_problem(source, base_dir)
    if problem:
        raise SourceError(problem)
    path = pt2_path(source, base_dir)
    try:
        ep = torch.export.load(str(path))
    except Exception as e:
        raise SourceError(f"{path}: torch.export.load cannot read it ({exception_line(e)}); is it a torch.export "
                          "archive (torch.export.save)?") from None
    module = ExportedModel(ep.module())
    # Parameters come back as the program recorded them; a training capture needs gradients.
    for p in module.parameters():
        p.requires_grad_(True)
    return module
