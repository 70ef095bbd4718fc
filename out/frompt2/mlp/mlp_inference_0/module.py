# mlp_inference_0: the inference graph of model mlp (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   p_program_layers_0_weight: param program.layers.0.weight float32[64, 32]
#   p_program_layers_0_bias: param program.layers.0.bias float32[64]
#   p_program_layers_1_weight: param program.layers.1.weight float32[64, 64]
#   p_program_layers_1_bias: param program.layers.1.bias float32[64]
#   p_program_head_weight: param program.head.weight float32[10, 64]
#   p_program_head_bias: param program.head.bias float32[10]
#   args_0: user arg0 float32[8, 32]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, p_program_layers_0_weight: "f32[64, 32][32, 1]cpu", p_program_layers_0_bias: "f32[64][1]cpu", p_program_layers_1_weight: "f32[64, 64][64, 1]cpu", p_program_layers_1_bias: "f32[64][1]cpu", p_program_head_weight: "f32[10, 64][64, 1]cpu", p_program_head_bias: "f32[10][1]cpu", args_0: "f32[8, 32][32, 1]cpu"):
        permute: "f32[32, 64][1, 32]cpu" = torch.ops.aten.permute.default(p_program_layers_0_weight, [1, 0]);  p_program_layers_0_weight = None
        addmm: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(p_program_layers_0_bias, args_0, permute);  p_program_layers_0_bias = args_0 = permute = None
        relu: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu.default(addmm);  addmm = None
        permute_1: "f32[64, 64][1, 64]cpu" = torch.ops.aten.permute.default(p_program_layers_1_weight, [1, 0]);  p_program_layers_1_weight = None
        addmm_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(p_program_layers_1_bias, relu, permute_1);  p_program_layers_1_bias = relu = permute_1 = None
        relu_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu.default(addmm_1);  addmm_1 = None
        permute_2: "f32[64, 10][1, 64]cpu" = torch.ops.aten.permute.default(p_program_head_weight, [1, 0]);  p_program_head_weight = None
        addmm_2: "f32[8, 10][10, 1]cpu" = torch.ops.aten.addmm.default(p_program_head_bias, relu_1, permute_2);  p_program_head_bias = relu_1 = permute_2 = None
        return (addmm_2,)
