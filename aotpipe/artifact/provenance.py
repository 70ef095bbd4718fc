"""Where each node of a captured graph came from: the module path and class, and the source line.

torch records this on the nodes it traces: ``nn_module_stack`` (the modules a node was
called inside, outermost first, each as (path, class)), ``stack_trace`` (the Python frames
that called the op) and, on a backward node AOTAutograd made, ``fwd_nn_module_stack`` (the
forward node's stack). graph.json keeps the innermost module and one source line per node
(:class:`aotpipe.format.records.NodeOrigin`); a file is named by the module it was imported
as (``aotpipe/models/zoo.py:94``), never by an absolute path or one relative to the working
folder, so no home directory or checkout path reaches an artefact and two captures of the
same model agree wherever they ran.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional

import torch.fx

from aotpipe.format.records import NodeOrigin
from aotpipe.format.source_files import relative_file

# The metadata key the writer keeps a node's relative source line under, once the stack
# trace (which holds absolute paths) is dropped.
SOURCE_KEY = "aotpipe_source"
# The metadata key a graph rebuilt from graph.json keeps each node's recorded origin under.
ORIGIN_KEY = "aotpipe_origin"

_FRAME = re.compile(r'File "([^"\n]+)", line (\d+), in ([^\n]+)')
_INDEX = re.compile(r"\[(\d+)\]")
_GETATTR = re.compile(r"""getattr\(([^,()]+), ['"]([^'"]+)['"]\)""")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def module_path(raw: Any) -> str:
    """A module path as torch.export writes it (``layers.0.attn``) from any capture's
    spelling (dynamo's ``L['self'].layers[0].attn``, ``getattr(L['self'].layers, '0')``)."""
    path = str(raw)
    while True:
        unwrapped = _GETATTR.sub(r"\1.\2", path)
        if unwrapped == path:
            break
        path = unwrapped
    path = _INDEX.sub(r".\1", path)
    for root in ("L['self']", 'L["self"]', "L['self_']", "self"):
        if path == root:
            return ""
        if path.startswith(root + "."):
            path = path[len(root) + 1:]
            break
    return path.replace("['", ".").replace("']", "").strip(".")


def class_name(raw: Any) -> str:
    """A module class as a qualified name, whether torch kept the class or its name."""
    if isinstance(raw, type):
        return f"{raw.__module__}.{raw.__qualname__}"
    return str(raw)


@functools.lru_cache(maxsize=4096)
def _in_torch(file: str) -> bool:
    """Whether a stack frame's file is torch's own (cached: a 70B-size graph's nodes name a
    few dozen files in some 300K frames)."""
    return os.path.abspath(file).startswith(_TORCH_DIR + os.sep)


def source_line(stack_trace: Any) -> Optional[str]:
    """The innermost frame of a node's stack trace outside torch itself, as
    ``package/file.py:LINE``: the model code that called the op (or the innermost frame
    when every frame is torch's)."""
    if not isinstance(stack_trace, str):
        return None
    # Only real files: "<eval_with_key>.256" (code torch.fx generated) numbers itself by a
    # process-wide counter, which would make two identical captures differ.
    frames = [f for f in _FRAME.findall(stack_trace) if not f[0].startswith("<")]
    if not frames:
        return None
    own = [f for f in frames if not _in_torch(f[0])]
    file, line, _ = (own or frames)[-1]
    return f"{relative_file(file)}:{line}"


def keep_source(gm: torch.fx.GraphModule) -> None:
    """Replace each node's stack trace (absolute paths) by its relative source line."""
    for node in gm.graph.nodes:
        line = source_line(node.meta.get("stack_trace"))
        if line is not None:
            node.meta[SOURCE_KEY] = line


def _internal(cls: str) -> bool:
    return cls.startswith(("torch.export.", "torch._", "torch.fx."))


def node_origin(node: torch.fx.Node) -> Optional[NodeOrigin]:
    """graph.json's ``origin`` of a node, or None where torch recorded nothing: the innermost
    module, its class, the source line, and whether it is the forward's (a backward node's
    gradient computation). A graph loaded from graph.json keeps the origin it was read with."""
    kept = node.meta.get(ORIGIN_KEY)
    if isinstance(kept, NodeOrigin):
        return kept
    stack = node.meta.get("nn_module_stack")
    from_forward = False
    if not stack:
        stack = node.meta.get("fwd_nn_module_stack")
        from_forward = bool(stack)
    source = node.meta.get(SOURCE_KEY)
    if not stack and source is None:
        return None
    # torch's own wrappers (export's non-strict Wrapper around the model) are no module of the model's.
    innermost = next((v for v in reversed((stack or {}).values()) if not _internal(class_name(v[1]))), None)
    path, cls = innermost if innermost is not None else (None, None)
    return _origin(innermost is not None, path, cls, source, from_forward)


@functools.lru_cache(maxsize=1 << 16)
def _origin(in_module: bool, path: Any, cls: Any, source: Optional[str], from_forward: bool) -> NodeOrigin:
    """One (immutable) NodeOrigin for each distinct origin: the nodes of a graph share a few
    hundred, and building one was most of the time of describing a node."""
    return NodeOrigin(module=module_path(path) if in_module else None,
                      module_class=class_name(cls) if in_module else None,
                      source=source, of_forward=True if from_forward else None)
