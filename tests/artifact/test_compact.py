"""save_values: minimal stores only what cannot be recomputed; full stores every value."""

import json
import shutil
import textwrap

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import replay, replay_chain

CNN = "{name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}]}"
CHAIN = "inference.freeze+fold_conv_bn+channels_last"


def _run(tmp_path, save_values):
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""
        version: 1
        name: c
        defaults: {{passes: [freeze, fold_conv_bn, channels_last], save_values: {save_values}}}
        models: [{CNN}]
    """))
    # In this process: the fixture patches the writer, which a worker process would not see.
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / save_values), "--no-progress",
                                  "--executor", "local"])
    assert r.exit_code == 0, r.output
    return tmp_path / save_values / "c" / "cnn"


def _record(folder, kind):
    return json.loads((folder / f"cnn_{kind}_0" / "inputs.json").read_text())


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from aotpipe.artifact import writer

    tmp = tmp_path_factory.mktemp("compact")
    with pytest.MonkeyPatch.context() as mp:  # a tiny model: recompute whatever its size
        mp.setattr(writer, "RECOMPUTE_MIN_BYTES", 0)
        mp.setattr(writer, "RECOMPUTE_MIN_SHARE", 0.0)
        return _run(tmp, "minimal"), _run(tmp, "full")


def test_small_computed_constants_are_stored_not_recomputed(tmp_path):
    folder = _run(tmp_path, "minimal")
    gj = json.loads((folder / f"cnn_{CHAIN.replace('inference.', 'inference_0.')}" / "graph.json").read_text())
    consts = [n for n in gj["nodes"] if n["op"] == "get_attr"]
    assert consts and not any(n.get("recompute") for n in consts)
    assert all((folder / "blobs" / f"{n['blob']}.safetensors").exists() for n in consts)


def test_minimal_stores_no_activation_tangent_or_output_value(both):
    minimal, _ = both
    bw = _record(minimal, "backward")
    assert {i["source"] for i in bw["inputs"]} == {"forward", "ones"}
    assert all(s["blob"] is None for s in bw["storages"])
    joint = _record(minimal, "joint")
    assert [i["source"] for i in joint["inputs"] if i["role"] == "tangent"] == ["ones"]
    for kind in ("inference", "forward", "backward", "joint"):
        outs = _record(minimal, kind)["outputs"]
        assert all(o["blob"] is None for o in outs)
        assert all(o["digest"] for o in outs if o["same_as"] is None and o.get("shape") is not None)


def test_folded_constants_are_recomputed_not_stored(both):
    minimal, full = both
    gj = json.loads((minimal / f"cnn_{CHAIN.replace('inference.', 'inference_0.')}" / "graph.json").read_text())
    recomputed = [n for n in gj["nodes"] if n.get("recompute")]
    assert recomputed and not any((minimal / "blobs" / f"{n['blob']}.safetensors").exists() for n in recomputed)
    assert sum(p.stat().st_size for p in minimal.rglob("*")) < sum(p.stat().st_size for p in full.rglob("*"))
    assert all(r.status == "match" for r in replay(minimal))
    assert replay_chain(minimal, rebuild_source=False).status == "match"


def test_a_recomputed_constant_that_differs_is_refused(both, tmp_path):
    minimal, _ = both
    folder = tmp_path / "cnn"
    shutil.copytree(minimal, folder)
    path = folder / f"cnn_{CHAIN.replace('inference.', 'inference_0.')}" / "graph.json"
    gj = json.loads(path.read_text())
    node = next(n for n in gj["nodes"] if n.get("recompute"))
    node["blob"] = "0" * 64
    path.write_text(json.dumps(gj))
    art = aotpipe.load(folder)  # built on first use: the inference graph still replays
    assert [r.status for r in replay(art, graphs=["inference"])] == ["match"]
    with pytest.raises(ArtifactError, match="recomputed by the pass chain differs"):
        art.graphs[f"{CHAIN}"].module
    r = CliRunner().invoke(main, ["verify", str(folder)])
    assert r.exit_code == 1 and "graph.json: sha256 differs" in r.output


def test_full_stores_every_value_and_replays_each_graph_alone(both):
    _, full = both
    bw = _record(full, "backward")
    assert {i["source"] for i in bw["inputs"]} == {"blob"} and all(s["blob"] for s in bw["storages"])
    assert all(o["blob"] for o in bw["outputs"] if o["same_as"] is None and o.get("shape") is not None)
    art = aotpipe.load(full)
    assert art.graphs["backward"].upstream is not None
    art.graphs["backward"].upstream = None  # runs without the forward
    (r,) = replay(art, graphs=["backward"])
    assert r.status == "match"
