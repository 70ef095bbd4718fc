"""The allow-list's refusals as a user meets them: `aotpipe show`, `verify` and `replay` on a
crafted artefact (tests/data/precheck_tiny, a copy per test) whose graph names an op just
inside or just outside a rule; in-process."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from tests.helpers.forge import reseal
from tests.helpers.ops_cache import NOT_LISTED, decided_afresh  # noqa: F401  # decided_afresh: autouse
from tests.helpers.replays import replayed

TINY = Path(__file__).resolve().parent.parent / "data" / "precheck_tiny" / "mlp"
X = {"node": "x"}


@pytest.fixture()
def tiny(tmp_path):
    dst = tmp_path / "mlp"
    shutil.copytree(TINY, dst)
    return dst


def call(folder, target, args):
    path = folder / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    out = data["nodes"].pop()
    data["nodes"] += [{"name": "h", "op": "call_function", "target": target, "args": args, "kwargs": {}}, out]
    path.write_text(json.dumps(data))
    assert reseal(folder)


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_the_in_place_form_of_a_listed_op_loads_and_replays(tiny):
    call(tiny, "aten.add_.Tensor", [{"node": "relu"}, 1.0])  # after relu's last use: the result is unchanged
    r = cli("show", tiny)
    assert r.exit_code == 0 and "add_.Tensor x1" in r.output, r.output
    r = cli("replay", tiny)
    assert replayed(r), r.output


@pytest.mark.parametrize("target", ["aten.add.out", "aten.flatten.using_ints"])
def test_an_op_just_outside_the_list_is_refused_by_show_and_replay_in_one_line(tiny, target):
    call(tiny, target, [X, X])
    for command in ("show", "replay"):
        r = cli(command, tiny)
        assert r.exit_code == 2 and r.output == f"error: graph.json names {target!r}, {NOT_LISTED}\n", r.output


def test_verify_reports_an_op_outside_the_list_as_the_artefacts_one_problem(tiny):
    call(tiny, "aten.add.out", [X, X])
    r = cli("verify", tiny)
    assert r.exit_code == 1, r.output
    assert r.output.splitlines()[:2] == [f"FAILED  {tiny}", f"    graph.json names 'aten.add.out', {NOT_LISTED}"]


def test_a_denied_op_is_refused_by_show_naming_why(tiny):
    call(tiny, "aten.resize_.default", [X, [100_000_000]])
    r = cli("show", tiny)
    assert r.exit_code == 2 and r.output == "error: graph.json names 'aten.resize_.default', which is not allowed: " \
                                            "it resizes a tensor in place\n", r.output


def test_a_librarys_op_is_refused_by_show_saying_how_to_trust_it(tiny):
    call(tiny, "aptestops.scaled_tanh.default", [X, 2.0])
    r = cli("show", tiny)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "an op of the library namespace 'aptestops', which aotpipe runs only if you trust that library: load " \
           "with --trust-ops aptestops" in r.output, r.output
