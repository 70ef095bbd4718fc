"""The lint and type ratchet: ruff's and mypy's findings may only go down.

    python tools/lint.py              # run ruff and mypy, compare with the baselines (CI runs this)
    python tools/lint.py --update     # rewrite the baselines to what they find now; commit them

Their settings are in pyproject.toml ([tool.ruff], [tool.mypy]). What they found when the
ratchet was set is committed in tools/lint_baseline/ (ruff.json, mypy.json) as counts per
file, rule (ruff's code, mypy's error code) and message, without line numbers: an edit that
only moves code changes nothing, and neither does a line number inside a message ("on line
12"). The check fails (exit 1) when

- a key occurs more often than the baseline counts, or is new: fix the code it names;
- the baseline counts more than occurs (something was fixed): the baseline may only shrink,
  so `--update` records the fix and the change is committed with it;
- anything is found in aotpipe/format/ (the records every artefact is read through): it is
  type-checked with mypy's --strict flags and has no baseline, so a baseline entry there
  fails too, and `--update` leaves that folder out;
- pyproject.toml no longer gives aotpipe/format/ every flag `mypy --strict` sets.

mypy's cache is .mypy_cache/ (gitignored); with it warm a check takes a few seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE_DIR = Path("tools") / "lint_baseline"
STRICT = "aotpipe/format/"  # strict, no baseline
STRICT_MODULE = "aotpipe.format.records"  # a module of it, to read the flags mypy gives it
COMMAND = "python tools/lint.py"

Key = tuple[str, str, str]  # (file relative to the root, rule, message)


class ToolFailed(Exception):
    """ruff or mypy did not run to the end (a crash, a bad setting): nothing to compare."""


def _message(text: str) -> str:
    """A message without line numbers ("defined on line 12" reads "defined on line N")."""
    return re.sub(r"\blines? \d+(?:-\d+)?\b", "line N", " ".join(text.split()))


def _relative(root: Path, name: str) -> str:
    p = Path(name)
    return (p.resolve().relative_to(root.resolve()) if p.is_absolute() else p).as_posix()


def _run(tool: str, args: list[str], root: Path) -> str:
    """`python -m tool args` in `root`: its output, where it ran to the end (exit 0 or 1: findings)."""
    proc = subprocess.run([sys.executable, "-m", tool, *args], cwd=root, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise ToolFailed(f"{tool} exited with {proc.returncode}:\n{proc.stderr or proc.stdout}")
    return proc.stdout


def ruff_findings(root: Path) -> list[tuple[Key, int]]:
    """Each finding of `ruff check` (pyproject.toml's rules) under `root`: its key and line."""
    out = _run("ruff", ["check", "--output-format", "json", "--quiet", "."], root)
    return [((_relative(root, d["filename"]), d["code"] or "syntax", _message(d["message"])), d["location"]["row"])
            for d in json.loads(out or "[]")]


def mypy_findings(root: Path) -> list[tuple[Key, int]]:
    """Each error mypy (pyproject.toml's settings) reports under `root`: its key and line."""
    out = _run("mypy", ["--output", "json"], root)
    found = []
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d["severity"] == "error":
            found.append(((_relative(root, d["file"]), d["code"] or "misc", _message(d["message"])), d["line"]))
    return found


TOOLS: dict[str, Callable[[Path], list[tuple[Key, int]]]] = {"ruff": ruff_findings, "mypy": mypy_findings}


def counts(found: list[tuple[Key, int]]) -> collections.Counter[Key]:
    return collections.Counter(key for key, _ in found)


def load_baseline(path: Path) -> collections.Counter[Key]:
    """A baseline file: {file: {rule: {message: count}}}; an empty one where there is none."""
    if not path.is_file():
        return collections.Counter()
    data = json.loads(path.read_text(encoding="utf-8"))
    return collections.Counter({(f, rule, msg): n for f, rules in data.items()
                                for rule, msgs in rules.items() for msg, n in msgs.items()})


def dump_baseline(found: collections.Counter[Key]) -> str:
    data: dict[str, dict[str, dict[str, int]]] = {}
    for (f, rule, msg), n in sorted(found.items()):
        if n > 0 and not f.startswith(STRICT):
            data.setdefault(f, {}).setdefault(rule, {})[msg] = n
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def compare(tool: str, found: list[tuple[Key, int]], baseline: collections.Counter[Key]) -> list[str]:
    """What is wrong, one line each: findings above the baseline, in the strict folder, or
    fixed while the baseline still counts them."""
    now = counts(found)
    lines: dict[Key, list[int]] = collections.defaultdict(list)
    for key, line in found:
        lines[key].append(line)
    problems = []
    for key in sorted(now):
        f, rule, msg = key
        at = "line" + ("s " if len(lines[key]) > 1 else " ") + ", ".join(map(str, sorted(lines[key])))
        if f.startswith(STRICT):
            problems.append(f"{f} ({at}): {tool} {rule}: {msg}\n    {STRICT} is checked strictly and has no "
                            "baseline: fix it")
        elif now[key] > baseline[key]:
            was = f"the baseline counts {baseline[key]}" if baseline[key] else "new"
            problems.append(f"{f} ({at}): {tool} {rule}: {msg}\n    {now[key]} found, {was}: fix it (the "
                            "baseline takes no new findings)")
    for key in sorted(baseline):
        f, rule, msg = key
        if f.startswith(STRICT):
            problems.append(f"{f}: {tool} {rule}: {msg}\n    the {tool} baseline lists {STRICT}, which may have "
                            f"none: remove it with {COMMAND} --update and commit it")
        elif baseline[key] > now[key]:
            problems.append(f"{f}: {tool} {rule}: {msg}\n    the baseline counts {baseline[key]}, {now[key]} "
                            f"found: the baseline may only shrink: run {COMMAND} --update and commit it")
    return problems


def strict_flags_missing(root: Path) -> list[str]:
    """The flags `mypy --strict` sets that pyproject.toml does not give aotpipe/format/.

    `strict = true` cannot say it: in an override section mypy reads it as the global flag and
    makes every module strict, so pyproject.toml spells the flags out, and this keeps them whole
    as mypy adds to --strict."""
    from mypy.main import process_options
    from mypy.options import Options

    default = Options()
    names = [n for n in dir(default) if not n.startswith("_") and isinstance(getattr(default, n), bool)]
    _, strict = process_options(["--strict", "-c", "pass"], require_targets=False)
    flags = {n: getattr(strict, n) for n in names if getattr(strict, n) != getattr(default, n)}
    cwd = Path.cwd()
    try:
        os.chdir(root)  # mypy reads paths in the file relative to where it runs
        _, configured = process_options(["--config-file", "pyproject.toml", "-c", "pass"], require_targets=False)
    finally:
        os.chdir(cwd)
    module = configured.clone_for_module(STRICT_MODULE)
    return sorted(f"{n} = {v!r}" for n, v in flags.items() if getattr(module, n) != v)


def check(root: Path, update: bool = False, out: Callable[[str], None] = print) -> int:
    """0 when every tool's findings match its baseline (or, with `update`, after rewriting the
    baselines, unless the strict folder has findings); 1 otherwise, naming each problem."""
    problems = []
    missing = strict_flags_missing(root)
    if missing:
        problems.append(f"pyproject.toml: the [[tool.mypy.overrides]] of aotpipe.format.* lacks what --strict "
                        f"sets: {', '.join(missing)}\n    add them there")
    for tool, run in TOOLS.items():
        path = root / BASELINE_DIR / f"{tool}.json"
        found = run(root)
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump_baseline(counts(found)), encoding="utf-8")
            out(f"{path.relative_to(root).as_posix()}: {sum(counts(found).values())} findings recorded")
        problems += compare(tool, found, load_baseline(path))
    for p in problems:
        out(p)
    if problems:
        out(f"{COMMAND}: {len(problems)} problem(s)")
        return 1
    if not update:
        out(f"{COMMAND}: ruff and mypy find nothing beyond tools/lint_baseline/")
    return 0


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the baselines to what ruff and mypy find now")
    args = ap.parse_args(argv)
    try:
        return check(root, update=args.update)
    except ToolFailed as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
