"""get_inputs: random inputs for a saved graph from its `.input` file (and inputs.json beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from aotpipe.artifact import input_meta
from aotpipe.artifact.graph_json import decode_dtype
from aotpipe.artifact.load import build_inputs
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format import records
from aotpipe.format.limits import check_record_bytes, extent
from aotpipe.format.records import GraphRecord, InputRecord, InputsRecord, StorageRecord
from aotpipe.format.symbolic import records_at, symbol_sizes
from aotpipe.runtime.tensors import StorageGroup, random_storage


def _entry_record(i: int, entry: Any, where: str) -> dict[str, Any]:
    """A .input entry as an input record like inputs.json's (a user input; no range)."""
    if not isinstance(entry, tuple) or not entry:
        raise ArtifactError(f"{where}: bad input entry {str(entry)[:60]}")
    base = {"index": i, "name": f"arg{i}", "role": "user"}
    if len(entry) == 1:
        t = entry[0]
        if t not in (int, float, bool):
            raise ArtifactError(f"{where}: bad scalar entry {str(entry)[:60]}")
        return {**base, "type": t.__name__}
    if len(entry) != 5:
        raise ArtifactError(f"{where}: an entry is (type, shape, stride, dtype, device), got {len(entry)} items")
    _, shape, stride, dtype, device = entry
    if not isinstance(dtype, torch.dtype):
        raise ArtifactError(f"{where}: bad dtype {str(dtype)[:40]}")
    return {**base, "type": "tensor", "shape": list(shape), "stride": list(stride),
            "dtype": str(dtype).removeprefix("torch."), "device": str(device), "storage_offset": 0}


def _flatten_meta(meta: list) -> tuple[list, Optional[list[int]]]:
    if meta and all(isinstance(m, list) for m in meta):
        return [e for group in meta for e in group], [len(g) for g in meta]
    return meta, None


def _records_from_input_file(meta: list, where: str) -> tuple[list[StorageRecord], list[InputRecord]]:
    """Storage and input records for a bare .input file: one storage per tensor input."""
    flat, _ = _flatten_meta(meta)
    inputs, storages = [], []
    for i, e in enumerate(flat):
        rec = records.parse(InputRecord, _entry_record(i, e, where), f"{where}: entry {i}")
        if rec.type == "tensor":
            rec.storage = len(storages)
            storages.append(StorageRecord(dtype=rec.dtype, device=rec.device or "cpu",
                                          numel=extent(tuple(rec.shape or []), tuple(rec.stride or []))))
        inputs.append(rec)
    return storages, inputs


def _random_inputs(storages: list[StorageRecord], inputs: list[InputRecord], seed: int,
                   device: Optional[str], forward: Optional[InputsRecord] = None) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    bases = []
    for s in storages:
        grp = StorageGroup(decode_dtype(s.dtype), s.device, s.numel)
        base = random_storage(grp, g, tuple(s.range) if s.range else None)  # drawn on the CPU: the same everywhere
        bases.append(base.to(device) if device else base)
    # Random inputs take every tensor from its storage, whatever the saved values' source.
    sizes = [o.value for o in forward.outputs] if forward is not None else None
    values = build_inputs(inputs, bases, sizes, random=True)
    if forward is not None:
        _draw_in_forward_ranges(values, inputs, forward, g)
    return values


def _draw_in_forward_ranges(values: list[Any], inputs: list[InputRecord], forward: InputsRecord,
                            g: torch.Generator) -> None:
    """A backward's saved integer tensors (indices the forward computed) drawn inside the range
    the forward's output had at capture (version 3): indices that fit what they index."""
    for v, rec in zip(values, inputs):
        k = rec.forward_output
        if rec.source != "forward" or rec.range is not None or k is None or k >= len(forward.outputs) \
                or not isinstance(v, torch.Tensor):
            continue
        rng = forward.outputs[k].range
        if rng is None or v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool \
                or 0 in v.stride() or rng[0] >= rng[1]:
            continue
        v.copy_(torch.randint(rng[0], rng[1], tuple(v.shape), generator=g, dtype=v.dtype))


