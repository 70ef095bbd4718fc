"""The pass manager: each pass verified against the graph before it; failures named."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

import aotpipe.passes as passes
from aotpipe.cli import main
from aotpipe.models import zoo
from aotpipe.passes import parse_pass_entry
from aotpipe.passes.base import PassError, PassResult, constant_value
from aotpipe.passes.manager import run_chain
from aotpipe.runtime.execution import run_graph
from aotpipe.spec import PassStep
from tests.passes.helpers import graph_of

CONV = torch.ops.aten.convolution.default


def _corrupt_conv_weights(g, options):
    """A broken pass: scales every convolution weight constant."""
    for n in g.gm.graph.nodes:
        if n.op == "call_function" and n.target is CONV:
            w = constant_value(g.gm, n.args[1])
            g.gm.register_buffer(n.args[1].target, w * 1.5)
    return PassResult(g, modified=True)


def _raises(g, options):
    raise RuntimeError("boom")


def _steps(*names):
    return [parse_pass_entry(n)[1] for n in names]


def test_chain_records_each_pass(tmp_path):
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    final, records = run_chain(g, _steps("freeze", "fold_conv_bn", "channels_last", "reinplace"))
    assert [r.name for r in records] == ["freeze", "fold_conv_bn", "channels_last", "reinplace"]
    assert records[0].nodes_before == len(g.gm.graph.nodes)
    assert all(a.nodes_after == b.nodes_before for a, b in zip(records, records[1:]))
    assert records[1].stats["conv_bn_folded"] == 2


def test_every_node_a_pass_makes_gets_the_layout_of_its_value(tmp_path):
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    final, _ = run_chain(g, _steps("freeze", "fold_conv_bn", "channels_last", "reinplace"))
    made = [n for n in final.gm.graph.nodes if n.op == "call_function" and n.name.endswith("_default")]
    assert made  # fold_conv_bn's new convolutions
    values = {}

    class Seen(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = v = super().run_node(n)
            return v

    Seen(final.gm).run(*final.values)
    for n in final.gm.graph.nodes:
        if n.op == "call_function" and isinstance(values[n.name], torch.Tensor):
            val, real = n.meta.get("val"), values[n.name]
            assert val is not None, n.name
            assert (tuple(val.shape), val.stride(), val.storage_offset(), val.dtype) == (
                tuple(real.shape), real.stride(), real.storage_offset(), real.dtype), n.name


def test_pass_that_changes_results_is_named_with_first_diverging_node(monkeypatch):
    info = dataclasses.replace(passes.PASSES["fold_conv_bn"], fn=_corrupt_conv_weights)
    monkeypatch.setitem(passes.PASSES, "fold_conv_bn", info)
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    with pytest.raises(PassError) as e:
        run_chain(g, _steps("freeze", "fold_conv_bn"))
    msg = str(e.value)
    assert "pass 'fold_conv_bn' (passes before it: freeze) changed the results" in msg
    assert "first diverging node: _const_conv1_weight" in msg  # the corrupted constant itself


def test_pass_that_raises_is_named_with_those_before_it(monkeypatch):
    monkeypatch.setitem(passes.PASSES, "channels_last", dataclasses.replace(passes.PASSES["channels_last"], fn=_raises))
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    with pytest.raises(PassError, match=r"pass 'channels_last' \(passes before it: freeze, fold_conv_bn\) failed: "
                                        r"RuntimeError: boom"):
        run_chain(g, _steps("freeze", "fold_conv_bn", "channels_last"))


def test_pass_on_a_kind_it_cannot_take_is_refused():
    g = graph_of(zoo.mlp(in_features=4), torch.randn(2, 4), kind="forward")
    with pytest.raises(PassError, match="cannot take a forward graph"):
        run_chain(g, [PassStep("freeze", passes.FreezeOptions())])


def test_failing_chain_fails_the_model_but_keeps_raw_graphs_and_goes_on(monkeypatch, tmp_path):
    info = dataclasses.replace(passes.PASSES["fold_conv_bn"], fn=_corrupt_conv_weights)
    monkeypatch.setitem(passes.PASSES, "fold_conv_bn", info)
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent("""
        version: 1
        name: broken
        defaults: {passes: [freeze, fold_conv_bn]}
        models:
          - {name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}]}
          - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 4}, inputs: [{shape: [2, 4]}]}
    """))
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--no-progress", "--json",
                                  "--executor", "local"])  # patched in this process
    assert r.exit_code == 1
    run = json.loads(r.output)
    cnn, mlp = run["models"]
    assert (cnn["status"], cnn["stage"]) == ("failed", "passes")
    assert "first diverging node" in cnn["error"] and "fold_conv_bn" in cnn["error"]
    assert mlp["status"] == "ok" and "inference.freeze+fold_conv_bn" in {g["kind"] for g in mlp["graphs"]}
    root = tmp_path / "out" / "broken"
    manifest = json.loads((root / "cnn" / "manifest.json").read_text())
    assert set(manifest["graphs"]) == {"inference", "forward", "backward", "joint"}
    assert all(v["status"] in ("recorded", "match") for v in manifest["verification"].values())
    assert manifest["pass_failures"] and "fold_conv_bn" in manifest["pass_failures"][0]


def test_optimised_graph_loads_and_runs_without_inductor(quickstart_run):
    root, _ = quickstart_run
    code = textwrap.dedent(f"""
        import sys
        import aotpipe
        from aotpipe.replay import replay
        art = aotpipe.load({str(root / 'small_cnn')!r})
        assert all(g.module is not None for g in art.graphs.values())
        # Loading needs no inductor (the fake-tensor check before a run imports it, as torch's
        # FakeTensorMode does; the graph itself calls no op inductor registers).
        assert "torch._inductor" not in sys.modules, "inductor was imported"
        results = replay(art)
        assert all(r.status == "match" for r in results), [(r.kind, r.status) for r in results]
        assert any(r.kind.startswith("inference.") for r in results)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_small_cnn_optimised_graph_has_no_batch_norm_and_channels_last_weights(quickstart_run):
    from aotpipe.artifact.load import load

    root, _ = quickstart_run
    art = load(root / "small_cnn")
    (key,) = [k for k in art.graphs if k.startswith("inference.")]
    gm = art.graphs[key].module
    assert not [n for n in gm.graph.nodes if "batch_norm" in str(n.target)]
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is CONV]
    assert len(convs) == 2
    for c in convs:
        w = constant_value(gm, c.args[1])
        assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()


