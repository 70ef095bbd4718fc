"""torch 2.13: nn.Transformer in eval mode under no_grad, given a src_key_padding_mask, takes the
encoder's nested-tensor fast path, which returns zeros at the padded positions; the decoder then
attends to those zeros (no memory mask is passed). The exported program takes the standard path
(as eager does with the fast path off), so the two differ at every decoder position.

    python benchmarks/torch_repros/transformer_fastpath_padding.py

Exit 0 and "reproduced" while torch behaves so; exit 1 once it no longer does.
"""

import sys
import warnings

import torch

warnings.simplefilter("ignore")  # nested tensors' prototype warning
torch.manual_seed(0)
m = torch.nn.Transformer(d_model=4, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8,
                         dropout=0.0, batch_first=True).eval()
src, tgt = torch.randn(2, 3, 4), torch.randn(2, 2, 4)
pad = torch.tensor([[False, False, True], [False, False, False]])  # one padded position
with torch.no_grad():
    fast = m(src, tgt, src_key_padding_mask=pad)
    torch.backends.mha.set_fastpath_enabled(False)
    standard = m(src, tgt, src_key_padding_mask=pad)
    torch.backends.mha.set_fastpath_enabled(True)
    exported = torch.export.export(m, (src, tgt), {"src_key_padding_mask": pad}).module()(
        src, tgt, src_key_padding_mask=pad)
eager_vs_export = (fast - exported).abs().max().item()
standard_vs_export = (standard - exported).abs().max().item()
if eager_vs_export > 1e-3 and standard_vs_export < 1e-5:
    print(f"reproduced: eager (fast path) and the exported program differ by {eager_vs_export:.3g}; "
          f"eager with the fast path off matches it ({standard_vs_export:.3g})")
    sys.exit(0)
print(f"not reproduced: eager vs export {eager_vs_export:.3g}, fast path off vs export {standard_vs_export:.3g}")
sys.exit(1)
