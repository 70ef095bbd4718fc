"""Replay of a model with data-dependent sizes (a top-k routing mixture of experts): its graphs
return sizes read from tensor values (how many tokens each expert got), recorded in
inputs.json (outputs[].value, version 3) and compared exactly; the backward takes them as
inputs, from the forward's run on saved inputs or, with random inputs, from their recorded
values, which the saved tensors' recorded shapes agree with."""

import json
import shutil
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
from aotpipe.replay import get_inputs, replay, replay_chain
from aotpipe.runtime.execution import run_graph
from tests.helpers.pipelines import run_yaml
from tests.test_replay_environment import reseal

KINDS = ["inference", "forward", "backward", "joint"]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A tiny top-k MoE, captured once in the default mode with every graph kind."""
    tmp = tmp_path_factory.mktemp("moe")
    result, out = run_yaml(tmp, textwrap.dedent("""\
        version: 1
        name: dd
        seed: 0
        defaults: {graphs: [inference, forward, backward, joint]}
        models:
          - {name: moe, source: "aotpipe.zoo:topk_moe", args: {dim: 4, experts: 2, k: 1, hidden: 4},
             inputs: [{shape: [1, 4, 4]}]}
        """))
    assert result.exit_code == 0, result.output
    return out / "dd" / "moe"


@pytest.fixture()
def moe_copy(moe, tmp_path):
    dst = tmp_path / "moe"
    shutil.copytree(moe, dst)
    return dst


def _inputs_json(root, kind):
    return root / f"moe_{kind}_0" / "inputs.json"


def _int_outputs(root, kind="forward"):
    """(index, value) of the graph's outputs recorded as Python ints."""
    outs = json.loads(_inputs_json(root, kind).read_text())["outputs"]
    return [(o["index"], o["value"]) for o in outs if isinstance(o.get("value"), int)]


def test_int_outputs_are_recorded_with_the_values_the_forward_gives(moe):
    ints = _int_outputs(moe)
    assert ints, "the forward returns the experts' token counts for the backward"
    ga = load(moe).graphs["forward"]
    outs = run_graph(ga.module, ga.saved_inputs())
    assert [(i, outs[i]) for i, _ in ints] == ints
    # the backward takes exactly these as its size inputs
    bw = json.loads(_inputs_json(moe, "backward").read_text())["inputs"]
    assert sorted(r["forward_output"] for r in bw if r["type"] == "int") == [i for i, _ in ints]


def test_every_graph_and_the_chain_replay_match_in_process(moe):
    results = replay(moe)
    assert [(r.kind, r.status, r.mismatches) for r in results] == [(k, "match", []) for k in KINDS]
    chain = replay_chain(moe)
    assert (chain.status, chain.problems) == ("match", [])


