"""Sizes in a shape-polymorphic graph's symbols: parsed and evaluated without eval.

A record stores a symbolic size as torch prints it (``s0``, ``4*s0*s1``, ``s1 + 1``,
``Max(1, s0)``, ``FloorDiv(s0, 2)``). An artefact may come from anyone, so the text is
parsed by :mod:`ast` and only integer arithmetic on named symbols is evaluated: no attribute,
no subscript, no call but the few size functions torch prints. sympy's ``sympify`` would
``eval`` the text, which is why this small evaluator exists rather than a library call.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from aotpipe.errors import ArtifactError
from aotpipe.format.limits import extent
from aotpipe.format.records import InputRecord, Layout, StorageRecord, SymbolRecord, updated

# Larger than any size a tensor can have: an expression past it is refused, not computed.
_LIMIT = 1 << 62
_MAX_EXPONENT = 64


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a // b


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("modulo by zero")
    return a % b


def _ceildiv(a: int, b: int) -> int:
    return -_floordiv(-a, b)


def _clean_div(a: int, b: int) -> int:
    if b == 0 or a % b:
        raise ValueError(f"{a} is not a multiple of {b}")
    return a // b


def _pow(a: int, b: int) -> int:
    if b < 0 or b > _MAX_EXPONENT:
        raise ValueError(f"exponent {b} out of range")
    return int(a ** b)


# The functions torch's size expressions print as calls.
_CALLS: dict[str, Callable[..., int]] = {
    "Max": max, "Min": min, "FloorDiv": _floordiv, "Mod": _mod, "PythonMod": _mod,
    "CleanDiv": _clean_div, "CeilDiv": _ceildiv, "IntTrueDiv": _clean_div,
}
_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: _floordiv, ast.Mod: _mod, ast.Pow: _pow, ast.Div: _clean_div,
}


def _eval(node: ast.AST, sizes: Mapping[str, int]) -> int:
    if isinstance(node, ast.Expression):
        return _eval(node.body, sizes)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in sizes:
            raise KeyError(node.id)
        return sizes[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, sizes)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        v = _BINARY[type(node.op)](_eval(node.left, sizes), _eval(node.right, sizes))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS \
            and not node.keywords and node.args:
        v = _CALLS[node.func.id](*(_eval(a, sizes) for a in node.args))
    else:
        raise ValueError(f"{type(node).__name__} is not size arithmetic")
    if abs(v) > _LIMIT:
        raise ValueError("the value is larger than any size")
    return v


def _parse(expr: str) -> ast.Expression:
    if len(expr) > 512:
        raise ValueError("longer than 512 characters")
    return ast.parse(expr, mode="eval")


def evaluate(expr: int | str, sizes: Mapping[str, int], where: str = "size") -> int:
    """The integer `expr` (a number, or a size in symbols) takes at `sizes` (symbol -> size).
    An ArtifactError naming `where` when it is not size arithmetic or names a symbol not given."""
    if isinstance(expr, int):
        return expr
    try:
        return _eval(_parse(expr), sizes)
    except KeyError as e:
        raise ArtifactError(f"{where}: {expr!r} names symbol {e.args[0]}, which the graph does not define") from None
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError, TypeError, OverflowError) as e:
        raise ArtifactError(f"{where}: {expr[:80]!r} is not a size this aotpipe computes ({e})") from None


def symbols_in(expr: int | str) -> set[str]:
    """The symbol names `expr` uses (none for a number)."""
    if isinstance(expr, int):
        return set()
    try:
        tree = _parse(expr)
    except (ValueError, SyntaxError, RecursionError):
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _CALLS}


def symbol_sizes(symbols: Mapping[str, SymbolRecord], sizes: Mapping[str, int], where: str) -> dict[str, int]:
    """Every symbol's size: those `sizes` names (by named dimension, symbol, or input dimension
    such as ``x.size(0)``), the rest at their example. A one-line ArtifactError, naming `where`,
    for a static graph, a name the graph does not have, or a size outside the recorded range."""
    if not symbols:
        raise ArtifactError(f"{where}: the artefact is static (captured without dims:, no symbolic sizes); "
                            "sizes apply only to a shape-polymorphic capture")
    by_name: dict[str, str] = {}
    for sym, rec in symbols.items():
        for name in [sym, *([rec.dim] if rec.dim else []), *rec.sources]:
            by_name.setdefault(name, sym)
    out = {sym: rec.example for sym, rec in symbols.items()}
    given: dict[str, tuple[str, int]] = {}
    for name, size in sizes.items():
        found = by_name.get(name)
        if found is None:
            raise ArtifactError(f"{where}: no dimension {name!r}; its dims are {_known(symbols)}")
        if found in given and given[found][1] != size:
            raise ArtifactError(f"{where}: {given[found][0]}={given[found][1]} and {name}={size} are the same "
                                f"dimension ({found}); give it once")
        rec = symbols[found]
        if size < rec.min or (rec.max is not None and size > rec.max):
            top = rec.max if rec.max is not None else "no max"
            raise ArtifactError(f"{where}: {name}={size} is outside the recorded range [{rec.min}, {top}]; "
                                "pick a size in range")
        given[found] = (name, size)
        out[found] = size
    return out


def _known(symbols: Mapping[str, SymbolRecord]) -> str:
    """The names a graph's symbols go by, for an error: "batch (s43), seq (s53)"."""
    return ", ".join(f"{rec.dim} ({sym})" if rec.dim else f"{sym} ({rec.sources[0] if rec.sources else 'unnamed'})"
                     for sym, rec in sorted(symbols.items(), key=lambda kv: (kv[1].dim or "~", kv[0])))


