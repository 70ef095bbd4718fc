"""Seeded, deterministic runs; kernels torch cannot make deterministic are named."""

import torch

from aotpipe.runtime.determinism import draws_random, op_draws_random, reproducible


def test_random_ops_come_from_torchs_tag():
    assert op_draws_random(torch.ops.aten.native_dropout.default)
    assert op_draws_random(torch.ops.aten.bernoulli.p)
    assert op_draws_random(torch.ops.aten.randint_like.default)
    assert not op_draws_random(torch.ops.aten.add.Tensor)


def test_reproducible_restores_the_callers_generator_and_flags():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with reproducible():
        torch.rand(5)
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(3), expected)


def test_a_kernel_without_a_deterministic_implementation_is_named():
    # put_ without accumulate has no deterministic CPU kernel (duplicate indices race)
    with reproducible() as log:
        torch.zeros(5).put_(torch.tensor([0, 0]), torch.ones(2))
    assert log.nondeterministic == ["put_"]


def test_graph_with_dropout_draws_random():
    class Drop(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, True)

    gm = torch.export.export(Drop(), (torch.randn(4),)).module()
    assert draws_random(torch.fx.symbolic_trace(torch.nn.Linear(2, 2))) is False
    assert any(op_draws_random(n.target) for n in gm.graph.nodes if n.op == "call_function")
