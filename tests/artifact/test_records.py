"""Every kind of record written to disk round-trips, and a newer format version is refused."""

import json
import shutil

import pytest
import torch

from aotpipe.artifact import input_meta
from aotpipe.artifact.blobs import BlobStore
from aotpipe.artifact.graph_json import graph_from_json, graph_to_json
from aotpipe.artifact.load import load
from aotpipe.artifact.manifest import dump_json, seal, seal_ok
from aotpipe.errors import ArtifactError
from aotpipe.tensors import storage_groups


def test_manifest_round_trips_and_keeps_its_seal(quickstart_run):
    root, _ = quickstart_run
    raw = (root / "mlp" / "manifest.json").read_bytes()
    m = json.loads(raw)
    assert seal_ok(m) and seal(m) == raw
    m["model"]["name"] = "other"
    assert not seal_ok(m)


def test_graph_json_round_trips_for_every_graph(quickstart_run):
    root, _ = quickstart_run
    for gj in root.rglob("graph.json"):
        data = json.loads(gj.read_text())
        store = BlobStore(gj.parent.parent)
        if any(n.get("recompute") for n in data["nodes"]):
            continue  # constants the loader recomputes: tested through aotpipe.load
        blobs = {n["blob"]: store.get(n["blob"]) for n in data["nodes"] if n["op"] == "get_attr"}
        gm = graph_from_json(data, blobs)
        back = graph_to_json(gm, {n["target"]: n["blob"] for n in data["nodes"] if n["op"] == "get_attr"})
        back["kind"], back["input_groups"] = data["kind"], data["input_groups"]
        nodes = [{k: v for k, v in n.items() if k != "val"} for n in data["nodes"]]
        assert [{k: v for k, v in n.items() if k != "val"} for n in back["nodes"]] == nodes, gj


def test_inputs_json_storages_round_trip_through_saved_inputs(quickstart_run):
    root, _ = quickstart_run
    for m in ("small_cnn", "tiny_transformer"):
        art = load(root / m)
        for ga in art.graphs.values():
            values = ga.saved_inputs()
            groups, member = storage_groups(values)
            assert [r.storage for r in ga.record.inputs] == member
            assert [g.numel for g in groups] == [s.numel for s in ga.record.storages]
            for v, r in zip(values, ga.record.inputs):
                assert list(v.stride()) == r.stride and v.storage_offset() == r.storage_offset


def test_input_pickle_round_trips(quickstart_run):
    root, _ = quickstart_run
    for f in root.rglob("*.input"):
        meta = input_meta.read(f)
        assert input_meta.dumps(meta) == f.read_bytes()


def test_blob_round_trip(tmp_path):
    store = BlobStore(tmp_path)
    for t in (torch.randn(3, 4), torch.arange(5), torch.tensor(True), torch.randn(2, 3).t(), torch.zeros(0, 2)):
        digest = store.put(t)
        back = store.get(digest)
        assert back.dtype == t.dtype and torch.equal(back, t.contiguous())
        assert store.put(t) == digest  # stored once


def test_trace_json_matches_a_rerun(quickstart_run):
    root, _ = quickstart_run
    from aotpipe.accuracy import sampled_summary
    from aotpipe.execution import run_with_summaries

    for ga in load(root / "running_norm").graphs.values():
        assert ga.trace.sampled is True
        from aotpipe.capture.checks import _is_view

        _, trace = run_with_summaries(ga.module, ga.saved_inputs(), sampled_summary, skip=_is_view)
        assert json.loads(dump_json(trace)) == ga.trace.model_dump()["nodes"]


def test_run_json_round_trips(quickstart_run):
    root, _ = quickstart_run
    raw = (root / "run.json").read_bytes()
    assert dump_json(json.loads(raw)) == raw


@pytest.mark.parametrize("record", ["manifest.json", "mlp_inference_0/graph.json", "mlp_inference_0/inputs.json",
                                    "mlp_inference_0/trace.json"])
def test_newer_format_version_is_refused_naming_both_versions(quickstart_run, tmp_path, record):
    root, _ = quickstart_run
    folder = tmp_path / "mlp"
    shutil.copytree(root / "mlp", folder)
    path = folder / record
    data = json.loads(path.read_text())
    data["format_version"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"format version 7; this aotpipe reads versions 1, 2") as e:
        load(folder)
    assert path.name in str(e.value)
