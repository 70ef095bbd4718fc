"""Running a graph on another device: factory ops' device arguments, constants and inputs moved.

Shared by the `to_device` pass and `aotpipe replay --device`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

# gm.meta key: the graph as graph.json holds it, kept when the loader packs the weights of a
# graph for this CPU (artifact/prepack.py); such a graph runs on the CPU only.
DENSE_GRAPH = "dense_graph"


# How the loader packs a graph's weights for this CPU now (artifact/prepack.py's schemes); the
# manifest records it (environment.packing) and a graph is always loaded as it was recorded.
PACKING = "onednn"
# An artefact that records no packing: written before it was, when the loader packed so.
LEGACY_PACKING = "mkl"


def is_packed(gm: torch.fx.GraphModule) -> bool:
    """Whether the loader packed `gm`'s weights for this CPU."""
    return DENSE_GRAPH in gm.meta


def parse_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device; a ValueError naming the valid forms if it is not one."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{device!r} is not a device; use cpu, cuda, cuda:N or meta") from None


def to_device(gm: torch.fx.GraphModule, device: str | torch.device) -> torch.fx.GraphModule:
    """A copy of `gm` whose factory ops and device arguments name `device`. A CPU-only
    graph (the cpu-fast chain's oneDNN ops, weights the loader packed) is refused for
    another device (ValueError) and returned as it is for the CPU."""
    dev = parse_device(device)
    cpu_only = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                       and getattr(n.target, "namespace", None) in ("mkldnn", "mkl")}
                      | ({"weights packed for this CPU"} if is_packed(gm) else set()))
    if cpu_only and dev.type != "cpu":
        raise ValueError(f"this graph runs on CPU only ({', '.join(cpu_only[:3])}: the cpu-fast chain's oneDNN "
                         f"ops); run its base graph on {dev.type}, or a chain without mkldnn_fuse")
    if cpu_only:
        return gm
    gm = copy.deepcopy(gm)

    def rewrite(a: Any) -> Any:
        if isinstance(a, torch.device):
            return dev
        if isinstance(a, (list, tuple)):
            return type(a)(rewrite(x) for x in a)
        return a

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = rewrite(node.args)
            node.kwargs = {k: (dev if k == "device" and v is not None else rewrite(v)) for k, v in node.kwargs.items()}
    # remove_duplicate=False: equal constants loaded from one blob share a tensor.
    for name, buf in list(gm.named_buffers(remove_duplicate=False)):
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        owner.register_buffer(attr, buf.to(dev))
    gm.recompile()
    return gm


def move_inputs(values: list[Any], device: str | torch.device) -> list[Any]:
    """Inputs on `device`, keeping aliasing: views of one storage stay views of one storage."""
    dev = torch.device(device)
    moved_storage: dict[Any, torch.Tensor] = {}
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(v)
            continue
        key = (StorageWeakRef(v.untyped_storage()), v.dtype)
        if key not in moved_storage:
            n = v.untyped_storage().nbytes() // v.element_size()
            moved_storage[key] = v.as_strided((n,), (1,), 0).to(dev)
        out.append(moved_storage[key].as_strided(v.shape, v.stride(), v.storage_offset()))
    return out
