"""The op allow-list: every op aotpipe's capture and passes emit loads; the excluded kinds never do."""

import json

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact.graph_json import graph_from_json, graph_to_json
from aotpipe.artifact.ops import DENIED, allowed_ops, resolve_op
from aotpipe.cli import main
from aotpipe.errors import ArtifactError


def graph_ops(root):
    """Every call_function target named in the graph.json files under `root`."""
    ops = set()
    for p in root.rglob("graph.json"):
        ops |= {n["target"] for n in json.loads(p.read_text())["nodes"] if n["op"] == "call_function"}
    return ops


def test_every_op_in_the_quickstart_graphs_is_allowed(quickstart_run):
    root, _ = quickstart_run
    ops = graph_ops(root)
    assert {"aten.addmm.default", "aten.convolution_backward.default", "aten.add_.Tensor",
            "operator.getitem", "aten._native_batch_norm_legit_functional.default"} <= ops
    for name in sorted(ops):
        resolve_op(name)



def _insert_call(folder, target, args, kwargs=None, graph="mlp_inference_0"):
    path = folder / graph / "graph.json"
    data = json.loads(path.read_text())
    first_call = next(i for i, n in enumerate(data["nodes"]) if n["op"] == "call_function")
    data["nodes"].insert(first_call, {"name": "hostile", "op": "call_function", "target": target,
                                      "args": args, "kwargs": kwargs or {}})
    path.write_text(json.dumps(data))


X = {"node": "x"}
EXCLUDED = {
    # builds a sparse tensor: with an index of 1e8, densifying it segfaults (never run here)
    "aten._sparse_coo_tensor_with_dims_and_tensors.default":
        [1, 1, [2], {"node": "x"}, {"node": "x"}], 
    "aten._nested_tensor_from_tensor_list.default": [[X]],
    "aten.to_sparse.default": [X],
    # resizes
    "aten.resize_.default": [X, [100_000_000]],
    "prims.resize.default": [X, [100_000_000]],
    "aten._copy_from_and_resize.default": [X, X],
    "aten._resize_output_.default": [X, [4], {"device": "cpu"}],
    "aten.resize_as_.default": [X, X],
    # storages and files
    "aten.from_file.default": ["/etc/passwd", True, 8],
    "aten.set_.source_Tensor": [X, X],
    "aten._unsafe_set_version_counter.default": [[X], [1]],
    # process-wide state: no ATen op sets grad mode or seeds; the Python callables that do are refused
    "aten._set_grad_enabled.default": [False],
    "torch._C._set_grad_enabled": [False],
    "torch.set_grad_enabled": [False],
    "torch.manual_seed": [1],
    "aten.seed.default": [],
    # out= overloads of allowed ops write (and resize) a tensor given to them
    "aten.add.out": [X, X],
}


@pytest.mark.parametrize("target", sorted(EXCLUDED))
def test_excluded_ops_are_refused_with_one_line(mlp_copy, target):
    _insert_call(mlp_copy, target, EXCLUDED[target])
    with pytest.raises(ArtifactError) as e:
        aotpipe.load(mlp_copy)
    assert target in str(e.value) and "\n" not in str(e.value)
    r = CliRunner().invoke(main, ["show", str(mlp_copy)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output


def test_sparse_layout_argument_is_refused(mlp_copy):
    _insert_call(mlp_copy, "aten.empty.memory_format", [[100_000_000, 100_000_000]],
                 {"layout": {"layout": "sparse_coo"}})
    with pytest.raises(ArtifactError, match="layout 'sparse_coo' is not allowed"):
        aotpipe.load(mlp_copy)


def test_allow_list_holds_no_op_of_an_excluded_kind():
    allowed = allowed_ops()
    assert "aten.add_.Tensor" in allowed and "aten.copy_.default" in allowed and "aten.relu.default" in allowed
    assert "aten.resize_.default" not in allowed  # core ATen, removed by DENIED
    for name in allowed:
        op = name.split(".")[1]
        assert not any(pattern.search(op) for pattern, _ in DENIED), name
        assert not name.endswith(".out"), name


def _dropout_graph_module():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        y, _ = torch.ops.aten.native_dropout.default(x, 0.5, True)
        return torch.ops.aten.mul.Tensor(y, 2.0)

    gm = make_fx(f)(torch.randn(4, 4))
    return graph_from_json(json.loads(json.dumps(graph_to_json(gm))))


@pytest.mark.parametrize("grad", [True, False])
def test_running_a_loaded_graph_keeps_the_callers_grad_mode_and_seed(grad):
    from aotpipe.replay import run_graph

    gm = _dropout_graph_module()
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    with torch.set_grad_enabled(grad):
        run_graph(gm, [torch.randn(4, 4)])  # seeds the generator as at capture, inside
        assert torch.is_grad_enabled() is grad
    assert torch.initial_seed() == 1234
    torch.set_rng_state(state)
    with torch.set_grad_enabled(grad):
        gm(torch.randn(4, 4))  # called directly: draws from the caller's generator, reseeds nothing
        assert torch.is_grad_enabled() is grad
    assert torch.initial_seed() == 1234


def test_the_runtime_asserts_export_leaves_in_graphs_load():
    # Their one string argument is the message of the error they raise (longcat_flash's graphs).
    for name in ("aten._assert_async.msg", "aten._assert_scalar.default", "aten._functional_assert_async.msg"):
        resolve_op(name)
