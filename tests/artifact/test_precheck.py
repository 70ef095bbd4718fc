"""The fake-tensor precheck: every literal size, view and referenced output is counted
before any kernel runs; a breach is one line naming the node (exit 2)."""

import json
import threading

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact import precheck
from aotpipe.cli import main
from aotpipe.errors import ArtifactError
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


def _one_blob_outputs(folder, n, clone):
    """mlp's inference graph returning one 8 MB constant `n` times (cloned each time, or as
    is), its inputs.json recording every output as that same stored blob."""
    import torch

    from aotpipe.artifact.blobs import BlobStore

    value = torch.zeros(2_000_000)
    digest = BlobStore(folder).put(value)
    path = folder / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    out = data["nodes"].pop()
    data["nodes"].append({"name": "blob", "op": "get_attr", "target": "blob", "blob": digest,
                          "shape": [2_000_000], "stride": [1]})
    names = ["blob"] * n
    if clone:
        names = [f"copy{i}" for i in range(n)]
        data["nodes"] += [{"name": c, "op": "call_function", "target": "aten.clone.default",
                           "args": [{"node": "blob"}], "kwargs": {}} for c in names]
    out["args"] = [{"tuple": [{"node": c} for c in names]}]
    data["nodes"].append(out)
    path.write_text(json.dumps(data))
    ipath = folder / "mlp_inference_0" / "inputs.json"
    rec = json.loads(ipath.read_text())
    rec["values"] = "full"
    rec["outputs"] = [{"index": i, "role": "user", "blob": digest, "shape": [2_000_000], "stride": [1],
                       "dtype": "float32"} for i in range(n)]
    ipath.write_text(json.dumps(rec))


def test_outputs_each_a_copy_of_one_blob_are_all_counted(mlp_copy):
    _one_blob_outputs(mlp_copy, 24, clone=True)  # 24 x 8 MB alive at the end
    r = cli("replay", mlp_copy, "--graph", "inference", "--max-bytes", "100M")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "node 'copy" in r.output and "(aten.clone.default) would hold 1" in r.output
    assert "alive at once" in r.output and "over the limit of 105 MB" in r.output


def test_outputs_naming_one_blob_read_it_once(mlp_copy):
    _one_blob_outputs(mlp_copy, 24, clone=False)
    (res,) = replay(mlp_copy, graphs=["inference"])
    assert res.status == "match", res
    expected = aotpipe.load(mlp_copy).graphs["inference"].expected_outputs()
    assert len({e.value.untyped_storage().data_ptr() for e in expected}) == 1  # one tensor, 24 views
    r = cli("replay", mlp_copy, "--graph", "inference", "--max-bytes", "20M")
    assert r.exit_code == 0, r.output


def test_a_view_past_its_storage_is_refused(mlp_copy):
    # x is float32[8, 32]: 1 KB; the view reaches 40 KB into it
    add_nodes(mlp_copy, [("far", "aten.as_strided.default", [X, [10, 10], [1000, 1], 0], {})])
    with pytest.raises(ArtifactError) as e:
        replay(mlp_copy, graphs=["inference"])
    assert ("node 'far' (aten.as_strided.default) gives a view (sizes [10, 10], strides [1000, 1], storage "
            "offset 0) that reaches byte 36,040 of a storage of 1,024 bytes") in str(e.value)


# A view whose size is read from values while the graph runs (JetMoE's joint: an expand to
# the sum of four routed-token counts, each bounded by all tokens, so the static bound is 4x
# the storage). x's 256 elements are all >= -1e30, so `rows` is 8 when the graph runs.
ROWS_FROM_VALUES = [("pos", "aten.ge.Scalar", [X, -1e30], {}),
                    ("cnt", "aten.sum.default", [{"node": "pos"}], {}),
                    ("u", "aten._local_scalar_dense.default", [{"node": "cnt"}], {}),
                    ("rows", "operator.floordiv", [{"node": "u"}, 32], {})]


def _run_inference(folder):
    from aotpipe.replay import run_graph

    ga = aotpipe.load(folder).graphs["inference"]
    return ga, run_graph(ga.module, ga.saved_inputs())


