# running_norm_forward_0: the forward graph of model running_norm (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param fc.weight float32[8, 8]
#   primals_2: param fc.bias float32[8]
#   primals_3: buffer running_mean float32[8]
#   primals_4: buffer calls int64[] range [0, 1)
#   primals_5: user arg0 float32[4, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[8, 8][8, 1]cpu", primals_2: "f32[8][1]cpu", primals_3: "f32[8][1]cpu", primals_4: "i64[][]cpu", primals_5: "f32[4, 8][8, 1]cpu"):
        mul: "f32[8][1]cpu" = torch.ops.aten.mul.Tensor(primals_3, 0.9);  primals_3 = None
        mean: "f32[8][1]cpu" = torch.ops.aten.mean.dim(primals_5, [0])
        add: "f32[8][1]cpu" = torch.ops.aten.add.Tensor(mul, mean, alpha = 0.1);  mul = mean = None
        add_1: "i64[][]cpu" = torch.ops.aten.add.Tensor(primals_4, 1);  primals_4 = None
        sub: "f32[4, 8][8, 1]cpu" = torch.ops.aten.sub.Tensor(primals_5, add);  primals_5 = None
        permute: "f32[8, 8][1, 8]cpu" = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
        addmm: "f32[4, 8][8, 1]cpu" = torch.ops.aten.addmm.default(primals_2, sub, permute);  primals_2 = permute = None
        sum_1: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(addmm, []);  addmm = None
        return (add, add_1, sum_1, sub)
