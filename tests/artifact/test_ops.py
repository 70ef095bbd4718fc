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
    # unsafe by contract: they trust sizes, strides and buffers as given
    "aten._reshape_alias.default": [X, [10**6], [1]],
    "aten._reshape_alias_copy.default": [X, [10**6], [1]],
    "aten._fused_sgd.default": [[X], [X], [X], 0.0, 0.1, 0.0, False, False, False],
    "aten._fused_moving_avg_obs_fq_helper_functional.default": [X] * 8 + [0.1, 0, 255, 0],
    # functional by schema, refused by category (the derived list's rule, tools/allowed_ops.py)
    "aten._copy_from.default": [X, X],  # writes dst, which its schema does not mark
    "aten._backward.default": [X, [X]],  # runs autograd
    "aten._make_dual.default": [X, X, 0],  # forward-AD internals
    "aten.coalesce.default": [X],  # sparse
    "aten._weight_int4pack_mm.default": [X, X, 32, X],  # packed quantized weights
    "aten._flash_attention_forward.default": [X, X, X, X, X, 4, 4, 0.0, False, False],  # reads offsets
    "aten._scaled_dot_product_flash_attention.quantized": [X, X, X],  # a quantized overload
    "aten._foobar.default": [X],  # a test op
    # not an op of this torch at all
    "aten.no_such_op.default": [X],
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


def test_an_argument_that_switches_a_kernels_checks_off_is_refused(mlp_copy):
    _insert_call(mlp_copy, "aten.segment_reduce.default", [X, "sum"], {"lengths": X, "unsafe": True})
    with pytest.raises(ArtifactError) as e:
        aotpipe.load(mlp_copy)
    assert "node 'hostile': aten.segment_reduce.default with unsafe=True skips the kernel's own checks" in str(e.value)


def test_the_reviewed_list_holds_only_what_the_rules_admit():
    from aotpipe.artifact.ops import LIST_FILE, listed

    lines = [line for line in LIST_FILE.read_text().splitlines() if not line.startswith("#")]
    assert lines == sorted(set(lines)) and len(lines) == len(listed())
    for name in lines:
        ns, op, overload = name.split(".")
        assert ns == "aten" and not any(pattern.search(op) for pattern, _ in DENIED), name
        target = getattr(getattr(torch.ops.aten, op), overload)
        assert not target._schema.is_mutable and not any(a.is_out for a in target._schema.arguments), name
    for unsafe in ("aten._reshape_alias.default", "aten._fused_sgd.default", "aten._reshape_alias_copy.default"):
        assert unsafe not in listed() and unsafe not in allowed_ops()
    # the value-indexing ops real training graphs hold stay, in checked forms
    from aotpipe.artifact.checked import CHECKS
    from aotpipe.artifact.ops import op_name

    assert {op_name(op) for op in CHECKS if not op._schema.is_mutable} <= set(allowed_ops())  # listed, or MKLDNN


@pytest.mark.slow
def test_every_op_in_the_zoo_hf_graphs_is_allowed(zoo_run):
    root, r = zoo_run
    assert r.exit_code == 0, r.output
    ops = graph_ops(root)
    assert len(ops) > 50
    for name in sorted(ops):
        resolve_op(name)


def _allowed_ops_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "allowed_ops.py"
    spec = importlib.util.spec_from_file_location("allowed_ops_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_op_the_passes_and_capture_emit_is_on_the_list():
    from aotpipe.artifact.ops import listed

    tool = _allowed_ops_tool()
    emitted = {name for name in tool.source_ops() if tool.rules_admit(name)}
    assert "aten.max_pool2d.default" in emitted and "aten.linear.default" in emitted
    assert emitted <= listed(), sorted(emitted - listed())
    # and the list is exactly what the tool derives from this torch's registry by its rule
    assert tool.generate() == sorted(listed())


def test_our_own_capture_is_never_refused_for_its_ops_and_says_what_others_refuse(tmp_path, monkeypatch):
    # Planted: the list for artefacts from elsewhere loses relu, an op the capture emits.
    from aotpipe.artifact import ops
    from aotpipe.pipeline.config import parse_pipeline
    from aotpipe.pipeline.runner import run_pipeline

    shrunk = ops.listed() - {"aten.relu.default"}
    monkeypatch.setattr(ops, "listed", lambda: shrunk)
    ops._resolve.cache_clear()
    try:
        text = ("version: 1\nname: own\nexecutor: {kind: local}\n"
                "defaults: {mode: export, graphs: [inference, forward], passes: []}\nmodels:\n"
                "  - {name: mlp, source: 'aotpipe.zoo:mlp', inputs: [{shape: [2, 32]}]}\n")
        run = run_pipeline(parse_pipeline(text, str(tmp_path / "p.yaml")), output=tmp_path / "out", progress=False)
        (m,) = run.models
        assert m.status == "ok", m.error  # checked after writing, where it was captured: not refused
        note = next(n for n in m.notes if "the loader refuses in artefacts from elsewhere" in n)
        assert "aten.relu.default" in note
        with pytest.raises(ArtifactError, match="aten.relu.default"):  # another loader refuses it
            aotpipe.load(tmp_path / "out" / "own" / "mlp")
    finally:
        ops._resolve.cache_clear()


def test_a_capture_whose_ops_are_all_listed_has_no_such_note(quickstart_run):
    root, _ = quickstart_run
    for manifest in root.rglob("manifest.json"):
        notes = json.loads(manifest.read_text())["capture"].get("notes", [])
        assert not [n for n in notes if "refuses in artefacts from elsewhere" in n], manifest


def test_an_op_without_a_fake_kernel_is_checked_where_captured_and_refused_elsewhere(tmp_path):
    # aten.geqrf has no fake-tensor kernel: the precheck cannot bound it. Our own capture takes
    # the outputs graph.json records for it (trust by provenance); a loader elsewhere refuses it.
    from aotpipe.pipeline.config import parse_pipeline
    from aotpipe.pipeline.runner import run_pipeline

    text = ("version: 1\nname: nf\nexecutor: {kind: local}\ndefaults: {passes: []}\nmodels:\n"
            "  - {name: geqrf, source: 'torch-op:geqrf', args: {sample: 0}, graphs: [inference]}\n")
    run = run_pipeline(parse_pipeline(text, str(tmp_path / "p.yaml")), output=tmp_path / "out", progress=False)
    (m,) = run.models
    assert m.status == "ok", m.error
    assert m.checks.run > 0 and m.checks.failed == 0
    r = CliRunner().invoke(main, ["replay", str(tmp_path / "out" / "nf" / "geqrf"), "--no-sandbox"])
    assert r.exit_code != 0 and "has no fake-tensor kernel" in r.output, r.output
