"""Count the string-key lookups on records left in aotpipe/: x["field"] and x.get("field").

    python tools/record_lookups.py [ROOT] [--run-json RUN_JSON] [-v]

A lookup counts when its key (a string literal) names a field of a record of
aotpipe/format/records.py (or a key of RUN_JSON, for a tree older than run.json's record)
and it is a read (not a store). Left out: node.meta[...] and os.environ[...] (not records),
and aotpipe/artifact/checked.py (it binds op arguments by name).

Also left out, and counted apart: lookups on values typed as unvalidated data. A record is
read through its class; but before a record exists there is data as parsed: the pipeline
YAML that config.py checks field by field so that validate reports every problem at once
with its line, a file's format_version peeked at to say which versions this aotpipe reads
before the record is validated, and pydantic's own error details. Such a value is
annotated with one of RAW_TYPES (aotpipe.format.records.RawYaml and RawJson, pydantic's
ErrorDetails, or format.limits.OpKwargs: an op call's keyword arguments, whose names
"dtype" and "stride" are torch's), as a parameter or a variable, and so is every value taken from one in the
same function by subscripting, .get(...) or iteration (`for m in data.get("models")`). The
annotation is the claim, in the code where a reviewer sees it, that the value is no record;
`-v` lists those lookups too, marked "raw".

ROOT defaults to this checkout.
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


# Type names that mark a value as data not yet validated into a record (see the docstring).
RAW_TYPES = {"RawYaml", "RawJson", "ErrorDetails", "OpKwargs"}


def _annotation_is_raw(a: ast.expr | None) -> bool:
    """Whether an annotation names one of RAW_TYPES (alone, or inside Optional[...], X | None, list[...])."""
    if a is None:
        return False
    if isinstance(a, ast.Constant) and isinstance(a.value, str):  # a string annotation
        try:
            a = ast.parse(a.value, mode="eval").body
        except SyntaxError:
            return False
    return any(isinstance(n, ast.Name) and n.id in RAW_TYPES or isinstance(n, ast.Attribute) and n.attr in RAW_TYPES
               for n in ast.walk(a))


def _raw_names(fn: ast.AST) -> set[str]:
    """The names in function `fn` that hold unvalidated data: annotated with a raw type, or
    taken from such a value by subscripting, .get(...), .items()/.values(), iteration or enumerate."""
    raw: set[str] = set()
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for arg in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            if _annotation_is_raw(arg.annotation):
                raw.add(arg.arg)
    for n in ast.walk(fn):
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and _annotation_is_raw(n.annotation):
            raw.add(n.target.id)

    def from_raw(e: ast.expr | None) -> bool:
        if isinstance(e, ast.Name):
            return e.id in raw
        if isinstance(e, ast.Subscript):
            return from_raw(e.value)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in ("get", "items", "values"):
            return from_raw(e.func.value)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in ("enumerate", "list", "zip"):
            return any(from_raw(a) for a in e.args)
        if isinstance(e, ast.IfExp):
            return from_raw(e.body) or from_raw(e.orelse)
        if isinstance(e, ast.BoolOp):
            return any(from_raw(v) for v in e.values)
        return False

    def bind(target: ast.expr) -> bool:
        new = {t.id for t in ast.walk(target) if isinstance(t, ast.Name)} - raw
        raw.update(new)
        return bool(new)

    changed = True
    while changed:  # to a fixed point: a name taken from one taken from raw data is raw too
        changed = False
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and from_raw(n.value):
                changed |= any(bind(t) for t in n.targets)
            elif isinstance(n, (ast.For, ast.comprehension)) and from_raw(n.iter):
                changed |= bind(n.target)
            elif isinstance(n, ast.NamedExpr) and from_raw(n.value):
                changed |= bind(n.target)
    return raw


def _is_raw(base: ast.expr, raw: set[str]) -> bool:
    """Whether a lookup's `base` is unvalidated data: a raw name, or a lookup on one."""
    while isinstance(base, (ast.Subscript, ast.Call, ast.Attribute)):
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute) and base.func.attr == "get":
            base = base.func.value
        elif isinstance(base, ast.Subscript):
            base = base.value
        else:
            return False
    return isinstance(base, ast.Name) and base.id in raw


def lookups_in(source: str, fields: set[str]) -> list[tuple[int, str, bool]]:
    """(line, the lookup, whether it is on unvalidated data) of every lookup of a record
    field's name in Python `source`."""
    tree = ast.parse(source)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    raw_at: dict[int, set[str]] = {}  # node id -> the raw names of its innermost function
    for fn in sorted(scopes, key=lambda f: -len(list(ast.walk(f)))):  # outer first; inner ones overwrite
        names = _raw_names(fn)
        for n in ast.walk(fn):
            raw_at[id(n)] = names
    out = []
    for n in ast.walk(tree):
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
        out.append((n.lineno, ast.unparse(n), _is_raw(base, raw_at.get(id(n), set()))))
    return out


def lookups(root: Path, fields: set[str]) -> list[tuple[str, int, str, bool]]:
    """(file, line, the lookup, whether on unvalidated data) of every lookup under ROOT/aotpipe."""
    out = []
    for p in sorted((root / "aotpipe").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel in SKIP:
            continue
        out += [(rel, line, text, raw) for line, text, raw in lookups_in(p.read_text(encoding="utf-8"), fields)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--run-json", type=Path, help="a run.json whose keys count as record fields too")
    ap.add_argument("-v", action="store_true", help="list every lookup")
    a = ap.parse_args()
    found = lookups(a.root, record_fields(a.root, a.run_json))
    on_records = [f for f in found if not f[3]]
    if a.v:
        for rel, line, text, raw in found:
            print(f"{rel}:{line}: {text}" + ("  (raw)" if raw else ""))
    for rel, n in collections.Counter(rel for rel, _, _, _ in on_records).most_common():
        print(f"{n:4d} {rel}")
    print(f"{len(on_records)} lookups ({len(found) - len(on_records)} more on unvalidated data, typed "
          f"{', '.join(sorted(RAW_TYPES))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
