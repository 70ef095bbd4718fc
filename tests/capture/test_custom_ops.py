"""Libraries' custom ops decomposed into ATen at capture, views that decompositions would break
turned into reshapes, and an op with no decomposition refused by name."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.capture import capture_export
from aotpipe.capture.custom_ops import DECOMPOSITIONS, library_ops
from aotpipe.capture.export import _views_to_reshapes
from aotpipe.cli import main


def _library_grouped_mm():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the op)

    return torch.ops.transformers.grouped_mm_fallback.default


@pytest.mark.parametrize("offs", [[2, 2, 6], [0, 3, 6], [6, 6, 6], [1, 4, 6]])
def test_grouped_mm_decomposition_matches_the_library_kernel_and_its_gradients(offs):
    op = _library_grouped_mm()
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    o = torch.tensor(offs)
    ref = op(x, w, o)
    got = DECOMPOSITIONS["transformers::grouped_mm_fallback"](x, w, o)
    torch.testing.assert_close(got, ref)
    g = torch.randn_like(ref)
    assert all(torch.allclose(a, b) for a, b in zip(torch.autograd.grad(ref, (x, w), g),
                                                     torch.autograd.grad(got, (x, w), g)))


MIXTRAL = """
version: 1
name: moe
models:
  - name: mixtral
    source: hf:MixtralModel
    config: {num_hidden_layers: 1, hidden_size: 32, intermediate_size: 64, num_attention_heads: 2,
             num_key_value_heads: 1, num_local_experts: 4, num_experts_per_tok: 2, vocab_size: 100, use_cache: false}
    inputs: [{name: input_ids, shape: [2, 8], dtype: int64, high: 100}]
  - name: gpt2
    source: hf:GPT2Model
    config: {n_layer: 1, n_head: 4, n_embd: 64, vocab_size: 128, bos_token_id: 127, eos_token_id: 127,
             use_cache: false}
    inputs: [{name: input_ids, shape: [2, 16], dtype: int64, high: 128}]
"""


@pytest.mark.slow
def test_a_mixture_of_experts_model_captures_in_aten_and_passes_its_checks(tmp_path):
    # Mixtral calls transformers::grouped_mm_fallback; GPT-2's attention output is a view that
    # the math SDPA's strides break ("Cannot view a tensor with shape ...").
    (tmp_path / "p.yaml").write_text(textwrap.dedent(MIXTRAL))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 0, r.output
    by = {m["name"]: m for m in json.loads(r.stdout)["models"]}
    for m in by.values():
        assert m["status"] == "ok" and m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m
        assert len(m["graphs"]) == 4
    assert any("transformers::grouped_mm_fallback" in n for n in by["mixtral"]["notes"]), by["mixtral"]["notes"]
    for gj in (tmp_path / "out" / "moe" / "mixtral").rglob("graph.json"):
        # Every call is an ATen op (the library's own op was decomposed); a node's origin may
        # still name the transformers module it came from, which is what provenance is for.
        targets = [n["target"] for n in json.loads(gj.read_text())["nodes"] if n["op"] == "call_function"]
        assert targets and not [t for t in targets if t.startswith("transformers")], gj


@torch.library.custom_op("aotpipe_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class UsesAnUnknownOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.aotpipe_test.twice(self.fc(x))


def test_a_custom_op_without_a_decomposition_stays_and_is_named():
    cap = capture_export(UsesAnUnknownOp(), (torch.randn(2, 4),), {}, name="m", graphs=["inference"],
                         input_names=["x"])
    assert [str(op) for op in library_ops(cap.graphs["inference"].gm)] == ["aotpipe_test.twice.default"]


def test_capturing_an_unknown_custom_op_fails_naming_it_and_the_trust_that_keeps_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "custom_op_model", sys.modules[__name__])
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: c
        models:
          - {name: m, source: "custom_op_model:UsesAnUnknownOp", inputs: [{shape: [2, 4]}], graphs: [inference]}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    assert r.exit_code == 1, r.output
    (m,) = json.loads(r.stdout)["models"]
    assert m["status"] == "failed" and m["stage"] == "capture" and "\n" not in m["error"], m
    assert "aotpipe_test::twice" in m["error"] and "trusted_ops: [aotpipe_test]" in m["error"], m["error"]


def test_views_become_reshapes_unless_something_writes_through_them():
    class M(torch.nn.Module):
        def forward(self, x):
            a = x.transpose(0, 1).contiguous().view(-1)  # read only: may become a reshape
            b = x.clone().view(-1)
            b.add_(1)  # written through: must stay a view
            return a, b

    ep = _views_to_reshapes(torch.export.export(M(), (torch.randn(3, 4),), strict=False))
    targets = [n.target for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.reshape.default in targets and torch.ops.aten.view.default in targets
    x = torch.randn(3, 4)
    for got, want in zip(ep.module()(x), M()(x)):
        torch.testing.assert_close(got, want)


class CallsGroupedMm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 5, 4))

    def forward(self, x):
        offs = torch.tensor([2, 2, 6])
        return torch.ops.transformers.grouped_mm_fallback(x, self.w, offs).relu()


def test_dynamo_capture_decomposes_the_library_op_too():
    _library_grouped_mm()
    from aotpipe.capture import capture_dynamo

    torch.manual_seed(0)
    cap = capture_dynamo(CallsGroupedMm(), (torch.randn(6, 5),), {}, name="m",
                         graphs=["inference", "forward", "backward", "joint"], input_names=["x"])
    assert cap.graphs and all(not library_ops(g.gm) for g in cap.graphs.values())


def test_flat_graph_shares_tensors_it_could_not_deep_copy():
    from aotpipe.capture.export import _flat_graph

    class WithMeta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.empty(3, device="meta"))

        def forward(self, x):
            return x + self.b

    gm = torch.fx.symbolic_trace(WithMeta())
    flat = _flat_graph(gm)
    assert flat.b is gm.b and flat.graph is not gm.graph and type(flat).__name__ == "GraphModule"
