"""tools/mutation.py: the mutation score's bookkeeping and CI's ratchet over it.

The unit tests build results by hand and check each decision both ways: which mutants count
as caught, how equivalent and wording entries leave the score, when `check` fails (a caught
mutant now surviving, a score under the floor or below the recorded one by more than the
slack), how a group file is refused, how a planted regression is applied. The slow test runs
mutmut for real: a copy of the repository whose accuracy tests lost an assertion fails
`check`, where the rest of the suite would pass.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mutation_tool", REPO / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
sys.modules["mutation_tool"] = mutation
_spec.loader.exec_module(mutation)

DIFF = """--- aotpipe/runtime/accuracy.py
+++ aotpipe/runtime/accuracy.py
@@ -1,6 +1,6 @@
 def multiplier(dtype, numel):
-    if numel <= 10:
+    if numel < 10:
         return 10.0"""


def _mutant(name: str, status: str, diff: str = DIFF, file: str = "aotpipe/runtime/accuracy.py") -> dict:
    return {"name": name, "status": status, "diff": diff, "file": file}


def test_stable_key_names_the_function_and_the_changed_lines_not_mutmuts_number():
    key = mutation.stable_key("aotpipe.runtime.accuracy.x_multiplier__mutmut_9", DIFF)
    assert key == "aotpipe.runtime.accuracy.multiplier: if numel <= 10: => if numel < 10:"
    assert mutation.stable_key("aotpipe.runtime.accuracy.x_multiplier__mutmut_31", DIFF) == key


def test_a_methods_key_is_module_class_method():
    name = "aotpipe.corpus.bench.graph.xǁTimingǁmedian__mutmut_2"
    assert mutation.stable_key(name, DIFF).startswith("aotpipe.corpus.bench.graph.Timing.median: ")


def test_the_same_change_twice_in_a_function_is_told_apart_in_source_order():
    ms = mutation.keyed([_mutant("m.x_f__mutmut_12", "killed"), _mutant("m.x_f__mutmut_3", "killed")])
    by_name = {m["name"]: m["key"] for m in ms}
    assert by_name["m.x_f__mutmut_3"] == "m.f: if numel <= 10: => if numel < 10:"
    assert by_name["m.x_f__mutmut_12"] == "m.f: if numel <= 10: => if numel < 10: #2"


@pytest.mark.parametrize("status, caught", [("killed", True), ("timeout", True), ("segfault", True),
                                            ("survived", False), ("no tests", False), ("suspicious", False)])
def test_what_counts_as_caught(status, caught):
    group = {"name": "g", "sources": ["aotpipe/runtime/accuracy.py"], "tests": ["t"]}
    summary = mutation.summarise(group, mutation.keyed([_mutant("a.x_f__mutmut_1", status)]))
    counts = summary["files"]["aotpipe/runtime/accuracy.py"]
    assert (counts["caught"], counts["survived"]) == ((1, 0) if caught else (0, 1))


def test_equivalent_and_wording_leave_the_score_and_not_checked_is_not_counted():
    diffs = [DIFF.replace("< 10", f"< {i}") for i in range(6)]
    ms = mutation.keyed([_mutant(f"a.x_f__mutmut_{i}", s, d) for i, (s, d) in enumerate(zip(
        ["killed", "killed", "killed", "survived", "survived", "not checked"], diffs))])
    eq_key, wording_key = ms[3]["key"], ms[4]["key"]
    group = {"name": "g", "sources": [], "tests": [],
             "equivalent": [{"mutant": eq_key, "reason": "equivalent: x"}]}
    counts = mutation.summarise(group, ms)["files"]["aotpipe/runtime/accuracy.py"]
    assert counts == {"total": 5, "caught": 3, "equivalent": 1, "wording": 0, "survived": 1,
                      "not_checked": 1, "score": 0.75}
    group["equivalent"].append({"mutant": wording_key, "reason": "wording: a log line"})
    counts = mutation.summarise(group, mutation.keyed([dict(m) for m in ms]))["files"]["aotpipe/runtime/accuracy.py"]
    assert (counts["wording"], counts["survived"], counts["score"]) == (1, 0, 1.0)


def test_an_explained_mutant_that_no_longer_exists_is_reported_stale():
    group = {"name": "g", "sources": [], "tests": [], "equivalent": [{"mutant": "gone: a => b", "reason": "equivalent: x"}]}
    assert mutation.summarise(group, [])["stale_equivalents"] == ["gone: a => b"]


def _recorded(statuses: list[str]) -> tuple[dict, list[dict]]:
    diffs = [DIFF.replace("< 10", f"< {i}") for i in range(len(statuses))]
    ms = mutation.keyed([_mutant(f"a.x_f__mutmut_{i}", s, d) for i, (s, d) in enumerate(zip(statuses, diffs))])
    group = {"name": "g", "sources": [], "tests": []}
    return {"mutants": ms, "summary": mutation.summarise(group, ms)}, ms


def _now(recorded_mutants: list[dict], statuses: list[str]) -> tuple[list[dict], dict]:
    now = [dict(m, status=s) for m, s in zip(recorded_mutants, statuses)]
    return now, mutation.summarise({"name": "g", "sources": [], "tests": []}, now)


def test_check_passes_when_nothing_changed():
    recorded, ms = _recorded(["killed"] * 19 + ["survived"])
    now, summary = _now(ms, [m["status"] for m in ms])
    assert mutation.compare(recorded, now, summary) == []


def test_check_fails_when_a_caught_mutant_survives_even_if_the_score_holds():
    recorded, ms = _recorded(["killed"] * 19 + ["survived"])
    now, summary = _now(ms, ["survived"] + ["killed"] * 19)  # one lost, one gained: same score
    problems = mutation.compare(recorded, now, summary)
    assert len(problems) == 1 and "was caught in the recorded run, now survived" in problems[0]


def test_a_partial_check_holds_only_the_caught_now_survives_rule():
    recorded, ms = _recorded(["killed"] * 100)
    now, summary = _now(ms[:3], ["killed", "killed", "survived"])  # 66.7% of what ran
    problems = mutation.compare(recorded, now, summary, full=False)
    assert len(problems) == 1 and "now survived" in problems[0]


def test_check_holds_what_was_reached_even_under_the_target():
    recorded, ms = _recorded(["killed"] * 899 + ["survived"] * 101)  # 89.9%: under the target
    now, summary = _now(ms, [m["status"] for m in ms])
    assert mutation.compare(recorded, now, summary) == []


def test_check_slack_one_point_below_the_recorded_score():
    # recorded 100.0%; now one new surviving mutant among 101 (99.0%): within the slack
    recorded, ms = _recorded(["killed"] * 100)
    extra = dict(ms[0], key="a.f: new => mutant", status="survived")
    now = [dict(m) for m in ms] + [extra]
    summary = mutation.summarise({"name": "g", "sources": [], "tests": []}, now)
    assert mutation.compare(recorded, now, summary) == []
    # two new survivors among 102 (98.0%): more than one point below
    now.append(dict(extra, key="a.f: another => mutant"))
    summary = mutation.summarise({"name": "g", "sources": [], "tests": []}, now)
    problems = mutation.compare(recorded, now, summary)
    assert len(problems) == 1 and "fell from the recorded 100.0%" in problems[0]


def _write_group(dir: Path, name: str, text: str) -> None:
    dir.mkdir(parents=True, exist_ok=True)
    (dir / f"{name}.toml").write_text(text)


@pytest.mark.parametrize("text, message", [
    ('tests = ["t"]\n', "`sources` is missing or empty"),
    ('sources = ["a.py"]\ntests = []\n', "`tests` is missing or empty"),
    ('sources = ["a.py"]\ntests = ["t"]\n[[equivalent]]\nmutant = "k"\n', "equivalent entry 1 lacks reason"),
    ('sources = ["a.py"]\ntests = ["t"]\n[[equivalent]]\nmutant = "k"\nreason = "because"\n',
     "must start with 'equivalent:' or 'wording:'"),
    ('sources = ["a.py"]\ntests = ["t"]\n[[planted]]\nfile = "a.py"\nold = "x"\n', "planted entry 1 lacks new, why"),
    ('sources = [', "not valid TOML"),
    ('sources = ["a.py"]\ntests = ["t"]\nwarmup = "m:f"\n', "`warmup` must be a list"),
    ('sources = ["a.py"]\ntests = ["t"]\nwarmup = ["m.f"]\n', "`warmup` must be a list"),
    ('sources = ["a.py"]\ntests = ["t"]\nwarmup = ["m:"]\n', "`warmup` must be a list"),
])
def test_a_bad_group_file_is_refused_naming_the_file_and_the_fix(tmp_path, text, message):
    _write_group(tmp_path, "g", text)
    with pytest.raises(SystemExit) as e:
        mutation.load_group("g", tmp_path)
    assert str(tmp_path / "g.toml") in str(e.value) and message in str(e.value)


def test_a_planted_regression_may_delete_its_snippet(tmp_path):
    _write_group(tmp_path, "g", 'sources = ["a.py"]\ntests = ["t"]\n[[planted]]\nfile = "a.py"\nold = "x"\n'
                 'new = ""\nwhy = "the check is gone"\n')
    assert mutation.load_group("g", tmp_path)["planted"][0]["new"] == ""


WARMED: list[str] = []


def warm_one() -> None:
    WARMED.append("one")


def warm_two() -> None:
    WARMED.append("two")


def test_a_groups_warmup_reaches_the_scratch_env_and_conftest_calls_each_once_collected(tmp_path, monkeypatch):
    _write_group(tmp_path, "g", 'sources = ["a.py"]\ntests = ["t"]\n'
                 'warmup = ["tests.test_mutation_tool:warm_one", "tests.test_mutation_tool:warm_two"]\n')
    group = mutation.load_group("g", tmp_path)
    env = mutation.scratch_env(group)
    assert env[mutation.WARMUP_ENV] == "tests.test_mutation_tool:warm_one,tests.test_mutation_tool:warm_two"
    # a group without one clears a warm-up the caller's environment may hold
    monkeypatch.setenv(mutation.WARMUP_ENV, "x:y")
    assert mutation.WARMUP_ENV not in mutation.scratch_env({"name": "h"})
    assert mutation.WARMUP_ENV not in mutation.scratch_env()

    from tests import conftest

    WARMED.clear()
    monkeypatch.setenv(mutation.WARMUP_ENV, env[mutation.WARMUP_ENV])
    conftest.pytest_collection_finish(None)
    assert WARMED == ["one", "two"]
    monkeypatch.delenv(mutation.WARMUP_ENV)
    conftest.pytest_collection_finish(None)
    assert WARMED == ["one", "two"]


def test_the_diff_groups_warmup_is_the_tiny_tree_its_tests_copy():
    group = mutation.load_group("diff")
    assert group["warmup"] == ["tests.helpers.diff_trees:tiny_tree"]
    source = (REPO / "tests" / "test_diff_cases.py").read_text()
    assert "from tests.helpers.diff_trees import tiny_tree" in source


def test_an_unknown_group_names_the_groups(tmp_path):
    _write_group(tmp_path, "known", 'sources = ["a.py"]\ntests = ["t"]\n')
    with pytest.raises(SystemExit, match="no such mutation group; the groups are: known"):
        mutation.load_group("other", tmp_path)


def test_every_listed_group_loads_and_names_files_that_exist():
    for name in mutation.group_names():
        group = mutation.load_group(name)
        for path in group["sources"]:
            assert (REPO / path).is_file(), f"{name}: {path}"
        for test in group["tests"]:
            assert (REPO / test.split("::")[0]).exists(), f"{name}: {test}"
        for entry in group.get("planted", []):
            assert (REPO / entry["file"]).read_text().count(entry["old"]) == 1, f"{name}: {entry['why']}"


def test_a_planted_regression_is_written_once_and_a_vanished_snippet_refused(tmp_path):
    (tmp_path / "aotpipe").mkdir()
    (tmp_path / "aotpipe" / "m.py").write_text("if a <= 10:\n    pass\n")
    mutation.apply_planted(tmp_path, {"file": "aotpipe/m.py", "old": "a <= 10", "new": "a < 10"})
    assert (tmp_path / "aotpipe" / "m.py").read_text() == "if a < 10:\n    pass\n"
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutation.apply_planted(tmp_path, {"file": "aotpipe/m.py", "old": "a <= 10", "new": "a < 10"})


def test_the_page_shows_each_files_score_each_survivor_and_each_reason(tmp_path):
    groups, results = tmp_path / "groups", tmp_path / "results"
    key = "aotpipe.runtime.accuracy.multiplier: if numel <= 10: => if numel < 10:"
    _write_group(groups, "g", 'sources = ["aotpipe/runtime/accuracy.py"]\ntests = ["tests/t.py"]\n'
                 f'[[equivalent]]\nmutant = "{key}"\nreason = "equivalent: the two agree here"\n')
    _write_group(groups, "h", 'sources = ["aotpipe/runtime/evidence.py"]\ntests = ["tests/t.py"]\n')
    _write_group(groups, "i", 'sources = ["aotpipe/corpus/opcov.py"]\ntests = ["tests/t.py"]\n')
    survivor = _mutant("aotpipe.runtime.accuracy.x_floor__mutmut_2", "survived", DIFF.replace("<= 10", "<= 500"))
    ms = mutation.keyed([_mutant("aotpipe.runtime.accuracy.x_multiplier__mutmut_1", "survived"), survivor,
                         _mutant("aotpipe.runtime.accuracy.x_floor__mutmut_1", "killed", DIFF.replace("<", ">")),
                         _mutant("aotpipe.runtime.accuracy.x_floor__mutmut_9", "not checked", DIFF.replace("<", "!="))])
    results.mkdir()
    (results / "g.json").write_text(json.dumps({"mutants": ms, "run": {"wall_s": 60.0, "date": "d", "commit": "c"}}))
    unrun = mutation.keyed([_mutant("aotpipe.corpus.opcov.x_f__mutmut_1", "not checked", file="aotpipe/corpus/opcov.py")])
    (results / "i.json").write_text(json.dumps({"mutants": unrun}))
    text = mutation.page(groups, results)
    assert ("| g | `aotpipe/runtime/accuracy.py` | 4 | 1 | 1 | 0 | 1 | 1 | 50.0% (of those run) **under target** "
            "| d, c, 60 s |") in text
    assert "| h | aotpipe/runtime/evidence.py | not run yet |" in text
    assert "| i | `aotpipe/corpus/opcov.py` | 1 | 0 | 0 | 0 | 0 | 1 | none run | not recorded" in text
    assert "- `aotpipe.runtime.accuracy.floor: if numel <= 500: => if numel < 10:` (survived)" in text
    assert f"| `{key}` | equivalent: the two agree here |" in text
    assert "all groups: 1.0 min" in text


@pytest.mark.slow
def test_check_fails_on_a_copy_whose_accuracy_tests_lost_their_teeth(tmp_path):
    """A planted weakening in the tests of a listed module: the suite still passes, `check` fails."""
    for name in ("aotpipe", "tests", "tools"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "docs").mkdir()
    shutil.copytree(REPO / "docs" / "mutation", tmp_path / "docs" / "mutation")
    group = mutation.load_group("accuracy")
    only = "aotpipe.runtime.accuracy.x_multiplier*"
    subprocess.run([sys.executable, str(tmp_path / "tools" / "mutation.py"), "run", "accuracy", "--only", only],
                   check=True, capture_output=True)
    recorded = json.loads((tmp_path / "docs" / "mutation" / "accuracy.json").read_text())
    before = [m for m in recorded["mutants"] if m["name"].startswith("aotpipe.runtime.accuracy.x_multiplier")]
    assert before and all(m["status"] in mutation.CAUGHT or m["equivalent"] for m in before)
    # every test that pins the small-tensor multiplier's bounds loses its assertion
    weakened = 0
    for test_file in group["tests"]:
        path = tmp_path / test_file.split("::")[0]
        text = path.read_text()
        lines = [("    pass  # weakened" if "multiplier(" in line and line.strip().startswith("assert") else line)
                 for line in text.splitlines()]
        weakened += sum(1 for line in lines if line.endswith("# weakened"))
        path.write_text("\n".join(lines) + "\n")
    assert weakened, "no assertion on multiplier() to weaken: the test is stale"
    suite = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *group["tests"]],
                           cwd=tmp_path, capture_output=True, text=True)
    assert suite.returncode == 0, suite.stdout[-2000:]  # the weakened suite still passes
    proc = subprocess.run([sys.executable, str(tmp_path / "tools" / "mutation.py"), "check", "accuracy",
                           "--only", only],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "was caught in the recorded run, now survived" in proc.stdout


def test_functions_are_named_as_mutmut_names_them(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    def inner():\n        pass\n\nclass C:\n    def m(self):\n        pass\n"
                   "    x = 1\n\nasync def g():\n    pass\n")
    assert mutation.functions(src, "pkg.m") == ["pkg.m.x_f__mutmut_*", "pkg.m.xǁCǁm__mutmut_*",
                                                "pkg.m.x_g__mutmut_*"]


def test_the_sample_is_fixed_and_tries_every_file(tmp_path):
    (tmp_path / "aotpipe").mkdir()
    (tmp_path / "aotpipe" / "a.py").write_text("".join(f"def f{i}():\n    pass\n" for i in range(40)))
    (tmp_path / "aotpipe" / "b.py").write_text("def only():\n    pass\n")
    group = {"sources": ["aotpipe/a.py", "aotpipe/b.py"]}
    picked = mutation.sample(group, 4, tmp_path)
    assert picked == mutation.sample(group, 4, tmp_path)
    from_a = [p for p in picked if p.startswith("aotpipe.a.")]
    assert 0 < len(from_a) < 40 and "aotpipe.b.x_only__mutmut_*" in picked
    assert len(mutation.sample(group, 1, tmp_path)) == 41


def test_resume_names_the_functions_a_recorded_run_did_not_reach(tmp_path, monkeypatch):
    ms = mutation.keyed([_mutant("a.x_f__mutmut_1", "killed"), _mutant("a.x_g__mutmut_1", "not checked"),
                         _mutant("a.x_g__mutmut_2", "not checked", DIFF.replace("<", ">"))])
    (tmp_path / "g.json").write_text(json.dumps({"mutants": ms}))
    monkeypatch.setattr(mutation, "RESULTS", tmp_path)
    assert mutation.resume_patterns("g") == ["a.x_g__mutmut_*"]
    with pytest.raises(SystemExit, match="no recorded run to resume"):
        mutation.resume_patterns("other")


def test_survivors_names_the_functions_with_an_unexplained_survivor_only(tmp_path, monkeypatch):
    ms = mutation.keyed([_mutant("a.x_f__mutmut_1", "killed"), _mutant("a.x_g__mutmut_1", "survived"),
                         _mutant("a.x_h__mutmut_1", "not checked"), _mutant("a.x_k__mutmut_1", "no tests"),
                         _mutant("a.x_e__mutmut_1", "survived")])
    ms[-1]["equivalent"] = "equivalent: the same either way"
    (tmp_path / "g.json").write_text(json.dumps({"mutants": ms}))
    monkeypatch.setattr(mutation, "RESULTS", tmp_path)
    assert mutation.resume_patterns("g", survivors=True) == ["a.x_g__mutmut_*", "a.x_k__mutmut_*"]
    assert mutation.resume_patterns("g") == ["a.x_h__mutmut_*"]
    # an equivalent written into the group's file after the run explains its survivor too
    monkeypatch.setattr(mutation, "GROUPS", tmp_path)
    (tmp_path / "g.toml").write_text(f'sources = ["aotpipe/a.py"]\ntests = ["tests/t.py"]\n'
                                     f'[[equivalent]]\nmutant = {json.dumps(ms[1]["key"])}\n'
                                     f'reason = "equivalent: x"\n')
    assert mutation.resume_patterns("g", survivors=True) == ["a.x_k__mutmut_*"]


def test_a_group_is_unchanged_until_a_source_or_a_test_file_changes(tmp_path):
    (tmp_path / "aotpipe").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "aotpipe" / "m.py").write_text("x = 1\n")
    (tmp_path / "tests" / "test_m.py").write_text("def test(): pass\n")
    group = {"sources": ["aotpipe/m.py"], "tests": ["tests/test_m.py::test"]}
    recorded = {"files_sha256": mutation.fingerprint(group, tmp_path)}
    assert sorted(recorded["files_sha256"]) == ["aotpipe/m.py", "tests/test_m.py"]
    assert mutation.unchanged(group, recorded, tmp_path)
    (tmp_path / "tests" / "test_m.py").write_text("def test(): assert True\n")
    assert not mutation.unchanged(group, recorded, tmp_path)
    recorded = {"files_sha256": mutation.fingerprint(group, tmp_path)}
    (tmp_path / "aotpipe" / "m.py").write_text("x = 2\n")
    assert not mutation.unchanged(group, recorded, tmp_path)
    assert not mutation.unchanged(group, {}, tmp_path)  # a record without hashes: run it


def test_the_results_file_keeps_a_diff_only_for_a_survivor_and_reads_back_whole():
    ms = mutation.keyed([_mutant("a.x_f__mutmut_1", "killed"), _mutant("a.x_f__mutmut_2", "survived",
                                                                       DIFF.replace("<", ">")),
                         _mutant("a.x_f__mutmut_3", "not checked", DIFF.replace("<", "!="))])
    for m in ms:
        m["equivalent"] = None
    kept = [mutation.recorded(m) for m in ms]
    assert ["diff" in m for m in kept] == [False, True, False]
    data = {"group": "g", "summary": {"files": {}}, "mutants": kept}
    text = mutation.dump(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    assert [json.loads(line.strip().rstrip(",")) for line in lines[-2 - len(kept):-2]] == kept  # one per line


def test_planted_verdicts_hold_until_a_source_a_test_or_an_entry_changes(tmp_path):
    (tmp_path / "aotpipe").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "aotpipe" / "m.py").write_text("x = 1\n")
    (tmp_path / "tests" / "test_m.py").write_text("def test(): pass\n")
    entry = {"file": "aotpipe/m.py", "old": "x = 1", "new": "x = 2", "why": "w"}
    group = {"sources": ["aotpipe/m.py"], "tests": ["tests/test_m.py"], "planted": [entry]}
    results = tmp_path / "results"
    mutation.record_planted("g", group, results, tmp_path)
    record = mutation.load_planted_record(results)
    assert record == {"g": {"files_sha256": mutation.planted_fingerprint(group, tmp_path), "caught": 1}}
    edited = {**group, "planted": [{**entry, "new": "x = 3"}]}
    assert mutation.planted_fingerprint(edited, tmp_path) != record["g"]["files_sha256"]
    (tmp_path / "tests" / "test_m.py").write_text("def test(): assert True\n")
    assert mutation.planted_fingerprint(group, tmp_path) != record["g"]["files_sha256"]


@pytest.mark.parametrize("same", [True, False])
def test_planted_changed_skips_a_group_as_recorded_and_runs_one_that_is_not(tmp_path, monkeypatch, capsys, same):
    group = {"name": "g", "sources": ["a.py"], "tests": ["tests/t.py"],
             "planted": [{"file": "a.py", "old": "x", "new": "y", "why": "w"}]}
    now = {"a.py": "1", "[[planted]]": "2"}
    monkeypatch.setattr(mutation, "RESULTS", tmp_path)
    monkeypatch.setattr(mutation, "group_names", lambda: ["g"])
    monkeypatch.setattr(mutation, "load_group", lambda name: group)
    monkeypatch.setattr(mutation, "planted_fingerprint", lambda g, root=None: now)
    (tmp_path / mutation.PLANTED_RECORD).write_text(json.dumps(
        {"g": {"files_sha256": now if same else {**now, "a.py": "0"}, "caught": 1}}))

    class Ran(Exception):
        pass

    def prepare(g, purpose=""):
        assert purpose == "planted"  # a copy of its own: a `run` of the group in progress is left alone
        raise Ran

    monkeypatch.setattr(mutation, "prepare", prepare)
    args = mutation.argparse.Namespace(groups=[], changed=True)
    if same:
        assert mutation.cmd_planted(args) == 0
        assert "g: its sources, tests and planted entries are as when all 1 were caught" in capsys.readouterr().out
    else:
        with pytest.raises(Ran):
            mutation.cmd_planted(args)


@pytest.mark.parametrize("verdicts, recorded", [([0, 1, 1], True), ([0, 1, 0], False), ([1], False)],
                         ids=["all caught", "one missed", "control fails"])
def test_planted_records_a_group_only_when_its_control_passes_and_every_regression_is_caught(
        tmp_path, monkeypatch, verdicts, recorded):
    group = {"name": "g", "sources": ["a.py"], "tests": ["tests/t.py"],
             "planted": [{"file": "a.py", "old": "x", "new": "y", "why": "w1"},
                         {"file": "a.py", "old": "x", "new": "z", "why": "w2"}]}
    monkeypatch.setattr(mutation, "RESULTS", tmp_path)
    monkeypatch.setattr(mutation, "group_names", lambda: ["g"])
    monkeypatch.setattr(mutation, "load_group", lambda name: group)
    monkeypatch.setattr(mutation, "planted_fingerprint", lambda g, root=None: {"a.py": "1"})
    monkeypatch.setattr(mutation, "prepare", lambda g, purpose="": tmp_path)
    monkeypatch.setattr(mutation, "apply_planted", lambda where, entry: None)
    codes = iter(verdicts)  # pytest's exit: the control's, then one per planted regression (1: caught)
    monkeypatch.setattr(mutation.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, next(codes), stdout="", stderr=""))
    rc = mutation.cmd_planted(mutation.argparse.Namespace(groups=[], changed=False))
    assert rc == (0 if recorded else 1)
    assert ("g" in mutation.load_planted_record(tmp_path)) is recorded
