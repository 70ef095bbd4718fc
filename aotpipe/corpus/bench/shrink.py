"""Shrink a minimised repro's sizes while it still fails: bench --minimize's last step.

A cut (minimize.py) runs on the values the whole graph gave it: a gelu of [2, 16, 3072] stays
that size. Sizes are shrunk by what they are: every input dimension of one size (all the 16s,
wherever they are: the dimensions a graph ties together usually share their size) is halved
at once, by taking the leading part of the recorded values (narrowed, then copied compactly so
that the repro stores only what it runs on), and kept halved while the cut still fails as the
graph does (the caller's predicate: the same culprit outside the bound); then again, down to 1,
largest size first. A cut whose own arguments fix a size (a view to [2, 16, 3072]) stops
running at the first halving of it: that size stays. At most MAX_TRIES tries in all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from aotpipe.passes.base import fill_vals

MAX_TRIES = 24  # cut runs spent shrinking, over every size


@dataclass
class Shrunk:
    """The inputs after shrinking, what changed ("3072 -> 1"), and the tries it took."""
    args: list[Any]
    steps: list[str] = field(default_factory=list)
    tries: int = 0


def _narrowed(args: list[Any], places: list[tuple[int, int]], size: int) -> list[Any]:
    """`args` with every (input, dimension) of `places` cut to its first `size` entries, each
    changed input copied compactly (its dense layout kept)."""
    out = list(args)
    dims: dict[int, list[int]] = {}
    for i, d in places:
        dims.setdefault(i, []).append(d)
    for i, ds in dims.items():
        t = out[i]
        for d in ds:
            t = t.narrow(d, 0, size)
        out[i] = t.clone(memory_format=torch.preserve_format)
    return out


def shrink_sizes(cm: torch.fx.GraphModule, args: list[Any],
                 fails: Callable[[torch.fx.GraphModule, list[Any]], tuple[bool, str]]) -> Shrunk:
    """`args` (the cut `cm`'s inputs, on which it fails) with each size halved while `cm` still
    `fails`; `cm`'s recorded layouts follow the sizes kept."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            for d, n in enumerate(a.shape):
                if n > 1:
                    groups.setdefault(n, []).append((i, d))
    out = Shrunk(list(args))
    for original in sorted(groups, reverse=True):
        size = original
        while size > 1 and out.tries < MAX_TRIES:
            smaller = (size + 1) // 2
            candidate = _narrowed(out.args, groups[original], smaller)
            out.tries += 1
            try:
                failed, _ = fails(cm, candidate)
            except Exception:  # the cut does not run at that size (a size it fixes): keep this one
                failed = False
            if not failed:
                break
            out.args, size = candidate, smaller
        if size != original:
            out.steps.append(f"{original} -> {size}")
    if out.steps:
        for p, a in zip([n for n in cm.graph.nodes if n.op == "placeholder"], out.args, strict=True):
            p.meta["val"] = a
        fill_vals(cm)  # graph.json records the sizes the repro runs at
    return out