_L = TypeVar("_L", bound=Layout)


def layout_at(rec: _L, sizes: Mapping[str, int], where: str) -> _L:
    """`rec` with its shape and stride (and a size input's value) at `sizes` (symbol -> size),
    from its symbolic ones; a record without them is returned as it is."""
    update: dict[str, object] = {}
    if rec.sym_shape is not None:
        update["shape"] = [evaluate(s, sizes, where) for s in rec.sym_shape]
    if rec.sym_stride is not None:
        update["stride"] = [evaluate(s, sizes, where) for s in rec.sym_stride]
    if isinstance(rec, InputRecord) and rec.sym_value is not None:
        update["value"] = evaluate(rec.sym_value, sizes, where)
    return updated(rec, **update) if update else rec


def storages_at(storages: list[StorageRecord], inputs: list[InputRecord]) -> list[StorageRecord]:
    """The storages with each element count recomputed from its views (inputs at other sizes):
    the furthest element any of them reaches. A storage no view reaches keeps its count."""
    reach: dict[int, int] = {}
    for rec in inputs:
        if rec.type == "tensor" and rec.storage is not None and rec.shape is not None and rec.stride is not None:
            end = (rec.storage_offset or 0) + extent(rec.shape, rec.stride)
            reach[rec.storage] = max(reach.get(rec.storage, 0), end)
    return [updated(s, numel=reach[k]) if k in reach else s for k, s in enumerate(storages)]


def records_at(storages: list[StorageRecord], inputs: list[InputRecord], sizes: Mapping[str, int] | None,
               where: str) -> tuple[list[StorageRecord], list[InputRecord]]:
    """A graph's storage and input records at `sizes` (symbol -> size; None: as recorded)."""
    if sizes is None:
        return storages, inputs
    at = [layout_at(rec, sizes, f"{where} input {rec.name}") for rec in inputs]
    return storages_at(storages, at), at


def _product(a: int | str, b: int | str) -> int | str:
    """a * b as a size expression (numbers multiplied, a factor of 1 left out, sums parenthesised)."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    return f"{_factor(a)}*{_factor(b)}"


def _factor(e: int | str) -> str:
    """A size expression as a factor of a product: anything but a product of names and numbers
    parenthesised."""
    return str(e) if isinstance(e, int) or re.fullmatch(r"[\w*]+", e) else f"({e})"


def dense_strides(sym_shape: list[int | str], stride: list[int], example: Mapping[str, int]) -> list[int | str] | None:
    """The strides, in symbols, of a dense layout of `sym_shape` whose strides at the example
    sizes are `stride` (any order of dimensions: contiguous, channels-last, a transpose); None
    when that layout is not dense (a view with gaps, overlap, a broadcast), `stride` does not
    say, or the shape does not compute at the example. A static size-1 dimension keeps its
    example stride (it never steps)."""
    try:
        shape = [evaluate(s, example) for s in sym_shape]
    except ArtifactError:
        return None
    out: list[int | str] = list(stride)
    run: int | str = 1
    value = 1  # run at the example
    for d in sorted(range(len(shape)), key=lambda d: (stride[d], shape[d])):
        if sym_shape[d] == 1:
            continue
        if value != stride[d]:
            return None
        out[d] = run
        run, value = _product(run, sym_shape[d]), value * shape[d]
    return out
