"""graph.json's node origins (aotpipe.artifact.provenance): the innermost module of a node, its
class and one source line, named the same wherever the capture ran.

Fast: nodes of a tiny torch.fx graph with their metadata set by hand, as each capture writes it.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.fx

import aotpipe
from aotpipe.artifact import provenance as prov
from aotpipe.format.records import NodeOrigin

TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")
ZOO_FILE = os.path.join(os.path.dirname(aotpipe.__file__), "models", "zoo.py")


def _frame(file: str, line: int, fn: str = "forward") -> str:
    return f'  File "{file}", line {line}, in {fn}\n    x = self.fc(x)\n'


@pytest.mark.parametrize("raw,path", [
    ("L['self'].layers[0].attn", "layers.0.attn"),
    ("getattr(L['self'].layers, '0').attn", "layers.0.attn"),
    ("getattr(getattr(L['self'], 'blocks'), '3')", "blocks.3"),
    ('L["self"].fc', "fc"),
    ("L['self_'].fc", "fc"),
    ("self.encoder.layer[11]", "encoder.layer.11"),
    ("L['self']", ""),
    ('L["self"]', ""),
    ("L['self_']", ""),
    ("self", ""),
    ("layers.0.attn", "layers.0.attn"),
    ("L['self'].fc['w']", "fc.w"),
    ("selfish.fc", "selfish.fc"),
    (".fc.", "fc"),
    ("L['self'].X", "X"),
])
def test_module_path_is_the_torch_export_spelling_of_every_captures(raw, path):
    assert prov.module_path(raw) == path


def test_class_name_qualifies_a_class_and_keeps_a_name():
    assert prov.class_name(torch.nn.Linear) == "torch.nn.modules.linear.Linear"
    assert prov.class_name("my.Block") == "my.Block"
    assert prov.class_name(3) == "3"


def test_source_line_is_the_innermost_frame_outside_torch_named_by_import():
    trace = _frame(ZOO_FILE, 10) + _frame(ZOO_FILE, 94) + _frame(TORCH_FILE, 125)
    assert prov.source_line(trace) == "aotpipe/models/zoo.py:94"


def test_source_line_falls_back_to_torch_frames_and_skips_generated_code():
    assert prov.source_line(_frame(TORCH_FILE, 7) + _frame(TORCH_FILE, 125)) == "torch/nn/modules/linear.py:125"
    assert prov.source_line(_frame("<eval_with_key>.256", 3)) is None
    assert prov.source_line(_frame(ZOO_FILE, 5) + _frame("<eval_with_key>.9", 3)) == "aotpipe/models/zoo.py:5"
    assert prov.source_line(None) is None and prov.source_line(12) is None and prov.source_line("no frames") is None


def test_a_file_beside_torch_whose_name_starts_like_it_is_not_torchs():
    beside = os.path.dirname(torch.__file__) + "_extras" + os.sep + "m.py"
    assert not prov._in_torch(beside)
    assert prov._in_torch(TORCH_FILE)


def _graph_node(**meta) -> torch.fx.Node:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(torch.relu, (x,))
    g.output(node)
    node.meta.update(meta)
    return node


def test_keep_source_replaces_stack_traces_by_relative_lines():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (a,))
    g.output(b)
    a.meta["stack_trace"] = _frame(ZOO_FILE, 42)
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    prov.keep_source(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["relu"].meta[prov.SOURCE_KEY] == "aotpipe/models/zoo.py:42"
    assert prov.SOURCE_KEY not in nodes["neg"].meta and prov.SOURCE_KEY not in nodes["x"].meta


def test_node_origin_is_the_innermost_module_of_the_model():
    node = _graph_node(nn_module_stack={
        "L__self__": ("", "torch.export.Wrapper"),
        "L__self___layers_0": ("L['self'].layers[0]", "m.Block"),
        "L__self___layers_0_fc": ("L['self'].layers[0].fc", torch.nn.Linear),
    }, **{prov.SOURCE_KEY: "m.py:3"})
    assert prov.node_origin(node) == NodeOrigin(module="layers.0.fc", module_class="torch.nn.modules.linear.Linear",
                                                source="m.py:3", of_forward=None)


@pytest.mark.parametrize("internal", ["torch.export.Wrapper", "torch._dynamo.X", "torch.fx.Y"])
def test_torchs_own_wrappers_are_no_module_of_the_model(internal):
    node = _graph_node(nn_module_stack={"a": ("L['self'].fc", "m.Fc"), "b": ("L['self'].fc.w", internal)})
    assert prov.node_origin(node).module == "fc"
    only = _graph_node(nn_module_stack={"b": ("L['self']", internal)}, **{prov.SOURCE_KEY: "m.py:1"})
    assert prov.node_origin(only) == NodeOrigin(module=None, module_class=None, source="m.py:1", of_forward=None)


def test_a_class_of_the_model_named_like_torch_is_kept():
    node = _graph_node(nn_module_stack={"a": ("L['self'].fc", "torchvision.Fc")})
    assert prov.node_origin(node).module_class == "torchvision.Fc"


def test_a_backward_node_takes_the_forward_nodes_module_and_says_so():
    node = _graph_node(fwd_nn_module_stack={"a": ("L['self'].fc", "m.Fc")})
    assert prov.node_origin(node) == NodeOrigin(module="fc", module_class="m.Fc", source=None, of_forward=True)
    both = _graph_node(nn_module_stack={"a": ("L['self'].g", "m.G")}, fwd_nn_module_stack={"a": ("L['self'].fc", "m.Fc")})
    assert prov.node_origin(both).module == "g" and prov.node_origin(both).of_forward is None


def test_a_node_with_nothing_recorded_has_no_origin_and_a_loaded_one_keeps_its_own():
    assert prov.node_origin(_graph_node()) is None
    assert prov.node_origin(_graph_node(nn_module_stack={}, fwd_nn_module_stack={})) is None
    kept = NodeOrigin(module="x", module_class="m.X", source="m.py:9", of_forward=None)
    assert prov.node_origin(_graph_node(**{prov.ORIGIN_KEY: kept, "nn_module_stack": {"a": ("L['self'].y", "m.Y")}})) \
        is kept
    assert prov.node_origin(_graph_node(**{prov.ORIGIN_KEY: "not an origin"})) is None


def test_a_source_line_alone_is_an_origin():
    assert prov.node_origin(_graph_node(**{prov.SOURCE_KEY: "m.py:2"})) == NodeOrigin(
        module=None, module_class=None, source="m.py:2", of_forward=None)
