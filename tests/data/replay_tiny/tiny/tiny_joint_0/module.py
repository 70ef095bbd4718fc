# tiny_joint_0: the joint graph of model tiny (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param scale float32[4]
#   primals_2: user arg0 float32[1, 4]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[4][1]cpu", primals_2: "f32[1, 4][4, 1]cpu", tangents_1: "f32[][]cpu"):
        mul: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(primals_2, primals_1);  primals_1 = None
        relu: "f32[1, 4][4, 1]cpu" = torch.ops.aten.relu.default(mul);  mul = None
        alias: "f32[1, 4][4, 1]cpu" = torch.ops.aten.alias.default(relu)
        add: "f32[1, 4][4, 1]cpu" = torch.ops.aten.add.Tensor(relu, 1.0);  relu = None
        full: "f32[][]cpu" = torch.ops.aten.full.default([], 1, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        arange: "i64[1][1]cpu" = torch.ops.aten.arange.start_step(0, 1, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_1: "i64[1][1]cpu" = torch.ops.aten.mul.Tensor(arange, 3);  arange = None
        add_1: "i64[1][1]cpu" = torch.ops.aten.add.Tensor(mul_1, 0);  mul_1 = None
        remainder: "i64[1][1]cpu" = torch.ops.aten.remainder.Scalar(add_1, 7);  add_1 = None
        _to_copy: "f32[1][1]cpu" = torch.ops.aten._to_copy.default(remainder, dtype = torch.float32);  remainder = None
        view: "f32[1, 1][1, 1]cpu" = torch.ops.aten.view.default(_to_copy, [1, 1]);  _to_copy = None
        mul_2: "f32[1, 1][1, 1]cpu" = torch.ops.aten.mul.Tensor(view, 0.125);  view = None
        add_2: "f32[1, 1][1, 1]cpu" = torch.ops.aten.add.Tensor(full, mul_2);  full = mul_2 = None
        arange_1: "i64[4][1]cpu" = torch.ops.aten.arange.start_step(0, 4, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_3: "i64[4][1]cpu" = torch.ops.aten.mul.Tensor(arange_1, 3);  arange_1 = None
        add_3: "i64[4][1]cpu" = torch.ops.aten.add.Tensor(mul_3, 1);  mul_3 = None
        remainder_1: "i64[4][1]cpu" = torch.ops.aten.remainder.Scalar(add_3, 7);  add_3 = None
        _to_copy_1: "f32[4][1]cpu" = torch.ops.aten._to_copy.default(remainder_1, dtype = torch.float32);  remainder_1 = None
        view_1: "f32[1, 4][4, 1]cpu" = torch.ops.aten.view.default(_to_copy_1, [1, 4]);  _to_copy_1 = None
        mul_4: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(view_1, 0.125);  view_1 = None
        add_4: "f32[1, 4][4, 1]cpu" = torch.ops.aten.add.Tensor(add_2, mul_4);  add_2 = mul_4 = None
        mul_5: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(add, add_4)
        sum_1: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(mul_5, []);  mul_5 = None
        full_1: "f32[][]cpu" = torch.ops.aten.full.default([], 1, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        arange_2: "i64[1][1]cpu" = torch.ops.aten.arange.start_step(0, 1, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_6: "i64[1][1]cpu" = torch.ops.aten.mul.Tensor(arange_2, 3);  arange_2 = None
        add_5: "i64[1][1]cpu" = torch.ops.aten.add.Tensor(mul_6, 0);  mul_6 = None
        remainder_2: "i64[1][1]cpu" = torch.ops.aten.remainder.Scalar(add_5, 7);  add_5 = None
        _to_copy_2: "f32[1][1]cpu" = torch.ops.aten._to_copy.default(remainder_2, dtype = torch.float32);  remainder_2 = None
        view_2: "f32[1, 1][1, 1]cpu" = torch.ops.aten.view.default(_to_copy_2, [1, 1]);  _to_copy_2 = None
        mul_7: "f32[1, 1][1, 1]cpu" = torch.ops.aten.mul.Tensor(view_2, 0.125);  view_2 = None
        add_6: "f32[1, 1][1, 1]cpu" = torch.ops.aten.add.Tensor(full_1, mul_7);  full_1 = mul_7 = None
        arange_3: "i64[4][1]cpu" = torch.ops.aten.arange.start_step(0, 4, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_8: "i64[4][1]cpu" = torch.ops.aten.mul.Tensor(arange_3, 3);  arange_3 = None
        add_7: "i64[4][1]cpu" = torch.ops.aten.add.Tensor(mul_8, 1);  mul_8 = None
        remainder_3: "i64[4][1]cpu" = torch.ops.aten.remainder.Scalar(add_7, 7);  add_7 = None
        _to_copy_3: "f32[4][1]cpu" = torch.ops.aten._to_copy.default(remainder_3, dtype = torch.float32);  remainder_3 = None
        view_3: "f32[1, 4][4, 1]cpu" = torch.ops.aten.view.default(_to_copy_3, [1, 4]);  _to_copy_3 = None
        mul_9: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(view_3, 0.125);  view_3 = None
        add_8: "f32[1, 4][4, 1]cpu" = torch.ops.aten.add.Tensor(add_6, mul_9);  add_6 = mul_9 = None
        mul_10: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(add, add_8);  add = None
        sum_2: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(mul_10, []);  mul_10 = None
        add_9: "f32[][]cpu" = torch.ops.aten.add.Tensor(sum_1, sum_2);  sum_1 = sum_2 = None
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
        return [add_9, view_4, None]
