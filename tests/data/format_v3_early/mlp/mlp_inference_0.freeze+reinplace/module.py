# mlp_inference_0.freeze+reinplace: the inference graph of model mlp (export capture) after passes freeze, reinplace
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   x: user arg0 float32[2, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _load_constants(self)

    def forward(self, x: "f32[2, 8][8, 1]cpu"):
        _const_layers_0_weight_1: "f32[16, 8][8, 1]cpu" = self._const_layers_0_weight
        _const_layers_0_bias_1: "f32[16][1]cpu" = self._const_layers_0_bias
        _const_head_weight_1: "f32[10, 16][16, 1]cpu" = self._const_head_weight
        _const_head_bias_1: "f32[10][1]cpu" = self._const_head_bias
        permute: "f32[8, 16][1, 8]cpu" = torch.ops.aten.permute.default(_const_layers_0_weight_1, [1, 0]);  _const_layers_0_weight_1 = None
        addmm: "f32[2, 16][16, 1]cpu" = torch.ops.aten.addmm.default(_const_layers_0_bias_1, x, permute);  _const_layers_0_bias_1 = x = permute = None
        relu: "f32[2, 16][16, 1]cpu" = torch.ops.aten.relu_.default(addmm);  relu = None
        permute_1: "f32[16, 10][1, 16]cpu" = torch.ops.aten.permute.default(_const_head_weight_1, [1, 0]);  _const_head_weight_1 = None
        addmm_1: "f32[2, 10][10, 1]cpu" = torch.ops.aten.addmm.default(_const_head_bias_1, addmm, permute_1);  _const_head_bias_1 = addmm = permute_1 = None
        return (addmm_1,)


def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {'_const_head_bias': ('0bc7f4df8bc7b0d35b5e75e548463604e28b25cb012229788ccde73518183cdd', [10], [1]), '_const_head_weight': ('8394185367dc8b8d6a0a45e62953acc54271754060e2680e8309a0367a154d6c', [10, 16], [16, 1]), '_const_layers_0_bias': ('ae209807b8d6f8f68a1f9a817ba2445bbae55b2f01ae3b3b5b4b953793777eb6', [16], [1]), '_const_layers_0_weight': ('130edc68364ad8d3a5c3e7fc56f98f368762cff131714d82705e2e3e0bb36a50', [16, 8], [8, 1])}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
