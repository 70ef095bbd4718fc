"""graph.json: round trip of every argument kind, and refusal of anything outside the allow-list."""

import json
import math

import pytest
import torch
import torch.fx

from aotpipe.artifact.graph_json import decode_arg, encode_arg, graph_from_json, graph_to_json, resolve_target
from aotpipe.errors import ArtifactError


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


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "torch.load", "inductor.foo.default",
                                  "aten.add", "aten.__class__.default", "operator.attrgetter", 42])
def test_targets_outside_allow_list_are_refused(name):
    with pytest.raises(ArtifactError):
        resolve_target(name)


def test_hostile_graph_naming_os_system_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    data = {"format_version": 1, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x"},
        {"name": "boom", "op": "call_function", "target": "os.system", "args": [f"touch {marker}"], "kwargs": {}},
        {"name": "output", "op": "output", "args": [{"node": "x"}], "kwargs": {}},
    ]}
    with pytest.raises(ArtifactError, match="os.system"):
        graph_from_json(data)
    assert not marker.exists()


def test_call_module_nodes_are_refused():
    data = {"format_version": 1, "nodes": [{"name": "m", "op": "call_module", "target": "sub"}]}
    with pytest.raises(ArtifactError, match="unsupported op"):
        graph_from_json(data)


def test_newer_format_version_is_refused_with_both_versions():
    with pytest.raises(ArtifactError, match="version 3.*reads versions 1, 2"):
        graph_from_json({"format_version": 3, "nodes": []})


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
