"""Every kind of record written to disk round-trips, and a newer format version is refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from aotpipe.artifact import input_meta
from aotpipe.artifact.blobs import BlobStore
from aotpipe.artifact.graph_json import graph_from_json, graph_to_json
from aotpipe.artifact.load import load
from aotpipe.artifact.manifest import dump_json, seal, seal_ok
from aotpipe.errors import ArtifactError
from aotpipe.runtime.tensors import storage_groups


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
    from aotpipe.runtime.accuracy import sampled_summary
    from aotpipe.runtime.execution import run_with_summaries

    for ga in load(root / "running_norm").graphs.values():
        assert ga.trace.sampled is True
        from aotpipe.checks.written import _is_view, trace_nodes

        _, trace = run_with_summaries(ga.module, ga.saved_inputs(), sampled_summary, skip=_is_view)
        assert trace_nodes(trace) == ga.trace.nodes


def test_run_json_round_trips(quickstart_run):
    root, _ = quickstart_run
    raw = (root / "run.json").read_bytes()
    assert dump_json(json.loads(raw)) == raw


def test_run_json_is_a_run_record_that_round_trips(quickstart_run):
    from aotpipe.format.records import RunRecord, load_run
    from aotpipe.pipeline.report import dump_run

    root, _ = quickstart_run
    raw = (root / "run.json").read_bytes()
    run = load_run(root)  # the folder, or the file
    assert isinstance(run, RunRecord) and load_run(root / "run.json") == run
    assert dump_run(run).encode("utf-8") == raw  # every field typed, nothing lost or added
    m = {m.name: m for m in run.models}["mlp"]
    assert m.status == "ok" and m.checks.failed == 0 and m.verification.ok
    (chain,) = m.passes.values()
    assert [s.name for s in chain.steps] == ["freeze", "fold_conv_bn", "channels_last", "reinplace"]
    assert all(s.seconds >= 0 for s in chain.steps) and m.eager["inference"].run >= 1


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["models"][0].__setitem__("status", "fine"), "models.0.status"),
    (lambda d: d["models"][0]["checks"].__setitem__("failed", "0"), "models.0.checks.failed"),
    (lambda d: d["models"][0].__setitem__("traceback", "Traceback..."), "models.0.traceback"),
    (lambda d: d["summary"].pop("graphs"), "summary.graphs"),
])
def test_a_run_json_off_its_record_is_one_line_naming_the_field(quickstart_run, tmp_path, edit, field):
    from aotpipe.format.records import load_run

    root, _ = quickstart_run
    data = json.loads((root / "run.json").read_text())
    edit(data)
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as e:
        load_run(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'run.json'}: field {field}: "), str(e.value)


def test_a_failed_model_keeps_its_traceback_out_of_run_json():
    from aotpipe.pipeline.results import ModelResult

    r = ModelResult(name="m", status="failed", stage="capture", error="boom", traceback="Traceback (most recent...")
    assert "traceback" not in r.to_record().model_dump() and r.traceback.startswith("Traceback")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"status\n  Input should be 'ok', 'partial' or 'failed'"):
        r.status = "fine"  # the result is run.json's record: checked as it is filled in


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


# ---------------------------------------------------------------------------------------
# The typed record layer (format/records.py)


def test_every_record_of_quickstart_and_of_version_1_validates(quickstart_run):
    from aotpipe.format import records

    root, _ = quickstart_run
    data = Path(__file__).resolve().parents[1] / "data"
    seen = {name: 0 for name in records.RECORDS}
    for base in (root, data / "format_v1", data / "format_v2"):
        for name, cls in records.RECORDS.items():
            for p in base.rglob(name):
                records.parse(cls, json.loads(p.read_text()), p)
                seen[name] += 1
    assert all(seen[n] for n in ("manifest.json", "inputs.json", "trace.json", "graph.json")), seen


@pytest.mark.parametrize("record,edit,field", [
    ("mlp_inference_0/inputs.json", lambda d: d["storages"][0].__setitem__("numel", "12"), "storages.0.numel"),
    ("mlp_inference_0/inputs.json", lambda d: d["storages"][0].__setitem__("numel", -5), "storages.0.numel"),
    ("mlp_inference_0/inputs.json", lambda d: d["inputs"][0].__setitem__("stride", [True, 1]), "inputs.0.stride.0"),
    ("mlp_inference_0/inputs.json", lambda d: d["outputs"][0].__setitem__("colour", 1), "outputs.0.colour"),
    ("mlp_inference_0/inputs.json", lambda d: d["inputs"][0].__setitem__("stride", [1]), "inputs.0"),
    ("mlp_inference_0/inputs.json", lambda d: d["inputs"][0].__setitem__("source", "network"), "inputs.0.source"),
    ("mlp_inference_0/graph.json", lambda d: d["nodes"][0].__setitem__("op", "call_module"), "nodes.0.op"),
    ("mlp_inference_0/graph.json", lambda d: d["nodes"][0].__setitem__("shape", [-1]), "nodes.0.shape.0"),
    ("mlp_inference_0/trace.json", lambda d: d.__setitem__("nodes", []), "nodes"),
    ("manifest.json", lambda d: d["graphs"]["inference"].__setitem__("folder", "../x"), "graphs.inference.folder"),
    ("manifest.json", lambda d: d["graphs"]["inference"].__setitem__("base", "training"), "graphs.inference.base"),
])
def test_a_record_off_the_format_is_one_line_naming_file_and_field(mlp_copy, record, edit, field):
    from aotpipe.artifact.manifest import seal

    path = mlp_copy / record
    data = json.loads(path.read_text())
    edit(data)
    path.write_bytes(seal(data) if record == "manifest.json" else json.dumps(data).encode())
    from click.testing import CliRunner

    from aotpipe.cli import main

    r = CliRunner().invoke(main, ["replay", str(mlp_copy)])
    assert r.exit_code == 2, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.strip()]
    assert line.startswith(f"error: {path}: field {field}:"), line


@pytest.mark.parametrize("arg,where,why", [
    ({"nodez": "x"}, "", "not a node argument: a JSON value, a list, or an object with one of the keys node, tuple"),
    ({"node": "x", "tuple": []}, "", "not a node argument"),  # one key, not two
    ({"dtype": "float99"}, ".dtype.dtype", "not one of the"),
    ({"slice": [1, 2]}, ".slice.slice", "List should have at least 3 items"),
    ({"float": "1.5"}, ".float.float", "Input should be 'nan', 'inf' or '-inf'"),
    ({"tuple": [{"node": 3}]}, ".tuple.tuple.0.node.node", "Input should be a valid string"),
])
def test_a_node_argument_off_its_tagged_forms_is_refused_naming_it(mlp_copy, arg, where, why):
    from click.testing import CliRunner

    from aotpipe.cli import main

    path = mlp_copy / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    i = next(i for i, n in enumerate(data["nodes"]) if n["op"] == "call_function")
    data["nodes"][i]["args"][0] = arg
    path.write_text(json.dumps(data))
    r = CliRunner().invoke(main, ["replay", str(mlp_copy)])
    assert r.exit_code == 2, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.strip()]
    assert line.startswith(f"error: {path}: field nodes.{i}.args.0{where}: {why}"), line


def test_the_writer_refuses_a_record_off_the_format():
    from aotpipe.format import records

    with pytest.raises(ArtifactError, match="field kind"):
        records.check_written(records.InputsRecord, {"format_version": 2, "kind": "training", "storages": [],
                                                     "inputs": [], "outputs": []}, "inputs.json")


def test_schema_artifact_prints_the_json_schema_of_every_record_file():
    from click.testing import CliRunner

    from aotpipe.cli import main

    r = CliRunner().invoke(main, ["schema", "--artifact"])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.output)
    assert set(schema["files"]) == {"manifest.json", "inputs.json", "trace.json", "graph.json", "signature.json",
                                    "run.json"}
    inputs = schema["files"]["inputs.json"]
    assert inputs["additionalProperties"] is False and "storages" in inputs["required"]
    storage = inputs["$defs"]["StorageRecord"]["properties"]
    assert storage["numel"] == {"minimum": 0, "title": "Numel", "type": "integer"}
    assert "manifest.json" in schema["description"] and "format" in schema["title"]


def test_ls_says_when_a_manifest_was_changed(mlp_copy):
    from aotpipe.corpus.inspect import list_artifacts

    assert list_artifacts(mlp_copy.parent)[0].status == "verified"
    m = json.loads((mlp_copy / "manifest.json").read_text())
    m["model"]["name"] = "other"  # checksum left as it was
    (mlp_copy / "manifest.json").write_text(json.dumps(m))
    assert list_artifacts(mlp_copy.parent)[0].status == "corrupt (checksum)"


def test_every_dtype_the_format_names_is_a_torch_dtype_and_reading_a_manifest_needs_no_torch():
    import subprocess
    import sys

    from aotpipe.format.records import DTYPES

    assert all(isinstance(getattr(torch, name, None), torch.dtype) for name in DTYPES)
    code = "import sys, aotpipe.format.records, aotpipe.pipeline.incremental; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_graph_kinds_a_record_may_name_are_the_vocabularys():
    from aotpipe.format.records import InputsRecord
    from aotpipe.format.vocabulary import GRAPH_KINDS, GraphKind

    kind = InputsRecord.model_json_schema()["properties"]["kind"]
    assert kind == {"enum": ["inference", "forward", "backward", "joint", "train_step"], "type": "string"}
    assert list(GRAPH_KINDS) == kind["enum"] and list(GraphKind) == kind["enum"]


def test_an_updated_record_is_validated_as_a_new_one():
    import pytest
    from pydantic import ValidationError

    from aotpipe.format.records import ModelRun, updated

    run = ModelRun(name="m", status="ok")
    changed = updated(run, status="failed", stage="capture")
    assert (changed.status, changed.stage, run.status) == ("failed", "capture", "ok")
    with pytest.raises(ValidationError, match="status"):
        updated(run, status="done")  # model_copy(update=...) would have kept it
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        updated(run, stauts="failed")
    with pytest.raises(ValidationError):
        updated(run, capture_seconds="1.5")  # strict: no coercion either


def test_no_module_copies_a_record_with_unvalidated_changes():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "aotpipe"
    found = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
             if "model_copy(update=" in p.read_text(encoding="utf-8").replace("model_copy(update=...)", "")]
    assert found == [], "use records.updated, which validates the changes"


def test_an_updated_record_sets_only_the_fields_set_before_and_the_changes():
    from aotpipe.format.records import ModelRun, updated

    changed = updated(ModelRun(name="m", status="ok"), error="boom")
    assert changed.model_fields_set == {"name", "status", "error"}
    assert changed.model_dump(exclude_unset=True) == {"name": "m", "status": "ok", "error": "boom"}
