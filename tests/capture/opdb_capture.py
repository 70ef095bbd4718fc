"""Capture every operator of torch's op_db (its first float32 CPU sample) and say, per
operator, which ops its graphs hold. Some captures abort the process inside torch (a C++
``terminate``), so the captures run in a worker process that prints one JSON line per
operator; a worker that dies is started again after the operator it died in.

    python -m tests.capture.opdb_capture AFTER     # the worker: operators after index AFTER
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree

REPO = Path(__file__).resolve().parents[2]


class Sample(torch.nn.Module):
    """One OpInfo sample as a model: its tensors are the inputs, the rest is baked in."""

    def __init__(self, op, spec, leaves):
        super().__init__()
        self.op, self.spec, self.leaves = op, spec, leaves

    def forward(self, *tensors):
        given = iter(tensors)
        args, kwargs = pytree.tree_unflatten([next(given) if isinstance(v, torch.Tensor) else v
                                              for v in self.leaves], self.spec)
        return self.op(*args, **kwargs)


def entries(names=None):
    """(op_db name, OpInfo) of each operator with a float32 CPU form (those in `names`)."""
    from torch.testing._internal.common_methods_invocations import op_db

    for info in op_db:
        full = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if (names is None or full in names) and torch.float32 in info.supported_dtypes("cpu"):
            yield full, info


def captured_ops(info):
    """The ops of the sample's captured graphs (inference; with autograd, forward, backward
    and joint too, its inputs' gradients included); None where torch cannot sample or
    capture it."""
    from aotpipe.artifact.ops import op_name
    from aotpipe.capture.export import capture_export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sample = list(info.sample_inputs("cpu", torch.float32, requires_grad=info.supports_autograd))[0]
        except Exception:
            return None
        leaves, spec = pytree.tree_flatten(((sample.input, *sample.args), sample.kwargs))
        tensors = tuple(v for v in leaves if isinstance(v, torch.Tensor))
        grad = info.supports_autograd and any(t.requires_grad for t in tensors)
        graphs = ["inference", "forward", "backward", "joint"] if grad else ["inference"]
        try:
            captured = capture_export(Sample(info.op, spec, leaves), tensors, {}, name="op", graphs=graphs,
                                      input_names=[])
        except Exception:
            return None
    return sorted({op_name(n.target) or str(n.target) for g in captured.graphs.values()
                   for n in g.gm.graph.nodes if n.op == "call_function"})


def run_all(timeout_s: float = 3600) -> dict[str, object]:
    """Every operator's captured ops (a list), None where it did not capture, or "crashed"."""
    results: dict[str, object] = {}
    after = -1
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    while True:
        proc = subprocess.run([sys.executable, "-m", "tests.capture.opdb_capture", str(after)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        current = None
        for line in proc.stdout.splitlines():
            record = json.loads(line)
            if "start" in record:
                current = record["start"]
            else:
                results[record["name"]] = record["ops"]
                current = None
        if current is None:
            return results
        index, name = current
        results[name] = "crashed"
        after = index


def _worker(after: int) -> None:
    for i, (name, info) in enumerate(entries()):
        if i <= after:
            continue
        print(json.dumps({"start": [i, name]}), flush=True)
        print(json.dumps({"name": name, "ops": captured_ops(info)}), flush=True)


if __name__ == "__main__":
    _worker(int(sys.argv[1]))
