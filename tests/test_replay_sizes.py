"""Replay at other sizes: get_inputs(sizes=) and `aotpipe replay --sizes` on a shape-polymorphic
artefact (dims: batch and seq), against the digests the capture's size checks recorded."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import get_inputs
from aotpipe.replay.inputs import _flatten_meta
from tests.sandbox.test_sandbox import needs_bwrap

# the committed artefact's model (tests/data/dynamic_tiny), captured afresh here
MODEL = Path(__file__).resolve().parent / "data" / "dynamic_tiny" / "scaled_model.py"

PIPELINE = '''
version: 1
name: sizes
output: {out}
executor: {{kind: local}}
defaults: {{mode: export}}
models:
  - name: scaled
    source: tinymods:Scaled
    dims: {{batch: {{min: 2, max: 6, example: 4}}, seq: {{min: 2, max: 5, example: 3}}}}
    inputs: [{{shape: [batch, seq, 8]}}]
  - name: static_mlp
    source: aotpipe.zoo:mlp
    inputs: [{{shape: [4, 32]}}]
'''


@pytest.fixture(scope="module")
def sizes_run(tmp_path_factory):
    """A tiny shape-polymorphic model (batch 2..6, seq 2..5) and a static one, captured once,
    unsigned (replayed with --no-sandbox, or in the sandbox)."""
    root = tmp_path_factory.mktemp("sizes")
    shutil.copy(MODEL, root / "tinymods.py")
    (root / "p.yaml").write_text(PIPELINE.format(out=root / "out"))
    r = CliRunner().invoke(main, ["run", str(root / "p.yaml"), "--no-progress", "--no-sign"])
    assert r.exit_code == 0, r.output
    return root / "out" / "sizes"


def graph(run, kind, model="scaled"):
    return run / model / f"{model}_{kind}_0"


def flat(values):
    return _flatten_meta(values)[0]


def checked(folder):
    """The size checks the capture recorded: point -> sizes."""
    m = json.loads((folder / "manifest.json").read_text())
    return {c["point"]: c["sizes"] for c in m["dims"]["checked"]}


def replay_json(folder, *args):
    r = CliRunner().invoke(main, ["replay", str(folder), "--json", *args])
    return r, (json.loads(r.stdout) if r.stdout.startswith("{") else None)


def test_get_inputs_at_sizes_has_the_shapes_the_symbols_give(sizes_run):
    x = flat(get_inputs(graph(sizes_run, "inference")))[-1]
    assert tuple(x.shape) == (4, 3, 8), "without sizes: the example's"
    x = flat(get_inputs(graph(sizes_run, "inference"), sizes={"batch": 5, "seq": 2}))[-1]
    assert tuple(x.shape) == (5, 2, 8) and x.stride() == (16, 8, 1)
    x = flat(get_inputs(graph(sizes_run, "inference"), sizes={"batch": 6}))[-1]
    assert tuple(x.shape) == (6, 3, 8), "seq not given: the example's"


def test_get_inputs_at_sizes_computes_a_backwards_sizes_and_saved_shapes(sizes_run):
    values = flat(get_inputs(graph(sizes_run, "backward"), sizes={"batch": 5, "seq": 4}))
    tensors = [tuple(v.shape) for v in values if hasattr(v, "shape")]
    assert (5, 4, 8) in tensors and (5, 4) in tensors
    assert [v for v in values if isinstance(v, int)] == [5, 4], "its size inputs: s_batch, s_seq"


def test_get_inputs_takes_a_symbol_or_an_input_dimension_as_well_as_a_name(sizes_run):
    symbols = json.loads((graph(sizes_run, "inference") / "graph.json").read_text())["symbols"]
    batch = next(s for s, r in symbols.items() if r["dim"] == "batch")
    assert tuple(flat(get_inputs(graph(sizes_run, "inference"), sizes={batch: 2}))[-1].shape) == (2, 3, 8)
    assert tuple(flat(get_inputs(graph(sizes_run, "inference"), sizes={"arg0.size(1)": 5}))[-1].shape) == (4, 5, 8)


@pytest.mark.parametrize("size", [2, 6])
def test_sizes_at_the_ends_of_the_recorded_range_pass(sizes_run, size):
    assert flat(get_inputs(graph(sizes_run, "joint"), sizes={"batch": size}))[1].shape[0] == size


@pytest.mark.parametrize("size", [1, 7])
def test_a_size_past_either_end_of_the_recorded_range_is_refused(sizes_run, size):
    with pytest.raises(ArtifactError) as e:
        get_inputs(graph(sizes_run, "inference"), sizes={"batch": size})
    assert str(e.value).endswith(f"graph.json: batch={size} is outside the recorded range [2, 6]; pick a size in range")


def test_an_unknown_dimension_is_refused_naming_the_known_ones(sizes_run):
    with pytest.raises(ArtifactError, match=r"no dimension 'bach'; its dims are batch \(s\d+\), seq \(s\d+\)$"):
        get_inputs(graph(sizes_run, "inference"), sizes={"bach": 3})


def test_a_static_artefact_refuses_sizes(sizes_run):
    with pytest.raises(ArtifactError, match="the artefact is static"):
        get_inputs(graph(sizes_run, "inference", "static_mlp"), sizes={"batch": 3})
    r = CliRunner().invoke(main, ["replay", str(sizes_run / "static_mlp"), "--no-sandbox", "--sizes", "batch=3"])
    assert r.exit_code == 2 and "the artefact is static" in r.output and "Traceback" not in r.output


def test_replay_at_a_checked_size_matches_the_recorded_outputs_bit_for_bit(sizes_run):
    at = checked(sizes_run / "scaled")["max"]
    r, out = replay_json(sizes_run / "scaled", "--no-sandbox", "--sizes", ",".join(f"{k}={v}" for k, v in at.items()))
    assert r.exit_code == 0, r.output
    assert {g["kind"]: g["status"] for g in out["graphs"]} == dict.fromkeys(("inference", "forward", "backward",
                                                                           "joint"), "match")
    assert all(g["bit_identical"] for g in out["graphs"])
    assert out["sizes"] == at and "max size check" in out["notes"][0]
    assert out["graphs"][0]["shapes"] == [[at["batch"], at["seq"]]]


def test_replay_at_the_example_sizes_draws_the_saved_inputs_and_matches_the_graphs_own_records(sizes_run):
    # the spec drawn at the example's sizes gives the inputs the capture saved: every output bit for bit
    r, out = replay_json(sizes_run / "scaled", "--no-sandbox", "--sizes", "batch=4,seq=3")
    assert r.exit_code == 0, r.output
    assert "(the example's sizes)" in out["notes"][0]
    assert {g["kind"]: g["status"] for g in out["graphs"]} == dict.fromkeys(("inference", "forward", "backward",
                                                                           "joint"), "match")
    assert all(g["bit_identical"] for g in out["graphs"])
    # one size off the example in one dimension: no reference any more
    assert {"batch": 4, "seq": 2} not in checked(sizes_run / "scaled").values()
    r, out = replay_json(sizes_run / "scaled", "--no-sandbox", "--sizes", "batch=4,seq=2")
    assert {g["status"] for g in out["graphs"]} == {"ran"} and "no reference" in out["notes"][0]


def test_replay_at_an_unchecked_size_runs_and_says_there_is_no_reference(sizes_run):
    assert {"batch": 5, "seq": 4} not in checked(sizes_run / "scaled").values()
    r = CliRunner().invoke(main, ["replay", str(sizes_run / "scaled"), "--no-sandbox", "--sizes", "batch=5,seq=4"])
    assert r.exit_code == 0, r.output
    assert "no reference at batch=5, seq=4 (not a size the capture checked" in r.output
    assert "inference  ran       (drawn inputs)  outputs [5, 4]" in r.output
    assert r.output.count(" ran ") == 4


def test_replay_at_sizes_with_random_inputs_runs_without_reference(sizes_run):
    r, out = replay_json(sizes_run / "scaled", "--no-sandbox", "--sizes", "batch=3", "--inputs", "random")
    assert r.exit_code == 0, r.output
    assert {g["status"] for g in out["graphs"]} == {"ran"} and {g["inputs"] for g in out["graphs"]} == {"random"}
    assert out["sizes"] == {"batch": 3, "seq": 3} and "random inputs" in out["notes"][0]
    assert out["graphs"][0]["shapes"] == [[3, 3]]


def test_a_wrong_recorded_digest_at_a_checked_size_is_a_mismatch(sizes_run, tmp_path):
    folder = tmp_path / "scaled"
    shutil.copytree(sizes_run / "scaled", folder)
    m = json.loads((folder / "manifest.json").read_text())
    point = m["dims"]["checked"][0]
    point["digests"]["inference"][0] = "0" * 64
    (folder / "manifest.json").write_bytes(seal(m))
    sizes = ",".join(f"{k}={v}" for k, v in point["sizes"].items())
    r = CliRunner().invoke(main, ["replay", str(folder), "--no-sandbox", "--sizes", sizes, "--graph", "inference"])
    assert r.exit_code == 1, r.output
    assert "inference  mismatch" in r.output
    assert "output 0 (user): not bit-identical to the recorded output" in r.output


@pytest.mark.parametrize("value", ["batch", "batch=x", "=3", "batch=3,batch=4"])
def test_sizes_that_are_not_dim_equals_n_are_a_usage_error(sizes_run, value):
    r = CliRunner().invoke(main, ["replay", str(sizes_run / "scaled"), "--no-sandbox", "--sizes", value])
    assert r.exit_code == 2 and "Invalid value for '--sizes'" in r.output
    assert "write e.g. --sizes batch=7,seq=33" in r.output or "give each dimension once" in r.output


def test_sizes_with_chain_is_a_usage_error(sizes_run):
    r = CliRunner().invoke(main, ["replay", str(sizes_run / "scaled"), "--no-sandbox", "--sizes", "batch=3", "--chain"])
    assert r.exit_code == 2 and "--bench, --chain and --steps run at the example sizes" in r.output


@needs_bwrap
def test_an_unsigned_artefact_replays_at_sizes_in_the_sandbox(sizes_run, monkeypatch):
    monkeypatch.delenv("AOTPIPE_NO_SANDBOX", raising=False)  # the suite replays in-process (conftest)
    at = checked(sizes_run / "scaled")["min"]
    r, out = replay_json(sizes_run / "scaled", "--sizes", ",".join(f"{k}={v}" for k, v in at.items()))
    assert r.exit_code == 0, r.output
    assert out["sandboxed"] is True and {g["status"] for g in out["graphs"]} == {"match"}
    assert out["sizes"] == at and "min size check" in out["notes"][0]
