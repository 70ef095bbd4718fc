"""aotpipe diff's records comparison, in process, over the tiny pipeline's mlp artefact: each
test reads A and B from the same folder, plants one change in B's records as read (a capture
option, a pass's log, a check count, a weight's name), and asserts the finding it makes: its
section, where it is, its text and its data, and that the findings after it are still made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aotpipe.corpus.diff import artifacts
from aotpipe.corpus.diff.artifacts import Side, read_side
from aotpipe.corpus.diff.model import Diff, Finding
from aotpipe.format.records import InputsRecord
from tests.helpers.diff_trees import tiny_tree

WEIGHTS = {"param layers.0.weight", "param layers.0.bias", "param head.weight", "param head.bias"}


@pytest.fixture(scope="module")
def mlp() -> Path:
    return tiny_tree() / "mlp"


def with_manifest(side: Side, **update: Any) -> Side:
    """The same folder, its manifest (as read) changed by `update`."""
    return Side(side.path, side.manifest.model_copy(update=update))


def with_entry(side: Side, key: str, **update: Any) -> Side:
    """The same folder, graph entry `key` of its manifest changed by `update`."""
    graphs = dict(side.manifest.graphs)
    graphs[key] = graphs[key].model_copy(update=update)
    return with_manifest(side, graphs=graphs)


def only_graphs(side: Side, *keys: str) -> Side:
    return with_manifest(side, graphs={k: v for k, v in side.manifest.graphs.items() if k in keys})


def compare(a: Side, b: Side, model: str = "") -> tuple[Diff, list[tuple[str, dict[str, str]]]]:
    diff = Diff("artifact", "a", "b")
    aligned = artifacts.compare_artifacts(a, b, diff, model)
    return diff, aligned


def in_section(diff: Diff, section: str) -> list[Finding]:
    return [f for f in diff.findings if f.section == section]


def freeze_step(side: Side, **update: Any) -> Any:
    return side.manifest.graphs["inference.freeze"].passes[0].model_copy(update=update)


# ---------------------------------------------------------------------------------------
# options


def test_capture_mode_and_options_are_named_by_their_dotted_field(mlp):
    a = read_side(mlp)
    capture = a.manifest.capture.model_copy(update={"mode": "dynamo",
                                                    "options": {**a.manifest.capture.options, "strict": True}})
    diff, _ = compare(a, with_manifest(a, capture=capture))
    assert [(f.where, f.text, f.data) for f in in_section(diff, "options")] == [
        ("", "capture.mode export -> dynamo", {"field": "capture.mode", "a": "export", "b": "dynamo"}),
        ("", "capture.options.strict false -> true", {"field": "capture.options.strict", "a": False, "b": True}),
    ]


# ---------------------------------------------------------------------------------------
# passes


def test_each_field_of_a_pass_s_log_is_named_at_the_graph_it_made(mlp):
    a = read_side(mlp)
    step = freeze_step(a, options={**freeze_step(a).options, "cse": False}, nodes_before=12, nodes_after=10,
                       modified=False)
    b = with_entry(a, "inference.freeze", passes=[step])
    for model, where in (("", "inference.freeze"), ("mlp", "mlp/inference.freeze")):
        diff, _ = compare(a, b, model)
        assert [(f.where, f.text) for f in in_section(diff, "passes")] == [
            (where, "freeze.modified true -> false"),
            (where, "freeze.nodes_after 11 -> 10"),
            (where, "freeze.nodes_before 11 -> 12"),
            (where, "freeze.options.cse true -> false"),
        ]


def test_a_pass_log_on_one_side_only_leaves_the_later_graphs_logs_compared(mlp):
    a = read_side(mlp)
    # "inference" sorts before "inference.freeze": A alone logs a chain there
    a_logged = with_entry(a, "inference", passes=[freeze_step(a, name="fold")])
    b = with_entry(a, "inference.freeze", passes=[freeze_step(a, modified=False)])
    diff, _ = compare(a_logged, b)
    assert [(f.where, f.text) for f in in_section(diff, "passes")] == [
        ("inference", "pass log only in A: fold"),
        ("inference.freeze", "freeze.modified true -> false"),
    ]


def test_another_chain_leaves_the_later_graphs_logs_compared(mlp):
    a = read_side(mlp)
    a_logged = with_entry(a, "inference", passes=[freeze_step(a, name="fold")])
    b = with_entry(with_entry(a, "inference", passes=[freeze_step(a, name="cse")]),
                   "inference.freeze", passes=[freeze_step(a, modified=False)])
    diff, _ = compare(a_logged, b)
    assert [(f.where, f.text) for f in in_section(diff, "passes")] == [
        ("inference", "chain fold -> cse"),
        ("inference.freeze", "freeze.modified true -> false"),
    ]


def test_pass_failures_are_named_for_the_whole_artefact(mlp):
    a = read_side(mlp)
    b = with_manifest(a, pass_failures=["freeze: boom"])
    for model, where in (("", ""), ("mlp", "mlp")):
        diff, _ = compare(a, b, model)
        assert [(f.where, f.text) for f in in_section(diff, "passes")] == [
            (where, 'failures [] -> ["freeze: boom"]')]


# ---------------------------------------------------------------------------------------
# checks


def test_check_counts_and_verification_statuses_are_named_for_the_whole_artefact(mlp):
    a = read_side(mlp)
    verification = dict(a.manifest.verification)
    verification["inference"] = verification["inference"].model_copy(update={"status": "match"})
    b = with_manifest(a, checks=a.manifest.checks.model_copy(update={"skipped": 12}), verification=verification)
    for model, where in (("", ""), ("mlp", "mlp")):
        diff, _ = compare(a, b, model)
        assert [(f.where, f.text, f.data) for f in in_section(diff, "checks")] == [
            (where, "checks.skipped 13 -> 12", {"field": "checks.skipped", "a": 13, "b": 12}),
            (where, "verification.inference recorded -> match",
             {"field": "verification.inference", "a": "recorded", "b": "match"}),
        ]


@pytest.mark.parametrize("side", ["a", "b"])
def test_check_totals_recorded_on_one_side_only_are_named_field_by_field(mlp, side):
    full = read_side(mlp)
    bare = with_manifest(full, checks=None)
    a, b = (bare, full) if side == "a" else (full, bare)
    diff, _ = compare(a, b)
    skipped = [f for f in in_section(diff, "checks") if f.data["field"] == "checks.skipped"]
    absent_a, absent_b = ("(absent)", 13) if side == "a" else (13, "(absent)")
    assert [(f.where, f.text) for f in skipped] == [("", f"checks.skipped {absent_a} -> {absent_b}")]


# ---------------------------------------------------------------------------------------
# weights


def test_weights_are_parameters_buffers_and_constants_not_user_inputs(mlp):
    side = read_side(mlp)
    rec = side.inputs("inference")
    assert rec is not None and any(i.role == "user" and i.target for i in rec.inputs)  # x is arg0
    assert set(artifacts.weight_digests(side, ["inference"])) == WEIGHTS
    # the same input recorded as a lifted constant is a weight of its own
    inputs = [i.model_copy(update={"role": "constant"}) if i.target == "head.bias" else i for i in rec.inputs]
    constant = Side(side.path, side.manifest, _inputs={"inference": rec.model_copy(update={"inputs": inputs})})
    digests = artifacts.weight_digests(constant, ["inference"])
    assert set(digests) == WEIGHTS - {"param head.bias"} | {"constant head.bias"}
    assert digests["constant head.bias"] == artifacts.weight_digests(side, ["inference"])["param head.bias"]


def _renamed(rec: InputsRecord, old: str, new: str) -> InputsRecord:
    inputs = [i.model_copy(update={"target": new}) if i.target == old else i for i in rec.inputs]
    return rec.model_copy(update={"inputs": inputs})


def test_a_weight_under_another_name_is_only_in_a_and_only_in_b_for_the_whole_artefact(mlp):
    a = only_graphs(read_side(mlp), "inference")
    rec = a.inputs("inference")
    assert rec is not None
    b = Side(a.path, a.manifest, _inputs={"inference": _renamed(rec, "head.bias", "head.offset")})
    blob = artifacts.weight_digests(a, ["inference"])["param head.bias"]
    assert blob is not None
    for model, where in (("", ""), ("mlp", "mlp")):
        diff, _ = compare(a, b, model)
        assert [(f.where, f.text, f.data) for f in in_section(diff, "weights")] == [
            (where, f"param head.bias: only in A ({blob[:12]})", {"name": "param head.bias", "a": blob}),
            (where, f"param head.offset: only in B ({blob[:12]})", {"name": "param head.offset", "b": blob}),
        ]


# ---------------------------------------------------------------------------------------
# graphs whose graph.json is missing


def test_a_graph_json_missing_on_both_sides_leaves_the_later_graphs_compared(mlp):
    def side() -> Side:
        s = read_side(mlp)
        s._graphs["backward"] = None  # as if backward's graph.json were not there
        return s

    a = side()
    assert list(a.manifest.graphs)[0] == "backward"
    diff, aligned = compare(a, side())
    assert diff.findings == []
    assert [key for key, _ in aligned] == ["forward", "inference", "inference.freeze"]
