# tiny_inference_0: the inference graph of model tiny (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   p_scale: param scale float32[4]
#   x: user arg0 float32[1, 4]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, p_scale: "f32[4][1]cpu", x: "f32[1, 4][4, 1]cpu"):
        mul: "f32[1, 4][4, 1]cpu" = torch.ops.aten.mul.Tensor(x, p_scale);  x = p_scale = None
        relu: "f32[1, 4][4, 1]cpu" = torch.ops.aten.relu.default(mul);  mul = None
        add: "f32[1, 4][4, 1]cpu" = torch.ops.aten.add.Tensor(relu, 1.0);  relu = None
        return (add, add)
