# running_norm_inference_0: the inference graph of model running_norm (export capture)
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   p_fc_weight: param fc.weight float32[8, 8]
#   p_fc_bias: param fc.bias float32[8]
#   b_running_mean: buffer running_mean float32[8]
#   b_calls: buffer calls int64[] range [0, 1)
#   x: user arg0 float32[4, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def forward(self, p_fc_weight: "f32[8, 8][8, 1]cpu", p_fc_bias: "f32[8][1]cpu", b_running_mean: "f32[8][1]cpu", b_calls: "i64[][]cpu", x: "f32[4, 8][8, 1]cpu"):
        # Annotation: {'_torchdynamo_disable': True, '_torchdynamo_disable_recursive': True, '_torchdynamo_disable_method': 'wrapper'} No stacktrace found for following nodes
        mul: "f32[8][1]cpu" = torch.ops.aten.mul.Tensor(b_running_mean, 0.9);  b_running_mean = None
        mean: "f32[8][1]cpu" = torch.ops.aten.mean.dim(x, [0])
        add: "f32[8][1]cpu" = torch.ops.aten.add.Tensor(mul, mean, alpha = 0.1);  mul = mean = None
        add_1: "i64[][]cpu" = torch.ops.aten.add.Tensor(b_calls, 1);  b_calls = None

        sub: "f32[4, 8][8, 1]cpu" = torch.ops.aten.sub.Tensor(x, add);  x = None
        permute: "f32[8, 8][1, 8]cpu" = torch.ops.aten.permute.default(p_fc_weight, [1, 0]);  p_fc_weight = None
        addmm: "f32[4, 8][8, 1]cpu" = torch.ops.aten.addmm.default(p_fc_bias, sub, permute);  p_fc_bias = sub = permute = None
        return (add, add_1, addmm)
