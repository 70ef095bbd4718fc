# running_norm_inference_0.freeze+fold_conv_bn+channels_last+reinplace: the inference graph of model running_norm (export capture) after passes freeze, fold_conv_bn, channels_last, reinplace
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   b_running_mean: buffer running_mean float32[8]
#   b_calls: buffer calls int64[] range [0, 1)
#   x: user arg0 float32[4, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _load_constants(self)

    def forward(self, b_running_mean: "f32[8][1]cpu", b_calls: "i64[][]cpu", x: "f32[4, 8][8, 1]cpu"):
        _const_fc_weight_1: "f32[8, 8][8, 1]cpu" = self._const_fc_weight
        _const_fc_bias_1: "f32[8][1]cpu" = self._const_fc_bias

        # Annotation: {'_torchdynamo_disable': True, '_torchdynamo_disable_recursive': True, '_torchdynamo_disable_method': 'wrapper'} No stacktrace found for following nodes
        mul: "f32[8][1]cpu" = torch.ops.aten.mul.Tensor(b_running_mean, 0.9);  b_running_mean = None
        mean: "f32[8][1]cpu" = torch.ops.aten.mean.dim(x, [0])
        add: "f32[8][1]cpu" = torch.ops.aten.add_.Tensor(mul, mean, alpha = 0.1);  mean = add = None
        add_1: "i64[][]cpu" = torch.ops.aten.add.Tensor(b_calls, 1);  b_calls = None

        sub: "f32[4, 8][8, 1]cpu" = torch.ops.aten.sub.Tensor(x, mul);  x = None
        permute: "f32[8, 8][1, 8]cpu" = torch.ops.aten.permute.default(_const_fc_weight_1, [1, 0]);  _const_fc_weight_1 = None
        addmm: "f32[4, 8][8, 1]cpu" = torch.ops.aten.addmm.default(_const_fc_bias_1, sub, permute);  _const_fc_bias_1 = sub = permute = None
        return (mul, add_1, addmm)


def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {'_const_fc_bias': ('3aa249c2e26eec759883fe3d15a26db06f9406250f74949b814101dafc94561b', [8], [1]), '_const_fc_weight': ('c921d3468ea46dfb49269f2ab5ef644f2efe8dc6875fb64f413e25077f2947ae', [8, 8], [8, 1])}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
