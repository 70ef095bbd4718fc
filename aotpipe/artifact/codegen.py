"""module.py: a readable, importable Python dump of one graph, with shape annotations.

For people: loading an artefact never imports it (graph.json is the safe way). Importing
it gives a ``GraphModule`` class like ``GraphModule.to_folder`` output; constants, if the
graph has any, are read from the model's blobs by relative path.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import torch.fx

from aotpipe.artifact.ops import SIZE_ARITHMETIC
from aotpipe.format import limits
from aotpipe.format.records import GraphRecord

# The Python functions a graph's size arithmetic calls (operator.mul, torch.sym_max, ...).
_SIZE_OPERATORS = tuple(fn for fn, _ in SIZE_ARITHMETIC.values())

_HEADER = '''\
# {title}
# Written by aotpipe {version} with torch {torch_version}. Generated code: do not edit.
# Inputs, in order:
{inputs}
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

'''

_CONSTANTS = '''

def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {constants!r}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
'''


def module_source(
    gm: torch.fx.GraphModule,
    *,
    title: str,
    input_lines: list[str],
    constants: dict[str, tuple],
    version: str,
    torch_version: str,
) -> str:
    """The module.py text for `gm` (its stack-trace comments already stripped)."""
    body = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    body = "\n".join(line for line in body.splitlines() if line.strip() != "# No stacktrace found for following nodes")
    if constants:
        body = body.replace(
            "class GraphModule(torch.nn.Module):\n",
            "class GraphModule(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        _load_constants(self)\n\n",
            1,
        )
    text = _HEADER.format(
        title=title,
        version=version,
        torch_version=torch_version,
        inputs="\n".join(f"#   {line}" for line in input_lines) or "#   (none)",
    ) + body.rstrip() + "\n"
    if constants:
        text += _CONSTANTS.format(constants=dict(sorted(constants.items())))
    return text


# ---------------------------------------------------------------------------------------
# checking module.py against graph.json (aotpipe verify, and load before --trust-code imports it)


def graph_constants(graph: GraphRecord) -> dict[str, tuple]:
    """{target: (blob, shape, stride)} of graph.json's constants: what module.py loads."""
    return {n.target: (n.blob, n.shape, n.stride) for n in graph.nodes if n.op == "get_attr" and n.target is not None}


class _NotCode(ast.NodeTransformer):
    """What module.py shows people but that runs nothing: an annotation that is a string
    literal (print_readable's shapes; Python evaluates it to the string), a statement that
    is only a string literal (a docstring). Keyword arguments in name order (graph.json
    stores them as a JSON object, keys sorted). Any other annotation is kept, so it is
    compared as code: an annotation is evaluated when its function is defined."""

    @staticmethod
    def _literal(n: Optional[ast.AST]) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str)

    def visit_Call(self, n: ast.Call) -> ast.AST:
        self.generic_visit(n)
        n.keywords.sort(key=lambda k: k.arg or "")
        return n

    def visit_AnnAssign(self, n: ast.AnnAssign) -> ast.AST:
        self.generic_visit(n)
        if n.value is not None and self._literal(n.annotation) and n.simple:
            return ast.copy_location(ast.Assign(targets=[n.target], value=n.value), n)
        return n

    def visit_arg(self, n: ast.arg) -> ast.AST:
        if self._literal(n.annotation):
            n.annotation = None
        return n

    def visit_FunctionDef(self, n: ast.FunctionDef) -> ast.AST:
        if self._literal(n.returns):
            n.returns = None
        self.generic_visit(n)
        return n

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and all(isinstance(s, ast.stmt) for s in stmts):
                kept = [s for s in stmts if not (isinstance(s, ast.Expr) and self._literal(s.value))]
                setattr(node, name, kept or [ast.Pass()])
        return node


def _by_position(fn: ast.FunctionDef) -> ast.FunctionDef:
    """`fn` with its parameters named by position: a name is not code. FX renames a
    placeholder that shadows a builtin (an nn.Sequential's `input` becomes `input_1` when
    graph.json is rebuilt) though module.py, printed from the captured graph, keeps it."""
    names = {a.arg: f"_arg{i}" for i, a in enumerate(fn.args.args) if a.arg != "self"}
    # FX's code for such a placeholder starts with `input_1 = input`: an alias, not code
    body = []
    for stmt in fn.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Name) and stmt.value.id in names):
            names[stmt.targets[0].id] = names[stmt.value.id]
            continue
        body.append(stmt)
    fn.body = body or [ast.Pass()]

    class Rename(ast.NodeTransformer):
        def visit_arg(self, n: ast.arg) -> ast.AST:
            n.arg = names.get(n.arg, n.arg)
            return n

        def visit_Name(self, n: ast.Name) -> ast.AST:
            n.id = names.get(n.id, n.id)
            return n

    return Rename().visit(fn)


