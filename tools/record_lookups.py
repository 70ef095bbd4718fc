"""Count the string-key lookups on records left in aotpipe/: x["field"] and x.get("field").

    python tools/record_lookups.py [ROOT] [--run-json RUN_JSON] [-v]

A lookup counts when its key (a string literal) names a field of a record of
aotpipe/format/records.py (or a key of RUN_JSON, for a tree older than run.json's record)
and it is a read (not a store). Left out: node.meta[...] and os.environ[...] (not records),
and aotpipe/artifact/checked.py (it binds op arguments by name). What is left is mostly raw
JSON before it is validated (the YAML parser, a worker's reply) and value summaries
(accuracy.summary), which are dicts by design. ROOT defaults to this checkout.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import sys
from pathlib import Path

SKIP = {"aotpipe/artifact/checked.py"}


def record_fields(root: Path, run_json: Path | None) -> set[str]:
    sys.path.insert(0, str(root))
    import pydantic

    from aotpipe.format import records

    fields: set[str] = set()
    for obj in vars(records).values():
        if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):
            fields |= set(obj.model_fields)
    if run_json is not None:
        def keys(o: object) -> None:
            if isinstance(o, dict):
                for k, v in o.items():
                    fields.add(k)
                    keys(v)
            elif isinstance(o, list):
                for v in o:
                    keys(v)
        keys(json.loads(run_json.read_text()))
    return fields


def lookups(root: Path, fields: set[str]) -> list[tuple[str, int, str]]:
    out = []
    for p in sorted((root / "aotpipe").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel in SKIP:
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and isinstance(n.slice, ast.Constant):
                key, base = n.slice.value, n.value
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                    and n.args and isinstance(n.args[0], ast.Constant):
                key, base = n.args[0].value, n.func.value
            else:
                continue
            if not isinstance(key, str) or key not in fields:
                continue
            src = ast.unparse(base)
            if src.endswith("meta") or "environ" in src:
                continue
            out.append((rel, n.lineno, ast.unparse(n)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--run-json", type=Path, help="a run.json whose keys count as record fields too")
    ap.add_argument("-v", action="store_true", help="list every lookup")
    a = ap.parse_args()
    found = lookups(a.root, record_fields(a.root, a.run_json))
    if a.v:
        for rel, line, text in found:
            print(f"{rel}:{line}: {text}")
    for rel, n in collections.Counter(rel for rel, _, _ in found).most_common():
        print(f"{n:4d} {rel}")
    print(f"{len(found)} lookups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
