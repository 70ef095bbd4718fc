"""Shape-polymorphic capture: the sizes torch.export keeps symbolic, what it could not, and why.

A pipeline names dynamic dimensions (`dims:`) with a range; :func:`export_shapes` turns them
into torch.export's ``dynamic_shapes`` (one ``Dim`` per name, shared by every input dimension
that names it). AOTAutograd then traces the training graphs from export's fake inputs, in
export's shape environment, so forward, backward and joint take the same symbols.

Where the model forces a size (a view with a literal size, a branch on the size), torch
refuses the range. :class:`GuardOrigins` records, for every guard torch adds, the line of the
model that made it; :func:`specialisation_error` turns torch's refusal into one line naming
the dimension, torch's reason, that line and the fix. With ``dims: auto`` nothing is refused:
:func:`auto_report` says per input which leading dimension stayed dynamic and which torch
specialised, and where.

After capture, :func:`graph_symbols` records each graph's symbols (range, example, the input
dimensions they came from, the named dimension) and the guards torch derived; the graphs'
shape environment is then frozen (:func:`frozen_shapes`), so nothing later (a layout read, a
pass) turns a symbol into a constant by asking for its value.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export import Dim, ShapesCollection
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy import functions as sympy_functions

import aotpipe
from aotpipe.errors import CaptureError
from aotpipe.format.ir import CapturedGraph
from aotpipe.format.records import SymbolRecord
from aotpipe.format.source_files import relative_file
from aotpipe.spec.modes import DynamicDims

_SKIPPED_DIRS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, aotpipe.__file__)) + (
    sysconfig.get_paths()["stdlib"] + os.sep,)
MAX_GUARDS = 64  # guards recorded per graph (the rest are counted)


def export_shapes(model: torch.nn.Module, args: tuple, kwargs: dict, user_names: list[str],
                  dynamic: DynamicDims, hints: bool = False) -> Any:
    """torch.export's ``dynamic_shapes`` for `dynamic`: each named dimension one ``Dim`` with its
    range; with `auto`, ``Dim.AUTO`` for every tensor input's leading dimension. `hints`: each
    named dimension ``Dim.DYNAMIC`` over its range instead, which torch.export does not refuse
    when its guard solver concludes a size is constant (see export._export)."""
    dims: dict[str, Any] = {name: Dim.DYNAMIC(min=lo, max=hi) if hints else Dim(name, min=lo, max=hi)
                            for name, (lo, hi) in dynamic.ranges.items()}
    shapes = ShapesCollection()
    for name, value in zip(user_names, pytree.tree_leaves((args, kwargs)), strict=False):
        if not isinstance(value, torch.Tensor):
            continue
        if dynamic.auto:
            if value.dim() >= 1:
                shapes[value] = {0: Dim.AUTO}
            continue
        named = dynamic.inputs.get(name, ())
        spec = {d: dims[n] for d, n in enumerate(named) if n is not None and d < value.dim()}
        if spec:
            shapes[value] = spec
    return shapes.dynamic_shapes(model, args, kwargs)


@contextlib.contextmanager
def keywords_named(model: torch.nn.Module, kwargs: dict) -> Iterator[None]:
    """`model.forward` seen, while inside, with each of `kwargs` that its ``**kwargs`` would take
    as a keyword parameter of its own (the call goes to the real forward unchanged).

    torch.export cannot take ``dynamic_shapes`` for a forward that binds inputs through
    ``**kwargs`` (pytorch#150022, #164313: the signature check wants them under ``kwargs``, the
    constraint solver then looks for them at the top level, "Must provide a tree_name when
    there might be a mismatch"); transformers' vision towers take ``input_ids`` that way. A
    forward with no ``**kwargs``, or none of `kwargs` bound through it, is left alone."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        yield
        return
    params = list(sig.parameters.values())
    var_kw = next((p for p in params if p.kind is p.VAR_KEYWORD), None)
    loose = [k for k in kwargs if k not in sig.parameters]
    if var_kw is None or not loose or "forward" in vars(model):
        yield
        return
    named = [p for p in params if p.kind is not p.VAR_KEYWORD] + \
        [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in loose]
    real = model.forward

    def forward(*args: Any, **kw: Any) -> Any:
        return real(*args, **kw)

    forward.__signature__ = sig.replace(parameters=named)  # type: ignore[attr-defined]
    model.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del model.forward


class _NoneGeneratorDropped(torch.overrides.TorchFunctionMode):
    """``torch.rand``/``randn``/``randint`` called with ``generator=None`` (the default generator,
    spelled out: transformers' UnivNet does) as if without it: those calls pick the
    ``.generator`` overloads, whose kernels take no symbolic sizes in torch 2.13 ("SymIntArrayRef
    expected to contain only concrete integers"), where the overloads without take them. The
    draw is the same: the default generator either way."""

    FACTORIES = frozenset({torch.rand, torch.randn, torch.randint})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self.FACTORIES and "generator" in kwargs and kwargs["generator"] is None:
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        return func(*args, **kwargs)


def none_generator_dropped() -> contextlib.AbstractContextManager[Any]:
    """While inside, a random factory's ``generator=None`` is left out (see _NoneGeneratorDropped)."""
    return _NoneGeneratorDropped()


def positional_names(model: torch.nn.Module, count: int, user_names: list[str]) -> dict[str, str]:
    """forward's parameter name -> the user's name of each of the first `count` (positional)
    inputs: torch names an input by the parameter it binds to (``L['x']``)."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return {}
    return {p.name: n for p, n in zip(params[:count], user_names, strict=False) if p.name != n}


@dataclass
class GuardOrigin:
    """A guard torch added while tracing, and the model's line that made it."""

    expr: str
    symbols: frozenset[str]
    where: str | None  # file:line (`code`), the innermost frame of the model's own code


@dataclass
class GuardOrigins:
    """Every guard added while :func:`guard_origins` was on, and the symbols each input
    dimension got (``x.size(0)``, by the user input's name -> symbol name)."""

    guards: list[GuardOrigin] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    # torch names a positional input by forward's parameter (L['x']); the user's name for it (arg0)
    aliases: dict[str, str] = field(default_factory=dict)

    def source(self, torch_source: str) -> str:
        """torch's source of an input dimension (``L['x'].size()[0]``, ``L['kwargs']['ids'].size()[1]``)
        as aotpipe names it (``arg0.size(0)``, ``ids.size(1)``); other sources as torch has them."""
        return _SOURCE.sub(lambda m: f"{self.aliases.get(m.group(1), m.group(1))}.size({m.group(2)})", torch_source)

    def first_on(self, symbol: str, like: re.Pattern[str] | None = None) -> GuardOrigin | None:
        """The first guard on `symbol` that names a line of the model (else the first at all);
        with `like`, the first such guard whose expression matches it, where one does."""
        on = [g for g in self.guards if symbol in g.symbols]
        if like is not None:
            on = [g for g in on if like.search(g.expr)] or on
        return next((g for g in on if g.where), on[0] if on else None)


def _model_frame() -> str | None:
    """'file:line (`code`)' of the innermost frame of the stack outside torch, aotpipe and the
    standard library: the model's line that is being traced. Walks the frames themselves (a
    guard is added hundreds of times in a large model; extracting the whole stack each time
    reads every frame's source line)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_SKIPPED_DIRS) or name.startswith("<") or not name.endswith(".py")):
            line = linecache.getline(name, frame.f_lineno).strip()
            return f"{relative_file(name)}:{frame.f_lineno} (`{line[:120]}`)"
        frame = frame.f_back  # type: ignore[assignment]
    return None


@contextlib.contextmanager
def guard_origins() -> Iterator[GuardOrigins]:
    """Record, while on, every guard torch's shape environment adds and the model line that
    added it, and each symbol's input source."""
    found = GuardOrigins()
    log_guard = ShapeEnv._log_guard

    def logged(self: Any, prefix: str, g: Any, forcing_spec: bool) -> None:
        found.guards.append(GuardOrigin(str(g), frozenset(str(s) for s in g.free_symbols), _model_frame()))
        for source, sym in list(self.source_to_var.items()):  # the input dimensions' symbols so far
            found.sources.setdefault(found.source(str(source)), str(sym))
        log_guard(self, prefix, g, forcing_spec)

    ShapeEnv._log_guard = logged  # type: ignore[method-assign]
    try:
        yield found
    finally:
        ShapeEnv._log_guard = log_guard  # type: ignore[method-assign]


_SOURCE = re.compile(r"L(?:\['\w+'\])*\['(\w+)'\]\.size\(\)\[(\d+)\]")
_VIOLATED = re.compile(r"(?:Constraints violated|Specializations unexpectedly required) \((.*)\)!")
_READ = re.compile(r"(\w+)\.size\((\d+)\)")
# dynamo's refusal carries the model's stack where it specialised (its frames are interpreted,
# not on Python's stack for guard_origins to walk): the innermost entry is the line
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s+(.+)')
_REASON = re.compile(r"^\s*- (.*)$", re.MULTILINE)
_FIXES = re.compile(r"Suggested fixes:\s*\n((?:\s+.+\n?)+)")
_CONSTANT = re.compile(r"specialized it to be a constant \((\d+)\)|resulted in a specialized value of (\d+)")
_GUARD = re.compile(r"satisfy the generated guard (.*)$")
_SOLVED = re.compile(r"solving the guards generated for (\w+) = .* resulted in a specialized value of (\d+)")


def solver_specialised(e: BaseException) -> list[str]:
    """The named dimensions torch.export refused because its guard solver concluded each is a
    constant ("solving the guards generated for seq ... resulted in a specialized value of 16"):
    a conclusion from guards it cannot simplify (a padding to a multiple, ``s + (256 - s % 256) %
    256``), which the shape environment itself may not share. Empty for any other error."""
    if "Specializations unexpectedly required" not in str(e):
        return []
    return [m.group(1) for m in _SOLVED.finditer(str(e))]


def specialised_dims(ep: torch.export.ExportedProgram, user_names: list[str], dynamic: DynamicDims) -> list[str]:
    """The named dimensions some user input of `ep` has as a plain integer: torch specialised them."""
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    users = [n.meta.get("val") for n, spec in zip(placeholders, ep.graph_signature.input_specs, strict=True)
             if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    found = []
    for name, value in zip(user_names, users, strict=False):
        if not isinstance(value, torch.Tensor):
            continue
        for d, dim in enumerate(dynamic.inputs.get(name, ())):
            if dim is not None and d < value.dim() and not isinstance(value.shape[d], torch.SymInt) \
                    and dim not in found:
                found.append(dim)
    return found


def _source_name(dim: str, dynamic: DynamicDims) -> str:
    places = [f"{name}.size({d})" for name, named in dynamic.inputs.items() for d, n in enumerate(named) if n == dim]
    return ", ".join(places[:3]) or dim


def specialisation_error(e: BaseException, dynamic: DynamicDims, origins: GuardOrigins,
                         what: str) -> CaptureError | None:
    """One line for torch.export's refusal of a named dimension's range (None when `e` is
    another error): the dimension and where it is read, torch's reason, the model line that
    made the guard, and what to change."""
    text = str(e)
    m = _VIOLATED.search(text)
    if m is None:
        return None
    names = [n.strip() for n in re.split(r",\s*(?![^\[]*\])", m.group(1)) if n.strip()]
    reasons = [r.strip() for r in _REASON.findall(text)]
    fixes = _FIXES.search(text)
    dim = names[0] if names else "?"
    if dim not in dynamic.ranges:  # dynamo names the marked size by its source: L['x'].size()[0]
        torch_source = dim
        read = _READ.fullmatch(origins.source(dim))
        named = dynamic.inputs.get(read.group(1), ()) if read else ()
        if read and int(read.group(2)) < len(named) and named[int(read.group(2))] is not None:
            dim = named[int(read.group(2))]  # type: ignore[assignment]
            reasons = [r.replace(torch_source, dim) for r in reasons]
    reason = next((r for r in reasons if dim in r), reasons[0] if reasons else text.splitlines()[0])
    lo, hi = dynamic.ranges.get(dim, (None, None))
    constant = _CONSTANT.search(reason)
    guard = _GUARD.search(reason)
    value = (constant.group(1) or constant.group(2)) if constant else None
    if constant:
        why = f"the model fixes it to {value}"
        fix = f"make {dim} static (write {value} in the shape), or change the model so it reads the size from the input"
    elif guard:
        why = f"the model only runs for {guard.group(1).strip()}"
        suggested = fixes.group(1).strip().splitlines()[0].strip() if fixes else None
        fix = f"narrow the range ({_yaml_fix(suggested)})" if suggested else "narrow the range"
        fix += f", or make {dim} static"
    else:
        why = reason.rstrip(".")
        fix = f"narrow the range of {dim}, or make it static"
    places = {f"{name}.size({d})" for name, named in dynamic.inputs.items() for d, n in enumerate(named) if n == dim}
    symbol = next((s for src, s in origins.sources.items() if src in places), None)
    # the guard that made it: one that fixes the symbol to the constant, or one torch cannot
    # decide over a range (a bound, a division, a remainder); not an equality of two inputs' sizes
    # (the solver's constant comes from guards it cannot simplify: one of those)
    like = re.compile(rf"Eq\({symbol}, {value}\)|Eq\({value}, {symbol}\)" if constant and constant.group(1)
                      else r"Mod|//|Max|Min|<|>") if symbol else None
    origin = origins.first_on(symbol, like) if symbol else None
    at = f" at {origin.where}" if origin is not None and origin.where else ""
    frames = _USER_FRAME.findall(text.split("User stack:", 1)[1]) if "User stack:" in text else []
    if frames:
        file, line, code = frames[-1]
        at = f" at {relative_file(file)}:{line} (`{code.strip()[:120]}`)"
    rng = f" in [{lo}, {hi}]" if lo is not None else ""
    return CaptureError(f"dims: {dim} ({_source_name(dim, dynamic)}) cannot be dynamic{rng} ({what}): "
                        f"{origins.source(why)}{at}; {fix}")


_DIM_FIX = re.compile(r"(\w+) = Dim\('\w+'(?:, min=(\d+))?(?:, max=(\d+))?\)")


def _yaml_fix(suggested: str) -> str:
    """torch's suggested fix (``batch = Dim('batch', max=8)``) as the YAML says it."""
    m = _DIM_FIX.search(suggested)
    if m is None:
        return suggested
    parts = [f"{k}: {v}" for k, v in (("min", m.group(2)), ("max", m.group(3))) if v]
    return f"{m.group(1)}: {{{', '.join(parts)}}} under dims:"


def _symbol_sources(g: CapturedGraph) -> dict[str, list[tuple[str, int]]]:
    """symbol -> the (user input, dimension) pairs whose size it is, in the graph's inputs."""
    out: dict[str, list[tuple[str, int]]] = {}
    for gi in g.inputs:
        if gi.role != "user" or gi.meta is None or gi.meta.sym_shape is None or gi.target is None:
            continue
        for d, s in enumerate(gi.meta.sym_shape):
            if isinstance(s, str) and s.isidentifier():
                out.setdefault(s, []).append((gi.target, d))
    return out


def shape_env_of(g: CapturedGraph) -> ShapeEnv | None:
    """The shape environment of the graph's symbolic values, if it has any."""
    for node in g.gm.graph.nodes:
        val = node.meta.get("val")
        for v in pytree.tree_leaves(val):
            sizes = list(v.shape) if isinstance(v, torch.Tensor) else [v]
            for s in sizes:
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
    return None


def _used_symbols(g: CapturedGraph) -> set[str]:
    """The names in the graph's input layouts and size inputs (symbols, and size functions)."""
    used: set[str] = set()
    for gi in g.inputs:
        exprs = [*(gi.meta.sym_shape or ()), *(gi.meta.sym_stride or ())] if gi.meta is not None else []
        exprs += [gi.sym_expr] if gi.sym_expr is not None else []
        for e in exprs:
            if isinstance(e, str):
                used.update(re.findall(r"[A-Za-z_]\w*", e))
    return used


def _bound(v: Any, default: int | None) -> int | None:
    """A range bound as an int; `default` for an infinite one (torch's int_oo, sympy's oo)."""
    try:
        return max(int(v), 0) if bool(v.is_number) and bool(v.is_finite) else default
    except (TypeError, ValueError, AttributeError, OverflowError):
        return default


_FAILED_ASSERTION = re.compile(r"^(\w+) graph does not run: .*\(aten\._assert_scalar")
_ASSERTED = re.compile(r"expression (.*) on node")
MAX_WALK = 4096  # sizes of one dimension the assertions are evaluated at, at most


_FAILED_NODE = re.compile(r"^(\w+) graph does not run: .*node '(\w+)' \(aten\._assert_scalar")


def failed_assertion(problems: list[str], graphs: dict[str, CapturedGraph]) -> str:
    """The expression of the first kept run-time assertion `problems` say failed, its symbols
    named by their dimensions (``Eq((frames//8), 8)``); empty where none is found."""
    for p in problems:
        m = _FAILED_NODE.match(p)
        g = graphs.get(m.group(1)) if m else None
        node = next((n for n in g.gm.graph.nodes if n.name == m.group(2)), None) if g is not None and m else None
        said = node.args[1] if node is not None and len(node.args) > 1 and isinstance(node.args[1], str) else ""
        expr = _ASSERTED.search(said)
        if expr is None or g is None:
            continue
        text = expr.group(1)
        for sym, rec in g.symbols.items():
            if rec.dim is not None:
                text = re.sub(rf"\b{re.escape(sym)}\b", rec.dim, text)
        return text
    return ""


def assertion_holds(problems: list[str], graphs: dict[str, CapturedGraph]) -> str:
    """Where a capture's kept run-time assertions hold, when one of `problems` is such an
    assertion failing: "it holds for seq in [4, 31]; set seq: {max: 31}". Each named dimension
    the assertions name is walked over its range with the others at their example, and the
    stretch around the example where every assertion of every graph holds is kept. Empty where
    no problem is a failed assertion, no dimension fails alone, or a range is too long to walk."""
    if not any(_FAILED_ASSERTION.match(p) for p in problems):
        return ""
    checks = _assertions(graphs)
    records = {name: rec for g in graphs.values() for name, rec in g.symbols.items()}
    if not checks or not records:
        return ""
    names = sorted(records)
    example = [records[n].example for n in names]
    lines = []
    for i, name in enumerate(names):
        rec = records[name]
        if rec.dim is None or rec.max is None or rec.max - rec.min > MAX_WALK:
            continue

        def holds(v: int, i: int = i) -> bool:
            values = [*example[:i], v, *example[i + 1:]]
            try:
                return all(bool(check(*values)) for check in checks)
            except (ArithmeticError, TypeError, ValueError):  # a division by a size of 0: outside
                return False

        if not holds(rec.example):
            continue
        lo = hi = rec.example
        while lo > rec.min and holds(lo - 1):
            lo -= 1
        while hi < rec.max and holds(hi + 1):
            hi += 1
        if (lo, hi) != (rec.min, rec.max):
            bounds = ", ".join(f"{k}: {v}" for k, v in (("min", lo), ("max", hi)) if v != getattr(rec, k))
            lines.append(f"it holds for {rec.dim} in [{lo}, {hi}]; set {rec.dim}: {{{bounds}}}")
    return "; ".join(lines)


def _assertions(graphs: dict[str, CapturedGraph]) -> list[Any]:
    """Every run-time assertion the graphs keep (aten._assert_scalar's message, which torch
    printed in this process from its own expression), as a function of the graphs' symbols in
    sorted order; those sympy cannot read are left out."""
    import sympy

    names = sorted({name for g in graphs.values() for name in g.symbols})
    syms = [sympy.Symbol(name, integer=True, positive=True) for name in names]
    texts = {m.group(1) for g in graphs.values() for n in g.gm.graph.nodes
             if n.target is torch.ops.aten._assert_scalar.default and len(n.args) > 1 and isinstance(n.args[1], str)
             and (m := _ASSERTED.search(n.args[1]))}
    functions = _torch_sympy_functions()
    # each of torch's functions read as an opaque one of aotpipe's name: lambdify prints those as
    # calls (it prints a class named like sympy's own by sympy's rule: torch's Mod lost its
    # parentheses, s6 % s6*x), and the call evaluates torch's function on the integers
    opaque = {name: sympy.Function(_OPAQUE + name) for name in functions}
    calls = {_OPAQUE + name: _integer_call(f) for name, f in functions.items()}
    out = []
    for text in sorted(texts):
        try:
            expr = sympy.sympify(text, locals={**opaque, **dict(zip(names, syms, strict=True))})
        except (sympy.SympifyError, TypeError, SyntaxError, NameError):
            continue
        if not expr.free_symbols <= set(syms):  # a symbol torch replaced by another, or an unbacked one
            continue
        unknown = {type(f).__name__ for f in expr.atoms(sympy.Function)} - set(calls) - _SYMPY_MATH
        if unknown:  # a function neither sympy's nor this torch's: not evaluated
            continue
        out.append(sympy.lambdify(syms, expr, modules=[calls, "math"]))
    return out


_SYMPY_MATH = {"Max", "Min", "floor", "ceiling", "Abs", "Mod"}  # sympy's own, which lambdify maps to math
_OPAQUE = "aotpipe_torch_"


def _torch_sympy_functions() -> dict[str, Any]:
    """torch's own sympy functions by name (PythonMod, FloorDiv, CleanDiv, ...): what its
    guards and assertions print, which plain sympy would read as undefined functions."""
    import sympy

    return {name: f for name, f in vars(sympy_functions).items()
            if isinstance(f, type) and issubclass(f, sympy.Function) and f.__module__ == sympy_functions.__name__}


def _integer_call(f: Any) -> Any:
    """torch's sympy function `f` as a Python callable over integers (sympy evaluates it)."""
    import sympy

    return lambda *a: f(*(sympy.sympify(x) for x in a))


def record_symbols(graphs: list[CapturedGraph], dynamic: DynamicDims | None) -> None:
    """Fill each graph's `symbols` and `guards`: every symbol its inputs' sizes use, with its
    range, its value at the example, the user input dimensions it is read from (in any graph of
    the capture: a backward reads none itself) and the named dimension they are; and the guards
    torch derived on them. A named dimension's range is the user's (torch.export kept it); a
    symbol of torch's own (dims: auto) has torch's."""
    sources: dict[str, list[tuple[str, int]]] = {}
    for g in graphs:
        for name, pairs in _symbol_sources(g).items():
            sources.setdefault(name, [])
            sources[name] += [p for p in pairs if p not in sources[name]]
    for g in graphs:
        env = shape_env_of(g)
        if env is None:
            continue
        by_name = {str(s): s for s in env.var_to_range}
        symbols = {}
        for name in sorted(_used_symbols(g)):
            sym = by_name.get(name)
            if sym is None:
                continue  # a size function's name (Max, FloorDiv), not a symbol
            vr, hint = env.var_to_range[sym], env.backed_var_to_val.get(sym)
            dims = {dynamic.inputs.get(inp, ())[d] for inp, d in sources.get(name, [])
                    if dynamic is not None and d < len(dynamic.inputs.get(inp, ()))} - {None}
            dim = sorted(d for d in dims if d is not None)[0] if len(dims) == 1 else None
            hi: int | None
            if dynamic is not None and dim in dynamic.ranges:
                lo, hi = dynamic.ranges[dim]
            else:
                lo, hi = _bound(vr.lower, 0) or 0, _bound(vr.upper, None)
            symbols[name] = SymbolRecord(dim=dim, min=lo, max=hi, example=int(hint) if hint is not None else 0,
                                         sources=[f"{inp}.size({d})" for inp, d in sources.get(name, [])])
        g.symbols = symbols
        names = set(symbols)
        guards = [str(gd.expr) for gd in env.guards if {str(s) for s in gd.expr.free_symbols} & names]
        g.guards = list(dict.fromkeys(guards))[:MAX_GUARDS]


@contextlib.contextmanager
def quiet_frozen_guards() -> Iterator[None]:
    """A frozen shape environment warns for each guard it ignores; those reads are of the
    example's values after capture (layouts, records), not decisions: not the user's concern."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def freeze(graphs: list[CapturedGraph]) -> None:
    """Freeze the graphs' shape environments: a later ``int()`` of a symbolic size gives its
    example value without making the symbol a constant."""
    for g in graphs:
        env = shape_env_of(g)
        if env is not None:
            env.freeze()


def auto_report(graphs: list[CapturedGraph], user_names: list[str], values: list[Any],
                origins: GuardOrigins) -> list[str]:
    """`dims: auto`: per tensor input, whether its leading dimension stayed dynamic (its symbol)
    or torch specialised it (its size, and the model line of the first guard that fixed it)."""
    dynamic: dict[tuple[str, int], str] = {}
    for g in graphs:
        for name, pairs in _symbol_sources(g).items():
            for pair in pairs:
                dynamic.setdefault(pair, name)
    lines = []
    for name, value in zip(user_names, values, strict=False):
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if (name, 0) in dynamic:
            lines.append(f"{name}.size(0): dynamic ({dynamic[(name, 0)]})")
            continue
        symbol = origins.sources.get(f"{name}.size(0)")
        origin = origins.first_on(symbol) if symbol else None
        at = f" by {origin.expr} at {origin.where}" if origin is not None and origin.where else (
            f" by {origin.expr}" if origin is not None else "")
        lines.append(f"{name}.size(0): specialised to {value.shape[0]}{at}")
    return lines
