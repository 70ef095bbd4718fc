"""The fake-tensor precheck: every literal size, view and referenced output is counted
before any kernel runs; a breach is one line naming the node (exit 2)."""

import json
import threading

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact import precheck
from aotpipe.cli import main
from aotpipe.errors import LimitError
from aotpipe.replay import replay

X = {"node": "x"}  # the mlp's user input: float32[8, 32]
F32 = {"dtype": {"dtype": "float32"}}
I64 = {"dtype": {"dtype": "int64"}}


def cli(*args, timeout=120):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", CliRunner().invoke(main, list(map(str, args)))),
                         daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"aotpipe {' '.join(map(str, args))} hung"
    return out["r"]


def add_nodes(folder, nodes, graph="mlp_inference_0", outputs=None):
    """Insert `nodes` ((name, target, args, kwargs) each) before the graph's output; with
    `outputs`, the graph returns those node names instead."""
    path = folder / graph / "graph.json"
    data = json.loads(path.read_text())
    out = data["nodes"].pop()
    for name, target, args, kwargs in nodes:
        data["nodes"].append({"name": name, "op": "call_function", "target": target, "args": args,
                              "kwargs": kwargs})
    if outputs is not None:
        out["args"] = [{"tuple": [{"node": n} for n in outputs]}]
    data["nodes"].append(out)
    path.write_text(json.dumps(data))


# Each asks for 400 MB to 4 GB in an argument other than `size` (checked at load by name).
BOMBS = {
    "arange": [("bomb", "aten.arange.start_step", [0, 100_000_000, 1], F32)],
    "eye": [("bomb", "aten.eye.default", [20_000], F32)],
    "linspace": [("bomb", "aten.linspace.default", [0.0, 1.0, 100_000_000], F32)],
    "bincount minlength": [("ints", "aten._to_copy.default", [X], I64),
                           ("bomb", "aten.bincount.default", [{"node": "ints"}, None, 100_000_000], {})],
    "upsample": [("x4", "aten.view.default", [X, [1, 1, 8, 32]], {}),
                 ("bomb", "aten.upsample_nearest2d.default", [{"node": "x4"}, [10_000, 10_000]], {})],
    "pad": [("bomb", "aten.constant_pad_nd.default", [X, [0, 10_000_000]], {})],
    "repeat": [("bomb", "aten.repeat.default", [X, [100_000, 10]], {})],
    "expand then clone": [("big", "aten.expand.default", [X, [400_000, 8, 32]], {}),
                          ("bomb", "aten.clone.default", [{"node": "big"}], {})],
    # no one tensor over the limit: 40 of 8 MB each, all alive at once
    "repeated cat": [(f"c{i}", "aten.cat.default", [[X] * 8192], {}) for i in range(40)],
    "prims.iota": [("bomb", "prims.iota.default", [100_000_000],
                    {"start": 0, "step": 1, "dtype": {"dtype": "int64"}, "device": {"device": "cpu"},
                     "requires_grad": False})],
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_a_literal_size_bomb_is_refused_before_allocation(mlp_copy, case):
    nodes = BOMBS[case]
    add_nodes(mlp_copy, nodes, outputs=[n[0] for n in nodes] if case == "repeated cat" else None)
    aotpipe.load(mlp_copy)  # loads: what it asks for is known only by propagating
    r = cli("replay", mlp_copy, "--graph", "inference", "--max-bytes", "100M")
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1 and "Traceback" not in r.output
    assert "mlp_inference_0/graph.json: node " in r.output and "refused before running the graph" in r.output
    if case == "repeated cat":
        assert "would hold" in r.output and "alive at once" in r.output and "over the limit of 105 MB" in r.output
    else:
        assert "node 'bomb'" in r.output and "over the limit of 105 MB" in r.output, r.output
