"""The cpu-fast chain: layout propagation, the named chain in the YAML, its graphs through
write, load (no torch._inductor) and replay, and the allow-list entries its ops need."""

import json
import subprocess
import sys

import pytest
import torch

from aotpipe.artifact.ops import STRING_ARG_VALUES, resolve_op
from aotpipe.errors import ArtifactError, ConfigError
from aotpipe.format.records import library_namespace_problem
from aotpipe.models import zoo
from aotpipe.passes import CHAINS
from aotpipe.passes.base import tensor_facts
from aotpipe.pipeline.config import load_pipeline
from tests.helpers.pipelines import run_yaml
from tests.passes.helpers import apply, assert_same_results, graph_of

CONV = torch.ops.aten.convolution.default


def _conv_inputs_channels_last(g):
    facts = tensor_facts(g.gm, g.values)
    return [facts[n.args[0].name].channels_last for n in g.gm.graph.nodes
            if n.op == "call_function" and n.target is CONV]


def test_layout_propagation_converts_the_image_once():
    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    frozen = apply("freeze", g).graph
    plain = apply("channels_last", frozen)
    assert plain.stats["activations_converted"] == 0
    assert _conv_inputs_channels_last(plain.graph) == [False, True]  # the image stays NCHW
    r = apply("channels_last", frozen, activations=True)
    assert r.stats["activations_converted"] == 1
    assert _conv_inputs_channels_last(r.graph) == [True, True]
    assert_same_results(g, r.graph)


def test_layout_propagation_leaves_a_graph_without_convolutions():
    g = graph_of(zoo.mlp(in_features=4, hidden=8, depth=1), torch.randn(2, 4))
    assert not apply("channels_last", apply("freeze", g).graph, activations=True).modified


def _yaml(passes, graphs="[inference]"):
    return f"""
version: 1
name: fast
output: out
seed: 0
defaults: {{graphs: {graphs}, passes: {passes}}}
models:
  - name: small_cnn
    source: aotpipe.zoo:small_cnn
    args: {{channels: 8}}
    inputs: [{{shape: [2, 3, 16, 16]}}]
  - name: attention
    source: tests.passes.test_cpu_fast:attention_model
    inputs:
      - {{shape: [2, 6, 16]}}
      - {{shape: [2, 1, 6, 6]}}
  - name: patches
    source: tests.passes.test_cpu_fast:patch_model
    inputs: [{{shape: [2, 3, 16, 16]}}]
  - name: residual
    source: tests.passes.test_cpu_fast:residual_model
    inputs: [{{shape: [2, 3, 16, 16]}}]
"""


class _Residual(torch.nn.Module):
    """A stem and two residual blocks: oneDNN's binary convolution, the second adding into
    the first's sum once loaded (artifact/prepack.py)."""

    def __init__(self):
        super().__init__()
        conv = lambda: torch.nn.Conv2d(8, 8, 3, padding=1)  # noqa: E731
        self.stem, self.a, self.b, self.c, self.d = torch.nn.Conv2d(3, 8, 3, padding=1), conv(), conv(), conv(), conv()

    def forward(self, x):
        r = torch.relu(self.stem(x))
        y = torch.relu(self.b(torch.relu(self.a(r))) + r)
        return torch.relu(self.d(torch.relu(self.c(y))) + y)


def residual_model():
    return _Residual()


