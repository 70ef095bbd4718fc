"""Mutation testing of the modules whose decisions users trust, with mutmut.

    python tools/mutation.py list                    # the groups and their files
    python tools/mutation.py run accuracy            # one group (or several, or none: all)
    python tools/mutation.py run accuracy --only 'aotpipe.runtime.accuracy.x_rmse*'
    python tools/mutation.py survivors accuracy      # each survivor's diff, from the last run
    python tools/mutation.py run accuracy --survivors    # again, only the functions with survivors
    python tools/mutation.py check                   # the ratchet: rerun, fail on a lower score
    python tools/mutation.py check --changed --sample 4   # CI's: groups whose files changed
    python tools/mutation.py planted                 # each group's planted regressions are caught
    python tools/mutation.py planted --changed       # CI's: only groups changed since last caught

The page docs/generated/mutation.md is rendered from docs/mutation/*.json by
`python tools/gen_docs.py` (tests/test_docs.py fails while it is stale).

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
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import tomllib

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


# The target of every listed file (the page marks a file under it), and the most a file's
# score may fall below the recorded one before CI fails (a changed function can shift a
# mutant or two either way).
FLOOR = 0.90
SLACK = 0.01

# mutmut forks each mutant's child from a server that has only collected the tests, so what a
# test helper caches in its module (a small captured tree, say) would be rebuilt by every
# child. A group's `warmup` ("module:function", each called with no argument) names those
# builders: tests/conftest.py calls them in the server, after collection, where no mutant is
# switched on, and every child inherits what they built.
WARMUP_ENV = "AOTPIPE_MUTATION_WARMUP"


def load_group(name: str, groups: Path = GROUPS) -> dict[str, Any]:
    path = groups / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in groups.glob("*.toml")))
        raise SystemExit(f"{path}: no such mutation group; the groups are: {known}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"{path}: not valid TOML ({e}); fix the file") from None
    for field in ("sources", "tests"):
        if not data.get(field):
            raise SystemExit(f"{path}: `{field}` is missing or empty; list the {field} of the group")
    for i, entry in enumerate(data.get("equivalent", []), 1):
        missing = [k for k in ("mutant", "reason") if not entry.get(k)]
        if missing:
            raise SystemExit(f"{path}: equivalent entry {i} lacks {', '.join(missing)}; each names the "
                             f"mutant's stable key and why no test can tell it from the original")
        if not entry["reason"].startswith(("equivalent:", "wording:")):
            raise SystemExit(f"{path}: equivalent entry {i}: the reason must start with 'equivalent:' or "
                             f"'wording:' (got {entry['reason'][:40]!r})")
    warmup = data.get("warmup", [])
    if not isinstance(warmup, list) or not all(isinstance(w, str) and w.count(":") == 1 and all(w.split(":"))
                                               for w in warmup):
        raise SystemExit(f"{path}: `warmup` must be a list of \"module:function\" strings "
                         f"(got {warmup!r})")
    for i, entry in enumerate(data.get("planted", []), 1):
        missing = [k for k in ("file", "old", "new", "why") if not entry.get(k) and not (k == "new" and k in entry)]
        if missing:
            raise SystemExit(f"{path}: planted entry {i} lacks {', '.join(missing)}")
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
        # no:unraisableexception: pytest's gc.collect() after each test walks torch's heap, in a
        # forked child touching every page: 4 s of a mutant's 5 s in the replay group
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-p", "no:unraisableexception"]\n'
        f"also_copy = {toml_list([p for p in _LINKED if (ROOT / p).exists()])}\n"
        "use_setproctitle = false\n"
    )


def prepare(group: dict[str, Any], purpose: str = "") -> Path:
    """A fresh scratch copy for the group: aotpipe/, tests/ and the files tests read. `purpose`
    names a copy of its own ("planted"), so that `planted` never wipes a `run` in progress."""
    where = SCRATCH / (f"{group['name']}.{purpose}" if purpose else group["name"])
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


def scratch_env(group: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a process in a scratch copy: its own aotpipe/ (no PYTHONPATH of the
    caller's), one torch thread (mutants run side by side), fixed hashing, and the group's
    warm-up functions (tests/conftest.py calls them once collection is done)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    env.pop(WARMUP_ENV, None)
    if group and group.get("warmup"):
        env[WARMUP_ENV] = ",".join(group["warmup"])
    return env


def run_group(group: dict[str, Any], *, only: list[str], max_children: int) -> Path:
    """mutmut over the group in a fresh scratch copy; returns the copy."""
    where = prepare(group)
    env = scratch_env(group)
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
    env = scratch_env()
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(group["sources"])], cwd=where, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reading mutmut's results in {where} failed:\n{proc.stderr[-3000:]}")
    mutants = json.loads(proc.stdout)
    for m in mutants:
        m["status"] = _STATUS.get(m.pop("exit_code"), "suspicious")
    return keyed(mutants)


def keyed(mutants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each mutant its stable key; the same change twice in one function is told apart
    by order (` #2`), mutmut's numbering being in source order."""
    seen: dict[str, int] = {}
    for m in sorted(mutants, key=lambda m: _mutant_number(m["name"])):
        key = stable_key(m["name"], m["diff"])
        seen[key] = seen.get(key, 0) + 1
        m["key"] = key if seen[key] == 1 else f"{key} #{seen[key]}"
    return mutants


