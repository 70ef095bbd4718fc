"""graph.json: round trip of every argument kind, and refusal of anything outside the allow-list."""

import json
import math
import re

import pytest
import torch
import torch.fx

from aotpipe.artifact.graph_json import decode_arg, encode_arg, graph_from_json, graph_to_json, resolve_target
from aotpipe.errors import ArtifactError
from aotpipe.artifact.ops import op_name


def _traced():
    def f(x, w):
        y = torch.ops.aten.addmm.default(torch.ops.aten.zeros.default([2, 3], dtype=torch.float32, device=torch.device("cpu")), x, w)
        z = torch.ops.aten.clamp.default(y, -math.inf, 1.5)
        parts = torch.ops.aten.split_with_sizes.default(z, [1, 1, 1], 1)  # core ATen: on the op allow-list
        return parts[0], torch.ops.aten.clone.default(z, memory_format=torch.contiguous_format)

    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f)(torch.randn(2, 4), torch.randn(4, 3))


def test_round_trip_gives_same_code_and_values():
    gm = _traced()
    data = json.loads(json.dumps(graph_to_json(gm)))
    back = graph_from_json(data)
    assert back.code == gm.code
    x, w = torch.randn(2, 4), torch.randn(4, 3)
    for a, b in zip(gm(x, w), back(x, w)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("value", [
    1, -2.5, True, None, "s", [1, 2], (1, (2, 3)), torch.float16, torch.device("cpu"), torch.strided,
    torch.channels_last, slice(1, None, 2), float("inf"), float("-inf"),
])
def test_encode_decode_each_argument_kind(value):
    back = decode_arg(json.loads(json.dumps(encode_arg(value))), {})
    assert back == value and type(back) is type(value)


def test_nan_round_trips():
    assert math.isnan(decode_arg(json.loads(json.dumps(encode_arg(float("nan")))), {}))


@pytest.mark.parametrize("name,why", [
    ("os.system", "which is not an op in an allowed namespace"),
    ("builtins.eval", "which is not an op in an allowed namespace"),
    ("torch.load", "which is not an op in an allowed namespace"),
    ("inductor.foo.default", "an op of the library namespace 'inductor'"),
    ("aten.add", "which is not an op in an allowed namespace"),
    ("aten.__class__.default", "which is not a valid op name"),
    ("operator.attrgetter", "which is not an op in an allowed namespace"),
    ("aten.from_file.default", "which is not allowed"),
])
def test_targets_outside_allow_list_are_refused(name, why):
    with pytest.raises(ArtifactError, match=rf"^graph\.json names {re.escape(repr(name))}, {re.escape(why)}"):
        resolve_target(name)


def test_a_target_that_is_not_a_string_is_refused():
    with pytest.raises(ArtifactError, match="^graph.json: op target must be a string, got int$"):
        resolve_target(42)


# Hostile graphs: each node would create `marker` if its target were called. The graph is
# loaded and, were it accepted, run: the tests assert the refusal names the target, and that
# the marker is absent (a loader that resolved the name by importing it would fail both).
def _payload_nodes(marker):
    m = str(marker)
    return {
        "os.system": [f"touch {m}"],
        "posix.system": [f"touch {m}"],
        "builtins.exec": [f"open({m!r}, 'w').close()"],
        "builtins.eval": [f"open({m!r}, 'w').close()"],
        "subprocess.call": [["touch", m]],
        "builtins.open": [m, "w"],
        "torch.save": [{"node": "x"}, m],
        "os.path.os.system": [f"touch {m}"],
    }


_REFUSAL: dict[str, str] = {}  # targets refused for another reason than their namespace


@pytest.mark.parametrize("target", list(_payload_nodes("m")))
def test_hostile_graph_is_refused_and_its_payload_never_runs(tmp_path, target):
    marker = tmp_path / "payload-ran"
    data = {"format_version": 1, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x"},
        {"name": "boom", "op": "call_function", "target": target, "args": _payload_nodes(marker)[target],
         "kwargs": {}},
        {"name": "output", "op": "output", "args": [{"node": "x"}], "kwargs": {}},
    ]}
    with pytest.raises(ArtifactError) as e:
        graph_from_json(data)(torch.zeros(1))  # run only if (wrongly) accepted
    assert not marker.exists(), "the payload ran"
    why = _REFUSAL.get(target, "which is not an op in an allowed namespace")
    assert f"graph.json names {target!r}, {why}" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_hostile_graph_through_the_cli_leaves_no_marker(mlp_copy, tmp_path):
    from click.testing import CliRunner

    from aotpipe.cli import main
    from tests.helpers.forge import reseal

    marker = tmp_path / "payload-ran"
    path = mlp_copy / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    x = next(n["name"] for n in data["nodes"] if n["op"] == "placeholder")
    data["nodes"].insert(len(data["nodes"]) - 1, {"name": "boom", "op": "call_function", "target": "os.system",
                                                  "args": [f"touch {marker}"], "kwargs": {}})
    data["nodes"][-1]["args"] = [[{"node": "boom"}, {"node": x}]]
    path.write_text(json.dumps(data))
    assert reseal(mlp_copy)  # past the sha256 checks: only the allow-list stands in the way
    for command in ("replay", "show", "verify"):
        r = CliRunner().invoke(main, [command, str(mlp_copy)])
        assert not marker.exists(), f"the payload ran in {command}"
        assert r.exit_code in (1, 2) and "graph.json names 'os.system', which is not" in r.output, r.output