def patch_model():
    """A ViT's patch embedding: one convolution on the image, flattened."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.Flatten(2), torch.nn.Linear(16, 4))


def attention_model():
    from tests.passes.test_sdpa import _Attention

    return _Attention("sdpa")


def test_named_chain_expands_in_the_pipeline(tmp_path):
    (tmp_path / "p.yaml").write_text(_yaml("cpu-fast"))
    spec = load_pipeline(tmp_path / "p.yaml").models[0]
    assert [p.name for p in spec.passes] == [e if isinstance(e, str) else next(iter(e)) for e in CHAINS["cpu-fast"]]
    assert {"name": "channels_last", "options": {"activations": True, "graphs": ["inference"]}} in spec.to_json()["passes"]


def test_an_unknown_chain_names_the_field_and_the_choices(tmp_path):
    (tmp_path / "p.yaml").write_text(_yaml("cpu-fastest"))
    with pytest.raises(ConfigError) as e:
        load_pipeline(tmp_path / "p.yaml")
    msg = str(e.value)
    assert "defaults.passes" in msg and "cpu-fastest" in msg and "cpu-fast" in msg and "p.yaml:" in msg


def test_cpu_fast_graphs_are_checked_written_loaded_and_replayed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    result, out = run_yaml(tmp_path, _yaml("cpu-fast"))
    assert result.exit_code == 0, result.output
    root = out / "fast"
    for model, op in (("small_cnn", "mkldnn._convolution_pointwise.default"),
                      ("attention", "aten.scaled_dot_product_attention.default"),
                      ("patches", "mkldnn._convolution_pointwise.default"),
                      ("residual", "mkldnn._convolution_pointwise.binary")):
        manifest = json.loads((root / model / "manifest.json").read_text())
        (key,) = [k for k in manifest["graphs"] if k.startswith("inference.")]
        folder = root / model / manifest["graphs"][key]["folder"]
        targets = {n.get("target") for n in json.loads((folder / "graph.json").read_text())["nodes"]}
        assert op in targets, (model, sorted(t for t in targets if t))
    # verify rebuilds them (packing their weights) and checks module.py against graph.json;
    # show lists graph.json's ops
    from click.testing import CliRunner

    from aotpipe.cli import main

    verified = CliRunner().invoke(main, ["verify", str(root)])
    assert verified.exit_code == 0, verified.output
    shown = CliRunner().invoke(main, ["show", str(root / "small_cnn")])
    assert shown.exit_code == 0 and "mkldnn._convolution_pointwise" in shown.output, shown.output
    # A fresh process loads them without inductor, and replays them against the saved
    # outputs (the precheck's FakeTensorMode imports torch._dynamo, and inductor with it,
    # when it first runs: after loading).
    code = (
        "import sys\n"
        "import aotpipe\n"
        "from aotpipe.replay import replay\n"
        "arts = [aotpipe.load(" + repr(str(root)) + " + '/' + m).build_all()\n"
        "        for m in ('small_cnn', 'attention', 'patches', 'residual')]\n"
        "assert 'torch._inductor' not in sys.modules, 'inductor imported'\n"
        "for art in arts:\n"
        "    results = replay(art)\n"
        "    assert any(r.kind.startswith('inference.') for r in results)\n"
        "    assert all(r.status == 'match' and r.max_abs_error == 0.0 for r in results), results\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    # The command line too, in its sandbox: an artefact from disk is not of this run's own
    # capture, so the precheck runs the residual convolution on fake tensors (torch has no
    # fake kernel for it: the precheck's own, which holds the residual to the output's shape).
    replayed = CliRunner().invoke(main, ["replay", str(root / "residual")])
    assert replayed.exit_code == 0 and "match" in replayed.output, replayed.output


def test_the_onednn_ops_the_passes_emit_are_allowed():
    for name in STRING_ARG_VALUES:
        assert resolve_op(name) is not None


@pytest.mark.parametrize("name", [
    "mkldnn._convolution_pointwise_.binary",  # writes into its residual
    "mkldnn._reorder_convolution_weight.default",  # builds a blocked mkldnn tensor
    "mkldnn._linear_pointwise.default",  # not emitted
    "mkl._mkl_linear.default",  # reads a packed buffer it cannot check
    "onednn.qconv2d_pointwise.default",
])
def test_other_onednn_ops_are_refused(name):
    with pytest.raises(ArtifactError):
        resolve_op(name)


@pytest.mark.parametrize("ns", ["mkldnn", "mkl", "onednn"])
def test_onednn_namespaces_cannot_be_trusted_wholesale(ns):
    assert library_namespace_problem(ns) is not None


def _edit(folder, fn):
    path = folder / "graph.json"
    data = json.loads(path.read_text())
    for n in data["nodes"]:
        if n.get("target") == "mkldnn._convolution_pointwise.default":
            fn(n)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("attr", ["sum", "relu; import os", "x" * 100])
def test_a_string_argument_off_its_list_is_refused_at_load(tmp_path, attr):
    result, out = run_yaml(tmp_path, _yaml("cpu-fast").split("  - name: attention")[0])
    assert result.exit_code == 0, result.output
    model = out / "fast" / "small_cnn"
    manifest = json.loads((model / "manifest.json").read_text())
    (key,) = [k for k in manifest["graphs"] if k.startswith("inference.")]
    _edit(model / manifest["graphs"][key]["folder"], lambda n: n["args"].__setitem__(7, attr))
    import aotpipe

    with pytest.raises(ArtifactError, match="attr=.*is not allowed for mkldnn._convolution_pointwise.default"):
        aotpipe.load(model).build_all()


def test_a_pass_that_needs_freeze_before_it_is_a_config_error(tmp_path):
    (tmp_path / "p.yaml").write_text(_yaml("[mkldnn_fuse, freeze]"))
    with pytest.raises(ConfigError) as e:
        load_pipeline(tmp_path / "p.yaml")
    msg = str(e.value)
    assert "defaults.passes[0]" in msg and "pass 'mkldnn_fuse' needs 'freeze' before it" in msg


def test_run_chain_refuses_a_chain_out_of_order():
    from aotpipe.passes import parse_pass_entry
    from aotpipe.passes.base import PassError
    from aotpipe.passes.manager import run_chain

    g = graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))
    with pytest.raises(PassError, match="'fold_conv_bn' needs 'freeze' before it"):
        run_chain(g, [parse_pass_entry("fold_conv_bn")[1]])


def test_a_lone_convolution_on_the_input_is_left_alone():
    """A ViT's patch embedding: no convolution feeds another, so there is no activation to
    keep channels-last; the pass changes nothing and says why, in an integer stat (the
    manifest's typed records take numbers only)."""
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.Flatten(2))
    g = graph_of(conv, torch.randn(2, 3, 16, 16))
    r = apply("channels_last", apply("freeze", g).graph, activations=True)
    assert not r.modified and r.stats == {"weights_converted": 0, "convolutions_left_alone": 1}
    assert apply("channels_last", apply("freeze", g).graph).stats["weights_converted"] == 1


