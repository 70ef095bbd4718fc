# mlp_inference_0.freeze+fold_conv_bn+channels_last+reinplace: the inference graph of model mlp (export capture) after passes freeze, fold_conv_bn, channels_last, reinplace
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   x: user arg0 float32[8, 32]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _load_constants(self)

    def forward(self, x: "f32[8, 32][32, 1]cpu"):
        _const_layers_0_bias_1: "f32[64][1]cpu" = self._const_layers_0_bias
        _const_layers_1_bias_1: "f32[64][1]cpu" = self._const_layers_1_bias
        _const_head_bias_1: "f32[10][1]cpu" = self._const_head_bias
        _const_permute_3: "f32[32, 64][64, 1]cpu" = self._const_permute
        _const_permute_4: "f32[64, 64][64, 1]cpu" = self._const_permute_1
        _const_permute_5: "f32[64, 10][10, 1]cpu" = self._const_permute_2
        addmm: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(_const_layers_0_bias_1, x, _const_permute_3);  _const_layers_0_bias_1 = x = _const_permute_3 = None
        relu: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu_.default(addmm);  relu = None
        addmm_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.addmm.default(_const_layers_1_bias_1, addmm, _const_permute_4);  _const_layers_1_bias_1 = addmm = _const_permute_4 = None
        relu_1: "f32[8, 64][64, 1]cpu" = torch.ops.aten.relu_.default(addmm_1);  relu_1 = None
        addmm_2: "f32[8, 10][10, 1]cpu" = torch.ops.aten.addmm.default(_const_head_bias_1, addmm_1, _const_permute_5);  _const_head_bias_1 = addmm_1 = _const_permute_5 = None
        return (addmm_2,)


def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {'_const_head_bias': ('03518ff5fb0270929155754a59152cac10c5d0493e1308fdc7add410abd246cb', [10], [1]), '_const_layers_0_bias': ('a6787b9386af26ac381558d0ac19e6f46b8a55cea4481d0386d7e57383297fcf', [64], [1]), '_const_layers_1_bias': ('8d0d1a0d5d2d90c6affadb59dcf3167ac4aa642df2d828a4677951e3dd5cd59b', [64], [1]), '_const_permute': ('014d8c93902ab7c4d5c03d9caba2ae811713bd64f2de49dd8aad6fbf1151cb4a', [32, 64], [64, 1]), '_const_permute_1': ('0dd2784be7d2917d85e959d3b935c52349fc2106d09cba24a57616577aee0b0c', [64, 64], [64, 1]), '_const_permute_2': ('435eaaf9665383487a15ad37d9c99ae9acbb06d752edb0fa4ecd8d92f6847910', [64, 10], [10, 1])}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
