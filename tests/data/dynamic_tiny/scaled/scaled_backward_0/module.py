# scaled_backward_0: the backward graph of model scaled (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_2: saved forward_output[1] float32[4, 3, 8]
#   alias: saved forward_output[2] float32[4, 3, 8]
#   add_51: saved forward_output[3] float32[4, 3]
#   sym_size_int: symint int
#   sym_size_int_1: symint int
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_2: "f32[s77, s27, 8][8*s27, 8, 1]cpu", alias: "f32[s77, s27, 8][8*s27, 8, 1]cpu", add_51: "f32[s77, s27][s27, 1]cpu", sym_size_int: "Sym(s77)", sym_size_int_1: "Sym(s27)", tangents_1: "f32[][]cpu"):
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
        return (view_2, None)