def test_every_graph_and_the_chain_replay_match_from_the_cli(moe):
    result = CliRunner().invoke(main, ["replay", str(moe), "--no-sandbox", "--chain"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split()[1] for line in result.output.splitlines() if line and line[0] != " "}
    assert lines == {**{k: "match" for k in KINDS}, "chain": "match"}, result.output


@pytest.mark.parametrize("change", ["other value", "float"])
def test_a_changed_int_output_value_is_a_mismatch_naming_that_output(moe_copy, change):
    path = _inputs_json(moe_copy, "forward")
    rec = json.loads(path.read_text())
    index, value = _int_outputs(moe_copy)[0]
    planted = value + 1 if change == "other value" else float(value)
    rec["outputs"][index]["value"] = planted
    path.write_text(json.dumps(rec))
    reseal(moe_copy)
    fw = replay(moe_copy, graphs=["forward"])[0]
    assert fw.status == "mismatch"
    assert fw.mismatches == [f"output {index} (saved): {value}, recorded {planted!r}; int outputs must be "
                             "equal, here and elsewhere"]
    result = CliRunner().invoke(main, ["replay", str(moe_copy), "--no-sandbox", "--graph", "forward"])
    assert result.exit_code == 1, result.output
    assert "forward    mismatch" in result.output and f"output {index} (saved): {value}, recorded" in result.output


def test_an_int_output_recorded_without_its_value_is_a_mismatch(moe_copy):
    """Version 3 records every int output's value: one recorded as nothing does not pass."""
    path = _inputs_json(moe_copy, "forward")
    rec = json.loads(path.read_text())
    index, value = _int_outputs(moe_copy)[0]
    del rec["outputs"][index]["value"]
    path.write_text(json.dumps(rec))
    reseal(moe_copy)
    fw = replay(moe_copy, graphs=["forward"])[0]
    assert (fw.status, fw.mismatches[0]) == ("mismatch", f"output {index} (saved): {value}, recorded None; "
                                                         "int outputs must be equal, here and elsewhere")


def _random_seed_that_reroutes(root):
    """A seed whose random input routes the tokens otherwise than the saved one."""
    ga = load(root).graphs["forward"]
    ints = _int_outputs(root)
    for seed in range(20):
        outs = run_graph(ga.module, get_inputs(ga.input_file, seed=seed))
        if [outs[i] for i, _ in ints] != [v for _, v in ints]:
            return seed
    pytest.fail("no random input routes the tokens otherwise")


def test_random_inputs_run_every_graph_with_the_backwards_sizes_from_the_recorded_values(moe):
    seed = _random_seed_that_reroutes(moe)
    results = replay(moe, inputs="random", seed=seed)
    # The forward's routed-token counts differ from the saved input's: their sizes are not held
    # to the recorded shapes; the backward's sizes are the recorded ones its saved tensors have.
    assert [(r.kind, r.status, r.error, r.mismatches) for r in results] == [(k, "ran", None, []) for k in KINDS]
    art = load(moe)
    bw = art.graphs["backward"]
    fw = art.graphs["forward"].record
    values = get_inputs(bw.input_file, seed=seed, forward=fw)
    sizes = [v for v, r in zip(values, bw.record.inputs) if r.type == "int"]
    assert sizes == [v for _, v in _int_outputs(moe)]
    # the saved indices lie where the forward's did: each row index below the token count, each
    # top-k slot below k (k = 1 here: all zero)
    for v, r in zip(values, bw.record.inputs):
        if r.source == "forward" and r.type == "tensor" and r.dtype == "int64":
            low, high = fw.outputs[r.forward_output].range
            assert low <= int(v.min()) and int(v.max()) < high, r.name
    slots = [fw.outputs[r.forward_output].range for r in bw.record.inputs if r.name in ("squeeze_1", "squeeze_3")]
    assert slots and all(rng == [0, 1] for rng in slots)


def test_random_inputs_without_recorded_sizes_are_refused_in_one_line(moe_copy):
    """An artefact that records no value for the forward's sizes (made before version 3)."""
    path = _inputs_json(moe_copy, "forward")
    rec = json.loads(path.read_text())
    for o in rec["outputs"]:
        o.pop("value", None)
    path.write_text(json.dumps(rec))
    reseal(moe_copy)
    with pytest.raises(ArtifactError, match=r"input 'sym_size_int' \(int\) is a value the forward graph computes "
                                            r"\(forward output \d+\).*random inputs cannot be used for this "
                                            r"graph.*--inputs saved"):
        replay(moe_copy, graphs=["backward"], inputs="random")
    result = CliRunner().invoke(main, ["replay", str(moe_copy), "--no-sandbox", "--inputs", "random"])
    assert result.exit_code == 2, result.output
    assert "random inputs cannot be used for this graph" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_get_inputs_on_a_backward_folder_alone_says_it_needs_the_forwards_values(moe):
    with pytest.raises(ArtifactError, match="random inputs cannot be used for this graph"):
        get_inputs(moe / "moe_backward_0")
    values = get_inputs(moe / "moe_forward_0", seed=1)  # a forward needs nothing from elsewhere
    assert all(isinstance(v, torch.Tensor) for v in values)
