import torch
from torch import nn

from tests.passes.helpers import apply, graph_of


class _Factory(nn.Module):
    def forward(self, x):
        return x + torch.arange(x.shape[0], device=x.device)


def test_device_arguments_and_inputs_move():
    g = graph_of(_Factory(), torch.randn(4))
    r = apply("to_device", g, device="meta")
    for n in r.graph.gm.graph.nodes:
        if n.op == "call_function" and "device" in n.kwargs:
            assert n.kwargs["device"] == torch.device("meta")
    assert all(v.device.type == "meta" for v in r.graph.values)
    (out,) = r.graph.gm(*r.graph.values)
    assert out.device.type == "meta" and out.shape == (4,)