def _mutant_number(name: str) -> tuple[str, int]:
    function, _, number = name.rpartition("__mutmut_")
    return (function, int(number) if number.isdigit() else 0)


def stable_key(name: str, diff: str) -> str:
    """`module.function: -old line => +new line`: mutmut's name without its number, and the
    lines the mutant changed, stripped. Unchanged by edits elsewhere in the file."""
    function = name.rsplit("__mutmut_", 1)[0].replace(".x_", ".", 1).replace("xǁ", "").replace("ǁ", ".")
    removed = [l[1:].strip() for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l[1:].strip() for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    return f"{function}: {' / '.join(removed)} => {' / '.join(added)}"


def score(counts: dict[str, int]) -> float:
    """Caught over the mutants that are not explained away (equivalent or wording only)."""
    scored = counts["total"] - counts["equivalent"] - counts["wording"]
    return round(counts["caught"] / scored, 4) if scored else 1.0


def equivalents(group: dict[str, Any]) -> dict[str, str]:
    return {e["mutant"]: e["reason"] for e in group.get("equivalent", [])}


def summarise(group: dict[str, Any], mutants: list[dict[str, Any]]) -> dict[str, Any]:
    eq = equivalents(group)
    per_file: dict[str, dict[str, int]] = {}
    for m in mutants:
        m["equivalent"] = eq.get(m["key"])
        counts = per_file.setdefault(m["file"], {"total": 0, "caught": 0, "equivalent": 0, "wording": 0,
                                                 "survived": 0, "not_checked": 0})
        if m["status"] == "not checked":
            counts["not_checked"] += 1
            continue
        counts["total"] += 1
        if m["status"] in CAUGHT:
            counts["caught"] += 1
        elif m["equivalent"]:
            counts["wording" if m["equivalent"].startswith("wording:") else "equivalent"] += 1
        else:
            counts["survived"] += 1
    for counts in per_file.values():
        counts["score"] = score(counts)
    stale = sorted(set(eq) - {m["key"] for m in mutants})
    return {"group": group["name"], "files": per_file, "stale_equivalents": stale}


def write_results(group: dict[str, Any], mutants: list[dict[str, Any]], only: list[str],
                  run: Optional[dict[str, Any]] = None) -> Path:
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
        "run": run or {},
        "sources_sha256": {s: hashlib.sha256((ROOT / s).read_bytes()).hexdigest() for s in group["sources"]},
        "files_sha256": fingerprint(group),
        "summary": summary,
        "mutants": sorted((recorded(m) for m in mutants), key=lambda m: m["name"]),
    }
    out.write_text(dump(data))
    return out


def dump(data: dict[str, Any]) -> str:
    """The results file: its header indented, then one mutant per line (small, and a rerun's
    git diff shows the mutants whose status changed)."""
    head = json.dumps({k: v for k, v in data.items() if k != "mutants"}, indent=1, ensure_ascii=False)
    rows = ",\n".join(" " + json.dumps(m, ensure_ascii=False) for m in data["mutants"])
    return head[:-2] + ',\n "mutants": [\n' + rows + "\n ]\n}\n"


