"""get_inputs: random inputs for a saved graph from its `.input` file (and inputs.json beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from aotpipe.artifact import input_meta
from aotpipe.artifact.load import build_inputs, read_json
from aotpipe.errors import ArtifactError
from aotpipe.tensors import StorageGroup, extent, random_storage


def _entry_meta(entry: Any, where: str) -> dict[str, Any]:
    """A .input entry as a record like inputs.json's (no role, no range)."""
    if not isinstance(entry, tuple) or not entry:
        raise ArtifactError(f"{where}: bad input entry {entry!r}")
    if len(entry) == 1:
        t = entry[0]
        if t not in (int, float, bool):
            raise ArtifactError(f"{where}: bad scalar entry {entry!r}")
        return {"type": t.__name__}
    if len(entry) != 5:
        raise ArtifactError(f"{where}: an entry is (type, shape, stride, dtype, device), got {len(entry)} items")
    _, shape, stride, dtype, device = entry
    if not isinstance(dtype, torch.dtype):
        raise ArtifactError(f"{where}: bad dtype {dtype!r}")
    return {
        "type": "tensor",
        "shape": [int(s) for s in shape],
        "stride": [int(s) for s in stride],
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "storage_offset": 0,
        "range": None,
    }


def _flatten_meta(meta: list) -> tuple[list, Optional[list[int]]]:
    if meta and all(isinstance(m, list) for m in meta):
        return [e for group in meta for e in group], [len(g) for g in meta]
    return meta, None


def _record_from_input_file(meta: list, where: str) -> dict[str, Any]:
    """An inputs.json-like record for a bare .input file: one storage per tensor input."""
    flat, groups = _flatten_meta(meta)
    inputs, storages = [], []
    for e in flat:
        rec = _entry_meta(e, where)
        if rec["type"] == "tensor":
            rec["storage"] = len(storages)
            storages.append({"dtype": rec["dtype"], "device": rec["device"],
                             "numel": extent(tuple(rec["shape"]), tuple(rec["stride"])), "range": None})
        inputs.append(rec)
    return {"inputs": inputs, "storages": storages, "groups": groups}


def _random_inputs(record: dict[str, Any], seed: int, device: Optional[str]) -> list[Any]:
    from aotpipe.artifact.graph_json import decode_dtype

    g = torch.Generator().manual_seed(seed)
    bases = []
    for s in record["storages"]:
        grp = StorageGroup(decode_dtype(s["dtype"]), s["device"], int(s["numel"]))
        rng = tuple(s["range"]) if s.get("range") else None
        base = random_storage(grp, g, rng)  # drawn on the CPU: the same on every machine
        bases.append(base.to(device) if device else base)
    # Random inputs take every tensor from its storage, whatever the saved values' source.
    record = dict(record, inputs=[{k: v for k, v in r.items() if k != "source"} for r in record["inputs"]])
    return build_inputs(record, bases)


def get_inputs(path: str | Path, seed: int = 0, device: str | torch.device | None = None) -> list[Any]:
    """Random inputs for a saved graph, from its `.input` file and inputs.json beside it.

    Same shapes, dtypes, strides and storage offsets as at capture, and the same aliasing
    (inputs that shared a storage share one again); floats N(0, 1) from a generator seeded
    with `seed`; integers inside the recorded range ([0, 2) when none is recorded); random
    booleans; recorded int/float scalars. The joint graph's come nested as
    [[primals...], [tangents...]]. Works on `.input` files torch's graph_dumper_aot wrote.
    `path` may be the `.input` file or its graph folder.
    """
    p = Path(path)
    if p.is_dir():
        candidates = sorted(p.glob("*.input"))
        if len(candidates) != 1:
            raise ArtifactError(f"{p}: expected one .input file, found {len(candidates)}")
        p = candidates[0]
    meta = input_meta.read(p)
    record_path = p.parent / "inputs.json"
    dev = str(device) if device is not None else None
    if record_path.exists():
        record = read_json(record_path)
        flat, groups = _flatten_meta(meta)
        if len(flat) != len(record.get("inputs", [])):
            raise ArtifactError(f"{p}: {len(flat)} entries but inputs.json lists {len(record['inputs'])} inputs")
        groups = record.get("groups") or groups
    else:
        record = _record_from_input_file(meta, str(p))
        groups = record["groups"]
    from aotpipe.artifact.limits import check_record_bytes

    check_record_bytes(record, record_path if record_path.exists() else p)
    try:
        values = _random_inputs(record, seed, dev)
    except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
        raise ArtifactError(f"{p}: cannot make inputs from it ({e.__class__.__name__}: "
                            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    return input_meta.nest(values, groups)
