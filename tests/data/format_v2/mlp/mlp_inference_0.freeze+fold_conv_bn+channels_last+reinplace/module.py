# mlp_inference_0.freeze+fold_conv_bn+channels_last+reinplace: the inference graph of model mlp (export capture) after passes freeze, fold_conv_bn, channels_last, reinplace
# Written by aotpipe 0.1.0 with torch 2.13.0+cpu. Generated code: do not edit.
# Inputs, in order:
#   x: user arg0 float32[4, 8]
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

class GraphModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _load_constants(self)

    def forward(self, x: "f32[4, 8][8, 1]cpu"):
        _const_layers_0_weight_1: "f32[16, 8][8, 1]cpu" = self._const_layers_0_weight
        _const_layers_0_bias_1: "f32[16][1]cpu" = self._const_layers_0_bias
        _const_layers_1_weight_1: "f32[16, 16][16, 1]cpu" = self._const_layers_1_weight
        _const_layers_1_bias_1: "f32[16][1]cpu" = self._const_layers_1_bias
        _const_head_weight_1: "f32[10, 16][16, 1]cpu" = self._const_head_weight
        _const_head_bias_1: "f32[10][1]cpu" = self._const_head_bias
        permute: "f32[8, 16][1, 8]cpu" = torch.ops.aten.permute.default(_const_layers_0_weight_1, [1, 0]);  _const_layers_0_weight_1 = None
        addmm: "f32[4, 16][16, 1]cpu" = torch.ops.aten.addmm.default(_const_layers_0_bias_1, x, permute);  _const_layers_0_bias_1 = x = permute = None
        relu: "f32[4, 16][16, 1]cpu" = torch.ops.aten.relu_.default(addmm);  relu = None
        permute_1: "f32[16, 16][1, 16]cpu" = torch.ops.aten.permute.default(_const_layers_1_weight_1, [1, 0]);  _const_layers_1_weight_1 = None
        addmm_1: "f32[4, 16][16, 1]cpu" = torch.ops.aten.addmm.default(_const_layers_1_bias_1, addmm, permute_1);  _const_layers_1_bias_1 = addmm = permute_1 = None
        relu_1: "f32[4, 16][16, 1]cpu" = torch.ops.aten.relu_.default(addmm_1);  relu_1 = None
        permute_2: "f32[16, 10][1, 16]cpu" = torch.ops.aten.permute.default(_const_head_weight_1, [1, 0]);  _const_head_weight_1 = None
        addmm_2: "f32[4, 10][10, 1]cpu" = torch.ops.aten.addmm.default(_const_head_bias_1, addmm_1, permute_2);  _const_head_bias_1 = addmm_1 = permute_2 = None
        return (addmm_2,)


def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {'_const_head_bias': ('9bc3dd2c15467ed729ae18aceddca9f0f0cec07eac0ec796f10572ca49ca4935', [10], [1]), '_const_head_weight': ('9879ccaa75b788b652a16382a644a96b2086e9430bcbb884a55db1fe41c5bbf3', [10, 16], [16, 1]), '_const_layers_0_bias': ('ae209807b8d6f8f68a1f9a817ba2445bbae55b2f01ae3b3b5b4b953793777eb6', [16], [1]), '_const_layers_0_weight': ('130edc68364ad8d3a5c3e7fc56f98f368762cff131714d82705e2e3e0bb36a50', [16, 8], [8, 1]), '_const_layers_1_bias': ('dfa3508c77a7033aeed4dade4ed3c5a30e0ec19ec763f4b3834b000d361e9ea2', [16], [1]), '_const_layers_1_weight': ('1222adc579c79231641cacee8568daf5c7236cfee5778a7e5cf3a60211699f01', [16, 16], [16, 1])}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
