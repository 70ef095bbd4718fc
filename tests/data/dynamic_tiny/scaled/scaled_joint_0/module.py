# scaled_joint_0: the joint graph of model scaled (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param w float32[8]
#   primals_2: user arg0 float32[4, 3, 8]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[8][1]cpu", primals_2: "f32[s77, s27, 8][8*s27, 8, 1]cpu", tangents_1: "f32[][]cpu"):
        sym_size_int: "Sym(s77)" = torch.ops.aten.sym_size.int(primals_2, 0)
        sym_size_int_1: "Sym(s27)" = torch.ops.aten.sym_size.int(primals_2, 1)
        mul: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.mul.Tensor(primals_2, primals_1);  primals_1 = None
        tanh: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.tanh.default(mul);  mul = None
        alias: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.alias.default(tanh)
        sum_1: "f32[s77, s27][s27, 1]cpu" = torch.ops.aten.sum.dim_IntList(tanh, [-1]);  tanh = None
        full: "f32[][]cpu" = torch.ops.aten.full.default([], 1, dtype = torch.float32, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        arange: "i64[s77][1]cpu" = torch.ops.aten.arange.start_step(0, sym_size_int, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_13: "i64[s77][1]cpu" = torch.ops.aten.mul.Tensor(arange, 3);  arange = None
        add_19: "i64[s77][1]cpu" = torch.ops.aten.add.Tensor(mul_13, 0);  mul_13 = None
        remainder: "i64[s77][1]cpu" = torch.ops.aten.remainder.Scalar(add_19, 7);  add_19 = None
        _to_copy: "f32[s77][1]cpu" = torch.ops.aten._to_copy.default(remainder, dtype = torch.float32);  remainder = None
        view: "f32[s77, 1][1, 1]cpu" = torch.ops.aten.view.default(_to_copy, [sym_size_int, 1]);  _to_copy = None
        mul_19: "f32[s77, 1][1, 1]cpu" = torch.ops.aten.mul.Tensor(view, 0.125);  view = None
        add_32: "f32[s77, 1][1, 1]cpu" = torch.ops.aten.add.Tensor(full, mul_19);  full = mul_19 = None
        arange_1: "i64[s27][1]cpu" = torch.ops.aten.arange.start_step(0, sym_size_int_1, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        mul_23: "i64[s27][1]cpu" = torch.ops.aten.mul.Tensor(arange_1, 3);  arange_1 = None
        add_40: "i64[s27][1]cpu" = torch.ops.aten.add.Tensor(mul_23, 1);  mul_23 = None
        remainder_1: "i64[s27][1]cpu" = torch.ops.aten.remainder.Scalar(add_40, 7);  add_40 = None
        _to_copy_1: "f32[s27][1]cpu" = torch.ops.aten._to_copy.default(remainder_1, dtype = torch.float32);  remainder_1 = None
        view_1: "f32[1, s27][s27, 1]cpu" = torch.ops.aten.view.default(_to_copy_1, [1, sym_size_int_1]);  _to_copy_1 = None
        mul_30: "f32[1, s27][s27, 1]cpu" = torch.ops.aten.mul.Tensor(view_1, 0.125);  view_1 = None
        add_51: "f32[s77, s27][s27, 1]cpu" = torch.ops.aten.add.Tensor(add_32, mul_30);  add_32 = mul_30 = None
        mul_35: "f32[s77, s27][s27, 1]cpu" = torch.ops.aten.mul.Tensor(sum_1, add_51);  sum_1 = None
        sum_2: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(mul_35, []);  mul_35 = None
        expand: "f32[s77, s27][0, 0]cpu" = torch.ops.aten.expand.default(tangents_1, [sym_size_int, sym_size_int_1]);  tangents_1 = None
        mul_38: "f32[s77, s27][s27, 1]cpu" = torch.ops.aten.mul.Tensor(expand, add_51);  expand = add_51 = None
        unsqueeze: "f32[s77, s27, 1][s27, 1, 1]cpu" = torch.ops.aten.unsqueeze.default(mul_38, -1);  mul_38 = None
        expand_1: "f32[s77, s27, 8][s27, 1, 0]cpu" = torch.ops.aten.expand.default(unsqueeze, [sym_size_int, sym_size_int_1, 8]);  unsqueeze = sym_size_int = sym_size_int_1 = None
        alias_1: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.alias.default(alias);  alias = None
        mul_39: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.mul.Tensor(alias_1, alias_1);  alias_1 = None
        sub_27: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.sub.Tensor(1, mul_39);  mul_39 = None
        mul_40: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.mul.Tensor(expand_1, sub_27);  expand_1 = sub_27 = None
        mul_41: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.mul.Tensor(mul_40, primals_2);  mul_40 = primals_2 = None
        sum_3: "f32[1, 1, 8][8, 8, 1]cpu" = torch.ops.aten.sum.dim_IntList(mul_41, [0, 1], True);  mul_41 = None
        view_2: "f32[8][1]cpu" = torch.ops.aten.view.default(sum_3, [8]);  sum_3 = None
        return [sum_2, view_2, None]
