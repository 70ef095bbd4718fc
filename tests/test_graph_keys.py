"""Graph keys: subgraph 0 keyed by kind (as export always was), subgraph i by kind and index."""

import pytest

from aotpipe.errors import ArtifactError
from aotpipe.format import records
from aotpipe.format.graph_keys import GraphKey, graph_folder_name, graph_key, key_order, parse_graph_key


def test_keys_and_folders():
    assert graph_key("forward") == "forward" and graph_key("forward", 2) == "forward_2"
    assert parse_graph_key("forward") == GraphKey("forward", 0, None)
    assert parse_graph_key("inference_12.freeze+reinplace") == GraphKey("inference", 12, "freeze+reinplace")
    assert parse_graph_key("inference_12.freeze").base == "inference_12"
    for bad in ("forward_0", "forward_01", "loss", "forward_x", ""):
        assert parse_graph_key(bad) is None, bad
    assert graph_folder_name("m", "joint") == "m_joint_0"
    assert graph_folder_name("m", "backward_3") == "m_backward_3"
    assert graph_folder_name("m", "inference_1.freeze") == "m_inference_1.freeze"
    with pytest.raises(ValueError):
        graph_folder_name("m", "chain")


def test_order_is_by_subgraph_then_kind_with_derived_graphs_after_their_base():
    keys = ["joint_1", "backward", "inference_1", "inference.freeze", "forward", "joint", "inference"]
    assert sorted(keys, key=key_order) == ["inference", "inference.freeze", "forward", "backward", "joint",
                                           "inference_1", "joint_1"]


def _entry(**extra):
    return {"folder": "m_inference_1.freeze", "nodes": 1, "inputs": 1, "outputs": 1, **extra}


def test_a_derived_graph_may_name_a_later_subgraph_as_its_base():
    assert records.parse(records.GraphEntry, _entry(base="inference_1"), "x").base == "inference_1"
    assert records.parse(records.GraphEntry, _entry(base="inference"), "x").base == "inference"
    for bad in ("inference_0", "inference.freeze", "loss"):
        with pytest.raises(ArtifactError, match="field base"):
            records.parse(records.GraphEntry, _entry(base=bad), "x")


def test_capture_record_fields_of_dynamo_are_optional():
    plain = {"mode": "export", "options": {}, "notes": []}
    assert records.parse(records.CaptureRecord, plain, "x").subgraphs is None
    dyn = {**plain, "mode": "dynamo", "subgraphs": 2, "fallback": "torch.export failed",
           "graph_breaks": [{"subgraph": 0, "reason": "print", "where": "m.py:3 in forward", "code": "print(x)"}]}
    rec = records.parse(records.CaptureRecord, dyn, "x")
    assert rec.graph_breaks[0].where == "m.py:3 in forward"
    with pytest.raises(ArtifactError, match="field subgraphs"):
        records.parse(records.CaptureRecord, {**plain, "subgraphs": 0}, "x")