def test_a_view_sized_by_values_is_checked_when_it_runs_and_runs_when_within_its_storage(mlp_copy):
    add_nodes(mlp_copy, ROWS_FROM_VALUES + [("e", "aten.expand.default", [X, [{"node": "rows"}, 32]], {})],
              outputs=["e"])
    ga, out = _run_inference(mlp_copy)
    assert ga.module.meta[precheck.RUN_CHECKED_VIEWS] == {"e"}
    assert torch.equal(out[0], ga.saved_inputs()[-1])  # x itself, expanded to its own 8 rows
    twin = precheck.checked_twin(ga.module, "graph.json")
    assert [n.target.__name__ for n in twin.graph.nodes if n.name == "e"] == ["run_checked_expand_default"]


@pytest.mark.parametrize("op", ["aten.as_strided.default", "aten.as_strided_.default"])
def test_a_view_sized_by_values_past_its_storage_is_refused_before_its_kernel_runs(mlp_copy, monkeypatch, op):
    from aotpipe.artifact import checked

    # the same rows (8), as a view of x (a copy of it, in place) that steps 4 rows at a time:
    # byte 3,712 of x's 1,024
    add_nodes(mlp_copy, ROWS_FROM_VALUES + [("xc", "aten.clone.default", [X], {}),
                                            ("far", op, [{"node": "xc"}, [{"node": "rows"}, 32], [128, 1], 0], {})],
              outputs=["far"])
    ran = []
    monkeypatch.setattr(checked.ViewCheckedAtRun, "__call__", _spy(checked.ViewCheckedAtRun.__call__, ran))
    with pytest.raises(ArtifactError) as e:
        _run_inference(mlp_copy)
    assert str(e.value).endswith(f"graph.json: node 'far' ({op}): gives a view (sizes [8, 32], "
                                 "strides [128, 1], storage offset 0) that reaches byte 3,712 of a storage of "
                                 "1,024 bytes; the kernel was not run"), str(e.value)
    assert ran == ["far"]  # aotpipe's check, ahead of torch's own in the kernel (a RuntimeError)
    # Planted fault: without the deferral the precheck lets the unbounded view through
    # silently (its static span is unknown) and nothing checks it when it runs.
    monkeypatch.setattr(precheck, "aliases_inputs", lambda target: False)
    mod = aotpipe.load(mlp_copy).graphs["inference"].module
    precheck.check_graph(mod, aotpipe.load(mlp_copy).graphs["inference"].saved_inputs())
    assert not mod.meta[precheck.RUN_CHECKED_VIEWS]


def test_a_view_sized_by_values_that_torch_rejects_fails_as_torch_says_without_its_kernel(mlp_copy, monkeypatch):
    from aotpipe.artifact import checked

    rows16 = [(n, t, a if n != "rows" else [{"node": "u"}, 16], k) for n, t, a, k in ROWS_FROM_VALUES]
    add_nodes(mlp_copy, rows16 + [("e", "aten.expand.default", [X, [{"node": "rows"}, 32]], {})], outputs=["e"])
    ran = []
    monkeypatch.setattr(checked.ViewCheckedAtRun, "__init__", _spy_init(checked.ViewCheckedAtRun.__init__, ran))
    with pytest.raises(RuntimeError, match=r"^The expanded size of the tensor \(16\) must match the existing size "
                                           r"\(8\) at non-singleton dimension 0"):
        _run_inference(mlp_copy)
    assert [w.checked_op for w in ran] == [torch.ops.aten.expand.default]  # checked, and its kernel never ran


def _spy_init(init, made):
    def spied(self, op, where):
        init(self, op, where)
        made.append(self)
        self.inner = lambda *a, **k: pytest.fail("the real kernel ran")
    return spied


def test_a_tensor_sized_by_values_runs_checked_within_its_share_of_the_room_left(mlp_copy):
    # SAM3's class: an arange to a count read from a tensor (here 256), with no bound before it runs
    add_nodes(mlp_copy, ROWS_FROM_VALUES + [("r", "aten.arange.start_step", [0, {"node": "u"}, 1], F32),
                                            ("r2", "aten.mul.Tensor", [{"node": "r"}, {"node": "r"}], {}),
                                            ("big", "aten.gt.Scalar", [{"node": "r2"}, 10_000.0], {}),
                                            ("nz", "aten.nonzero.default", [{"node": "big"}], {})],
              outputs=["r2", "nz"])
    ga, out = _run_inference(mlp_copy)
    assert torch.equal(out[0], torch.arange(256.0) ** 2)
    assert torch.equal(out[1], torch.arange(101, 256)[:, None])  # nonzero of a run-sized tensor: at most its input's
    shares = ga.module.meta[precheck.RUN_CHECKED_ALLOCS]
    assert set(shares) == {"r", "r2", "big", "nz"} and len(set(shares.values())) == 1  # equal shares
    from aotpipe.format import limits

    assert 4 * shares["r"] <= limits.current().max_bytes - 1024  # all fit beside x (1 KB) under the limit


