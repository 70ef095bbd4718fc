# mlp_backward_0: the backward graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_7: saved forward_output[1] float32[8, 32]
#   relu: saved forward_output[2] float32[8, 64]
#   alias: saved forward_output[3] float32[8, 64]
#   permute_1: saved forward_output[4] float32[64, 64]
#   relu_1: saved forward_output[5] float32[8, 64]
#   alias_1: saved forward_output[6] float32[8, 64]
#   permute_2: saved forward_output[7] float32[64, 10]
#   add_3: saved forward_output[8] float32[8, 10]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_7: "f32[8, 32][32, 1]cpu", relu: "f32[8, 64][64, 1]cpu", alias: "f32[8, 64][64, 1]cpu", permute_1: "f32[64, 64][1, 64]cpu", relu_1: "f32[8, 64][64, 1]cpu", alias_1: "f32[8, 64][64, 1]cpu", permute_2: "f32[64, 10][1, 64]cpu", add_3: "f32[8, 10][10, 1]cpu", tangents_1: "f32[][]cpu"):
        expand: "f32[8, 10][0, 0]cpu" = torch.ops.aten.expand.default(tangents_1, [8, 10]);  tangents_1 = None
        mul_5: "f32[8, 10][10, 1]cpu" = torch.ops.aten.mul.Tensor(expand, add_3);  expand = add_3 = None
        permute_3: "f32[10, 64][64, 1]cpu" = torch.ops.aten.permute.default(permute_2, [1, 0]);  permute_2 = None
        mm: "f32[8, 64][64, 1]cpu" = torch.ops.aten.mm.default(mul_5, permute_3);  permute_3 = None
        permute_4: "f32[10, 8][1, 10]cpu" = torch.ops.aten.permute.default(mul_5, [1, 0])
        mm_1: "f32[10, 64][64, 1]cpu" = torch.ops.aten.mm.default(permute_4, relu_1);  permute_4 = relu_1 = None
        permute_5: "f32[64, 10][1, 64]cpu" = torch.ops.aten.permute.default(mm_1, [1, 0]);  mm_1 = None
        sum_2: "f32[1, 10][10, 1]cpu" = torch.ops.aten.sum.dim_IntList(mul_5, [0], True);  mul_5 = None
        view_2: "f32[10][1]cpu" = torch.ops.aten.view.default(sum_2, [10]);  sum_2 = None
        permute_6: "f32[10, 64][64, 1]cpu" = torch.ops.aten.permute.default(permute_5, [1, 0]);  permute_5 = None
        alias_2: "f32[8, 64][64, 1]cpu" = torch.ops.aten.alias.default(alias_1);  alias_1 = None
        le: "b8[8, 64][64, 1]cpu" = torch.ops.aten.le.Scalar(alias_2, 0);  alias_2 = None
        scalar_tensor: "f32[][]cpu" = torch.ops.aten.scalar_tensor.default(0, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'))
        where: "f32[8, 64][64, 1]cpu" = torch.ops.aten.where.self(le, scalar_tensor, mm);  le = scalar_tensor = mm = None
        permute_7: "f32[64, 64][64, 1]cpu" = torch.ops.aten.permute.default(permute_1, [1, 0]);  permute_1 = None
        mm_2: "f32[8, 64][64, 1]cpu" = torch.ops.aten.mm.default(where, permute_7);  permute_7 = None
        permute_8: "f32[64, 8][1, 64]cpu" = torch.ops.aten.permute.default(where, [1, 0])
        mm_3: "f32[64, 64][64, 1]cpu" = torch.ops.aten.mm.default(permute_8, relu);  permute_8 = relu = None
        permute_9: "f32[64, 64][1, 64]cpu" = torch.ops.aten.permute.default(mm_3, [1, 0]);  mm_3 = None
        sum_3: "f32[1, 64][64, 1]cpu" = torch.ops.aten.sum.dim_IntList(where, [0], True);  where = None
        view_3: "f32[64][1]cpu" = torch.ops.aten.view.default(sum_3, [64]);  sum_3 = None
        permute_10: "f32[64, 64][64, 1]cpu" = torch.ops.aten.permute.default(permute_9, [1, 0]);  permute_9 = None
        alias_3: "f32[8, 64][64, 1]cpu" = torch.ops.aten.alias.default(alias);  alias = None
        le_1: "b8[8, 64][64, 1]cpu" = torch.ops.aten.le.Scalar(alias_3, 0);  alias_3 = None
        scalar_tensor_1: "f32[][]cpu" = torch.ops.aten.scalar_tensor.default(0, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'))
        where_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.where.self(le_1, scalar_tensor_1, mm_2);  le_1 = scalar_tensor_1 = mm_2 = None
        permute_11: "f32[64, 8][1, 64]cpu" = torch.ops.aten.permute.default(where_1, [1, 0])
        mm_4: "f32[64, 32][32, 1]cpu" = torch.ops.aten.mm.default(permute_11, primals_7);  permute_11 = primals_7 = None
        permute_12: "f32[32, 64][1, 32]cpu" = torch.ops.aten.permute.default(mm_4, [1, 0]);  mm_4 = None
        sum_4: "f32[1, 64][64, 1]cpu" = torch.ops.aten.sum.dim_IntList(where_1, [0], True);  where_1 = None
        view_4: "f32[64][1]cpu" = torch.ops.aten.view.default(sum_4, [64]);  sum_4 = None
        permute_13: "f32[64, 32][32, 1]cpu" = torch.ops.aten.permute.default(permute_12, [1, 0]);  permute_12 = None
        return (permute_13, view_4, permute_10, view_3, permute_6, view_2, None)
