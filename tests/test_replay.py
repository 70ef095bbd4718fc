"""Replay: get_inputs, bit-exact replay of saved graphs, divergence location, devices, chain."""

import hashlib
import json
import pickle
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import get_inputs, replay, replay_chain, to_device

MODELS = ["mlp", "small_cnn", "tiny_transformer", "running_norm"]
KINDS = ["inference", "forward", "backward", "joint"]


@pytest.fixture()
def copy_of(quickstart_run, tmp_path):
    """A private copy of one quickstart model folder, safe to tamper with."""
    root, _ = quickstart_run

    def make(model):
        dst = tmp_path / "copy" / model
        shutil.copytree(root / model, dst)
        return dst

    return make


# --- get_inputs --------------------------------------------------------------------------


def test_get_inputs_matches_recorded_layout_for_every_graph(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        for k in KINDS:
            folder = root / m / f"{m}_{k}_0"
            rec = json.loads((folder / "inputs.json").read_text())
            values = get_inputs(folder / f"{m}_{k}_0.input", seed=1)
            flat = [v for g in values for v in g] if k == "joint" else values
            assert len(flat) == len(rec["inputs"])
            for v, r in zip(flat, rec["inputs"]):
                assert list(v.shape) == r["shape"] and list(v.stride()) == r["stride"], (m, k, r["name"])
                assert str(v.dtype) == "torch." + r["dtype"] and v.storage_offset() == r["storage_offset"]


def test_non_contiguous_inputs_stay_non_contiguous(quickstart_run):
    root, _ = quickstart_run
    folder = root / "mlp" / "mlp_backward_0"
    rec = json.loads((folder / "inputs.json").read_text())
    values = get_inputs(folder)
    non_contig = [v for v, r in zip(values, rec["inputs"]) if not v.is_contiguous()]
    assert non_contig, "mlp's backward saves transposed weights"


def test_inputs_that_shared_a_storage_share_one_again(quickstart_run):
    root, _ = quickstart_run
    found = 0
    for folder in root.rglob("*_backward_0"):
        rec = json.loads((folder / "inputs.json").read_text())
        values = get_inputs(folder)
        by_storage = {}
        for v, r in zip(values, rec["inputs"]):
            if r["storage"] is not None:
                by_storage.setdefault(r["storage"], []).append(v)
        for members in by_storage.values():
            ptrs = {v.untyped_storage().data_ptr() for v in members}
            assert len(ptrs) == 1
            found += len(members) > 1
        assert len({v.untyped_storage().data_ptr() for v in values}) == len(by_storage)
    assert found, "some backward graph takes two views of one storage"


def test_integers_stay_in_recorded_range_and_are_not_all_zero(quickstart_run):
    root, _ = quickstart_run
    folder = root / "tiny_transformer" / "tiny_transformer_inference_0"
    rec = json.loads((folder / "inputs.json").read_text())
    values = dict(zip([r["target"] for r in rec["inputs"]], get_inputs(folder, seed=3)))
    ids, mask = values["input_ids"], values["attention_mask"]
    assert int(ids.min()) >= 0 and int(ids.max()) < 1000 and len(ids.unique()) > 5
    assert bool((mask == 1).all())


def test_same_seed_same_tensors_in_another_process(quickstart_run):
    root, _ = quickstart_run
    path = root / "small_cnn" / "small_cnn_joint_0"

    def digest(values):
        h = hashlib.sha256()
        for v in [x for g in values for x in g]:
            h.update(v.contiguous().numpy().tobytes())
        return h.hexdigest()

    code = f"import aotpipe, sys; v = aotpipe.get_inputs({str(path)!r}, seed=5)\n" + textwrap.dedent("""
        import hashlib
        h = hashlib.sha256()
        for x in [x for g in v for x in g]:
            h.update(x.contiguous().numpy().tobytes())
        sys.stdout.write(h.hexdigest())
    """)
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other == digest(aotpipe.get_inputs(path, seed=5))
    assert digest(get_inputs(path, seed=6)) != other


def test_joint_inputs_are_nested(quickstart_run):
    root, _ = quickstart_run
    primals, tangents = get_inputs(root / "mlp" / "mlp_joint_0")
    assert len(tangents) == 1 and tangents[0].shape == ()
    assert len(primals) == 7  # 3 linear layers x (weight, bias) + the input


def test_reads_graph_dumper_aot_files_without_inputs_json(tmp_path):
    meta = [
        (torch.Tensor, torch.Size([4, 3]), (1, 4), torch.float32, torch.device("cpu")),
        (torch.Tensor, torch.Size([5]), (1,), torch.int8, torch.device("cpu")),
        (torch.Tensor, torch.Size([6]), (1,), torch.bool, torch.device("cpu")),
        (int,),
        (float,),
    ]
    p = tmp_path / "g_forward_0.input"
    p.write_bytes(pickle.dumps(meta))
    a, b, c, d, e = get_inputs(p, seed=0)
    assert a.shape == (4, 3) and a.stride() == (1, 4) and not a.is_contiguous()
    assert b.dtype == torch.int8 and c.dtype == torch.bool
    assert isinstance(d, int) and isinstance(e, float)
    nested = tmp_path / "j_joint_0.input"
    nested.write_bytes(pickle.dumps([meta[:2], meta[2:3]]))
    primals, tangents = get_inputs(nested)
    assert len(primals) == 2 and len(tangents) == 1


def test_hostile_input_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    p = tmp_path / "x.input"
    p.write_bytes(pickle.dumps([Evil()]))
    with pytest.raises(ArtifactError, match="refusing to unpickle io.open"):
        get_inputs(p)
    assert not marker.exists()


# --- replay ------------------------------------------------------------------------------


def test_every_quickstart_graph_replays_bit_exactly(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        results = replay(root / m)
        assert [r.kind for r in results] == KINDS + ["inference.freeze+fold_conv_bn+channels_last+reinplace"]
        for r in results:
            assert r.status == "match" and r.max_abs_error == 0.0, (m, r)


def test_every_graph_runs_on_random_inputs(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        for r in replay(root / m, inputs="random", seed=2):
            assert r.status == "ran", (m, r.kind, r.error, r.mismatches)


def test_mutated_inputs_are_copied_back(quickstart_run):
    root, _ = quickstart_run
    art = aotpipe.load(root / "running_norm")
    ga = art.graphs["inference"]
    (r,) = replay(art, graphs=["inference"])
    assert r.mutated == ["running_mean", "calls"]
    from aotpipe.replay import copy_mutations_back, run_graph

    inputs = ga.saved_inputs()
    calls_before = int(inputs[3])
    outs = run_graph(ga.module, inputs)
    copy_mutations_back(ga.record, inputs, outs)
    assert int(inputs[3]) == calls_before + 1
    assert torch.equal(inputs[2], outs[0])


def test_chain_forward_then_backward_matches_joint_and_eager(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        c = replay_chain(root / m)
        assert c.status == "match", (m, c.problems)
        assert c.max_abs_error_vs_joint == 0.0 and c.compared > 0
        assert c.eager_within_tolerance is True, m


def test_tampered_graph_mismatches_and_names_first_diverging_node(copy_of):
    folder = copy_of("running_norm")
    gj_path = folder / "running_norm_inference_0" / "graph.json"
    data = json.loads(gj_path.read_text())
    node = next(n for n in data["nodes"] if n["op"] == "call_function" and n["kwargs"].get("alpha") == 0.1)
    node["kwargs"]["alpha"] = 0.5  # the running mean's momentum, was 0.1
    gj_path.write_text(json.dumps(data))
    (r,) = replay(folder, graphs=["inference"])
    assert r.status == "mismatch" and r.max_abs_error > 0
    assert r.first_divergence.startswith(node["name"] + " ")
    res = CliRunner().invoke(main, ["replay", str(folder), "--graph", "inference"])
    assert res.exit_code == 1 and f"first diverging node: {node['name']}" in res.output


def test_copied_folder_replays_the_same(quickstart_run, tmp_path):
    root, _ = quickstart_run
    dst = tmp_path / "elsewhere" / "moved small_cnn"
    shutil.copytree(root / "small_cnn", dst)
    for text_file in dst.rglob("*.json"):
        assert str(root) not in text_file.read_text()
    for r in replay(dst):
        assert r.status == "match"


def test_trust_code_imports_module_py(quickstart_run):
    root, _ = quickstart_run
    for r in replay(root / "mlp", trust_code=True):
        assert r.status == "match", r


def test_to_device_rewrites_factory_ops_and_runs_on_meta(quickstart_run):
    root, _ = quickstart_run
    ga = aotpipe.load(root / "tiny_transformer").graphs["inference"]
    factory = [n for n in ga.module.graph.nodes if n.op == "call_function" and "device" in n.kwargs]
    assert factory, "tiny_transformer's arange has a device argument"
    moved = to_device(ga.module, "meta")
    for n in moved.graph.nodes:
        if n.op == "call_function" and "device" in n.kwargs:
            assert n.kwargs["device"] == torch.device("meta")
    results = replay(root / "tiny_transformer", device="meta")
    assert all(r.status == "ran" for r in results), [(r.kind, r.error) for r in results]


def test_replay_cli_prints_each_graph_and_bench(quickstart_run):
    root, _ = quickstart_run
    r = CliRunner().invoke(main, ["replay", str(root / "mlp"), "--bench", "3", "--chain"])
    assert r.exit_code == 0, r.output
    for k in KINDS + ["chain"]:
        assert re.search(rf"^{k} +match ", r.output, re.M), k
    assert "median of 3" in r.output and "eager model" in r.output
    r = CliRunner().invoke(main, ["replay", str(root / "mlp" / "mlp_backward_0"), "--json"])
    data = json.loads(r.output)
    assert r.exit_code == 0 and [g["kind"] for g in data["graphs"]] == ["backward"]


# --- hostile artefacts -------------------------------------------------------------------


def test_graph_json_naming_os_system_is_refused(copy_of, tmp_path):
    folder = copy_of("mlp")
    marker = tmp_path / "pwned"
    gj = folder / "mlp_inference_0" / "graph.json"
    data = json.loads(gj.read_text())
    data["nodes"].insert(1, {"name": "evil", "op": "call_function", "target": "os.system",
                             "args": [f"touch {marker}"], "kwargs": {}})
    gj.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="os.system"):
        aotpipe.load(folder)
    r = CliRunner().invoke(main, ["replay", str(folder)])
    assert r.exit_code == 2 and "os.system" in r.output and "Traceback" not in r.output
    assert not marker.exists()


def test_graph_json_naming_builtins_eval_is_refused(copy_of):
    folder = copy_of("mlp")
    gj = folder / "mlp_forward_0" / "graph.json"
    data = json.loads(gj.read_text())
    op = next(n for n in data["nodes"] if n["op"] == "call_function")
    op["target"] = "builtins.eval"
    gj.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="builtins.eval"):
        aotpipe.load(folder)


def test_changed_blob_is_refused(copy_of):
    folder = copy_of("mlp")
    # a stored input every replay reads (evidence blobs are read only where bits differ)
    storages = json.loads((folder / "mlp_inference_0" / "inputs.json").read_text())["storages"]
    blob = folder / "blobs" / f"{next(s['blob'] for s in storages if s['blob'])}.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="do not match its hash"):
        for r in replay(folder):
            pass


def test_newer_manifest_version_is_refused(copy_of):
    folder = copy_of("mlp")
    m = json.loads((folder / "manifest.json").read_text())
    m["format_version"] = 5
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="format version 5; this aotpipe reads versions 1, 2, 3, 4; upgrade"):
        aotpipe.load(folder)


# --- run records verification; ls and show -------------------------------------------------


def test_run_records_verification_in_manifest_and_report(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        v = json.loads((root / m / "manifest.json").read_text())["verification"]
        assert {k: v[k]["status"] for k in KINDS} == {k: "recorded" for k in KINDS}
        assert v["chain"]["status"] == "match"
    assert "5 graphs recorded, chain match" in (root / "report.md").read_text()


def test_ls_and_show(quickstart_run):
    root, _ = quickstart_run
    r = CliRunner().invoke(main, ["ls", str(root.parent)])
    assert r.exit_code == 0
    for m in MODELS:
        assert f"quickstart/{m}" in r.output
    assert r.output.count("verified") == 4
    r = CliRunner().invoke(main, ["show", str(root / "small_cnn")])
    assert r.exit_code == 0
    assert "small_cnn_inference_0: inference graph" in r.output
    assert "convolution.default x2" in r.output and "partition: 6 mutated" in r.output


def test_duplicated_outputs_are_recorded_and_re_expanded(tmp_path):
    (tmp_path / "dup.py").write_text(textwrap.dedent("""
        import torch
        class Dup(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 3)
            def forward(self, x):
                y = self.fc(x)
                return y, y, x
        def dup():
            return Dup()
    """))
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: d
        models: [{name: dup, source: dup:dup, inputs: [{shape: [2, 3]}], graphs: [inference]}]
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    folder = tmp_path / "out" / "d" / "dup"
    rec = json.loads((folder / "dup_inference_0" / "inputs.json").read_text())
    outs = rec["outputs"]
    assert outs[1]["same_as"] == 0 and outs[2]["same_as_input"] is not None
    (res,) = replay(folder)
    assert res.status == "match"
    ref = aotpipe.load(folder).graphs["inference"].expected_outputs()
    assert ref[1] is ref[0] and ref[0].digest is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_capture_replays_on_cuda_within_tolerance(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        for r in replay(root / m, device="cuda"):
            assert r.status == "close", (m, r.kind, r.error, r.mismatches)
