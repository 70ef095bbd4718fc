# mlp_joint_0: the joint graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param program.layers.0.weight float32[64, 32]
#   primals_2: param program.layers.0.bias float32[64]
#   primals_3: param program.layers.1.weight float32[64, 64]
#   primals_4: param program.layers.1.bias float32[64]
#   primals_5: param program.head.weight float32[10, 64]
#   primals_6: param program.head.bias float32[10]
#   primals_7: user arg0 float32[8, 32]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[64, 32][32, 1]cpu", primals_2: "f32[64][1]cpu", primals_3: "f32[64, 64][64, 1]cpu", primals_4: "f32[64][1]cpu", primals_5: "f32[10, 64][64, 1]cpu", primals_6: "f32[10][1]cpu", primals_7: "f32[8, 32][32, 1]cpu", tangents_1: "f32[][]cpu"):
        permute: "f32[32, 64][1, 32]cpu" = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
        addmm: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(primals_2, primals_7, permute);  primals_2 = permute = None
        relu: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu.default(addmm);  addmm = None
        alias: "f32[8, 64][64, 1]cpu" = torch.ops.aten.alias.default(relu)
        permute_1: "f32[64, 64][1, 64]cpu" = torch.ops.aten.permute.default(primals_3, [1, 0]);  primals_3 = None
        addmm_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(primals_4, relu, permute_1);  primals_4 = None
        relu_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu.default(addmm_1);  addmm_1 = None
        alias_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.alias.default(relu_1)
        permute_2: "f32[64, 10][1, 64]cpu" = torch.ops.aten.permute.default(primals_5, [1, 0]);  primals_5 = None
        addmm_2: "f32[8, 10][10, 1]cpu" = torch.ops.aten.addmm.default(primals_6, relu_1, permute_2);  primals_6 = None
        full: "f32[][]cpu" = torch.ops.aten.full.default([], 1, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        arange: "i64[8][1]cpu" = torch.ops.aten.arange.start_step(0, 8, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul: "i64[8][1]cpu" = torch.ops.aten.mul.Tensor(arange, 3);  arange = None
        add: "i64[8][1]cpu" = torch.ops.aten.add.Tensor(mul, 0);  mul = None
        remainder: "i64[8][1]cpu" = torch.ops.aten.remainder.Scalar(add, 7);  add = None
        _to_copy: "f32[8][1]cpu" = torch.ops.aten._to_copy.default(remainder, dtype = torch.float32);  remainder = None
        view: "f32[8, 1][1, 1]cpu" = torch.ops.aten.view.default(_to_copy, [8, 1]);  _to_copy = None
        mul_1: "f32[8, 1][1, 1]cpu" = torch.ops.aten.mul.Tensor(view, 0.125);  view = None
        add_1: "f32[8, 1][1, 1]cpu" = torch.ops.aten.add.Tensor(full, mul_1);  full = mul_1 = None
        arange_1: "i64[10][1]cpu" = torch.ops.aten.arange.start_step(0, 10, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_2: "i64[10][1]cpu" = torch.ops.aten.mul.Tensor(arange_1, 3);  arange_1 = None
        add_2: "i64[10][1]cpu" = torch.ops.aten.add.Tensor(mul_2, 1);  mul_2 = None
        remainder_1: "i64[10][1]cpu" = torch.ops.aten.remainder.Scalar(add_2, 7);  add_2 = None
        _to_copy_1: "f32[10][1]cpu" = torch.ops.aten._to_copy.default(remainder_1, dtype = torch.float32);  remainder_1 = None
        view_1: "f32[1, 10][10, 1]cpu" = torch.ops.aten.view.default(_to_copy_1, [1, 10]);  _to_copy_1 = None
        mul_3: "f32[1, 10][10, 1]cpu" = torch.ops.aten.mul.Tensor(view_1, 0.125);  view_1 = None
        add_3: "f32[8, 10][10, 1]cpu" = torch.ops.aten.add.Tensor(add_1, mul_3);  add_1 = mul_3 = None
        mul_4: "f32[8, 10][10, 1]cpu" = torch.ops.aten.mul.Tensor(addmm_2, add_3);  addmm_2 = None
        sum_1: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(mul_4, []);  mul_4 = None
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
        return [sum_1, permute_13, view_4, permute_10, view_3, permute_6, view_2, None]
