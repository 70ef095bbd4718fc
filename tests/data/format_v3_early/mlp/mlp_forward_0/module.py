# mlp_forward_0: the forward graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param layers.0.weight float32[16, 8]
#   primals_2: param layers.0.bias float32[16]
#   primals_3: param head.weight float32[10, 16]
#   primals_4: param head.bias float32[10]
#   primals_5: user arg0 float32[2, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[16, 8][8, 1]cpu", primals_2: "f32[16][1]cpu", primals_3: "f32[10, 16][16, 1]cpu", primals_4: "f32[10][1]cpu", primals_5: "f32[2, 8][8, 1]cpu"):
        permute: "f32[8, 16][1, 8]cpu" = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
        addmm: "f32[2, 16][16, 1]cpu" = torch.ops.aten.addmm.default(primals_2, primals_5, permute);  primals_2 = permute = None
        relu: "f32[2, 16][16, 1]cpu" = torch.ops.aten.relu.default(addmm);  addmm = None
        alias: "f32[2, 16][16, 1]cpu" = torch.ops.aten.alias.default(relu)
        permute_1: "f32[16, 10][1, 16]cpu" = torch.ops.aten.permute.default(primals_3, [1, 0]);  primals_3 = None
        addmm_1: "f32[2, 10][10, 1]cpu" = torch.ops.aten.addmm.default(primals_4, relu, permute_1);  primals_4 = None
        full: "f32[][]cpu" = torch.ops.aten.full.default([], 1, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        arange: "i64[2][1]cpu" = torch.ops.aten.arange.start_step(0, 2, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul: "i64[2][1]cpu" = torch.ops.aten.mul.Tensor(arange, 3);  arange = None
        add: "i64[2][1]cpu" = torch.ops.aten.add.Tensor(mul, 0);  mul = None
        remainder: "i64[2][1]cpu" = torch.ops.aten.remainder.Scalar(add, 7);  add = None
        _to_copy: "f32[2][1]cpu" = torch.ops.aten._to_copy.default(remainder, dtype = torch.float32);  remainder = None
        view: "f32[2, 1][1, 1]cpu" = torch.ops.aten.view.default(_to_copy, [2, 1]);  _to_copy = None
        mul_1: "f32[2, 1][1, 1]cpu" = torch.ops.aten.mul.Tensor(view, 0.125);  view = None
        add_1: "f32[2, 1][1, 1]cpu" = torch.ops.aten.add.Tensor(full, mul_1);  full = mul_1 = None
        arange_1: "i64[10][1]cpu" = torch.ops.aten.arange.start_step(0, 10, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_2: "i64[10][1]cpu" = torch.ops.aten.mul.Tensor(arange_1, 3);  arange_1 = None
        add_2: "i64[10][1]cpu" = torch.ops.aten.add.Tensor(mul_2, 1);  mul_2 = None
        remainder_1: "i64[10][1]cpu" = torch.ops.aten.remainder.Scalar(add_2, 7);  add_2 = None
        _to_copy_1: "f32[10][1]cpu" = torch.ops.aten._to_copy.default(remainder_1, dtype = torch.float32);  remainder_1 = None
        view_1: "f32[1, 10][10, 1]cpu" = torch.ops.aten.view.default(_to_copy_1, [1, 10]);  _to_copy_1 = None
        mul_3: "f32[1, 10][10, 1]cpu" = torch.ops.aten.mul.Tensor(view_1, 0.125);  view_1 = None
        add_3: "f32[2, 10][10, 1]cpu" = torch.ops.aten.add.Tensor(add_1, mul_3);  add_1 = mul_3 = None
        mul_4: "f32[2, 10][10, 1]cpu" = torch.ops.aten.mul.Tensor(addmm_1, add_3);  addmm_1 = None
        sum_1: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(mul_4, []);  mul_4 = None
        return (sum_1, primals_5, relu, alias, permute_1, add_3)