def test_replay_refuses_a_tensor_sized_by_values_over_its_share_in_one_line(mlp_copy):
    add_nodes(mlp_copy, ROWS_FROM_VALUES + [("n", "operator.mul", [{"node": "u"}, 1000], {}),
                                            ("r", "aten.arange.start_step", [0, {"node": "n"}, 1], F32)],
              outputs=["r"])
    r = cli("replay", mlp_copy, "--graph", "inference", "--max-bytes", "256K")  # r: 256,000 float32s, 1 MB
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1 and "Traceback" not in r.output
    assert "node 'r' (aten.arange.start_step): makes float32[256000] (1.02 MB) from values read while the graph " \
           "runs, over the " in r.output and "the kernel was not run" in r.output, r.output


def test_a_tensor_sized_by_values_with_no_room_left_under_the_limit_is_refused_before_the_graph_runs(mlp_copy):
    from aotpipe.errors import LimitError
    from aotpipe.format import limits

    add_nodes(mlp_copy, ROWS_FROM_VALUES + [("r", "aten.arange.start_step", [0, {"node": "u"}, 1], F32)],
              outputs=["r"])
    ga = aotpipe.load(mlp_copy).graphs["inference"]
    inputs = ga.saved_inputs()

    def fits(limit):  # does the graph's checked peak fit under `limit`?
        with limits.override(max_bytes=limit, max_tensor_bytes=1 << 30):
            try:
                precheck.check_graph(ga.module, inputs)
            except LimitError as e:
                if "alive at once" in str(e):
                    return False
                assert "leaves it no room" in str(e), str(e)  # the peak fits, with nothing left over
            return True

    low, high = 1, 1 << 30  # the smallest limit the checked tensors fit under: the checked peak itself
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid + 1, high)
    with limits.override(max_bytes=low, max_tensor_bytes=1 << 30), pytest.raises(LimitError) as e:
        precheck.check_graph(ga.module, inputs)
    assert str(e.value).endswith(f"node 'r' (aten.arange.start_step) makes a tensor whose size depends on values "
                                 f"read from tensors while the graph runs, and the graph leaves it no room under "
                                 f"the limit of {limits.human(low)} (raise it with AOTPIPE_MAX_BYTES or --max-bytes); "
                                 "refused before running the graph"), str(e.value)
    assert fits(low + 1) and ga.module.meta[precheck.RUN_CHECKED_ALLOCS]["r"] == 1  # one byte of room: its share


# SAM3's class: torch's fake kernel for constant_pad_nd cannot take a size read from values,
# in its pad (here rows * cols = 64: "SymIntArrayRef expected to contain only concrete
# integers") or in its input's shape (SAM3's: "Could not extract specialized integer").
SIZES_FROM_VALUES = ROWS_FROM_VALUES + [("v", "aten._local_scalar_dense.default", [{"node": "cnt"}], {}),
                                        ("cols", "operator.floordiv", [{"node": "v"}, 32], {}),
                                        ("n", "operator.mul", [{"node": "rows"}, {"node": "cols"}], {})]
PADS = {
    "pad read from values": (SIZES_FROM_VALUES + [("p", "aten.constant_pad_nd.default", [X, [0, {"node": "n"}]], {})],
                             "RuntimeError: .*SymIntArrayRef expected to contain only concrete integers"),
    "input sized by values": (SIZES_FROM_VALUES + [
        ("r", "aten.arange.start_step", [0, {"node": "n"}, 1], F32),
        ("p", "aten.constant_pad_nd.default", [{"node": "r"}, [2, 1]], {})],
        "GuardOnDataDependentSymNode: Could not extract specialized integer from data-dependent expression"),
}


