"""`source: pt2:path/model.pt2`: an exported program (a torch.export archive) as a model
source: where its file is, and whether it is there. Torch-free (the up-to-date check hashes
the file; aotpipe/models/pt2_source.py loads it, aotpipe/corpus/pt2_program.py writes such archives from artefacts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

PT2_PREFIX = "pt2:"


# ---------------------------------------------------------------------------------------
# source: pt2:path/model.pt2


def pt2_path(source: str, base_dir: Optional[Path]) -> Path:
    """The file a `pt2:` source names (relative to the pipeline's folder)."""
    p = Path(source[len(PT2_PREFIX):])
    return p if p.is_absolute() or base_dir is None else base_dir / p


def pt2_problem(source: str, base_dir: Optional[Path]) -> Optional[str]:
    """Why a `pt2:` source cannot be used (the file is missing), or None."""
    rest = source[len(PT2_PREFIX):]
    if not rest:
        return f"source {source!r}: after 'pt2:' put the path of a torch.export archive, e.g. pt2:model.pt2"
    p = pt2_path(source, base_dir)
    if not p.is_file():
        return (f"source {source!r}: no file {p}; write one with torch.export.save or aotpipe export-pt2, or fix "
                "the path (relative to the pipeline file)")
    return None
