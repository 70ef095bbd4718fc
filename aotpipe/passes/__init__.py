"""Graph passes, registered by name in one explicit table.

The table is empty until the passes issue lands; the YAML's `passes:` list is checked
against it so an unknown name is a validate-time error that lists the valid ones.
"""

from __future__ import annotations

from typing import Callable

import torch.fx

PassFn = Callable[[torch.fx.GraphModule], torch.fx.GraphModule]

# name -> pass function. One explicit table; no registration by import side effect.
PASSES: dict[str, PassFn] = {}


def check_pass_names(name: object) -> str | None:
    """None if `name` is a registered pass, else a message naming the valid passes."""
    if not isinstance(name, str):
        return f"a pass is named by a string, got {name!r}"
    if name in PASSES:
        return None
    valid = ", ".join(sorted(PASSES)) or "none yet (passes are not implemented in this version)"
    return f"unknown pass {name!r}; valid passes: {valid}"