def _pad_expected(folder, case):
    x = aotpipe.load(folder).graphs["inference"].saved_inputs()[-1]
    return torch.nn.functional.pad(x, [0, 64]) if case == "pad read from values" else \
        torch.nn.functional.pad(torch.arange(64.0), [2, 1])


@pytest.mark.parametrize("case", sorted(PADS))
def test_an_op_whose_fake_kernel_needs_a_plain_size_runs_with_its_outputs_checked(mlp_copy, case, caplog):
    add_nodes(mlp_copy, PADS[case][0] + [("s", "aten.sum.dim_IntList", [{"node": "p"}, [-1]], {})], outputs=["p", "s"])
    ga, out = _run_inference(mlp_copy)
    # torch's traceback for the fake kernel's error: kept quiet, the check says what it means
    assert not [r for r in caplog.records if "failed while attempting to run meta" in r.getMessage()]
    want = _pad_expected(mlp_copy, case)
    assert torch.equal(out[0], want) and torch.equal(out[1], want.sum(-1))
    # the sizes the probes agree on are kept (x's 8 rows), the others are the run's
    shape = (8, None) if case == "pad read from values" else (None,)
    assert ga.module.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", shape),)}
    assert "p" in ga.module.meta[precheck.RUN_CHECKED_ALLOCS]  # its storage has no bound here: a share
    twin = precheck.checked_twin(ga.module, "graph.json")
    assert [n.target.__name__ for n in twin.graph.nodes if n.name == "p"] == ["run_checked_constant_pad_nd_default"]


@pytest.mark.parametrize("case", sorted(PADS))
def test_an_op_whose_fake_kernel_needs_a_plain_size_is_refused_without_the_assumed_outputs(mlp_copy, monkeypatch,
                                                                                           case):
    # Planted fault: without the probes the precheck cannot go past the pad (SAM3's failure).
    add_nodes(mlp_copy, PADS[case][0], outputs=["p"])
    monkeypatch.setattr(precheck, "_assumed_outputs", lambda *a: None)
    refusal = ArtifactError if case == "input sized by values" else precheck.GraphWillNotRun  # as before
    with pytest.raises(refusal, match=r"graph.json: node 'p' \(aten.constant_pad_nd.default\) (has a size that "
                                            r"depends on the values of tensors \(|does not run on these inputs: )"
                                            + PADS[case][1]):
        _run_inference(mlp_copy)


def test_outputs_the_precheck_assumed_wrongly_are_refused_before_the_kernel_runs(mlp_copy, monkeypatch):
    # Planted fault: probes whose pads agree (u = 2 and 3: no padding either way) make the
    # precheck assume a [8, 32] output; the run's values pad by 64 and its check refuses.
    add_nodes(mlp_copy, PADS["pad read from values"][0], outputs=["p"])
    monkeypatch.setattr(precheck, "_PROBES", ((lambda i: 2), (lambda i: 3)))
    with pytest.raises(ArtifactError) as e:
        _run_inference(mlp_copy)
    assert str(e.value).endswith("graph.json: node 'p' (aten.constant_pad_nd.default): gives float32[8, 96] where "
                                 "the check before the run assumed float32[8, 32]; the kernel was not run"), str(e.value)


def test_the_outputs_assumed_are_those_of_the_inputs_layout(mlp_copy):
    from aotpipe.replay import run_graph

    add_nodes(mlp_copy, PADS["pad read from values"][0], outputs=["p"])
    ga = aotpipe.load(mlp_copy).graphs["inference"]
    inputs = ga.saved_inputs()
    short = [t.clone() for t in inputs[:-1]] + [inputs[-1][:4].clone()]  # 4 rows: padded by 4 * 4
    assert run_graph(ga.module, inputs)[0].shape == (8, 96)
    assert run_graph(ga.module, short)[0].shape == (4, 48)
    assert ga.module.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (4, None)),)}
    # the first layout again (checked already): held to its own assumption, not the last one's
    assert run_graph(ga.module, inputs)[0].shape == (8, 96)
    assert ga.module.meta[precheck.RUN_CHECKED_OUTPUTS] == {"p": (("float32", (8, None)),)}