def recorded(m: dict[str, Any]) -> dict[str, Any]:
    """A mutant as the results file keeps it: its diff only where someone must read it (a
    survivor); a caught or not yet run mutant's key says what it is, in a tenth of the bytes."""
    kept = {k: m[k] for k in ("key", "name", "file", "status", "equivalent")}
    if m["status"] not in CAUGHT | {"not checked"}:
        kept["diff"] = m["diff"]
    return kept


def print_summary(summary: dict[str, Any]) -> None:
    for path, c in sorted(summary["files"].items()):
        print(f"  {path}: {c['caught']}/{c['total'] - c['equivalent'] - c['wording']} caught "
              f"({100 * c['score']:.1f}%), {c['equivalent']} equivalent, {c['wording']} wording, "
              f"{c['survived']} surviving")
    for key in summary["stale_equivalents"]:
        print(f"  stale equivalent (no such mutant now): {key}")


def cmd_run(args: argparse.Namespace) -> int:
    names = args.groups or group_names()
    for name in names:
        group = load_group(name)
        print(f"{name}: mutating {', '.join(group['sources'])}", flush=True)
        start = time.monotonic()
        only = list(args.only)
        if args.resume or args.survivors:
            picked = (resume_patterns(name) if args.resume else []) + \
                (resume_patterns(name, survivors=True) if args.survivors else [])
            if not picked:
                print(f"  {name}: no function has a mutant to run again")
                continue
            only += sorted(set(picked))
        where = run_group(group, only=only, max_children=args.max_children)
        mutants = collect(group, where)
        out = write_results(group, mutants, only, run_facts(start, mutants, args.max_children))
        print_summary(json.loads(out.read_text())["summary"])
        print(f"  results: {out.relative_to(ROOT)}")
    return 0


def fingerprint(group: dict[str, Any], root: Path = ROOT) -> dict[str, str]:
    """sha256 of each file a group's results depend on most: its sources and its test files."""
    files = list(group["sources"]) + [t.split("::")[0] for t in group["tests"]]
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in dict.fromkeys(files)
            if (root / f).is_file()}


def unchanged(group: dict[str, Any], recorded: dict[str, Any], root: Path = ROOT) -> bool:
    """Whether neither the group's sources nor its tests changed since its recorded run (whose
    results then still hold: the same code under the same tests)."""
    return recorded.get("files_sha256") == fingerprint(group, root)


def resume_patterns(name: str, *, survivors: bool = False) -> list[str]:
    """mutmut patterns for the functions with a mutant the recorded run did not reach, or
    (survivors) with one it reached and did not catch and no equivalent explains (to run
    them again after new tests)."""
    data = load_results(name)
    if data is None:
        raise SystemExit(f"{name}: no recorded run to resume; run: python tools/mutation.py run {name}")
    if survivors:
        # explained by the recorded run, or by an entry added to the group's file since
        known = equivalents(load_group(name, GROUPS)) if (GROUPS / f"{name}.toml").is_file() else {}
        picked = [m for m in data["mutants"] if m["status"] not in CAUGHT | {"not checked"}
                  and not m.get("equivalent") and m["key"] not in known]
    else:
        picked = [m for m in data["mutants"] if m["status"] == "not checked"]
    return sorted({m["name"].rsplit("__mutmut_", 1)[0] + "__mutmut_*" for m in picked})


