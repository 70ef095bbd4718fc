# scaled_inference_0: the inference graph of model scaled (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   p_w: param w float32[8]
#   x: user arg0 float32[4, 3, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, p_w: "f32[8][1]cpu", x: "f32[s77, s27, 8][8*s27, 8, 1]cpu"):
        mul: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.mul.Tensor(x, p_w);  x = p_w = None
        tanh: "f32[s77, s27, 8][8*s27, 8, 1]cpu" = torch.ops.aten.tanh.default(mul);  mul = None
        sum_1: "f32[s77, s27][s27, 1]cpu" = torch.ops.aten.sum.dim_IntList(tanh, [-1]);  tanh = None
        return (sum_1,)
