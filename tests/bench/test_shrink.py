"""bench --minimize's last step (aotpipe/corpus/bench/shrink.py): a repro's sizes halved while it
still fails as the graph does; a size the fault needs stays just inside its bound, and a size the
cut's own arguments fix stays as it is."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.artifact.load import load
from aotpipe.corpus.bench import minimize as minimize_mod
from aotpipe.corpus.bench.backends import Backend
from aotpipe.corpus.bench.locate import Located, first_faulty_node
from aotpipe.corpus.bench.minimize import MinimizeTask
from aotpipe.corpus.bench.shrink import MAX_TRIES, shrink_sizes

PLANTED = "tests.bench.backends"


def _minimized(tmp_path, f, x, backend):
    gm = make_fx(f)(x)
    b = Backend(f"{PLANTED}:{backend}")
    res = Located("m", "inference", False, "")
    culprit, tensors = first_faulty_node(res, gm, [x], ["user"], b, b.resolve())
    task = MinimizeTask("m", "m", "inference", f"{PLANTED}:{backend}", "saved", 0, str(tmp_path), ())
    return minimize_mod.minimized_repro(gm, culprit, [x], tensors, b, task)


def test_a_fault_at_any_size_is_shrunk_to_one_element(tmp_path):
    # every value where gelu and relu part (3x in [0.15, 0.45]: gelu 60% of relu), whatever the draw
    x = 0.1 + 0.02 * torch.rand(64, 32, generator=torch.Generator().manual_seed(0))
    m = _minimized(tmp_path, lambda x: torch.nn.functional.gelu(x * 3) + 1, x, "gelu_as_relu")
    assert m.found and m.op == "aten.gelu.default" and m.shrunk == ["64 -> 1", "32 -> 1"], m
    ga = load(m.repro).graphs["inference"]
    (inp,) = ga.saved_inputs()
    assert inp.shape == (1, 1) and torch.equal(inp, (x * 3)[:1, :1])  # the leading part of the recorded values
    placeholder = next(n for n in ga.module.graph.nodes if n.op == "placeholder")
    assert placeholder.meta["saved_val"]["shape"] == [1, 1]  # graph.json records the size the repro runs at
    assert "    shrunk: 64 -> 1, 32 -> 1" in "\n".join(m.lines())


def test_a_fault_from_a_size_on_keeps_the_size_just_inside_it(tmp_path):
    m = _minimized(tmp_path, lambda x: torch.nn.functional.gelu(x * 3), torch.randn(64, 32), "off_from_1024_elements")
    assert m.found and m.shrunk == ["64 -> 32"], m  # 32 x 32 = 1024 fails, 16 x 32 and 32 x 16 do not
    (inp,) = load(m.repro).graphs["inference"].saved_inputs()
    assert inp.shape == (32, 32) and inp.is_contiguous() and inp.untyped_storage().nbytes() == 1024 * 4


def test_a_size_the_cut_fixes_stays_and_the_tries_are_bounded():
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    v = g.call_function(aten.view.default, (x, [8, 4]))  # the cut's own argument fixes 32 elements
    g.output((g.call_function(aten.relu.default, (v,)),))
    cm = torch.fx.GraphModule(torch.nn.Module(), g)
    calls = []

    def fails(gm, args):
        calls.append(tuple(args[0].shape))
        gm(*args)  # raises where the view no longer fits
        return True, ""

    out = shrink_sizes(cm, [torch.randn(2, 16)], fails)
    assert out.steps == [] and calls == [(2, 8), (1, 16)] and out.args[0].shape == (2, 16)
    five = _inputs_graph(5)
    many = shrink_sizes(five, [torch.randn(n) for n in (64, 63, 62, 61, 60)], lambda gm, args: (True, ""))
    assert many.tries == MAX_TRIES  # 6 halvings each would take 30
    assert many.steps == ["64 -> 1", "63 -> 1", "62 -> 1", "61 -> 1"]  # 60 left: no try left
    same = shrink_sizes(_inputs_graph(1), [torch.randn(*[2] * 10)], lambda gm, args: (True, ""))
    assert same.tries == 1 and same.steps == ["2 -> 1"]  # every 2 is one size, halved at once
    odd = shrink_sizes(_inputs_graph(1), [torch.randn(5)], lambda gm, args: (args[0].shape[0] >= 3, ""))
    assert odd.steps == ["5 -> 3"] and odd.args[0].shape == (3,) and odd.tries == 2  # halving rounds up: 5, 3, 2


def _inputs_graph(n):
    g = torch.fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n)]
    g.output(tuple(xs))
    return torch.fx.GraphModule(torch.nn.Module(), g)
