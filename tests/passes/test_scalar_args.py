"""Every pass on graphs whose ATen calls take Python scalars, None, lists and SymInts where
their schema says Tensor (``aten.sub.Tensor(1, x)``, ``aten.mul.Tensor(2.0, x)``,
``aten.where.ScalarSelf(c, 0.0, x)``): each pass runs, and leaves the results as they were."""

import operator

import pytest
import torch
from torch import nn

from aotpipe.passes import PASSES, parse_pass_entry
from aotpipe.passes.manager import run_chain
from tests.passes.helpers import graph_of

aten = torch.ops.aten
README_CHAIN = ["freeze", "fold_conv_bn", "channels_last", "reinplace"]


class Gates(nn.Module):
    """A GRU-like gate, a where with a constant, a clamp with None, a conv + batch norm scaled."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 1)
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x, img):
        z = torch.sigmoid(self.lin(x))
        a = (1 - z) * x + z * 2.0 + 1 / (z + 1)
        b = torch.where(z > 0.5, 0.0, a).clamp(max=1.0)
        y = self.bn(self.conv(img)) * 2.0 + 1
        return torch.cat([b, 1 - b]), y


def _scalar_first(g):
    """The captured graph with its scalar operands moved where ATen also takes them: first
    (mul.Tensor(2.0, t), add.Tensor(1, t), div.Tensor(1, t)), as where's branch (where.ScalarSelf(c, 0.0, t)), as
    rsub.Scalar, and a SymInt-valued node (sym_size) as mul's first operand."""
    graph = g.gm.graph
    rewritten = set()
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target in (aten.mul.Tensor, aten.add.Tensor) and isinstance(n.args[1], (int, float)) \
                and isinstance(n.args[0], torch.fx.Node):
            n.args = (n.args[1], n.args[0])
            rewritten.add(str(n.target).replace("aten.", ""))
        elif n.target is aten.reciprocal.default:
            n.target, n.args = aten.div.Tensor, (1, n.args[0])
            rewritten.add("div.Tensor")
        elif n.target is aten.where.self and n.args[1].target is aten.scalar_tensor.default:
            n.target, n.args = aten.where.ScalarSelf, (n.args[0], n.args[1].args[0], n.args[2])
            rewritten.add("where.ScalarSelf")
        elif n.target is aten.sub.Tensor and not isinstance(n.args[0], torch.fx.Node) \
                and "rsub.Scalar" not in rewritten:  # the other sub.Tensor(1, x) stays as it is
            n.target, n.args = aten.rsub.Scalar, (n.args[1], n.args[0])
            rewritten.add("rsub.Scalar")
    x = next(n for n in graph.nodes if n.op == "placeholder" and n.target == "x")
    clamp = next(n for n in graph.nodes if n.target is aten.clamp.default)
    with graph.inserting_after(clamp):
        size = graph.call_function(aten.sym_size.int, (x, 0))
        size.meta["val"] = 4
    with graph.inserting_after(size):
        scaled = graph.call_function(aten.mul.Tensor, (size, clamp))
        scaled.meta = dict(clamp.meta)
    for user in list(clamp.users):
        if user is not scaled:
            user.replace_input_with(clamp, scaled)
    graph.eliminate_dead_code()
    g.gm.recompile()
    assert {"mul.Tensor", "add.Tensor", "div.Tensor", "where.ScalarSelf", "rsub.Scalar"} <= rewritten, rewritten
    assert any(n.target is aten.sub.Tensor and n.args[0] == 1 for n in graph.nodes)
    return g


@pytest.fixture(scope="module")
def scalar_first_graph():
    torch.manual_seed(0)
    return _scalar_first(graph_of(Gates(), torch.randn(4, 8), torch.randn(1, 2, 3, 3)))


def _chain_for(name):
    """The pass alone, after those it needs (freeze for the passes that work on its constants)."""
    return [*PASSES[name].needs, name]


def _steps(names):
    return [parse_pass_entry(n)[1] for n in names]


@pytest.mark.parametrize("name", [n for n, p in PASSES.items() if "inference" in p.kinds])
def test_each_pass_takes_scalars_where_aten_takes_tensors(scalar_first_graph, name):
    g = scalar_first_graph.copy()
    final, records = run_chain(g, _steps(_chain_for(name)))  # raises, naming the pass, if one fails or errs
    assert [r.name for r in records] == _chain_for(name)


def test_readme_chain_reinplaces_a_graph_with_scalar_first_subtraction(scalar_first_graph):
    final, records = run_chain(scalar_first_graph.copy(), _steps(README_CHAIN))
    assert [r.name for r in records] == README_CHAIN
    assert records[-1].stats["ops_reinplaced"] > 0
    subs = [n for n in final.gm.graph.nodes if n.op == "call_function" and n.target is aten.sub.Tensor
            and not isinstance(n.args[0], torch.fx.Node)]
    assert subs  # the scalar-first subtraction is still there, functional (nothing to write into)
