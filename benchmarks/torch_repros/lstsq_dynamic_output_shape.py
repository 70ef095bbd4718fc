"""torch 2.13: torch.export of torch.linalg.lstsq on CPU fails with DynamicOutputShapeException:
with the default driver (gelsy) the rank and residuals outputs' sizes depend on the values, so
its fake kernel cannot give static shapes, even where only the solution is used.

    python benchmarks/torch_repros/lstsq_dynamic_output_shape.py

Exit 0 and "reproduced" while torch behaves so; exit 1 once it no longer does.
"""

import sys

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException


class Lstsq(torch.nn.Module):
    def forward(self, a, b):
        return torch.linalg.lstsq(a, b).solution


try:
    torch.export.export(Lstsq(), (torch.randn(3, 3), torch.randn(3, 2)))
except DynamicOutputShapeException as e:
    print(f"reproduced: DynamicOutputShapeException: {e}")
    sys.exit(0)
print("not reproduced: torch.export captured linalg.lstsq")
sys.exit(1)