def test_a_cpu_fast_graph_is_refused_for_another_device():
    """replay --device cuda runs a graph through to_device: a graph of oneDNN ops has no CUDA
    kernels, so it is refused with one line naming what to run instead (no GPU needed)."""
    from aotpipe.runtime.devices import to_device

    g = apply("mkldnn_fuse", apply("freeze", graph_of(zoo.small_cnn(channels=4), torch.randn(2, 3, 8, 8))).graph)
    with pytest.raises(ValueError, match="runs on CPU only .*run its base graph on cuda"):
        to_device(g.graph.gm, "cuda")
    assert to_device(g.graph.gm, "cpu") is g.graph.gm


def _gelu_mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


_MLP = """
version: 1
name: fast
output: out
seed: 0
defaults: {graphs: [inference], passes: cpu-fast}
models:
  - name: mlp
    source: tests.passes.test_cpu_fast:_gelu_mlp
    inputs: [{shape: [4, 16]}]
"""


def _packed_targets(root):
    import aotpipe

    art = aotpipe.load(root / "mlp")
    (graph,) = [g for k, g in art.graphs.items() if k.startswith("inference.")]
    return art, {getattr(n.target, "__name__", str(n.target)) for n in graph.module.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("recorded", ["onednn", None])
def test_a_graph_is_packed_as_its_recorded_outputs_were_and_replays_bit_for_bit(tmp_path, monkeypatch, recorded):
    """environment.packing says how the loader packed the graph its outputs were recorded
    from; an artefact written before it was recorded (None) was packed with MKL's GEMM and
    nothing fused, and still is: both replay bit for bit on the machine that made them."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from aotpipe.runtime import determinism

    monkeypatch.setattr(determinism, "PACKING", recorded)  # None: a writer from before the field
    result, out = run_yaml(tmp_path, _MLP)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "fast" / "mlp" / "manifest.json").read_text())
    assert manifest["environment"].get("packing") == recorded
    monkeypatch.undo()  # the reader of today
    art, targets = _packed_targets(out / "fast")
    if recorded:
        assert "packed_linear" in targets and "mkl_packed_linear" not in targets
        assert not any("gelu" in t for t in targets)  # fused into the GEMM
    else:
        assert "mkl_packed_linear" in targets and "packed_linear" not in targets
        assert any("gelu" in t for t in targets)  # nothing fused at load then
    from click.testing import CliRunner

    from aotpipe.cli import main

    replayed = CliRunner().invoke(main, ["replay", str(out / "fast" / "mlp")])
    assert replayed.exit_code == 0 and "mismatch" not in replayed.output, replayed.output


def test_a_packing_this_aotpipe_does_not_know_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    result, out = run_yaml(tmp_path, _MLP)
    assert result.exit_code == 0, result.output
    path = out / "fast" / "mlp" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["environment"]["packing"] = "amx-2027"
    path.write_text(json.dumps(manifest))
    import aotpipe
    from aotpipe.errors import ArtifactError

    with pytest.raises(ArtifactError, match="packing weights as 'amx-2027', which this aotpipe does not know"):
        aotpipe.load(out / "fast" / "mlp", trust_code=False).build_all()