def test_call_module_nodes_are_refused():
    data = {"format_version": 1, "nodes": [{"name": "m", "op": "call_module", "target": "sub"}]}
    with pytest.raises(ArtifactError, match=r"^graph\.json: field nodes\.0\.op: Input should be 'placeholder', "
                                            r"'get_attr', 'call_function' or 'output' \(got \"call_module\"\)$"):
        graph_from_json(data)


def test_newer_format_version_is_refused_with_both_versions():
    with pytest.raises(ArtifactError, match="version 4.*reads versions 1, 2, 3"):
        graph_from_json({"format_version": 4, "nodes": []})
    graph_from_json({"format_version": 3, "nodes": []})  # the newest it reads: just inside


def test_forward_reference_is_refused():
    data = {"format_version": 1, "nodes": [
        {"name": "y", "op": "call_function", "target": "aten.relu.default", "args": [{"node": "x"}], "kwargs": {}},
        {"name": "x", "op": "placeholder", "target": "x"},
    ]}
    with pytest.raises(ArtifactError, match="before it is defined"):
        graph_from_json(data)


def _graph(nodes):
    return {"format_version": 1, "nodes": nodes}


@pytest.mark.parametrize("nodes", [
    [{"name": "None", "op": "placeholder", "target": "None"}],
    [{"name": "x", "op": "placeholder", "target": "x"}, {"name": "lambda", "op": "call_function",
                                                          "target": "aten.relu.default", "args": [{"node": "x"}]}],
    [{"name": "self", "op": "placeholder", "target": "self"}],
    [{"name": "c", "op": "get_attr", "target": "import", "blob": "0" * 64}],
    [{"name": "c", "op": "get_attr", "target": "a.None", "blob": "0" * 64}],
], ids=["placeholder None", "node lambda", "placeholder self", "get_attr import", "get_attr a.None"])
def test_names_that_are_python_keywords_are_refused_before_codegen(nodes):
    nodes = nodes + [{"name": "output", "op": "output", "args": [{"node": nodes[-1]["name"]}]}]
    with pytest.raises(ArtifactError, match="bad (name|get_attr target)") as e:
        graph_from_json(_graph(nodes), {"0" * 64: torch.zeros(1)})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args,why", [
    ([[0], 10 ** 12], "operator.mul takes (int, int) (sizes and conditions), got (list, int); not computed"),
    ([{"node": "x"}, 3], "operator.mul takes (int, int) (sizes and conditions), got (Tensor, int); not computed"),
    ([True, 3], "operator.mul takes (int, int) (sizes and conditions), got (bool, int); not computed"),
    ([2 ** 62, 4], "operator.mul of sizes gave 18446744073709551616..., beyond an int64"),
])
def test_size_arithmetic_from_a_graph_takes_ints_only_and_stays_within_an_int64(args, why):
    data = {"format_version": 1, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x"},
        {"name": "n", "op": "call_function", "target": "operator.mul", "args": args, "kwargs": {}},
        {"name": "output", "op": "output", "args": [[{"node": "x"}, {"node": "n"}]], "kwargs": {}},
    ]}
    gm = graph_from_json(data)
    with pytest.raises(ArtifactError) as e:
        gm(torch.zeros(1))
    assert str(e.value) == why


def test_size_arithmetic_round_trips_by_name_and_computes_on_ints():
    import operator

    for name, fn, args in [("operator.add", operator.add, (7, 5)), ("operator.sub", operator.sub, (7, 5)),
                           ("operator.floordiv", operator.floordiv, (7, 2)), ("operator.mod", operator.mod, (7, 2)),
                           ("operator.neg", operator.neg, (7,)), ("torch.sym_max", torch.sym_max, (7, 5)),
                           ("torch.sym_min", torch.sym_min, (7, 5)), ("operator.eq", operator.eq, (7, 7)),
                           ("operator.gt", operator.gt, (7, 5)), ("operator.or_", operator.or_, (False, True)),
                           ("torch.sym_not", torch.sym_not, (False,)), ("torch.sym_ite", torch.sym_ite, (True, 7, 5))]:
        loaded = resolve_target(name)
        assert loaded is not fn and loaded(*args) == fn(*args), name
        assert op_name(loaded) == op_name(fn) == name
    for other in ("operator.rshift", "operator.lshift", "builtins.max", "operator.add_", "operator.xor"):
        with pytest.raises(ArtifactError, match=f"^graph.json names '{other}', which is not an op in an allowed "):
            resolve_target(other)
    with pytest.raises(ArtifactError, match=r"operator.or_ takes \(bool, bool\)"):
        resolve_target("operator.or_")(6, 1)  # bitwise or of ints: not a condition
    with pytest.raises(ArtifactError, match=r"torch.sym_ite takes \(bool, int, int\)"):
        resolve_target("torch.sym_ite")(1, [0] * 3, 2)
