"""module.py: a readable, importable Python dump of one graph, with shape annotations.

For people: loading an artefact never imports it (graph.json is the safe way). Importing
it gives a ``GraphModule`` class like ``GraphModule.to_folder`` output; constants, if the
graph has any, are read from the model's blobs by relative path.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Optional

import torch.fx

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
# checking module.py against graph.json (aotpipe verify)


def _strip(node: ast.AST) -> ast.AST:
    """`node` without what print_readable adds for people (annotations, docstrings), keyword
    arguments in name order (graph.json stores them as a JSON object, keys sorted)."""

    class Strip(ast.NodeTransformer):
        def visit_Call(self, n: ast.Call) -> ast.AST:
            self.generic_visit(n)
            n.keywords.sort(key=lambda k: k.arg or "")
            return n

        def visit_AnnAssign(self, n: ast.AnnAssign) -> ast.AST:
            self.generic_visit(n)
            if n.value is None:
                return ast.Pass()
            return ast.copy_location(ast.Assign(targets=[n.target], value=n.value), n)

        def visit_arg(self, n: ast.arg) -> ast.AST:
            n.annotation = None
            return n

        def visit_FunctionDef(self, n: ast.FunctionDef) -> ast.AST:
            n.returns = None
            n.body = [s for s in n.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                and isinstance(s.value.value, str))] or [ast.Pass()]
            self.generic_visit(n)
            return n

    return Strip().visit(node)


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


def _forward_of(tree: ast.Module, in_class: bool) -> Optional[ast.FunctionDef]:
    body = tree.body
    if in_class:
        cls = next((s for s in body if isinstance(s, ast.ClassDef) and s.name == "GraphModule"), None)
        body = cls.body if cls is not None else []
    return next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None)


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


def code_mismatch(module_py: Path, gm: torch.fx.GraphModule, constants: Optional[dict[str, tuple]] = None
                  ) -> Optional[str]:
    """None if module.py shows the code `gm` (rebuilt from graph.json) generates, else one line
    naming the first statement that differs.

    Compared as Python syntax trees without annotations, comments and docstrings: the
    readable extras of module.py are not code. `constants` ({target: (blob, shape, stride)}
    from graph.json) is compared with the constants module.py loads. Nothing is imported.
    """
    from aotpipe.artifact import limits

    try:
        data = limits.read_bytes(module_py, limit=limits.current().max_record_bytes, limit_name="max_record_bytes")
        tree = ast.parse(data.decode("utf-8"), filename=str(module_py))
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        return f"{module_py}: not valid Python ({e.__class__.__name__}: {getattr(e, 'msg', e)})"
    shown = _forward_of(tree, in_class=True)
    # A graph the loader packed weights for (passes/prepack.py): module.py shows graph.json's.
    from aotpipe.passes.prepack import is_packed, stored_graph

    code = stored_graph(gm).python_code(root_module="self").src if is_packed(gm) else gm.code
    expected = _forward_of(ast.parse(code), in_class=False)
    if shown is None or expected is None:
        return f"{module_py}: has no GraphModule.forward (module.py does not match graph.json)"
    a, b = _by_position(_strip(copy.deepcopy(shown))), _by_position(_strip(expected))
    if ast.dump(a.args) != ast.dump(b.args):
        return (f"{module_py}:{shown.lineno}: forward takes ({ast.unparse(a.args)[:80]}), graph.json's graph "
                f"({ast.unparse(b.args)[:80]}) (module.py does not match graph.json)")
    for i in range(max(len(a.body), len(b.body))):
        sa = a.body[i] if i < len(a.body) else None
        sb = b.body[i] if i < len(b.body) else None
        if sa is None or sb is None or ast.dump(sa) != ast.dump(sb):
            line = shown.body[i].lineno if i < len(shown.body) else shown.end_lineno
            show = ast.unparse(sa)[:100] if sa is not None else "nothing"
            want = ast.unparse(sb)[:100] if sb is not None else "nothing"
            return (f"{module_py}:{line}: shows `{show}` where graph.json's graph has `{want}` "
                    "(module.py does not match graph.json)")
    if constants is not None:
        written = _constants_of(tree) or {}
        as_list = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
        want = {k: (v[0], as_list(v[1]), as_list(v[2])) for k, v in constants.items()}
        got = {k: (v[0], as_list(v[1]), as_list(v[2])) for k, v in written.items()
               if isinstance(v, tuple) and len(v) == 3}
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:3]
            return f"{module_py}: constants {', '.join(diff)} differ from graph.json's (module.py does not match graph.json)"
    return None