# Each asks for more than its share of the room left, from the run's values.
OVER_SHARE = {
    # 256 * 10**7 float32s: 10.2 GB
    "arange": (ROWS_FROM_VALUES + [("n", "operator.mul", [{"node": "u"}, 10**7], {}),
                                   ("r", "aten.arange.start_step", [0, {"node": "n"}, 1], F32)],
               "node 'r' (aten.arange.start_step): makes float32[2560000000] (10.2 GB)",
               torch.ops.aten.arange.start_step),
    # a pad by those 256 * 10**7 (a fake kernel that needs plain ints: the outputs assumed): 81.9 GB
    "pad": ([(n, t, a if n != "n" else [{"node": "u"}, 10**7], k) for n, t, a, k in PADS["pad read from values"][0]],
            "node 'p' (aten.constant_pad_nd.default): makes float32[8, 2560000032] (81.9 GB)",
            torch.ops.aten.constant_pad_nd.default),
}


@pytest.mark.parametrize("case", sorted(OVER_SHARE))
def test_a_tensor_sized_by_values_over_its_share_is_refused_before_its_kernel_runs(mlp_copy, monkeypatch, case):
    from aotpipe.artifact import checked

    nodes, refusal, op = OVER_SHARE[case]
    add_nodes(mlp_copy, nodes, outputs=[nodes[-1][0]])
    made = []
    monkeypatch.setattr(checked.AllocationCheckedAtRun, "__init__", _spy_alloc_init(checked.AllocationCheckedAtRun.__init__,
                                                                                     made))
    with pytest.raises(ArtifactError) as e:
        _run_inference(mlp_copy)
    assert f"graph.json: {refusal} from values read while the graph runs, over the 2.15 GB the graph leaves it " \
           "under the byte limit" in str(e.value), str(e.value)
    assert str(e.value).endswith("; the kernel was not run")
    assert [m.checked_op for m in made] == [op] and not made[0].ran


def _spy_alloc_init(init, made):
    def spied(self, op, limit, where, expected=None):
        init(self, op, limit, where, expected)
        made.append(self)
        self.ran = False

        def inner(*a, **k):
            self.ran = True
        self.inner = inner
    return spied


def _spy(call, ran):
    def spied(self, *args, **kwargs):
        ran.append(self.where.rsplit("'", 2)[-2])
        return call(self, *args, **kwargs)
    return spied


def test_a_graph_is_checked_once_per_input_layout(mlp_copy, monkeypatch):
    art = aotpipe.load(mlp_copy)
    ga = art.graphs["inference"]
    calls = []
    real = precheck.check_graph
    monkeypatch.setattr(precheck, "check_graph", lambda *a, **k: calls.append(1) or real(*a, **k))
    from aotpipe.replay import run_graph

    inputs = ga.saved_inputs()
    run_graph(ga.module, inputs)
    run_graph(ga.module, inputs)
    assert len(calls) == 1
    run_graph(ga.module, [t.clone() for t in inputs[:-1]] + [inputs[-1][:4]])  # another layout
    assert len(calls) == 2


def test_an_rnn_over_an_empty_packed_sequence_is_refused_without_reading_through_a_null_pointer():
    # lstm.data's C++ reads batch_sizes through its data pointer while it decomposes: a fake
    # tensor has none, and an empty one made the precheck itself die (SIGSEGV). In a process
    # of its own, so that a regression fails this test rather than the run.
    import subprocess
    import sys

    script = """
import torch, torch.fx
from aotpipe.artifact import precheck
g = torch.fx.Graph()
xs = [g.placeholder(f"x{i}") for i in range(8)]
g.output(g.call_function(torch.ops.aten.lstm.data, (xs[0], xs[1], [xs[2], xs[3]], xs[4:], True, 1, 0.0, False, False)))
r = lambda *s: torch.randn(*s)
inputs = [r(6, 3), torch.zeros(0, dtype=torch.int64), r(1, 3, 4), r(1, 3, 4), r(16, 3), r(16, 4), r(16), r(16)]
try:
    precheck.check_graph(torch.fx.GraphModule(torch.nn.Module(), g), inputs, "g/graph.json")
except precheck.GraphWillNotRun as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == ("g/graph.json: node 'lstm_data' (aten.lstm.data) does not run on these inputs: it "
                                "reads the values of batch_sizes as it decomposes, which fake tensors do not have")
