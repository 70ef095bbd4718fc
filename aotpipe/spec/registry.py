"""The two registries' shared pieces (the pass registry and the capture-mode table): entries
keyed by a unique name, and functions named ``module:attribute``, imported on first use so that
reading a table imports no torch."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


def by_name(entries: Iterable[T], what: str) -> dict[str, T]:
    """`entries` keyed by their `.name`, in order; a name registered twice is an error."""
    table: dict[str, T] = {}
    for entry in entries:
        name = entry.name  # type: ignore[attr-defined]
        if name in table:
            raise ValueError(f"{what} {name!r} is registered twice")
        table[name] = entry
    return table


def resolve(ref: str) -> Callable[..., Any]:
    """The function `ref` ("module:attribute") names, importing its module."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
