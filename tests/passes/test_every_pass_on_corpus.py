"""Every registered pass, and the README's chain, over every graph of a corpus: each runs
and leaves the results as they were (run_chain checks each pass against the graph before it).

The quick test takes the inference graph of the model the issue was about (a GRU; its
training graphs hold ``aten.sub.Tensor(1, z)``, and tests/passes/test_scalar_args.py puts
such calls in an inference graph); the slow ones take every graph of the first-hour models (the quickstart's, an
embedding model of tests/test_first_hour.py, LSTM, GRU, RNN) and a sample of the torch corpus (pipelines/torch-ops.yaml,
pipelines/torch-modules.yaml): the scalar-first operators (``__rsub__``, ``__radd__``,
``rsub``, ``where`` ...), the recurrent modules, and every 60th other entry.
"""

import textwrap
from pathlib import Path

import pytest

from aotpipe.passes import PASSES, parse_pass_entry
from aotpipe.passes.base import GraphUnderPass, PassError
from aotpipe.passes.manager import run_chain
from aotpipe.pipeline.config import load_pipeline, parse_pipeline
from aotpipe.pipeline.job import ModelJob, _capture, _source
from aotpipe.pipeline.results import ModelResult
from aotpipe.spec.modes import capture_mode
from tests.test_first_hour import EMBEDDING_MODEL

ROOT = Path(__file__).resolve().parents[2]
README_CHAIN = ["freeze", "fold_conv_bn", "channels_last", "reinplace"]

FIRST_HOUR = textwrap.dedent("""\
    version: 1
    name: first-hour
    defaults: {mode: export, save_values: full}
    models:
      - {name: gru, source: "aotpipe.zoo:gru", args: {hidden: 4}, inputs: [{shape: [3, 2, 8]}]}
      - {name: gru2, source: "aotpipe.zoo:gru", args: {num_layers: 2, bidirectional: true, batch_first: true},
         inputs: [{shape: [2, 3, 8]}]}
      - {name: lstm, source: "aotpipe.zoo:lstm", args: {num_layers: 2, proj_size: 4}, inputs: [{shape: [3, 2, 8]}]}
      - {name: rnn, source: "aotpipe.zoo:rnn", args: {nonlinearity: relu}, inputs: [{shape: [3, 2, 8]}]}
      - {name: mlp, source: "aotpipe.zoo:mlp", args: {in_features: 8}, inputs: [{shape: [2, 8]}]}
      - {name: small_cnn, source: "aotpipe.zoo:small_cnn", args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}]}
      - name: tiny_transformer
        source: "aotpipe.zoo:tiny_transformer"
        args: {vocab: 50, dim: 16, heads: 2, layers: 1}
        inputs: [{name: input_ids, shape: [2, 5], dtype: int64, high: 50},
                 {name: attention_mask, shape: [2, 5], dtype: int64, low: 1, high: 2}]
      - {name: running_norm, source: "aotpipe.zoo:running_norm", args: {features: 8}, inputs: [{shape: [4, 8]}]}
      - {name: bag, source: "embmodel:build", args: {rows: 100}, inputs: [{shape: [2, 3], dtype: int64, high: 100}]}
    """)
SCALAR_FIRST_OPS = ["__radd__.s0", "__rsub__.s0", "__rmul__.s0", "__rdiv__.s0", "__rpow__.s0", "rsub.s0", "sub.s0",
                    "where.s0", "lerp.s0", "addcmul.s0", "clamp.s0", "masked_fill.s0", "nn.functional.conv2d.s0"]
RECURRENT_MODULES = ["nn.GRU.s0", "nn.GRU.s5", "nn.LSTM.s0", "nn.RNN.s0", "nn.GRUCell.s0", "nn.BatchNorm2d.s0"]


def _specs(pipeline, names=None, every=None):
    specs = pipeline.models
    chosen = [s for i, s in enumerate(specs) if (names and s.name in names) or (every and i % every == 0)]
    return [s.model_copy(update={"save_values": "full", "mode": "export"}) for s in chosen]


def _first_hour():
    return _specs(parse_pipeline(FIRST_HOUR, base_dir=ROOT, check_sources=False), names=None, every=1)


def _corpus():
    ops = load_pipeline(ROOT / "pipelines" / "torch-ops.yaml", check_sources=False)
    modules = load_pipeline(ROOT / "pipelines" / "torch-modules.yaml", check_sources=False)
    return _specs(ops, SCALAR_FIRST_OPS, every=60) + _specs(modules, RECURRENT_MODULES, every=60)


def _graphs(spec, tmp_path):
    """Each captured graph of `spec`, as a pass takes it, with its real inputs."""
    base = ROOT
    if spec.source.startswith("embmodel:"):  # test_first_hour's embedding model, beside its pipeline
        base = tmp_path / "src"
        base.mkdir(parents=True)
        (base / "embmodel.py").write_text(EMBEDDING_MODEL)
    job = ModelJob(spec, capture_mode(spec.mode), tmp_path, base, None, ModelResult(name=spec.name, status="failed"))
    _source(job)
    _capture(job)
    return {key: GraphUnderPass(g.gm, g.kind, list(g.inputs), list(g.outputs), list(job.inputs[key]))
            for key, g in job.captured.graphs.items() if key in job.inputs}


def _chains(kind):
    """Each registered pass taking `kind` graphs (after the passes it needs), and the README's chain."""
    chains = [[*PASSES[name].needs, name] for name, info in PASSES.items() if kind in info.kinds]
    return chains + ([README_CHAIN] if kind == "inference" else [])


def _failures(spec, graphs):
    """'<model> <graph> <chain>: why' for every chain that fails or changes a graph's results."""
    failures = []
    for key, g in graphs.items():
        for chain in _chains(g.kind):
            options = [{n: {"graphs": [g.kind]}} for n in chain]
            steps = [parse_pass_entry(o)[1] for o in options]
            try:
                run_chain(g.copy(), steps)  # each pass run and compared with the graph before it
            except PassError as e:
                failures.append(f"{spec.name} {key} {'+'.join(chain)}: {e}")
    return failures


def test_every_inference_pass_and_the_readme_chain_take_a_grus_inference_graph(tmp_path):
    (gru,) = [s for s in _first_hour() if s.name == "gru"]
    graphs = _graphs(gru.model_copy(update={"graphs": ["inference"]}), tmp_path)  # quick: its training graphs are slow
    assert list(graphs) == ["inference"]
    assert _failures(gru, graphs) == []


@pytest.mark.slow
@pytest.mark.parametrize("spec", _first_hour(), ids=lambda s: s.name)
def test_every_pass_takes_every_graph_of_the_first_hour_models(spec, tmp_path):
    graphs = _graphs(spec, tmp_path)
    assert {"inference", "forward", "backward", "joint"} <= set(graphs)
    failures = _failures(spec, graphs)
    assert failures == [], "\n".join(failures)


@pytest.mark.slow
def test_every_pass_takes_every_graph_of_a_sample_of_the_torch_corpus(tmp_path):
    specs = _corpus()
    assert set(SCALAR_FIRST_OPS) | set(RECURRENT_MODULES) <= {s.name for s in specs} and len(specs) > 40
    failures, uncaptured = [], []
    for spec in specs:
        try:
            graphs = _graphs(spec, tmp_path / spec.name)
        except Exception as e:  # a capture failure is not this test's business, but counted
            uncaptured.append(f"{spec.name}: {type(e).__name__}")
            continue
        failures += _failures(spec, graphs)
    assert failures == [], "\n".join(failures)
    assert len(uncaptured) <= len(specs) // 10, uncaptured
