"""aotpipe diff, in process and from records alone: how two lists of signature rows, two
graphs' nodes and two pass chains are compared (no artefact on disk, nothing run)."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from aotpipe.corpus.diff import artifacts
from aotpipe.corpus.diff.model import Diff
from aotpipe.format.records import GraphRecord, InputsRecord, PassRecord

F2 = {"dtype": "float32", "shape": [2]}


def new_diff() -> Diff:
    return Diff("artifact", "a", "b")


def found(diff: Diff) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [(f.section, f.where, f.text, f.data) for f in diff.findings]


def graph(*nodes: dict[str, Any]) -> GraphRecord:
    """A graph of one placeholder x (float32[2]) and then `nodes`."""
    return GraphRecord.model_validate(
        {"format_version": 2, "nodes": [{"name": "x", "op": "placeholder", "val": F2}, *nodes]})


def call(name: str, target: str = "aten.relu.default", arg: str = "x", **more: Any) -> dict[str, Any]:
    return {"name": name, "op": "call_function", "target": target, "args": [{"node": arg}], "val": F2, **more}


def chain_of(targets: list[str]) -> GraphRecord:
    """x -> n0 -> n1 -> ... each node calling its target on the one before."""
    return graph(*[call(f"n{i}", t, f"n{i - 1}" if i else "x") for i, t in enumerate(targets)])


# ---------------------------------------------------------------------------------------
# _list_diff: signature rows


def test_a_row_changed_in_place_names_the_row_then_only_the_new_layout_with_both_rows_as_data():
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", ["input 0 user x: float32[2]"], ["input 0 user x: float32[3]"])
    assert found(diff) == [("signature", "g", "input 0 user x: float32[2] -> float32[3]",
                            {"a": "input 0 user x: float32[2]", "b": "input 0 user x: float32[3]"})]


def test_a_changed_row_keeps_everything_after_its_first_separator():
    # a layout that itself holds ": " is shown whole, not cut at its last separator
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", ["input 0 user x: float32[2]"], ["input 0 user x: sym: s0: s1"])
    assert [f.text for f in diff.findings] == ["input 0 user x: float32[2] -> sym: s0: s1"]


def test_a_row_that_lost_its_layout_is_shown_whole_as_the_new_row():
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", ["input 0 user x: float32[2]"], ["input 0 user x"])
    assert [f.text for f in diff.findings] == ["input 0 user x: float32[2] -> input 0 user x"]


def test_rows_present_on_one_side_only_are_named_with_their_side_and_where():
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", ["input 0 user x: f", "input 1 user y: f"],
                         ["input 0 user x: f", "output 0 user: f", "output 1 user: f", "output 2 user: f"])
    # A has one row where B has three: not a replace of equal lengths, so each is named whole
    assert found(diff) == [
        ("signature", "g", "only in A: input 1 user y: f", {"a": "input 1 user y: f"}),
        ("signature", "g", "only in B: output 0 user: f", {"b": "output 0 user: f"}),
        ("signature", "g", "only in B: output 1 user: f", {"b": "output 1 user: f"}),
        ("signature", "g", "only in B: output 2 user: f", {"b": "output 2 user: f"}),
    ]


def test_past_eight_changed_stretches_the_rest_are_counted_in_the_same_section_and_place():
    rows_a = [f"row {i}: f" for i in range(40)]
    rows_b = [r if i % 4 else f"row {i}: g" for i, r in enumerate(rows_a)]  # 10 stretches changed
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", rows_a, rows_b)
    assert len(diff.findings) == artifacts.MAX_HUNKS + 1
    assert found(diff)[-1] == ("signature", "g", "and 2 more changed stretches", {})


def test_a_row_moved_past_many_repeated_rows_is_one_row_only_in_each_side():
    # difflib's autojunk would drop a row repeated in 200 or more as "popular", align the
    # moved row alone, and report all 300 repeated rows as only in A and only in B
    rows = ["input 0 user x: float32[2]"] * 300
    diff = new_diff()
    artifacts._list_diff(diff, "signature", "g", rows + ["output 0 user: f"], ["output 0 user: f"] + rows)
    assert [f.text for f in diff.findings] == ["only in B: output 0 user: f", "only in A: output 0 user: f"]


# ---------------------------------------------------------------------------------------
# _signature_rows


def _inputs(output_target: str | None) -> InputsRecord:
    return InputsRecord.model_validate({
        "format_version": 2, "kind": "backward", "storages": [],
        "inputs": [{"index": 0, "name": "x", "role": "user", "type": "tensor", **F2}],
        "outputs": [{"index": 0, "role": "grad", "target": output_target, **F2}]})


def test_an_output_row_names_its_target_and_an_output_without_one_does_not():
    assert artifacts._signature_rows(_inputs("w"))[1] == ["output 0 grad w: float32[2]"]
    assert artifacts._signature_rows(_inputs(None))[1] == ["output 0 grad: float32[2]"]


def test_an_output_for_another_target_is_a_signature_difference():
    diff = new_diff()
    artifacts._compare_signature(diff, "g", _inputs("w1"), _inputs("w2"))
    assert [f.text for f in diff.findings] == ["output 0 grad w1: float32[2] -> output 0 grad w2: float32[2]"]


# ---------------------------------------------------------------------------------------
# node_keys and _compare_nodes


def test_a_node_whose_keyword_arguments_changed_is_a_node_difference():
    a = graph(call("r", kwargs={"alpha": 1}))
    b = graph(call("r", kwargs={"alpha": 2}))
    assert artifacts.node_keys(a)[1] != artifacts.node_keys(b)[1]
    diff = new_diff()
    artifacts._compare_nodes(diff, "g", a, b)
    assert [(f.section, f.where, f.data["a"], f.data["b"]) for f in diff.findings] == [("nodes", "g", "r", "r")]


def test_a_layout_recorded_on_a_node_that_is_not_a_constant_is_not_part_of_its_key():
    # shape and stride are a get_attr's constant layout; on a call they are not compared
    plain = graph(call("r"))
    stray = graph(call("r", shape=[2], stride=[1]))
    assert artifacts.node_keys(plain)[1] == artifacts.node_keys(stray)[1]
    consts = [graph({"name": "c", "op": "get_attr", "target": "c", "val": F2, "shape": [2], "stride": s})
              for s in ([1], [2])]
    assert artifacts.node_keys(consts[0])[1] != artifacts.node_keys(consts[1])[1]


def test_two_removed_nodes_are_counted_in_the_plural_and_one_in_the_singular():
    base = ["aten.relu.default", "aten.neg.default", "aten.exp.default", "aten.abs.default"]
    diff = new_diff()
    artifacts._compare_nodes(diff, "g", chain_of(base), chain_of(base[:1] + base[3:]))
    assert [f.text for f in diff.findings] == [
        "A has 2 nodes from n1 (aten.neg.default) (after A n0, B n0)"]
    diff = new_diff()
    artifacts._compare_nodes(diff, "g", chain_of(base[:1] + base[3:]), chain_of(base))
    assert [f.text for f in diff.findings] == [
        "B has 2 nodes from n1 (aten.neg.default) (after A n0, B n0)"]
    diff = new_diff()
    artifacts._compare_nodes(diff, "g", chain_of(base), chain_of(base[:2] + base[3:]))
    assert [f.text for f in diff.findings] == [
        "A has 1 node from n2 (aten.exp.default) (after A n1, B n1)"]


def test_past_eight_changed_stretches_of_nodes_the_rest_are_counted_as_node_differences():
    targets = ["aten.relu.default"] * 40
    other = ["aten.neg.default" if i % 4 == 0 else t for i, t in enumerate(targets)]  # 10 stretches
    diff = new_diff()
    artifacts._compare_nodes(diff, "m/g", chain_of(targets), chain_of(other))
    assert len(diff.findings) == artifacts.MAX_HUNKS + 1
    section, where, text, data = found(diff)[-1]
    assert (section, where, data) == ("nodes", "m/g", {})
    assert re.fullmatch(r"and \d+ more changed stretches of nodes", text)


def test_a_node_moved_past_many_alike_nodes_leaves_the_alike_nodes_aligned():
    # 300 nodes of one key: difflib's autojunk would call that key popular, align the moved
    # node alone, and leave none of the 300 aligned
    alike = ["aten.relu.default"] * 300
    a, b = chain_of(alike + ["aten.neg.default"]), chain_of(["aten.neg.default"] + alike)
    diff = new_diff()
    aligned = artifacts._compare_nodes(diff, "g", a, b)
    assert [f.text for f in diff.findings] == [
        "B has 1 node from n0 (aten.neg.default) (at the start)",
        "A has 1 node from n300 (aten.neg.default) (after A n299, B n300)"]
    assert aligned == {f"n{i}": f"n{i + 1}" for i in range(300)}


# ---------------------------------------------------------------------------------------
# _chain (through _compare_passes)


def _step(name: str) -> PassRecord:
    return PassRecord(name=name, options={}, nodes_before=1, nodes_after=1, modified=False, stats={})


def _manifest(chains: dict[str, list[PassRecord]]) -> Any:
    return SimpleNamespace(pass_chains=lambda: chains, pass_failures=[])


def test_a_pass_chain_is_named_step_by_step_joined_by_plus_and_an_empty_one_as_none():
    diff = new_diff()
    artifacts._compare_passes(diff, lambda k: k, _manifest({"g": [_step("freeze"), _step("cse")], "h": []}),
                              _manifest({"g": [_step("freeze")], "h": [_step("cse")]}))
    assert found(diff) == [
        ("passes", "g", "chain freeze+cse -> freeze", {"a": "freeze+cse", "b": "freeze"}),
        ("passes", "h", "chain (none) -> cse", {"a": "(none)", "b": "cse"}),
    ]


def test_a_keyword_argument_is_keyed_by_the_layout_of_the_node_it_refers_to_not_its_name():
    y = {"name": "y", "op": "placeholder", "val": {"dtype": "float32", "shape": [3]}}
    a = graph(y, call("r", kwargs={"out": {"node": "y"}}))
    renamed = graph({**y, "name": "z"}, call("r", kwargs={"out": {"node": "z"}}))
    other = graph(y, call("r", kwargs={"out": {"node": "x"}}))  # float32[2], not y's float32[3]
    assert artifacts.node_keys(a)[1] == artifacts.node_keys(renamed)[1]
    assert artifacts.node_keys(a)[1] != artifacts.node_keys(other)[1]


def test_the_op_histogram_counts_call_function_nodes_only():
    # A placeholder and an output that carry a target are not ops: counted, a graph whose
    # input was renamed would show an op difference.
    g = GraphRecord.model_validate({"format_version": 2, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x", "val": F2},
        call("r"), call("s", arg="r"),
        {"name": "output", "op": "output", "target": "output", "args": [[{"node": "s"}]]}]})
    assert artifacts.op_histogram(g) == {"aten.relu.default": 2}
