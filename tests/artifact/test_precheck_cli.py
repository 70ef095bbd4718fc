"""The precheck's refusals as a user meets them: `aotpipe replay` on a crafted artefact, one
line naming the file, the node and what would fix it, exit 2; the graph just inside each
bound replays. The artefact is tests/data/precheck_tiny (an mlp of one hidden layer, 912
bytes of inputs and weights), copied and edited per test; the CLI runs in-process."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from tests.helpers.forge import reseal
from tests.helpers.replays import replayed

TINY = Path(__file__).resolve().parent.parent / "data" / "precheck_tiny" / "mlp"
X = {"node": "x"}  # float32[2, 8]: a storage of 64 bytes


@pytest.fixture()
def tiny(tmp_path):
    dst = tmp_path / "mlp"
    shutil.copytree(TINY, dst)
    return dst


def add_nodes(folder, nodes):
    """Insert `nodes` ((name, target, args, kwargs) each) before the graph's output, and reseal."""
    path = folder / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    out = data["nodes"].pop()
    data["nodes"] += [{"name": n, "op": "call_function", "target": t, "args": a, "kwargs": k} for n, t, a, k in nodes]
    data["nodes"].append(out)
    path.write_text(json.dumps(data))
    assert reseal(folder)


def replay(folder, *args, env=None):
    return CliRunner().invoke(main, ["replay", str(folder), *map(str, args)], env=env)


def one_line_refusal(r, folder):
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {folder}/mlp_inference_0/graph.json: node ") and r.output.count("\n") == 1
    assert "Traceback" not in r.output and r.output.endswith("; refused before running the graph\n"), r.output
    return r.output


def test_replay_at_exactly_the_peak_of_inputs_weights_and_intermediates_runs(tiny):
    # weights 848 bytes + x 64, then addmm (128) and relu (128) alive together
    r = replay(tiny, "--max-bytes", 1168)
    assert replayed(r), r.output


def test_replay_one_byte_under_the_peak_is_refused_in_one_line_naming_the_fix(tiny):
    out = one_line_refusal(replay(tiny, "--max-bytes", 1167), tiny)
    assert "node 'relu' (aten.relu.default) would hold 1.17 kB of tensors alive at once (inputs, constants, values " \
           "still to be used and outputs), over the limit of 1.17 kB (raise it with AOTPIPE_MAX_BYTES or " \
           "--max-bytes)" in out, out


def test_replay_of_a_view_that_ends_at_its_storages_end_runs(tiny):
    add_nodes(tiny, [("far", "aten.as_strided.default", [X, [2, 8], [8, 1], 0], {})])
    r = replay(tiny)
    assert replayed(r), r.output


def test_replay_of_a_view_one_element_past_its_storage_by_its_offset_is_refused(tiny):
    add_nodes(tiny, [("far", "aten.as_strided.default", [X, [2, 8], [8, 1], 1], {})])
    out = one_line_refusal(replay(tiny), tiny)
    assert "node 'far' (aten.as_strided.default) gives a view (sizes [2, 8], strides [8, 1], storage offset 1) " \
           "that reaches byte 68 of a storage of 64 bytes" in out, out


@pytest.mark.parametrize("n,refused", [(150, False), (151, True)])
def test_replay_holds_one_tensor_to_the_per_tensor_limit_set_in_the_environment(tiny, n, refused):
    add_nodes(tiny, [("z", "aten.arange.start_step", [0, n, 1], {"dtype": {"dtype": "float32"}})])
    r = replay(tiny, env={"AOTPIPE_MAX_TENSOR_BYTES": "600"})  # the largest weight: 512 bytes
    if not refused:
        assert replayed(r), r.output
        return
    out = one_line_refusal(r, tiny)
    assert "node 'z' (aten.arange.start_step) makes a float32[151] tensor, which needs 604 bytes, over the limit " \
           "of 600 bytes (raise it with AOTPIPE_MAX_TENSOR_BYTES)" in out, out