def graph_symbols(folder: Path) -> dict[str, Any]:
    """The symbols of the graph in `folder` (graph.json, version 3), by name; {} for a static one."""
    path = folder / records.GRAPH_JSON
    if not path.exists():
        return {}
    _, graph = records.read(GraphRecord, path)
    return dict(graph.symbols or {})


def sizes_by_symbol(folder: Path, sizes: dict[str, int]) -> dict[str, int]:
    """`sizes` (by named dimension, symbol or input dimension) as every symbol of the graph in
    `folder` at a size, checked against the ranges its graph.json records."""
    return symbol_sizes(graph_symbols(folder), sizes, str(folder / records.GRAPH_JSON))


def get_inputs(path: str | Path, seed: int = 0, device: str | torch.device | None = None,
               forward: Optional[InputsRecord] = None, sizes: dict[str, int] | None = None) -> list[Any]:
    """Random inputs for a saved graph, from its `.input` file and inputs.json beside it.

    Same shapes, dtypes, strides and storage offsets as at capture, and the same aliasing
    (inputs that shared a storage share one again); floats N(0, 1) from a generator seeded
    with `seed`; integers inside the recorded range ([0, 2) when none is recorded); random
    booleans; recorded int/float scalars. For a backward, `forward` is the forward graph's
    inputs.json record (replay passes it): the sizes the forward computed from tensor values
    (data-dependent: how many tokens a router sent to an expert) are their recorded values,
    those the saved tensors' recorded shapes were made with, and saved integer tensors
    (indices) are drawn in the range the forward's output had; a size with no recorded value
    (no `forward`, or an artefact from before format version 3) is an ArtifactError saying
    random inputs cannot be used for that graph. The joint graph's come nested as
    [[primals...], [tangents...]]. Works on `.input` files torch's graph_dumper_aot wrote.
    `path` may be the `.input` file or its graph folder.

    `sizes`: for a shape-polymorphic graph, inputs at other sizes, by named dimension
    ("batch"), symbol ("s43") or input dimension ("x.size(0)"); dimensions not given keep
    the example's. Each input's shape and stride (and a size input's value) are its recorded
    symbolic ones evaluated there, so the graph runs at those sizes; a size outside the range
    graph.json records, or a name it does not know, is an ArtifactError.
    """
    p = Path(path)
    if p.is_dir():
        candidates = sorted(p.glob("*" + records.INPUT_SUFFIX))
        if len(candidates) != 1:
            raise ArtifactError(f"{p}: expected one .input file, found {len(candidates)}")
        p = candidates[0]
    meta = input_meta.read(p)
    record_path = p.parent / records.INPUTS_JSON
    dev = str(device) if device is not None else None
    flat, groups = _flatten_meta(meta)
    if record_path.exists():
        _, record = records.read(InputsRecord, record_path)
        if len(flat) != len(record.inputs):
            raise ArtifactError(f"{p}: {len(flat)} entries but inputs.json lists {len(record.inputs)} inputs")
        storages, inputs, groups = record.storages, record.inputs, record.groups or groups
    elif sizes is not None:
        raise ArtifactError(f"{p}: no inputs.json beside it, which records the symbolic sizes; "
                            "inputs at other sizes need the whole graph folder")
    else:
        storages, inputs = _records_from_input_file(meta, str(p))
    if sizes is not None:
        storages, inputs = records_at(storages, inputs, sizes_by_symbol(p.parent, sizes), str(record_path))
    check_record_bytes(storages, inputs, record_path if record_path.exists() else p)
    try:
        values = _random_inputs(storages, inputs, seed, dev, forward)
    except (TypeError, KeyError, ValueError, IndexError, RuntimeError) as e:
        raise ArtifactError(f"{p}: cannot make inputs from it ({exception_line(e)})") from None
    return input_meta.nest(values, groups)
