""".pt2 interop: `aotpipe export-pt2` writes an artefact's inference graph as a torch.export
archive that torch.export.load reads and that matches the artefact's replay; `source: pt2:`
captures every graph kind from such an archive."""

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.runtime.execution import run_graph

CHAIN = "inference.freeze+fold_conv_bn+channels_last+reinplace"


def cli(*args, **kw):
    return CliRunner().invoke(main, list(map(str, args)), **kw)


def _replay_user_outputs(folder, key):
    """The artefact's own graph run on its saved inputs (as replay runs it): the user outputs."""
    ga = aotpipe.load(folder).graphs[key]
    outs = run_graph(ga.module, ga.saved_inputs())
    user = [i for i, o in enumerate(ga.record.outputs) if o.role == "user"]
    user_inputs = [v for v, r in zip(ga.saved_inputs(), ga.record.inputs) if r.role == "user"]
    return [outs[i] for i in user], user_inputs


@pytest.mark.parametrize("model,key", [("mlp", "inference"), ("running_norm", "inference"), ("small_cnn", CHAIN)])
def test_export_pt2_loads_with_torch_export_and_matches_the_artefacts_replay(quickstart_run, tmp_path, model, key):
    root, _ = quickstart_run
    out = tmp_path / f"{model}.pt2"
    r = cli("export-pt2", root / model, "-o", out, "--graph", key)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"wrote {out}: {key} graph, 1 inputs, 1 outputs") and r.output.rstrip().endswith(
        "outputs vs the artefact's graph: identical")
    ep = torch.export.load(str(out))
    expected, user_inputs = _replay_user_outputs(root / model, key)
    got = ep.module()(*user_inputs)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    if model == "running_norm":  # its inference graph updates two buffers: they stay buffers, mutated
        assert len(ep.graph_signature.buffers_to_mutate) == 2
    if key == "inference":  # the same ops as the artefact's graph; parameters keep their recorded names
        ops = sorted(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
        ga = aotpipe.load(root / model).graphs[key]
        assert ops == sorted(str(n.target) for n in ga.structure.graph.nodes if n.op == "call_function")
        assert set(ep.graph_signature.parameters) == {
            i.target for i in aotpipe.load(root / model).graphs[key].record.inputs if i.role == "param"}


def test_export_pt2_says_when_the_loaded_program_differs(quickstart_run, tmp_path, monkeypatch):
    root, _ = quickstart_run
    real = torch.export.load

    class Off:  # a loaded program whose output is 1e-3 off: the check must see it
        def __init__(self, ep):
            self.ep = ep

        def module(self):
            m = self.ep.module()
            return lambda *a: m(*a)[0] + 1e-3

    monkeypatch.setattr(torch.export, "load", lambda *a, **k: Off(real(*a, **k)))
    r = cli("export-pt2", root / "mlp", "-o", tmp_path / "m.pt2")
    assert r.exit_code == 1
    assert "outputs vs the artefact's graph: max abs difference 0.001" in r.output


def test_export_pt2_refuses_an_unsigned_artefact_without_trust(quickstart_run, tmp_path, monkeypatch):
    root, _ = quickstart_run
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")
    r = cli("export-pt2", root / "mlp", "-o", tmp_path / "m.pt2")
    assert r.exit_code == 2 and not (tmp_path / "m.pt2").exists()
    assert r.output == ("error: not exported (export-pt2 runs the graph in this process, and the artefact is not "
                        f"signed by a key you trust): {root / 'mlp'}: not signed (made elsewhere, or before aotpipe "
                        "signed what it writes); aotpipe trust add its maker's public key, or aotpipe sign it "
                        "yourself; or --no-sandbox if you otherwise trust it\n")


def test_export_pt2_exports_a_signed_artefact_and_refuses_a_tampered_one(mlp_copy, tmp_path, monkeypatch):
    from aotpipe.trust.verify import sign_artifact

    monkeypatch.delenv("AOTPIPE_NO_SANDBOX")
    key = tmp_path / "secret.key"
    key.write_bytes(bytes(range(64)))
    sign_artifact(mlp_copy, f"hmac:{key}")
    r = cli("export-pt2", mlp_copy, "-o", tmp_path / "m.pt2", "--key", f"hmac:{key}")
    assert r.exit_code == 0, r.output
    g = mlp_copy / "mlp_inference_0" / "graph.json"
    g.write_text(g.read_text().replace("aten.relu.default", "aten.neg.default", 1))
    r = cli("export-pt2", mlp_copy, "-o", tmp_path / "t.pt2", "--key", f"hmac:{key}")
    assert r.exit_code == 2 and "not signed by" in r.output and "graph.json" in r.output
    assert not (tmp_path / "t.pt2").exists()


def test_export_pt2_takes_inference_graphs_only(quickstart_run, tmp_path):
    root, _ = quickstart_run
    r = cli("export-pt2", root / "mlp", "-o", tmp_path / "m.pt2", "--graph", "forward")
    assert r.exit_code == 2
    assert r.output.startswith(f"error: {root / 'mlp'}: graph 'forward' is not an inference graph; export-pt2 "
                               "writes inference graphs")


@pytest.fixture()
def mlp_pt2(quickstart_run, tmp_path):
    root, _ = quickstart_run
    out = tmp_path / "models" / "mlp.pt2"
    out.parent.mkdir()
    assert cli("export-pt2", root / "mlp", "-o", out).exit_code == 0
    return out


PIPELINE = textwrap.dedent("""
    version: 1
    name: frompt2
    output: out
    executor: {kind: local}
    defaults: {mode: export, graphs: [inference, forward, backward, joint], save_inputs: true, verify: true}
    models:
      - name: mlp
        source: pt2:models/mlp.pt2
        inputs: [{shape: [8, 32], dtype: float32}]
""")


def test_a_pt2_source_is_validated_and_built_with_its_weights(mlp_pt2, quickstart_run, tmp_path):
    from aotpipe.models.sources import build_model
    from aotpipe.pipeline.config import load_pipeline

    (tmp_path / "p.yaml").write_text(PIPELINE)
    r = cli("validate", tmp_path / "p.yaml")
    assert r.exit_code == 0, r.output
    model = build_model(load_pipeline(tmp_path / "p.yaml").models[0], tmp_path)
    expected, user_inputs = _replay_user_outputs(quickstart_run[0] / "mlp", "inference")
    torch.testing.assert_close(model.eval()(*user_inputs)[0], expected[0], rtol=0, atol=0)
    assert all(p.requires_grad for p in model.parameters())  # trainable: forward, backward and joint need it
    (tmp_path / "p.yaml").write_text(PIPELINE.replace("models/mlp.pt2", "models/gone.pt2"))
    r = cli("validate", tmp_path / "p.yaml")
    assert r.exit_code == 2
    assert f"models[0].source: source 'pt2:models/gone.pt2': no file {tmp_path / 'models' / 'gone.pt2'}" in r.output


@pytest.mark.slow
def test_a_pt2_source_captures_all_four_graph_kinds(mlp_pt2, tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    run = ("run", tmp_path / "p.yaml", "--no-progress", "-o", tmp_path / "out")
    r = cli(*run)
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "out" / "frompt2" / "mlp" / "manifest.json").read_text())
    assert {"inference", "forward", "backward", "joint"} <= set(man["graphs"])
    assert man["checks"]["failed"] == 0 and man["checks"]["run"] > 0
    # The archive is the source's code: another archive, another fingerprint (redone, not kept).
    assert "kept" in cli(*run).output
    mlp_pt2.write_bytes(mlp_pt2.read_bytes() + b"\0")  # a zip archive still reads with a byte appended
    r = cli(*run)
    assert r.exit_code == 0 and "kept" not in r.output, r.output


@pytest.mark.slow
def test_aoti_packages_the_exported_program(mlp_pt2, quickstart_run, tmp_path):
    ep = torch.export.load(str(mlp_pt2))
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "mlp_aoti.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    expected, user_inputs = _replay_user_outputs(quickstart_run[0] / "mlp", "inference")
    got = runner(*user_inputs)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, expected[0])
