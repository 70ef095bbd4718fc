"""get_inputs(sizes=) and replay's layout judgement at other sizes, on a committed shape-polymorphic
artefact (tests/data/dynamic_tiny: batch 2..6, example 4; seq 2..5, example 3): fast enough for
the replay mutation group. tests/test_replay_sizes.py covers the command through a fresh capture."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from aotpipe.artifact.load import load
from aotpipe.errors import ArtifactError
from aotpipe.replay import get_inputs
from aotpipe.replay.inputs import _flatten_meta
from aotpipe.replay.run import compare_recorded, layout_mismatches
from aotpipe.replay.sizes import _outputs_at

DATA = Path(__file__).resolve().parent / "data"
TINY = DATA / "dynamic_tiny" / "scaled"
STATIC = DATA / "replay_tiny" / "tiny"


def folder(kind: str, root: Path = TINY) -> Path:
    return next(root.glob(f"*_{kind}_0"))


def user_input(values):
    return next(v for v in _flatten_meta(values)[0] if isinstance(v, torch.Tensor) and v.dim() == 3)


@pytest.mark.parametrize("kind", ["inference", "forward", "joint"])
def test_inputs_at_sizes_have_the_shapes_the_symbols_give(kind):
    assert user_input(get_inputs(folder(kind))).shape == (4, 3, 8)
    assert user_input(get_inputs(folder(kind), sizes={"batch": 6, "seq": 2})).shape == (6, 2, 8)
    assert user_input(get_inputs(folder(kind), sizes={"seq": 5})).shape == (4, 5, 8)  # batch at the example


def test_inputs_at_sizes_are_drawn_like_the_examples():
    a = user_input(get_inputs(folder("inference"), seed=3, sizes={"batch": 2}))
    b = user_input(get_inputs(folder("inference"), seed=3, sizes={"batch": 2}))
    assert torch.equal(a, b) and a.std() > 0


@pytest.mark.parametrize("sizes, message", [
    ({"batch": 7}, "graph.json: batch=7 is outside the recorded range [2, 6]; pick a size in range"),
    ({"seq": 1}, "graph.json: seq=1 is outside the recorded range [2, 5]; pick a size in range"),
    ({"width": 3}, "graph.json: no dimension 'width'; its dims are batch ("),
])
def test_sizes_outside_the_range_or_unknown_are_refused_naming_the_graph(sizes, message):
    with pytest.raises(ArtifactError) as e:
        get_inputs(folder("inference"), sizes=sizes)
    assert str(e.value).startswith(f"{folder('inference')}/{message}")


def test_a_static_graph_refuses_sizes_and_so_does_one_without_graph_json(tmp_path):
    with pytest.raises(ArtifactError, match=r"replay_tiny/tiny/tiny_inference_0/graph.json: the artefact is static"):
        get_inputs(folder("inference", STATIC), sizes={"batch": 2})
    bare = tmp_path / "g"
    shutil.copytree(folder("inference"), bare)
    (bare / "graph.json").unlink()
    with pytest.raises(ArtifactError, match=r"/g/graph.json: the artefact is static"):
        get_inputs(bare, sizes={"batch": 2})
    assert user_input(get_inputs(bare)).shape == (4, 3, 8)  # without sizes: the recorded layout


def test_an_input_file_alone_takes_no_sizes(tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    src = next(folder("inference").glob("*.input"))
    shutil.copy(src, lone / src.name)
    with pytest.raises(ArtifactError) as e:
        get_inputs(lone / src.name, sizes={"batch": 2})
    assert str(e.value) == (f"{lone / src.name}: no inputs.json beside it, which records the symbolic sizes; "
                            "inputs at other sizes need the whole graph folder")
    assert get_inputs(lone / src.name)  # torch's .input format alone: the example's sizes


def test_a_symbolic_size_the_graph_does_not_define_names_inputs_json(tmp_path):
    g = tmp_path / "g"
    shutil.copytree(folder("inference"), g)
    record = json.loads((g / "inputs.json").read_text())
    user = next(i for i in record["inputs"] if i["role"] == "user")
    user["sym_shape"][0] = "s999"
    (g / "inputs.json").write_text(json.dumps(record))
    with pytest.raises(ArtifactError, match=rf"^{g}/inputs.json input {user['name']}: 's999' names symbol s999"):
        get_inputs(g, sizes={"batch": 2})


def test_outputs_are_judged_against_their_layout_at_the_sizes_they_ran_at():
    art = load(TINY).build_all()
    ga = art.graphs["inference"]
    symbols = {name: {"batch": 5, "seq": 2}[rec.dim] for name, rec in ga.graph.symbols.items()}
    outs = [torch.zeros(5, 2)]
    assert layout_mismatches(ga, outs, _outputs_at(ga, symbols)) == []
    assert layout_mismatches(ga, outs) == ["output 0: torch.float32[5, 2] != recorded float32[4, 3]"]
    expected = ga.expected_outputs()
    problems, _, identical = compare_recorded(ga, outs, expected, outputs=_outputs_at(ga, symbols))
    # judged at its own layout: only its values differ from the recorded ones (another size's)
    assert not identical and [p.split(";")[0] for p in problems] == ["output 0 (user): not bit-identical to the "
                                                                    "recorded output"]
    problems, _, _ = compare_recorded(ga, outs, expected)  # against the example's layout, its stride differs
    assert problems[0] == "output 0: stride [2, 1] != recorded [3, 1]"
