# tiny_backward_0: the backward graph of model tiny (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_2: saved forward_output[1] float32[1, 4]
#   alias: saved forward_output[2] float32[1, 4]
#   add_4: saved forward_output[3] float32[1, 4]
#   add_8: saved forward_output[4] float32[1, 4]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_2: "f32[1, 4][4, 1]cpu", alias: "f32[1, 4][4, 1]cpu", add_4: "f32[1, 4][4, 1]cpu", add_8: "f32[1, 4][4, 1]cpu", tangents_1: "f32[][]cpu"):
        expand: "f32[1, 4][1, 0]cpu" = torch.ops.aten.expand.default(tangents_1, [1, 4])
        mul_11: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(expand, add_8);  expand = add_8 = None
        expand_1: "f32[1, 4][1, 0]cpu" = torch.ops.aten.expand.default(tangents_1, [1, 4]);  tangents_1 = None
        mul_12: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(expand_1, add_4);  expand_1 = add_4 = None
        add_10: "f32[1, 4][4, 1]cpu" = torch.ops.aten.add.Tensor(mul_11, mul_12);  mul_11 = mul_12 = None
        alias_1: "f32[1, 4][4, 1]cpu" = torch.ops.aten.alias.default(alias);  alias = None
        le: "b8[1, 4][4, 1]cpu" = torch.ops.aten.le.Scalar(alias_1, 0);  alias_1 = None
        scalar_tensor: "f32[][]cpu" = torch.ops.aten.scalar_tensor.default(0, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'))
        where: "f32[1, 4][4, 1]cpu" = torch.ops.aten.where.self(le, scalar_tensor, add_10);  le = scalar_tensor = add_10 = None
        mul_13: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(where, primals_2);  where = primals_2 = None
        sum_3: "f32[1, 4][4, 1]cpu" = torch.ops.aten.sum.dim_IntList(mul_13, [0], True);  mul_13 = None
        view_4: "f32[4][1]cpu" = torch.ops.aten.view.default(sum_3, [4]);  sum_3 = None
        return (view_4, None)