def _git_head() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def run_facts(start: float, mutants: list[dict[str, Any]], max_children: int) -> dict[str, Any]:
    wall = time.monotonic() - start
    ran = sum(1 for m in mutants if m["status"] != "not checked")
    return {"commit": _git_head(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(wall, 1), "mutants_run": ran, "max_children": max_children,
            "cores": os.cpu_count()}


def load_results(name: str, results: Optional[Path] = None) -> Optional[dict[str, Any]]:
    path = (results or RESULTS) / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def compare(recorded: dict[str, Any], now: list[dict[str, Any]], summary: dict[str, Any],
            full: bool = True) -> list[str]:
    """What CI fails on: a mutant the recorded run caught that now survives (a test lost its
    teeth), and, after a full run, a file whose score fell more than SLACK below the recorded
    one. (A file under FLOOR is the page's business: the ratchet holds what was reached.)"""
    problems: list[str] = []
    was = {m["key"]: m["status"] for m in recorded["mutants"]}
    for m in now:
        if was.get(m["key"]) in CAUGHT and m["status"] not in CAUGHT and not m.get("equivalent"):
            problems.append(f"{m['file']}: {m['key']}\n    was caught in the recorded run, now {m['status']}: "
                            f"a test that caught it was removed or weakened")
    rec_files = recorded["summary"]["files"]
    for path, counts in sorted(summary["files"].items()):
        if counts["total"] == 0 or not full:
            continue
        before = rec_files.get(path, {}).get("score")
        if before is not None and counts["score"] < before - SLACK:
            problems.append(f"{path}: score {100 * counts['score']:.1f}% fell from the recorded "
                            f"{100 * before:.1f}%")
    return problems


def functions(path: Path, module: str) -> list[str]:
    """mutmut's name pattern for each function it mutates in a file: its top-level functions
    (`mod.x_f__mutmut_*`) and the methods of its top-level classes (`mod.xǁCǁm__mutmut_*`)."""
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(f"{module}.x_{node.name}__mutmut_*")
        elif isinstance(node, ast.ClassDef):
            names += [f"{module}.xǁ{node.name}ǁ{m.name}__mutmut_*" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names


def sample(group: dict[str, Any], every: int, root: Path = ROOT) -> list[str]:
    """A fixed sample of the group's functions: those whose name's CRC-32 is 0 modulo `every`,
    and at least the first function of each file, so that every file is tried."""
    chosen: list[str] = []
    for src in group["sources"]:
        module = src.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        names = functions(root / src, module)
        picked = [n for n in names if zlib.crc32(n.encode()) % every == 0]
        chosen += picked or names[:1]
    return chosen


def cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for name in args.groups or group_names():
        group = load_group(name)
        recorded = load_results(name)
        if recorded is None:
            print(f"{name}: FAIL: no recorded results (docs/mutation/{name}.json); "
                  f"run: python tools/mutation.py run {name}")
            failed = True
            continue
        if args.changed and unchanged(group, recorded):
            print(f"{name}: its sources and tests are as in its recorded run: its score holds")
            continue
        start = time.monotonic()
        only = list(args.only) + (sample(group, args.sample) if args.sample > 1 else [])
        where = run_group(group, only=only, max_children=args.max_children)
        mutants = [m for m in collect(group, where) if m["status"] != "not checked"]
        summary = summarise(group, mutants)
        problems = compare(recorded, mutants, summary, full=not only)
        wall = time.monotonic() - start
        print(f"{name}: {len(mutants)} mutants in {wall:.0f} s")
        print_summary(summary)
        for p in problems:
            print(f"  FAIL: {p}")
        if problems:
            failed = True
            print(f"  fix: kill the survivors with a test (python tools/mutation.py survivors {name} after a run), "
                  f"or record a true equivalent in tools/mutation_groups/{name}.toml; then record the new "
                  f"score: python tools/mutation.py run {name}")
    return 1 if failed else 0


def apply_planted(where: Path, entry: dict[str, str]) -> None:
    """Write one planted regression into the scratch copy; refuse one whose snippet is gone."""
    path = where / entry["file"]
    text = path.read_text()
    count = text.count(entry["old"])
    if count != 1:
        raise ValueError(f"{entry['file']}: the planted snippet {entry['old']!r} occurs {count} times "
                         f"(it must occur once): update the [[planted]] entry")
    path.write_text(text.replace(entry["old"], entry["new"]))


PLANTED_RECORD = "planted.json"  # in RESULTS: per group, the files and entries of its last all-caught run


def planted_fingerprint(group: dict[str, Any], root: Path = ROOT) -> dict[str, str]:
    """What a group's planted verdicts depend on: its sources, its test files (as
    :func:`fingerprint`) and its planted entries themselves."""
    entries = json.dumps(group.get("planted", []), sort_keys=True).encode()
    return {**fingerprint(group, root), "[[planted]]": hashlib.sha256(entries).hexdigest()}


def load_planted_record(results: Path | None = None) -> dict[str, Any]:
    path = (results or RESULTS) / PLANTED_RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def record_planted(name: str, group: dict[str, Any], results: Path | None = None, root: Path = ROOT) -> None:
    """Note that every planted regression of `name` was caught with the files as they are now."""
    folder = results or RESULTS
    data = load_planted_record(folder)
    data[name] = {"files_sha256": planted_fingerprint(group, root), "caught": len(group.get("planted", []))}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PLANTED_RECORD).write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")


def cmd_planted(args: argparse.Namespace) -> int:
    """Each group's planted regressions, one at a time in a scratch copy: the group's tests must
    fail. With --changed, only the groups whose sources, test files or planted entries differ
    from the last run that caught all of them (docs/mutation/planted.json): the same code under
    the same tests gives the same verdicts."""
    missed: list[str] = []
    env = scratch_env()
    record = load_planted_record()

    def pytest(where: Path, tests: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=where, env=env, capture_output=True, text=True)

    for name in args.groups or group_names():
        group = load_group(name)
        if not group.get("planted"):
            continue
        if args.changed and record.get(name, {}).get("files_sha256") == planted_fingerprint(group):
            print(f"{name}: its sources, tests and planted entries are as when all {len(group['planted'])} were "
                  "caught: they still are")
            continue
        # the control: in a clean scratch copy the group's first test file passes, so a
        # failure below is the planted regression's doing, not the copy's
        control = pytest(prepare(group, "planted"), [group["tests"][0].split("::")[0]])
        if control.returncode != 0:
            missed.append(f"{name}: {group['tests'][0]} fails in a clean scratch copy (pytest exit "
                          f"{control.returncode}): no planted regression can be judged\n{control.stdout[-1500:]}")
            continue
        before = len(missed)
        for entry in group.get("planted", []):
            where = prepare(group, "planted")
            try:
                apply_planted(where, entry)
            except ValueError as e:
                missed.append(f"{name}: {e}")
                continue
            proc = pytest(where, group["tests"])
            caught = proc.returncode == 1
            print(f"{name}: {'caught' if caught else 'MISSED'}: {entry['file']}: {entry['why']}", flush=True)
            if not caught:
                missed.append(f"{name}: {entry['file']}: {entry['why']} (pytest exit {proc.returncode})")
        if len(missed) == before:
            record_planted(name, group)
    for m in missed:
        print(f"FAIL: {m}")
    return 1 if missed else 0


def _md(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|").replace("`", "'")


def page(groups: Path = GROUPS, results: Path = RESULTS) -> str:
    """docs/generated/mutation.md: the score of every listed file, each survivor, each equivalent
    and why, from the recorded results (written by `run`) and the groups' files."""
    names = sorted(p.stem for p in groups.glob("*.toml"))
    lines = [
        "# Mutation score of the modules users trust (generated)", "",
        "Each listed file is mutated by [mutmut](https://github.com/boxed/mutmut) (a changed comparison, "
        "operator, constant, argument, return value or string) and the group's tests run against each "
        "mutant. **Caught**: a test failed, timed out or crashed. **Equivalent**: no test can tell it "
        "from the original, for the reason given. **Wording**: it only changes the text of a message no "
        "code reads. **Not run**: the recorded run stopped before it. **Score** = caught / (mutants run "
        f"- equivalent - wording); the target is {100 * FLOOR:.0f}% in every file. CI (`python "
        f"tools/mutation.py check`) fails when a file's score falls more than {100 * SLACK:.0f} point "
        "below its recorded one, or a mutant recorded as caught survives.", "",
        "Rerun a group with `python tools/mutation.py run GROUP` (or every group without a name), then "
        "`python tools/gen_docs.py`. Groups are defined in `tools/mutation_groups/*.toml`.", "",
        "How a run stays short: mutmut imports the code and the tests once and forks a child per "
        "mutant; each child runs only the tests that executed the mutated function (a traced first run "
        "maps them), fastest first, and stops at the first failure; a group's `warmup` builds what its "
        "tests share (a small captured tree) once, before the forks. The run column gives each group's "
        "last run, whole or partial (`--only`, `--survivors`), and its wall time.", "",
        "| group | file | mutants | caught | equivalent | wording | surviving | not run | score | run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    total_wall = 0.0
    for name in names:
        group = load_group(name, groups)
        data = load_results(name, results)
        if data is None:
            lines.append(f"| {name} | {', '.join(group['sources'])} | not run yet | | | | | | | |")
            continue
        run = data.get("run", {})
        total_wall += run.get("wall_s", 0.0)
        when = (f"{run['date']}, {run['commit']}, {run['wall_s']:.0f} s" if run else
                "not recorded (an earlier version of this tool)")
        summary = summarise(group, [dict(m) for m in data["mutants"]])
        for path in group["sources"]:
            c = summary["files"].get(path)
            if c is None:
                lines.append(f"| {name} | `{path}` | no mutants recorded | | | | | | | {when} |")
                continue
            # a score over part of the file's mutants is marked; so is one under the target
            mark = " (of those run)" if c["not_checked"] else ""
            mark += " **under target**" if c["score"] < FLOOR else ""
            shown = f"{100 * c['score']:.1f}%{mark}" if c["total"] else "none run"
            lines.append(f"| {name} | `{path}` | {c['total'] + c['not_checked']} | {c['caught']} | "
                         f"{c['equivalent']} | {c['wording']} | {c['survived']} | {c['not_checked']} | "
                         f"{shown} | {when} |")
        survivors = [m for m in data["mutants"]
                     if m["status"] not in CAUGHT | {"not checked"} and not equivalents(group).get(m["key"])]
        explained = [(k, r) for k, r in equivalents(group).items()]
        details += ["", f"## {name}", "", f"Tests: {', '.join(f'`{t}`' for t in group['tests'])}.", ""]
        if survivors:
            details += ["Surviving (neither caught nor explained):", ""]
            details += [f"- `{_md(m['key'])}` ({m['status']})" for m in survivors]
            details.append("")
        if explained:
            details += ["Explained:", "", "| mutant | reason |", "|---|---|"]
            details += [f"| `{_md(k)}` | {_md(r)} |" for k, r in sorted(explained)]
            details.append("")
        if summary["stale_equivalents"]:
            details += ["Explained mutants that no longer exist (remove them from the group file):", ""]
            details += [f"- `{_md(k)}`" for k in summary["stale_equivalents"]]
            details.append("")
        planted = group.get("planted", [])
        if planted:
            details += ["Planted regressions the tests catch (`python tools/mutation.py planted`):", ""]
            details += [f"- `{e['file']}`: {_md(e['why'])}" for e in planted]
    lines += ["", f"Wall time of the last recorded runs, all groups: {total_wall / 60:.1f} min "
                  "(a partial run counts only its own time)."]
    return "\n".join(lines + details).rstrip() + "\n"


def cmd_survivors(args: argparse.Namespace) -> int:
    for name in args.groups or group_names():
        path = RESULTS / f"{name}.json"
        if not path.is_file():
            print(f"{name}: no results yet; run: python tools/mutation.py run {name}")
            continue
        data = json.loads(path.read_text())
        for m in data["mutants"]:
            if m["status"] not in CAUGHT | {"not checked"} and not m["equivalent"]:
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
    run.add_argument("--resume", action="store_true",
                     help="only the functions with mutants the recorded run did not reach")
    run.add_argument("--survivors", action="store_true",
                     help="only the functions with a surviving mutant no equivalent explains")
    run.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    run.set_defaults(func=cmd_run)
    surv = sub.add_parser("survivors", help="each surviving mutant's diff, from the last run")
    surv.add_argument("groups", nargs="*")
    surv.set_defaults(func=cmd_survivors)
    chk = sub.add_parser("check", help="rerun the groups; fail where a score fell or a caught mutant survives")
    chk.add_argument("groups", nargs="*")
    chk.add_argument("--only", action="append", default=[],
                     help="mutmut name pattern (fnmatch); only the caught-now-survives rule then applies")
    chk.add_argument("--changed", action="store_true",
                     help="only the groups whose sources or test files changed since their recorded run")
    chk.add_argument("--sample", type=int, default=1, metavar="N",
                     help="only a fixed 1/N of each group's functions (and one per file); CI uses it")
    chk.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    chk.set_defaults(func=cmd_check)
    pl = sub.add_parser("planted", help="apply each planted regression in a scratch copy; its tests must fail")
    pl.add_argument("groups", nargs="*")
    pl.add_argument("--changed", action="store_true",
                    help="only the groups whose sources, test files or planted entries changed since all their "
                         "planted regressions were last caught (docs/mutation/planted.json)")
    pl.set_defaults(func=cmd_planted)
    lst = sub.add_parser("list", help="the groups")
    lst.set_defaults(func=cmd_list)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
