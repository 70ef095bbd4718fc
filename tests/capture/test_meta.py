"""Capture mode meta: the graphs of a model built on the meta device, without its memory.

A meta capture must give the graphs and metadata a real CPU capture gives (structure, every
input's and output's shape, stride, dtype, and device "cpu"), allocate no parameter
storage, write a metadata-only artefact that replays with random inputs, and refuse a
model that reads tensor values with one clear line.
"""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from aotpipe.capture import capture_export
from aotpipe.capture.meta import build_on_meta, capture_meta, meta_example_inputs
from aotpipe.checks.meta import check_meta_written
from aotpipe.checks.written import graph_structure
from aotpipe.errors import CaptureError, SourceError
from aotpipe.models.sources import build_model, make_example_inputs
from aotpipe.spec import ModelSpec

KINDS = ["inference", "forward", "backward", "joint"]

LLAMA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, use_cache=False)


def _spec(source, inputs, *, config=None, args=None, name="m"):
    data = dict(name=name, source=source, args=args or {}, config=config, inputs=inputs, graphs=KINDS, passes=[],
                save_inputs=False, verify=False, loss="sum", seed=0)
    try:
        return ModelSpec.model_validate({**data, "mode": "meta"})
    except ValueError:  # a config that does not know mode meta yet
        return ModelSpec.model_validate({**data, "mode": "export"})


def _ranges(spec):
    return {(inp.name or f"arg{i}"): (int(inp.low or 0), int(inp.high if inp.high is not None else 2))
            for i, inp in enumerate(spec.inputs) if inp.is_integer}


def _names(spec):
    return [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)]


def _meta_capture(spec):
    model = build_on_meta(spec)
    args, kwargs = meta_example_inputs(spec)
    cap = capture_meta(model, args, kwargs, name=spec.name, graphs=KINDS, input_names=_names(spec),
                       int_ranges=_ranges(spec))
    return model, cap


def _real_capture(spec):
    model = build_model(spec)
    args, kwargs = make_example_inputs(spec)
    return capture_export(model, args, kwargs, name=spec.name, graphs=KINDS, input_names=_names(spec),
                          int_ranges=_ranges(spec))


SPECS = {
    "llama": lambda: _spec("hf:LlamaForCausalLM", [{"name": "input_ids", "shape": [2, 16], "dtype": "int64",
                                                    "high": 1000}], config=LLAMA, name="llama"),
    "tiny_transformer": lambda: _spec("aotpipe.zoo:tiny_transformer", [
        {"name": "input_ids", "shape": [2, 12], "dtype": "int64", "high": 1000},
        {"name": "attention_mask", "shape": [2, 12], "dtype": "int64", "low": 1, "high": 2}], name="tt"),
    "running_norm": lambda: _spec("aotpipe.zoo:running_norm", [{"shape": [4, 16]}], name="rn"),
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def both(request):
    if request.param == "llama":
        pytest.importorskip("transformers")
    spec = SPECS[request.param]()
    model, cap = _meta_capture(spec)
    return spec, model, cap, _real_capture(spec)


def test_all_four_kinds_and_mode(both):
    _, _, cap, _ = both
    assert list(cap.graphs) == KINDS
    assert cap.mode == "meta"
    assert cap.contract is not None and cap.contract.num_tangents >= 1


def test_no_parameter_storage(both):
    spec, model, _, _ = both
    built = build_on_meta(spec)
    assert all(t.is_meta for t in list(built.parameters()) + list(built.buffers()))
    # after capture the model holds fake tensors (no storage) that say they are on the CPU
    for t in list(model.parameters()) + list(model.buffers()):
        assert isinstance(t, FakeTensor) and t.device == torch.device("cpu")


def test_every_tensor_meta_is_on_cpu(both):
    _, _, cap, _ = both
    for kind, g in cap.graphs.items():
        metas = [gi.meta for gi in g.inputs] + [go.meta for go in g.outputs]
        assert all(m.device == torch.device("cpu") for m in metas if m is not None), kind
        for node in g.gm.graph.nodes:  # no factory op or node value names the meta device
            assert "meta" not in repr(node.kwargs.get("device", "")), (kind, node.format_node())
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                assert val.device == torch.device("cpu"), (kind, node.name)


def test_same_graphs_and_layouts_as_a_real_capture(both):
    _, _, cap, real = both
    for kind in KINDS:
        g, r = cap.graphs[kind], real.graphs[kind]
        assert graph_structure(g.gm) == graph_structure(r.gm), kind
        assert [(i.name, i.role, i.target, i.meta) for i in g.inputs] == \
            [(i.name, i.role, i.target, i.meta) for i in r.inputs], kind
        assert [(o.role, o.target, o.meta) for o in g.outputs] == [(o.role, o.target, o.meta) for o in r.outputs]
    assert cap.contract == real.contract


def test_user_integer_ranges_are_kept(both):
    spec, _, cap, _ = both
    ranges = _ranges(spec)
    for kind in ("inference", "forward", "joint"):
        for gi in cap.graphs[kind].inputs:
            if gi.role == "user" and gi.target in ranges and gi.target != "input_ids":
                assert gi.int_range == ranges[gi.target]


def test_embedding_gives_the_index_range_without_int_ranges():
    spec = SPECS["tiny_transformer"]()
    model = build_on_meta(spec)
    args, kwargs = meta_example_inputs(spec)
    cap = capture_meta(model, args, kwargs, name="tt", graphs=["inference"], input_names=_names(spec))
    ids = next(gi for gi in cap.graphs["inference"].inputs if gi.target == "input_ids")
    assert ids.int_range == (0, 1000)


def test_real_inputs_are_used_for_their_shapes_and_ranges():
    spec = SPECS["running_norm"]()
    model = build_on_meta(spec)
    cap = capture_meta(model, (torch.randn(4, 16),), {}, name="rn", graphs=["inference"], input_names=["x"])
    x = next(gi for gi in cap.graphs["inference"].inputs if gi.role == "user")
    assert x.meta.shape == (4, 16) and x.meta.device == torch.device("cpu")


def test_metadata_only_artefact_checks_and_replays_with_random_inputs(tmp_path):
    from aotpipe.artifact.writer import graph_entries, write_model
    from aotpipe.replay.run import replay

    spec = SPECS["tiny_transformer"]()
    _, cap = _meta_capture(spec)
    codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(cap)}
    found = []

    def check(folder):
        mc = check_meta_written(folder, codes=codes)
        found.append(mc)
        return mc.outcome

    written = write_model(tmp_path, cap, model_record=spec.to_json(), fingerprint="0" * 64, inputs=None, check=check)
    assert found[0].problems == []
    assert not list(written.path.rglob("*.safetensors"))  # metadata only: no blobs
    from aotpipe.format import records

    manifest = records.read(records.Manifest, written.path / records.MANIFEST, written.path)[1]
    assert manifest.capture.mode == "meta"
    assert {k: v.status for k, v in manifest.verification.items()} == {k: "shapes only" for k in KINDS}
    from aotpipe.trust.verify import verify_artifact

    assert verify_artifact(written.path) == []  # hashes, safe loading, module.py matches graph.json
    results = replay(written.path, inputs="random")
    assert [r.status for r in results] == ["ran"] * 4, [r.error or r.mismatches for r in results]