def _normal_form(tree: ast.Module) -> ast.Module:
    """`tree` as compared: readable extras dropped (_NotCode), GraphModule.forward's
    parameters named by position."""
    tree = _NotCode().visit(tree)
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "GraphModule":
            cls.body = [_by_position(s) if isinstance(s, ast.FunctionDef) and s.name == "forward" else s
                        for s in cls.body]
    return tree


def _constants_of(tree: ast.Module) -> Optional[dict]:
    """The {target: (digest, shape, stride)} literal _load_constants reads, or None if absent."""
    fn = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "_load_constants"), None)
    loop = next((s for s in ast.walk(fn) if isinstance(s, ast.For)), None) if fn is not None else None
    if loop is None or not isinstance(loop.iter, ast.Call) or not isinstance(loop.iter.func, ast.Attribute):
        return None
    try:
        return ast.literal_eval(loop.iter.func.value)
    except ValueError:
        return None


def _first_difference(shown: list[ast.stmt], want: list[ast.stmt], end: int
                      ) -> Optional[tuple[int, Optional[ast.stmt], Optional[ast.stmt]]]:
    """(line, statement shown, statement wanted) where two statement lists first differ,
    looking inside a class or function whose header matches; None if they are the same."""
    for i in range(max(len(shown), len(want))):
        a = shown[i] if i < len(shown) else None
        b = want[i] if i < len(want) else None
        if a is not None and b is not None and ast.dump(a) == ast.dump(b):
            continue
        if isinstance(a, (ast.ClassDef, ast.FunctionDef)) and type(a) is type(b) and a.name == b.name:
            head = lambda n: ast.dump(type(n)(**{**{f: getattr(n, f) for f in n._fields}, "body": []}))  # noqa: E731
            if head(a) == head(b):
                inner = _first_difference(a.body, b.body, a.end_lineno or a.lineno)
                if inner is not None:
                    return inner
                continue
        return (a.lineno if a is not None else end), a, b
    return None


@contextlib.contextmanager
def _plain_size_arithmetic(gm: torch.fx.GraphModule) -> Iterator[None]:
    """While on, `gm`'s size arithmetic calls the operator it stands for (``a * b``), as the
    captured graph module.py was printed from did, not the checked form graph.json's graph is
    rebuilt with (ops.checked_size_arithmetic): the same computation, printed differently."""
    swapped = [(n, n.target) for n in gm.graph.nodes
               if n.op == "call_function" and getattr(n.target, "checked_op", None) in _SIZE_OPERATORS]
    for node, target in swapped:
        node.target = target.checked_op  # type: ignore[union-attr]
    try:
        yield
    finally:
        for node, target in swapped:
            node.target = target


def code_mismatch(module_py: Path, gm: torch.fx.GraphModule, constants: Optional[dict[str, tuple]] = None
                  ) -> Optional[str]:
    """None if module.py is the file this codegen writes for `gm` (graph.json's graph as
    rebuilt, unpacked: GraphArtifact.structure) and `constants` ({target: (blob, shape,
    stride)} from graph.json), else one line naming the first statement that differs.

    The whole file is compared, as Python syntax trees: module level, the class body,
    ``__init__``, ``forward`` and ``_load_constants``. Comments, string-literal annotations
    (shapes) and docstrings are for people and run nothing; they are not compared. Nothing
    is imported.
    """
    try:
        data = limits.read_bytes(module_py, limit=limits.current().max_record_bytes, limit_name="max_record_bytes")
        tree = ast.parse(data.decode("utf-8"), filename=str(module_py))
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError) as e:
        return f"{module_py}: not valid Python ({e.__class__.__name__}: {getattr(e, 'msg', e)})"
    if constants is None:
        constants = {}
    try:
        written = _constants_of(tree)
    except RecursionError:
        written = None
    as_list = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    want = {k: (v[0], as_list(v[1]), as_list(v[2])) for k, v in constants.items()}
    got = {k: (v[0], as_list(v[1]), as_list(v[2])) for k, v in (written or {}).items()
           if isinstance(v, tuple) and len(v) == 3}
    if got != want:
        diff = sorted(str(k) for k in set(got) | set(want) if got.get(k) != want.get(k))[:3]
        return (f"{module_py}: constants {', '.join(diff)} differ from graph.json's "
                "(module.py does not match graph.json)")
    with _plain_size_arithmetic(gm):
        expected = ast.parse(module_source(gm, title="", input_lines=[], constants=constants, version="",
                                           torch_version=""))
    try:
        found = _first_difference(_normal_form(tree).body, _normal_form(expected).body, len(data.splitlines()))
    except RecursionError:
        return f"{module_py}: nested too deeply to compare (module.py does not match graph.json)"
    if found is None:
        return None
    line, a, b = found
    show = ast.unparse(a)[:100] if a is not None else "nothing"
    wanted = ast.unparse(b)[:100] if b is not None else "nothing"
    return (f"{module_py}:{line}: shows `{' '.join(show.split())}` where graph.json's graph makes "
            f"`{' '.join(wanted.split())}` (module.py does not match graph.json)")
