# mlp_forward_0: the forward graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   primals_1: param layers.0.weight float32[16, 8]
#   primals_2: param layers.0.bias float32[16]
#   primals_3: param layers.1.weight float32[16, 16]
#   primals_4: param layers.1.bias float32[16]
#   primals_5: param head.weight float32[10, 16]
#   primals_6: param head.bias float32[10]
#   primals_7: user arg0 float32[4, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[16, 8][8, 1]cpu", primals_2: "f32[16][1]cpu", primals_3: "f32[16, 16][16, 1]cpu", primals_4: "f32[16][1]cpu", primals_5: "f32[10, 16][16, 1]cpu", primals_6: "f32[10][1]cpu", primals_7: "f32[4, 8][8, 1]cpu"):
        permute: "f32[8, 16][1, 8]cpu" = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
        addmm: "f32[4, 16][16, 1]cpu" = torch.ops.aten.addmm.default(primals_2, primals_7, permute);  primals_2 = permute = None
        relu: "f32[4, 16][16, 1]cpu" = torch.ops.aten.relu.default(addmm);  addmm = None
        alias: "f32[4, 16][16, 1]cpu" = torch.ops.aten.alias.default(relu)
        permute_1: "f32[16, 16][1, 16]cpu" = torch.ops.aten.permute.default(primals_3, [1, 0]);  primals_3 = None
        addmm_1: "f32[4, 16][16, 1]cpu" = torch.ops.aten.addmm.default(primals_4, relu, permute_1);  primals_4 = None
        relu_1: "f32[4, 16][16, 1]cpu" = torch.ops.aten.relu.default(addmm_1);  addmm_1 = None
        alias_1: "f32[4, 16][16, 1]cpu" = torch.ops.aten.alias.default(relu_1)
        permute_2: "f32[16, 10][1, 16]cpu" = torch.ops.aten.permute.default(primals_5, [1, 0]);  primals_5 = None
        addmm_2: "f32[4, 10][10, 1]cpu" = torch.ops.aten.addmm.default(primals_6, relu_1, permute_2);  primals_6 = None
        sum_1: "f32[][]cpu" = torch.ops.aten.sum.dim_IntList(addmm_2, []);  addmm_2 = None
        return (sum_1, primals_7, relu, alias, permute_1, relu_1, alias_1, permute_2)
