"""End to end through the real CLI: `aotpipe run` on the quickstart and on failing input."""

import hashlib
import json
import textwrap

import torch
from click.testing import CliRunner

from aotpipe.cli import main

KINDS = ["inference", "forward", "backward", "joint"]
CHAIN = "freeze+fold_conv_bn+channels_last+reinplace"  # quickstart's pass chain, on inference graphs
OPTIMISED = f"inference.{CHAIN}"
MODELS = ["mlp", "small_cnn", "tiny_transformer", "running_norm"]


def test_quickstart_writes_every_graph_kind_with_its_files(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        for k in KINDS + [OPTIMISED]:
            d = root / m / f"{m}_{k}_0" if k in KINDS else root / m / f"{m}_inference_0.{CHAIN}"
            assert sorted(p.name for p in d.iterdir()) == sorted(
                ["module.py", "graph.json", "inputs.json", "trace.json", f"{d.name}.input"]
            ), d
        assert (root / m / "manifest.json").is_file()
    assert (root / "run.json").is_file() and (root / "report.md").is_file()
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "temporary folders left behind"


def test_manifest_lists_every_file_with_its_sha256(quickstart_run):
    root, _ = quickstart_run
    for m in MODELS:
        manifest = json.loads((root / m / "manifest.json").read_text())
        assert manifest["format_version"] == 4
        assert manifest["versions"]["torch"] == torch.__version__
        assert manifest["model"]["name"] == m and manifest["model"]["source"] == f"aotpipe.zoo:{m}"
        on_disk = {p.relative_to(root / m).as_posix() for p in (root / m).rglob("*") if p.is_file()}
        assert set(manifest["files"]) == on_disk - {"manifest.json"}
        for rel, digest in manifest["files"].items():
            assert hashlib.sha256((root / m / rel).read_bytes()).hexdigest() == digest
        assert set(manifest["graphs"]) == set(KINDS) | {OPTIMISED}
        assert manifest["graphs"][OPTIMISED]["base"] == "inference"
        assert [p["name"] for p in manifest["graphs"][OPTIMISED]["passes"]] == CHAIN.split("+")
        assert len(manifest["fingerprint"]) == 64


def test_torch_get_inputs_reads_every_non_joint_input_file(quickstart_run):
    from torch._functorch.compilers import get_inputs

    root, _ = quickstart_run
    files = sorted(p for p in root.rglob("*.input") if "_joint_" not in p.name)
    assert len(files) == len(MODELS) * 4  # inference, forward, backward, optimised inference
    for f in files:
        inputs = get_inputs(str(f))
        meta = json.loads((f.parent / "inputs.json").read_text())["inputs"]
        assert [list(t.shape) for t in inputs] == [m["shape"] for m in meta], f


def test_joint_input_file_is_nested_primals_tangents(quickstart_run):
    from aotpipe.artifact import input_meta

    root, _ = quickstart_run
    meta = input_meta.read(root / "mlp" / "mlp_joint_0" / "mlp_joint_0.input")
    assert len(meta) == 2 and len(meta[1]) == 1  # one tangent: the scalar loss
    assert meta[1][0][1] == torch.Size([])


def test_graph_json_rebuilds_every_graph(quickstart_run):
    from aotpipe.artifact.load import load

    root, _ = quickstart_run
    for m in MODELS:
        art = load(root / m)
        assert set(art.graphs) == set(KINDS) | {OPTIMISED}
        for ga in art.graphs.values():
            data = json.loads((ga.folder / "graph.json").read_text())
            assert len(ga.module.graph.nodes) == len(data["nodes"])


def test_module_py_imports_and_has_shape_annotations(quickstart_run):
    import importlib.util

    root, _ = quickstart_run
    path = root / "small_cnn" / "small_cnn_inference_0" / "module.py"
    text = path.read_text()
    assert 'f32[8, 3, 32, 32]' in text
    assert str(root) not in text and "/home/" not in text and "/work/" not in text
    spec = importlib.util.spec_from_file_location("qs_module", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.GraphModule().forward)


def test_partition_contract_saved_with_forward_and_backward(quickstart_run):
    root, _ = quickstart_run
    fw = json.loads((root / "small_cnn" / "small_cnn_forward_0" / "inputs.json").read_text())
    bw = json.loads((root / "small_cnn" / "small_cnn_backward_0" / "inputs.json").read_text())
    assert fw["partition"] == bw["partition"]
    c = fw["partition"]
    assert c["num_mutated_inputs"] == 6 and c["num_user_outputs"] == 1
    assert len(fw["outputs"]) == c["num_mutated_inputs"] + c["num_user_outputs"] + c["num_saved_tensors"]
    assert len(bw["inputs"]) == c["num_saved_tensors"] + c["num_saved_symints"] + c["num_tangents"]
    assert len(c["grad_of"]) == len(fw["inputs"])
    roles = {i["role"] for i in fw["inputs"]}
    assert roles == {"param", "buffer", "user"}


def test_inputs_json_records_roles_and_integer_ranges(quickstart_run):
    root, _ = quickstart_run
    rec = json.loads((root / "tiny_transformer" / "tiny_transformer_inference_0" / "inputs.json").read_text())
    user = {i["target"]: i for i in rec["inputs"] if i["role"] == "user"}
    assert user["input_ids"]["range"] == [0, 1000]  # the embedding's size
    assert user["attention_mask"]["range"] == [1, 2]  # as the YAML says
    params = [i for i in rec["inputs"] if i["role"] == "param"]
    assert params and all(i["range"] is None for i in params)


def test_report_and_run_json_give_status_nodes_seconds_bytes(quickstart_run):
    root, result = quickstart_run
    run = json.loads((root / "run.json").read_text())
    assert run["ok"] is True and run["summary"] == {
        "models": 4, "ok": 4, "partial": 0, "up_to_date": 0, "kept": 0, "failed": 0, "graphs": 20,
        "bytes": run["summary"]["bytes"],
        "checks": run["summary"]["checks"]}
    settled = run["summary"]["checks"]  # how many go past the floor may depend on the CPU
    assert (settled["run"], settled["skipped"], settled["exact"]) == (70, 0, 5)
    assert settled["floor"] + settled["fp64"] == 65
    for m in run["models"]:
        assert m["status"] == "ok" and m["capture_seconds"] > 0 and m["bytes"] > 0
        assert {g["kind"] for g in m["graphs"]} == set(KINDS) | {OPTIMISED}
        assert all(g["nodes"] > 0 for g in m["graphs"])
    report = (root / "report.md").read_text()
    for m in MODELS:
        assert f"| {m} | ok |" in report
    assert "4/4 models ok" in result.output


def _write(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_failing_model_is_recorded_and_the_others_go_on(tmp_path):
    (tmp_path / "badmodels.py").write_text(textwrap.dedent("""
        import torch
        class Branchy(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x * 2
                return x
        def branchy():
            return Branchy()
        def explodes():
            raise RuntimeError("no weights for you")
    """))
    p = _write(tmp_path, """
        version: 1
        name: mixed
        models:
          - {name: branchy, source: badmodels:branchy, mode: export, inputs: [{shape: [3]}]}  # auto would capture it
          - {name: explodes, source: badmodels:explodes, inputs: [{shape: [3]}]}
          - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 4}, inputs: [{shape: [2, 4]}], graphs: [inference]}
    """)
    r = CliRunner().invoke(main, ["run", str(p), "--output", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 1, r.output
    run = json.loads((tmp_path / "out" / "mixed" / "run.json").read_text())
    status = {m["name"]: (m["status"], m["stage"]) for m in run["models"]}
    assert status == {"branchy": ("failed", "capture"), "explodes": ("failed", "source"), "mlp": ("ok", None)}
    assert "no weights for you" in [m for m in run["models"] if m["name"] == "explodes"][0]["error"]
    assert (tmp_path / "out" / "mixed" / "mlp" / "mlp_inference_0").is_dir()
    assert not (tmp_path / "out" / "mixed" / "branchy").exists()
    report = (tmp_path / "out" / "mixed" / "report.md").read_text()
    assert "## Failures" in report and "branchy" in report


def test_bad_pipeline_exits_2_with_one_line_per_error_and_no_traceback(tmp_path):
    p = _write(tmp_path, """
        version: 1
        name: bad
        models:
          - {name: a, source: aotpipe.zoo:mlp, inputs: [{shape: [2, 32], dtype: flaot32}]}
    """)
    r = CliRunner().invoke(main, ["run", str(p), "--output", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert f"{p}:5: models[0].inputs[0].dtype: unknown dtype 'flaot32'" in r.output
    assert not (tmp_path / "out").exists()


def test_only_runs_the_named_models_and_graphs_selects_kinds(tmp_path):
    p = _write(tmp_path, """
        version: 1
        name: sel
        defaults: {graphs: [forward, backward]}
        models:
          - {name: a, source: aotpipe.zoo:mlp, args: {in_features: 4}, inputs: [{shape: [2, 4]}]}
          - {name: b, source: aotpipe.zoo:mlp, args: {in_features: 4}, inputs: [{shape: [2, 4]}]}
    """)
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--only", "b", "--json"])
    assert r.exit_code == 0, r.output
    run = json.loads(r.output)
    assert [m["name"] for m in run["models"]] == ["b"]
    root = tmp_path / "out" / "sel"
    assert sorted(d.name for d in (root / "b").iterdir() if d.is_dir()) == ["b_backward_0", "b_forward_0", "blobs"]
    assert not (root / "a").exists()
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--only", "zzz"])
    assert r.exit_code == 2 and "no model named 'zzz'" in r.output


def test_module_callable_source_beside_the_pipeline_file(tmp_path):
    (tmp_path / "mymodel.py").write_text("import torch\ndef build(n):\n    return torch.nn.Linear(n, 2)\n")
    p = _write(tmp_path, """
        version: 1
        name: local
        models:
          - {name: lin, source: mymodel:build, args: {n: 3}, inputs: [{shape: [1, 3]}]}
    """)
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out" / "local" / "lin" / "manifest.json").read_text())
    assert manifest["model"]["args"] == {"n": 3}


def test_run_missing_file_exits_2(tmp_path):
    r = CliRunner().invoke(main, ["run", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "no such file" in r.output
