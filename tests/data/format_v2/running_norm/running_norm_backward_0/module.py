# running_norm_backward_0: the backward graph of model running_norm (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   sub: saved forward_output[3] float32[4, 8]
#   tangents_1: tangent output[0] float32[]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, sub: "f32[4, 8][8, 1]cpu", tangents_1: "f32[][]cpu"):
        expand: "f32[4, 8][0, 0]cpu" = torch.ops.aten.expand.default(tangents_1, [4, 8]);  tangents_1 = None
        permute_1: "f32[8, 4][0, 0]cpu" = torch.ops.aten.permute.default(expand, [1, 0])
        mm: "f32[8, 8][8, 1]cpu" = torch.ops.aten.mm.default(permute_1, sub);  permute_1 = sub = None
        permute_2: "f32[8, 8][1, 8]cpu" = torch.ops.aten.permute.default(mm, [1, 0]);  mm = None
        sum_2: "f32[1, 8][8, 1]cpu" = torch.ops.aten.sum.dim_IntList(expand, [0], True);  expand = None
        view: "f32[8][1]cpu" = torch.ops.aten.view.default(sum_2, [8]);  sum_2 = None
        permute_3: "f32[8, 8][8, 1]cpu" = torch.ops.aten.permute.default(permute_2, [1, 0]);  permute_2 = None
        return (permute_3, view, None, None, None)
