"""A function-level import of aotpipe's own modules or of torch stands only where it keeps
torch (or cryptography, transformers) off a torch-free import, or breaks an import cycle, and
says so in a comment on its line or the line above. Everything else imports at module level."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def function_level_imports(source: str) -> list[tuple[int, str, bool]]:
    """(line, the import, whether it says why) of each import of aotpipe or torch inside a def."""
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                names = ["." * n.level + (n.module or "")]
            else:
                continue
            if not any(m.startswith(("aotpipe", ".")) or m == "torch" or m.startswith("torch.") for m in names):
                continue
            said = "#" in lines[n.lineno - 1] or (n.lineno > 1 and lines[n.lineno - 2].strip().startswith("#"))
            out.append((n.lineno, ast.unparse(n), said))
    return sorted(set(out))


def test_every_function_level_import_in_aotpipe_says_why_it_is_there():
    silent = [f"{p.relative_to(ROOT)}:{line}: {text}"
              for p in sorted((ROOT / "aotpipe").rglob("*.py"))
              for line, text, said in function_level_imports(p.read_text(encoding="utf-8")) if not said]
    assert silent == [], "import these at module level, or say why not (torch-free path, cycle):\n" + \
        "\n".join(silent)


def test_a_silent_function_level_import_is_found():
    found = function_level_imports(textwrap.dedent("""
        import torch

        def f():
            from aotpipe.format import records
            import json
            return records, json

        def g():
            import torch.fx  # torch: kept off the torch-free path
            return torch
    """))
    assert found == [(5, "from aotpipe.format import records", False), (10, "import torch.fx", True)]