def test_folded_constants_are_stored_once(quickstart_run):
    root, _ = quickstart_run
    model = root / "tiny_transformer"
    refs = []
    for gj in model.rglob("graph.json"):
        refs += [n["blob"] for n in json.loads(gj.read_text())["nodes"] if n["op"] == "get_attr"]
    for ij in model.rglob("inputs.json"):
        rec = json.loads(ij.read_text())
        refs += [s["blob"] for s in rec["storages"] if s["blob"]] + [o["blob"] for o in rec["outputs"] if o["blob"]]
        refs += [o["evidence"]["blob"] for o in rec["outputs"] if o.get("evidence")]  # replay's evidence samples
    blobs = {p.stem for p in (model / "blobs").iterdir()}
    assert set(refs) == blobs
    assert len(refs) > len(blobs)  # weights shared by the raw graphs' inputs and the frozen graph's constants


@pytest.fixture(scope="module")
def cnn_graph():
    return graph_of(zoo.small_cnn(channels=4), torch.randn(1, 3, 8, 8))


def _chain_leaving_out(cnn_graph, monkeypatch, failing, names):
    """run_chain_leaving_out over `names`, the passes in `failing` made to raise; the graph it
    started from (each pass works on a copy: the fixture is never changed)."""
    from aotpipe.passes.manager import run_chain_leaving_out

    for name in failing:
        monkeypatch.setitem(passes.PASSES, name, dataclasses.replace(passes.PASSES[name], fn=_raises))
    return cnn_graph, run_chain_leaving_out(cnn_graph, _steps(*names), "inference")


def test_a_run_leaves_out_an_optional_pass_that_raises_and_goes_on_from_the_graph_before_it(cnn_graph, monkeypatch):
    g, (final, records, ran, left) = _chain_leaving_out(cnn_graph, monkeypatch, ["channels_last"],
                                                        ["freeze", "fold_conv_bn", "channels_last", "reinplace"])
    assert [r.name for r in records] == [s.name for s in ran] == ["freeze", "fold_conv_bn", "reinplace"]
    (lo,) = left
    assert lo.record.model_dump() == {
        "graph": "inference", "name": "channels_last", "left_out": [], "chain": "freeze+fold_conv_bn+reinplace",
        "error": "pass 'channels_last' (passes before it: freeze, fold_conv_bn) failed: RuntimeError: boom"}
    assert 'raise RuntimeError("boom")' in lo.traceback  # the pass's own frame, for -v
    assert not [n for n in final.gm.graph.nodes if "batch_norm" in str(n.target)]  # the passes after it ran
    torch.testing.assert_close(run_graph(final.gm, final.values), run_graph(g.gm, g.values))


def test_a_run_leaves_out_the_passes_that_need_a_failed_one(cnn_graph, monkeypatch):
    _, (final, records, ran, left) = _chain_leaving_out(cnn_graph, monkeypatch, ["freeze"],
                                                        ["freeze", "fold_conv_bn", "channels_last", "reinplace"])
    assert [s.name for s in ran] == ["reinplace"]
    assert [(lo.record.name, lo.record.left_out, lo.record.chain) for lo in left] == [
        ("freeze", ["fold_conv_bn", "channels_last"], "reinplace")]


def test_a_run_leaves_out_nothing_when_no_pass_fails(cnn_graph, monkeypatch):
    _, (final, records, ran, left) = _chain_leaving_out(cnn_graph, monkeypatch, [], ["freeze", "reinplace"])
    assert [s.name for s in ran] == ["freeze", "reinplace"] and left == []


def test_a_pass_that_half_changed_the_graph_before_failing_leaves_nothing_behind(cnn_graph, monkeypatch):
    def half_then_raise(g, options):
        g.gm.graph.erase_node(next(n for n in reversed(g.gm.graph.nodes) if n.op == "output"))
        raise RuntimeError("half-way")

    monkeypatch.setitem(passes.PASSES, "reinplace", dataclasses.replace(passes.PASSES["reinplace"], fn=half_then_raise))
    g, (final, records, ran, left) = _chain_leaving_out(cnn_graph, monkeypatch, [], ["freeze", "reinplace"])
    assert [s.name for s in ran] == ["freeze"] and left[0].record.name == "reinplace"
    final.gm.graph.lint()
    torch.testing.assert_close(run_graph(final.gm, final.values), run_graph(g.gm, g.values))


def test_a_required_pass_that_raises_still_raises_in_a_run(cnn_graph, monkeypatch):
    assert not passes.PASSES["to_device"].optional
    with pytest.raises(PassError, match=r"pass 'to_device' \(passes before it: freeze\) failed: RuntimeError: boom"):
        _chain_leaving_out(cnn_graph, monkeypatch, ["to_device"], ["freeze", "to_device"])
