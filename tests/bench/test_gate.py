"""The --baseline gate and the exit status of `aotpipe bench`, through the real CLI in-process
with the bench itself replaced by planted results (no workers): which changes fail the gate,
which are listed only, and what --removed excuses."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.corpus.bench import baseline, command
from aotpipe.corpus.bench.graph import GraphResult
from aotpipe.corpus.bench.run import Bench
from aotpipe.corpus.bench.scores import scores
from aotpipe.errors import AotpipeError


def result(artifact: str, graph: str, status: str, reason: str = "why") -> GraphResult:
    return GraphResult(artifact, graph, graph.split(".")[0], status, reason)


@pytest.fixture
def benched(monkeypatch):
    """Set what the bench returns: a list of GraphResults."""
    now: list[GraphResult] = []

    def fake(paths, backend, **kwargs):
        return Bench(backend, list(now), scores(now), 1.0)

    monkeypatch.setattr(command, "bench", fake)
    return now


def run(tmp_path, *args: str):
    return CliRunner().invoke(main, ["bench", str(tmp_path), "--backend", "eager", "--no-progress", *args])


def write(tmp_path, rows: list[str]):
    p = tmp_path / "base.csv"
    p.write_text("artifact,graph,status\n" + "".join(f"{r}\n" for r in rows))
    return str(p)


BASE = ["a,inference,pass", "a,forward,pass", "b,inference,pass", "c,inference,compile_error"]


def test_a_graph_that_passed_and_is_gone_fails_the_gate_naming_it(tmp_path, benched):
    benched += [result("a", "inference", "pass"), result("a", "forward", "pass")]
    r = run(tmp_path, "--baseline", write(tmp_path, BASE))
    assert r.exit_code == 1, r.output
    assert "regressions (passed in the baseline, gone now): 1\n    b inference: pass -> not benched (gone; " \
           "--removed b/inference if removed on purpose)" in r.output
    assert "in the baseline, not benched: 2\n    b inference: pass\n    c inference: compile_error" in r.output
    assert "no regressions" not in r.output


def test_removed_on_purpose_passes_the_gate_and_is_listed(tmp_path, benched):
    benched += [result("a", "inference", "pass")]
    base = write(tmp_path, BASE)
    r = run(tmp_path, "--baseline", base, "--removed", "b", "--removed", "a/forward", "--removed", "c")
    assert r.exit_code == 0, r.output
    assert ("removed on purpose (--removed): 3\n    a forward: pass -> removed (--removed a/forward)\n"
            "    b inference: pass -> removed (--removed b)\n"
            "    c inference: compile_error -> removed (--removed c)") in r.output
    assert "in the baseline, not benched" not in r.output and f"baseline {base}: no regressions" in r.output
    # one of the two gone passing graphs named: the other still fails the gate
    r = run(tmp_path, "--baseline", base, "--removed", "b/inference")
    assert r.exit_code == 1 and "a forward: pass -> not benched" in r.output, r.output
    assert "b inference: pass -> removed (--removed b/inference)" in r.output


def test_a_removed_name_must_name_a_graph_of_the_baseline_that_is_gone(tmp_path, benched):
    benched += [result("a", "inference", "pass")]
    base = write(tmp_path, BASE)
    r = run(tmp_path, "--baseline", base, "--removed", "bb")
    assert r.exit_code == 2, r.output
    assert f"--removed bb: no graph of the baseline {base} has that name; name one as MODEL or MODEL/GRAPH" \
        in r.output
    r = run(tmp_path, "--baseline", base, "--removed", "b", "--removed", "a/inference")
    assert r.exit_code == 2, r.output
    assert "--removed a/inference: every graph of the baseline it names is still benched; drop it" in r.output
    r = run(tmp_path, "--removed", "b")
    assert r.exit_code == 2 and "--removed b: names a graph of a baseline; give the baseline with --baseline" \
        in r.output, r.output


def test_a_pass_now_skipped_is_a_regression(tmp_path, benched):
    benched += [result("a", "inference", "skipped", "the loaded graph does not run eagerly: boom")]
    r = run(tmp_path, "--baseline", write(tmp_path, ["a,inference,pass"]))
    assert r.exit_code == 1, r.output
    assert "regressions (passed in the baseline, fail now): 1\n    a inference: pass -> skipped (the loaded graph " \
           "does not run eagerly: boom)" in r.output


def test_the_gate_decides_the_exit_even_when_a_baseline_is_written_too(tmp_path, benched):
    benched += [result("a", "inference", "fail_accuracy")]
    new = tmp_path / "new.csv"
    r = run(tmp_path, "--baseline", write(tmp_path, ["a,inference,pass"]), "--write-baseline", str(new))
    assert r.exit_code == 1, r.output
    assert new.read_text() == "artifact,graph,status\na,inference,fail_accuracy\n"
    assert f"wrote baseline {new} (1 graphs)" in r.output
    # the same failure with no baseline to hold it to: writing one is the point, exit 0
    r = run(tmp_path, "--write-baseline", str(new))
    assert r.exit_code == 0, r.output
    # and a baseline the failure was in already: no regression
    r = run(tmp_path, "--baseline", str(new))
    assert r.exit_code == 0 and "no regressions" in r.output, r.output


@pytest.mark.parametrize("statuses, code", [(["pass", "pass"], 0), (["pass", "fail_accuracy"], 1),
                                            (["pass", "skipped"], 1), ([], 0)])
def test_without_a_baseline_the_exit_is_0_only_when_every_graph_passed(tmp_path, benched, statuses, code):
    benched += [result("a", f"inference_{i}", s) for i, s in enumerate(statuses)]
    r = run(tmp_path)
    assert r.exit_code == code, r.output


def test_improvements_changes_and_new_graphs_are_listed_without_failing_the_gate(tmp_path, benched):
    benched += [result("a", "inference", "pass"), result("c", "inference", "timeout"), result("d", "inference", "pass"),
                result("e", "inference", "crashed")]
    r = run(tmp_path, "--baseline", write(tmp_path, ["a,inference,compile_error", "c,inference,crashed"]))
    assert r.exit_code == 0, r.output
    assert "improvements: 1\n    a inference: compile_error -> pass" in r.output
    assert "changed failures: 1\n    c inference: crashed -> timeout" in r.output
    assert "not in the baseline: 2\n    d inference: pass\n    e inference: crashed" in r.output


def test_the_json_gives_the_comparison(tmp_path, benched):
    benched += [result("a", "inference", "fail_accuracy")]
    r = run(tmp_path, "--json", "--baseline", write(tmp_path, ["a,inference,pass", "b,inference,pass"]),
            "--removed", "b")
    assert r.exit_code == 1, r.output
    data = json.loads(r.output[r.output.index("{"):])
    assert data["baseline"]["regressions"] == ["a inference: pass -> fail_accuracy (why)"]
    assert data["baseline"]["removed"] == ["b inference: pass -> removed (--removed b)"]
    assert data["baseline"]["vanished"] == [] and data["located"] == []


def test_graphs_this_bench_would_not_run_are_neither_missing_nor_regressions(tmp_path, benched):
    benched += [result("a", "inference", "pass")]
    base = write(tmp_path, ["a,inference,pass", "a,backward,pass", "a,inference.freeze,pass"])
    r = run(tmp_path, "--baseline", base, "--graphs", "inference")
    assert r.exit_code == 1 and "a inference.freeze: pass -> not benched" in r.output, r.output
    assert "a backward" not in r.output
    r = CliRunner().invoke(main, ["bench", str(tmp_path), "--backend", "inductor-freezing", "--no-progress",
                                  "--baseline", base, "--removed", "a/inference.freeze"])
    assert r.exit_code == 0 and "a backward" not in r.output, r.output


def test_compare_counts_a_lost_pass_of_every_kind_and_nothing_else():
    expected = {("m", "p"): "pass", ("m", "f"): "fail_accuracy", ("m", "gone"): "compile_error"}
    for status in ("fail_accuracy", "compile_error", "runtime_error", "timeout", "crashed", "skipped"):
        c = baseline.compare([result("m", "p", status), result("m", "f", "fail_accuracy")], expected)
        assert not c.ok and c.regressions == [f"m p: pass -> {status} (why)"], status
        assert c.missing == ["m gone: compile_error"] and c.vanished == [] and c.changed == []
    c = baseline.compare([result("m", "p", "pass"), result("m", "f", "fail_accuracy")], expected)
    assert c.ok and c.regressions == c.improvements == c.changed == c.new == []


def test_check_removed_takes_a_model_or_a_model_and_graph_as_the_columns_give_them():
    rows = {("lib/mlp", "inference.freeze"): "pass"}
    baseline.check_removed(rows, ["lib/mlp", "lib/mlp/inference.freeze"], "b.csv")
    for bad in ("mlp", "lib/mlp/inference", "lib", "inference.freeze"):
        with pytest.raises(AotpipeError, match=f"--removed {bad}: no graph of the baseline b.csv"):
            baseline.check_removed(rows, [bad], "b.csv")


def test_a_baseline_file_is_read_as_people_and_the_csv_writer_write_it(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("artifact, graph , status,kind,reason\n\nm,b, pass ,inference,x\nm,a,timeout\n")
    assert baseline.read_baseline(p) == {("m", "b"): "pass", ("m", "a"): "timeout"}
    for text in ("", "\n"):
        p.write_text(text)
        with pytest.raises(AotpipeError, match=r"b.csv:1: a baseline's first line is the header artifact,graph,status; "
                                               r"write one with aotpipe bench \.\.\. --write-baseline FILE$"):
            baseline.read_baseline(p)
    with pytest.raises(AotpipeError, match=r"--baseline .*nope.csv: cannot read it \(No such file or directory\)"):
        baseline.read_baseline(tmp_path / "nope.csv")


def test_a_written_baseline_is_sorted_one_row_a_graph(tmp_path):
    p = tmp_path / "b.csv"
    baseline.write_baseline(p, [result("m", "b", "pass"), result("k", "z", "crashed"), result("m", "a", "skipped")])
    assert p.read_bytes() == b"artifact,graph,status\nk,z,crashed\nm,a,skipped\nm,b,pass\n"
    with pytest.raises(AotpipeError, match=r"--write-baseline .*: cannot write it \(Is a directory\)"):
        baseline.write_baseline(tmp_path, [])
