"""Mutation testing of the modules whose decisions users trust, with mutmut.

    python tools/mutation.py list                    # the groups and their files
    python tools/mutation.py run accuracy            # one group (or several, or none: all)
    python tools/mutation.py run accuracy --only 'aotpipe.accuracy.x_rmse*'
    python tools/mutation.py survivors accuracy      # each survivor's diff, from the last run

Why mutmut (3.x) and not cosmic-ray: mutmut imports the code and the tests once and forks a
child per mutant, running only the tests that executed the mutated function (it records that
map in one traced run first). With torch's 2-second import that is the difference between
about ten mutants a second and one every few seconds; cosmic-ray rewrites the file on disk and
starts a fresh test command per mutant.

A group is a file tools/mutation_groups/<group>.toml: `sources` (the files mutated), `tests`
(the test files or node ids that run against them: fast, in-process tests; a test that reaches
the code only through a subprocess does not count for mutmut), and `[[equivalent]]` entries,
each a mutant's stable key and the reason no test can tell it from the original.

A run happens in a scratch copy, .mutation/<group>/ (mutmut writes its mutants/ folder into
the directory it runs in and reads its settings from pyproject.toml there), and writes
docs/mutation/<group>.json: every mutant's stable key, status and diff. The stable key names
the function and the changed lines, not mutmut's number, so it survives unrelated edits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ROOT / "tools" / "mutation_groups"
RESULTS = ROOT / "docs" / "mutation"
SCRATCH = ROOT / ".mutation"

# mutmut's exit codes, as its own `mutmut.stats.status_by_exit_code` reads them; anything else
# is "suspicious". A timeout or a crash of the mutant counts as caught: the tests noticed.
_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
           35: "suspicious", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout",
           255: "timeout", -11: "segfault", -9: "segfault", None: "not checked"}
CAUGHT = {"killed", "timeout", "segfault"}

# Copied or linked into the scratch copy beside aotpipe/ and tests/, for tests that read them.
_LINKED = ("pipelines", "docs", "tools", "benchmarks", "README.md", "constraints.txt", ".ci",
           "artifacts")


def load_group(name: str) -> dict[str, Any]:
    path = GROUPS / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in GROUPS.glob("*.toml")))
        raise SystemExit(f"{path}: no such mutation group; the groups are: {known}")
    data = tomllib.loads(path.read_text())
    for field in ("sources", "tests"):
        if not data.get(field):
            raise SystemExit(f"{path}: `{field}` is missing or empty; list the {field} of the group")
    data["name"] = name
    return data


def group_names() -> list[str]:
    return sorted(p.stem for p in GROUPS.glob("*.toml"))


def _mutmut_section(group: dict[str, Any]) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"
    return (
        "\n\n[tool.mutmut]\n"
        'source_paths = ["aotpipe"]\n'
        f"only_mutate = {toml_list(group['sources'])}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(group['tests'])}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-p", "no:randomly"]\n'
        f"also_copy = {toml_list([p for p in _LINKED if (ROOT / p).exists()])}\n"
        "use_setproctitle = false\n"
    )


def prepare(group: dict[str, Any]) -> Path:
    """A fresh scratch copy for the group: aotpipe/, tests/ and the files tests read."""
    where = SCRATCH / group["name"]
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "aotpipe", where / "aotpipe", ignore=ignore)
    shutil.copytree(ROOT / "tests", where / "tests", ignore=ignore)
    for name in _LINKED:
        if (ROOT / name).exists():
            (where / name).symlink_to(ROOT / name)
    (where / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + _mutmut_section(group))
    return where


def _mutmut() -> str:
    exe = Path(sys.executable).parent / "mutmut"
    if not exe.exists():
        raise SystemExit("mutmut is not installed in this environment: pip install -e '.[test]' -c constraints.txt")
    return str(exe)


def run_group(group: dict[str, Any], *, only: list[str], max_children: int) -> Path:
    where = prepare(group)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)  # the scratch copy's aotpipe/, not the caller's
    cmd = [_mutmut(), "run", "--max-children", str(max_children), *only]
    log = where / "mutmut.log"
    with open(log, "w") as out:
        code = subprocess.call(cmd, cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"mutmut failed on group {group['name']} (exit {code}); the end of {log}:\n{tail}")
    return where


def collect(group: dict[str, Any], where: Path) -> list[dict[str, Any]]:
    """Every mutant of the run: name, stable key, status and diff (read in the scratch copy,
    where mutmut's own diff function finds its files)."""
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from mutmut.mutation.data import SourceFileMutationData\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "out = []\n"
        "for src in json.loads(sys.argv[1]):\n"
        "    m = SourceFileMutationData(path=Path(src))\n"
        "    m.load()\n"
        "    for name, code in m.exit_code_by_key.items():\n"
        "        out.append({'name': name, 'file': src, 'exit_code': code,\n"
        "                    'diff': get_diff_for_mutant(name, path=Path(src))})\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(group["sources"])], cwd=where, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reading mutmut's results in {where} failed:\n{proc.stderr[-3000:]}")
    mutants = json.loads(proc.stdout)
    seen: dict[str, int] = {}
    for m in mutants:
        m["status"] = _STATUS.get(m.pop("exit_code"), "suspicious")
        key = stable_key(m["name"], m["diff"])
        seen[key] = seen.get(key, 0) + 1
        m["key"] = key if seen[key] == 1 else f"{key} #{seen[key]}"
    return mutants