def _tampered_meta_check(tmp_path, tamper, codes_edit=None):
    """The meta check's problems for tiny_transformer's artefact, `tamper(folder)` applied to
    the written folder before the check runs (the check sees files the loader accepts)."""
    import json

    from aotpipe.artifact.writer import graph_entries, write_model

    spec = SPECS["tiny_transformer"]()
    _, cap = _meta_capture(spec)
    codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(cap)}
    if codes_edit:
        codes_edit(codes)
    found = []

    def check(folder):
        tamper(folder, json)
        mc = check_meta_written(folder, codes=codes)
        found.append(mc)
        return mc.outcome

    write_model(tmp_path, cap, model_record=spec.to_json(), fingerprint="0" * 64, inputs=None, check=check)
    return found[0].problems


def _edit_inputs_json(kind, edit):
    def tamper(folder, json):
        path = next(folder.glob(f"*_{kind}_0")) / "inputs.json"
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))
    return tamper


# Planted faults: each check of the meta check, broken on purpose and seen reported.


def test_meta_check_reports_an_output_shape_that_is_not_the_recorded_one(tmp_path):
    def edit(record):
        record["outputs"][0]["shape"][0] += 1  # recorded one row more than the graph makes

    problems = _tampered_meta_check(tmp_path, _edit_inputs_json("inference", edit))
    assert len(problems) == 1 and problems[0].startswith("inference graph: output 0 is torch.float32[2, 12, 64]"), problems
    assert "recorded float32[3, 12, 64]" in problems[0]


def test_meta_check_reports_a_graph_that_does_not_run_on_its_fake_inputs(tmp_path):
    def edit(record):
        user = next(i for i in record["inputs"] if i["role"] == "user")
        user["shape"][-1] += 1  # the inputs' sizes no longer fit the graph's first op
        user["stride"] = [user["shape"][-1], 1][-len(user["shape"]):]
        record["storages"][user["storage"]]["numel"] = user["shape"][0] * user["shape"][-1]

    problems = _tampered_meta_check(tmp_path, _edit_inputs_json("inference", edit))
    assert len(problems) == 1 and problems[0].startswith("inference graph: the written graph does not run on fake inputs"), problems


def test_meta_check_reports_a_graph_json_that_is_not_the_captured_graph(tmp_path):
    def edit(codes):
        codes["joint"][-2] = codes["joint"][-2] + " "  # the captured graph, one node changed

    problems = _tampered_meta_check(tmp_path, lambda folder, json: None, edit)
    assert problems == ["joint graph: graph.json does not rebuild the captured graph exactly"], problems


# ---------------------------------------------------------------------------------------
# what a meta capture cannot do


class _ReadsValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y * y.sum().item()


class _Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y if y.sum() > 0 else -y


def _reads_value():
    return _ReadsValue()


def _names_a_device():
    m = nn.Linear(4, 4)
    m.register_buffer("scale", torch.ones(4, device="cpu"))
    return m


@pytest.mark.parametrize("cls", [_ReadsValue, _Branches])
def test_a_forward_that_reads_values_is_one_clear_line(cls):
    with torch.device("meta"):
        model = cls()
    with pytest.raises(CaptureError) as info:
        capture_meta(model, (torch.empty(2, 8, device="meta"),), {}, name="m", graphs=KINDS, input_names=["x"])
    msg = str(info.value)
    assert "\n" not in msg
    assert "reads a tensor's value" in msg and "mode export" in msg


def test_a_source_that_names_a_device_is_refused():
    spec = _spec("tests.capture.test_meta:_names_a_device", [{"shape": [2, 4]}])
    with pytest.raises(SourceError, match="names a device"):
        build_on_meta(spec)
