"""ATen ops given Python kernels of aotpipe's own for the length of a capture.

Tracing (torch.export, AOTAutograd, dynamo's backends) dispatches through the Python
dispatcher, which looks an op up in its ``py_kernels`` before its C++ kernels. Setting one
there at CompositeImplicitAutograd and Autograd makes every trace compute the op with
aotpipe's function (made of other ATen ops: it decomposes into them, and autograd
differentiates them), while eager code outside a trace still runs torch's kernel. Used by
capture/rnn.py (recurrent ops), capture/ctc.py (the CTC loss) and capture/torch_branches.py
(compositions that read values).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping

import torch
from torch._C import DispatchKey

KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)


@contextlib.contextmanager
def python_kernels(kernels: Mapping[torch._ops.OpOverload, Callable[..., Any]]) -> Iterator[None]:
    """Within the block each op of `kernels` dispatches to its function at :data:`KEYS`;
    afterwards the kernels it had (or none) are back, also on error."""
    saved = {(op, key): op.py_kernels.get(key) for op in kernels for key in KEYS}
    try:
        for op, fn in kernels.items():
            for key in KEYS:
                op.py_kernels[key] = fn
            op._dispatch_cache.clear()
        yield
    finally:
        for (op, key), fn in saved.items():
            if fn is None:
                op.py_kernels.pop(key, None)
            else:
                op.py_kernels[key] = fn
            op._dispatch_cache.clear()
