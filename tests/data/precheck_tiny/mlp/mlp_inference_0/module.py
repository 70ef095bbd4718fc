# mlp_inference_0: the inference graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   p_layers_0_weight: param layers.0.weight float32[16, 8]
#   p_layers_0_bias: param layers.0.bias float32[16]
#   p_head_weight: param head.weight float32[4, 16]
#   p_head_bias: param head.bias float32[4]
#   x: user arg0 float32[2, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, p_layers_0_weight: "f32[16, 8][8, 1]cpu", p_layers_0_bias: "f32[16][1]cpu", p_head_weight: "f32[4, 16][16, 1]cpu", p_head_bias: "f32[4][1]cpu", x: "f32[2, 8][8, 1]cpu"):
        permute: "f32[8, 16][1, 8]cpu" = torch.ops.aten.permute.default(p_layers_0_weight, [1, 0]);  p_layers_0_weight = None
        addmm: "f32[2, 16][16, 1]cpu" = torch.ops.aten.addmm.default(p_layers_0_bias, x, permute);  p_layers_0_bias = x = permute = None
        relu: "f32[2, 16][16, 1]cpu" = torch.ops.aten.relu.default(addmm);  addmm = None
        permute_1: "f32[16, 4][1, 16]cpu" = torch.ops.aten.permute.default(p_head_weight, [1, 0]);  p_head_weight = None
        addmm_1: "f32[2, 4][4, 1]cpu" = torch.ops.aten.addmm.default(p_head_bias, relu, permute_1);  p_head_bias = relu = permute_1 = None
        return (addmm_1,)