def stable_key(name: str, diff: str) -> str:
    """`module.function: -old line => +new line`: mutmut's name without its number, and the
    lines the mutant changed, stripped. Unchanged by edits elsewhere in the file."""
    function = name.rsplit("__mutmut_", 1)[0].replace(".x_", ".", 1).replace("xǁ", "").replace("ǁ", ".")
    removed = [l[1:].strip() for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l[1:].strip() for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    return f"{function}: {' / '.join(removed)} => {' / '.join(added)}"


def equivalents(group: dict[str, Any]) -> dict[str, str]:
    return {e["mutant"]: e["reason"] for e in group.get("equivalent", [])}


def summarise(group: dict[str, Any], mutants: list[dict[str, Any]]) -> dict[str, Any]:
    eq = equivalents(group)
    per_file: dict[str, dict[str, int]] = {}
    for m in mutants:
        m["equivalent"] = eq.get(m["key"])
        counts = per_file.setdefault(m["file"], {"total": 0, "caught": 0, "equivalent": 0, "survived": 0})
        counts["total"] += 1
        if m["status"] in CAUGHT:
            counts["caught"] += 1
        elif m["equivalent"]:
            counts["equivalent"] += 1
        else:
            counts["survived"] += 1
    for counts in per_file.values():
        scored = counts["total"] - counts["equivalent"]
        counts["score"] = round(counts["caught"] / scored, 4) if scored else 1.0
    stale = sorted(set(eq) - {m["key"] for m in mutants})
    return {"group": group["name"], "files": per_file, "stale_equivalents": stale}


def write_results(group: dict[str, Any], mutants: list[dict[str, Any]], only: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{group['name']}.json"
    if only and out.is_file():
        # a partial run: mutants it did not select keep the status of the last run (by stable key)
        before = {m["key"]: m["status"] for m in json.loads(out.read_text())["mutants"]}
        for m in mutants:
            if m["status"] == "not checked" and m["key"] in before:
                m["status"] = before[m["key"]]
    summary = summarise(group, mutants)
    data = {
        "group": group["name"],
        "sources": group["sources"],
        "tests": group["tests"],
        "partial": any(m["status"] == "not checked" for m in mutants),
        "sources_sha256": {s: hashlib.sha256((ROOT / s).read_bytes()).hexdigest() for s in group["sources"]},
        "summary": summary,
        "mutants": sorted(({k: m[k] for k in ("key", "name", "file", "status", "equivalent", "diff")}
                           for m in mutants), key=lambda m: m["name"]),
    }
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return out


def print_summary(summary: dict[str, Any]) -> None:
    for path, c in sorted(summary["files"].items()):
        print(f"  {path}: {c['caught']}/{c['total'] - c['equivalent']} caught ({100 * c['score']:.1f}%), "
              f"{c['equivalent']} equivalent, {c['survived']} surviving")
    for key in summary["stale_equivalents"]:
        print(f"  stale equivalent (no such mutant now): {key}")


def cmd_run(args: argparse.Namespace) -> int:
    names = args.groups or group_names()
    for name in names:
        group = load_group(name)
        print(f"{name}: mutating {', '.join(group['sources'])}", flush=True)
        where = run_group(group, only=args.only, max_children=args.max_children)
        mutants = collect(group, where)
        out = write_results(group, mutants, args.only)
        print_summary(json.loads(out.read_text())["summary"])
        print(f"  results: {out.relative_to(ROOT)}")
    return 0


def cmd_survivors(args: argparse.Namespace) -> int:
    for name in args.groups or group_names():
        path = RESULTS / f"{name}.json"
        if not path.is_file():
            print(f"{name}: no results yet; run: python tools/mutation.py run {name}")
            continue
        data = json.loads(path.read_text())
        for m in data["mutants"]:
            if m["status"] not in CAUGHT and not m["equivalent"]:
                print(f"## {m['name']} ({m['status']})\n   key: {m['key']}\n{m['diff']}\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for name in group_names():
        group = load_group(name)
        print(f"{name}: {' '.join(group['sources'])}\n    tests: {' '.join(group['tests'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="mutate the groups' sources and run their tests against each mutant")
    run.add_argument("groups", nargs="*")
    run.add_argument("--only", action="append", default=[], help="mutmut name pattern (fnmatch); repeatable")
    run.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    run.set_defaults(func=cmd_run)
    surv = sub.add_parser("survivors", help="each surviving mutant's diff, from the last run")
    surv.add_argument("groups", nargs="*")
    surv.set_defaults(func=cmd_survivors)
    lst = sub.add_parser("list", help="the groups")
    lst.set_defaults(func=cmd_list)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
