"""torch 2.13: the decomposition of aten.multilabel_margin_loss_forward gives a [1] loss for a 1-D
input with reduction none, where the eager kernel gives a 0-d one. Any capture that decomposes
(torch.export's run_decompositions, AOTAutograd) then disagrees with eager on the output's shape.

    python benchmarks/torch_repros/multilabel_margin_loss_decomposition_shape.py

Exit 0 and "reproduced" while torch behaves so; exit 1 once it no longer does.
"""

import sys

import torch
from torch._decomp import decomposition_table

op = torch.ops.aten.multilabel_margin_loss_forward.default
x, target = torch.randn(4), torch.tensor([3, 0, -1, 1])
eager = op(x, target, 0)[0]  # reduction 0: none
decomposed = decomposition_table[op](x, target, 0)[0]
if eager.shape != decomposed.shape:
    print(f"reproduced: eager's loss has shape {list(eager.shape)}, the decomposition's {list(decomposed.shape)}")
    sys.exit(0)
print("not reproduced: the shapes agree")
sys.exit(1)
