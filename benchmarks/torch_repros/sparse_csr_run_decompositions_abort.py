"""torch 2.13: ExportedProgram.run_decompositions on a program with a sparse CSR input that requires
grad aborts the process (a C++ terminate in functionalization: "layout_impl is only implemented
for TensorImpl subclasses"); no Python handler sees it. aotpipe refuses sparse inputs before capture for this.

    python benchmarks/torch_repros/sparse_csr_run_decompositions_abort.py

Exit 0 and "reproduced" while the child process aborts; exit 1 once it no longer does.
"""

import signal
import subprocess
import sys

CHILD = """
import torch
class MM(torch.nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)
a = torch.eye(5).to_sparse_csr().requires_grad_()
ep = torch.export.export(MM(), (a, torch.randn(5, 3)))
ep.run_decompositions()
print("decomposed")
"""

r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
if r.returncode == -signal.SIGABRT and "layout_impl" in r.stderr:
    print("reproduced: run_decompositions aborted the process (SIGABRT, layout_impl)")
    sys.exit(0)
print(f"not reproduced: exit {r.returncode}: {(r.stdout + r.stderr)[-300:]}")
sys.exit(1)
