"""Replay at other sizes: a shape-polymorphic artefact's graphs run at sizes the caller picks
(``aotpipe replay --sizes batch=7``), not only at the example's.

The inputs are bound as the capture's size checks (checks/sizes.py) bind them, by the same
functions: parameters and buffers (here from the artefact's blobs), the user inputs drawn
from the model's spec at those sizes with its input function and seed, tangents and size
inputs computed from the symbols, a backward's saved values from the forward's outputs. So at
a size the capture checked (a manifest `dims.checked` entry) the outputs are those it
recorded, and are compared with its digests: bit for bit where the artefact was made, by the
sums of their sampled elements elsewhere. At any other size, or with random inputs
(get_inputs at the sizes), there is no reference: the graphs run, and their outputs' shapes
and dtypes are checked against the recorded symbolic ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from aotpipe.artifact.load import Artifact, Expected, GraphArtifact
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format.graph_keys import graph_key, key_order, parse_graph_key
from aotpipe.format.records import MANIFEST, DimRecord, DimsRecord, OutputRecord, SizeCheckRecord, SymbolRecord
from aotpipe.format.symbolic import evaluate, layout_at, symbol_sizes
from aotpipe.format.vocabulary import GraphKind
from aotpipe.models.sources import user_input_names
from aotpipe.replay.inputs import _flatten_meta, get_inputs
from aotpipe.replay.run import (
    GraphReplay,
    _cpu,
    compare_recorded,
    layout_mismatches,
    recorded_threads,
    replay_environment,
    run_on_device,
    selected_graphs,
)
from aotpipe.runtime.determinism import intra_op_threads
from aotpipe.runtime.devices import parse_device
from aotpipe.runtime.tensors import tangent
from aotpipe.spec import ModelSpec
from aotpipe.spec.modes import capture_mode


def capture_symbols(art: Artifact) -> dict[str, SymbolRecord]:
    """Every symbol any graph of the artefact records, by name (graph.json, version 3)."""
    out: dict[str, SymbolRecord] = {}
    for ga in art.graphs.values():
        if ga.graph is not None and ga.graph.symbols:
            for name, rec in ga.graph.symbols.items():
                if name not in out or (rec.sources and not out[name].sources):
                    out[name] = rec
    return out


def _auto_spec(spec: ModelSpec, dims: dict[str, DimRecord], sizes: dict[str, int]) -> ModelSpec:
    """dims: auto: the spec with each input's leading dimension at the size of its dimension
    (keyed by the input dimension, ``x.size(0)``; one symbol may stand for several)."""
    by_source = {src: sizes[k] for k, d in dims.items() if k in sizes for src in d.sources}
    inputs = []
    for i, inp in enumerate(spec.inputs):
        name = inp.name or f"arg{i}"
        shape = [by_source.get(f"{name}.size({d})", s) for d, s in enumerate(inp.shape)]
        inputs.append(type(inp)(**{**{f: getattr(inp, f) for f in type(inp).model_fields}, "shape": shape}))
    return ModelSpec(**{**{f: getattr(spec, f) for f in type(spec).model_fields}, "inputs": inputs})


def draw_user_inputs(spec: ModelSpec, dims: dict[str, DimRecord], sizes: dict[str, int],
                     example_inputs: Callable[[ModelSpec], tuple[tuple, dict]]) -> tuple[tuple, dict]:
    """The model's (args, kwargs) at `sizes` (by dimension), drawn as the example's were: the
    spec at those sizes given to the mode's input function, which draws from the spec's seed."""
    return example_inputs(spec.at(sizes) if not spec.auto_dims else _auto_spec(spec, dims, sizes))


def bind_at_sizes(ga: GraphArtifact, state: dict[str, Any], user: dict[str, Any], sizes: dict[str, int],
                  saved: list[Any] | None) -> list[Any]:
    """A graph's inputs at `sizes` (symbol -> size): model tensors by target, the user inputs
    drawn at those sizes by name, tangents and sizes computed from the symbols, a backward's
    saved values (`saved`: the forward's outputs at those sizes)."""
    out: list[Any] = []
    for rec in ga.record.inputs:
        where = f"{ga.folder.name} input {rec.name}"
        if rec.role in ("param", "buffer", "constant"):
            out.append(state[rec.target or rec.name])
        elif rec.role == "user" and rec.target is not None:
            out.append(user[rec.target])
        elif rec.role == "tangent":
            shape = [evaluate(s, sizes, where) for s in (rec.sym_shape or rec.shape or [])]
            stride = [evaluate(s, sizes, where) for s in (rec.sym_stride or rec.stride or [])]
            out.append(tangent(shape, stride, getattr(torch, rec.dtype or "float32")))
        elif rec.source == "forward" and saved is not None and rec.forward_output is not None:
            out.append(saved[rec.forward_output])
        elif rec.role == "symint" and rec.sym_value is not None:
            out.append(evaluate(rec.sym_value, sizes, where))
        else:
            raise ValueError(f"{where}: cannot bind a {rec.role} input at other sizes")
    return out


@dataclass
class SizedReplay:
    """What replaying at other sizes gave: each graph's replay, the sizes (every dimension),
    and a note on what the outputs were compared with."""

    graphs: list[GraphReplay]
    sizes: dict[str, int]
    notes: list[str] = field(default_factory=list)


def replay_at_sizes(art: Artifact, sizes: dict[str, int], *, graphs: list[str] | None = None,
                    inputs: str = "saved", seed: int = 0, device: str | None = None,
                    threads: int | None = None) -> SizedReplay:
    """Replay the graphs of a shape-polymorphic artefact (all, or those named) at `sizes` (by
    named dimension, symbol or input dimension; the others at the example's): see the module.

    `inputs` "saved" draws the user inputs from the manifest's model spec and binds the
    stored parameters (compared with the capture's size checks where it checked these sizes);
    "random" takes every input from get_inputs at the sizes (nothing to compare with)."""
    kinds = selected_graphs(art, graphs, threads)
    if inputs not in ("saved", "random"):
        raise ArtifactError(f"--inputs must be saved or random, got {inputs!r}")
    by_symbol = symbol_sizes(capture_symbols(art), sizes, str(art.path))
    record = art.manifest.dims
    dims = record.dims if record is not None else {}
    by_dim = {name: by_symbol[d.symbol] for name, d in dims.items() if d.symbol in by_symbol}
    every = by_dim or dict(by_symbol)
    at = ", ".join(f"{k}={v}" for k, v in every.items())
    if inputs == "saved" and not all(art.graphs[k].has_saved_values for k in kinds):
        inputs = "random"  # captured with save_inputs: false
    with intra_op_threads(threads if threads is not None else recorded_threads(art)):
        differs, why_judged = replay_environment(art, device)
        if inputs == "random":
            results = [_replay_random(art.graphs[k], by_symbol, seed, device) for k in kinds]
            return SizedReplay(results, every, [f"no reference at {at} with random inputs: the graphs ran, "
                                                "and their outputs' shapes are checked"])
        meta = device is not None and parse_device(device).type == "meta"  # no values: shapes only
        checked = None if meta or record is None else next((c for c in record.checked if c.sizes == by_dim), None)
        # at the example's sizes the drawn inputs are the saved ones: the graphs' own records compare
        example = not meta and bool(dims) and by_dim == {n: d.example for n, d in dims.items() if d.symbol in by_symbol}
        reference: SizeCheckRecord | str | None = "example" if example and checked is None else checked
        results = _replay_drawn(art, kinds, dims, by_dim, by_symbol, reference, device, (differs, why_judged))
    if reference == "example":
        note = f"compared with the outputs the capture recorded at {at} (the example's sizes)"
    elif checked is not None:
        note = f"compared with the outputs the capture recorded at {at} (its {checked.point} size check)"
    else:
        why = "on the meta device (no values)" if meta else \
            f"(not a size the capture checked: {_checked_points(record)})"
        note = f"no reference at {at} {why}: the graphs ran, and their outputs' shapes are checked"
    return SizedReplay(results, every, [note])


def _checked_points(record: DimsRecord | None) -> str:
    """The sizes the capture checked, for a note: "batch=1; batch=16; batch=5"."""
    checked = record.checked if record is not None else []
    return "; ".join(", ".join(f"{k}={v}" for k, v in c.sizes.items()) for c in checked) or "it checked none"


def _outputs_at(ga: GraphArtifact, sizes: dict[str, int]) -> list[OutputRecord]:
    return [layout_at(rec, sizes, f"{ga.folder.name} output {i}") for i, rec in enumerate(ga.record.outputs)]


def _shapes(outs: list[Any]) -> list[list[int] | None]:
    return [list(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]


def _replay_random(ga: GraphArtifact, sizes: dict[str, int], seed: int, device: str | None) -> GraphReplay:
    """One graph on get_inputs at `sizes` (symbol -> size): ran, and its outputs' layouts checked."""
    result = GraphReplay(ga.name, "error", "random")
    mine = {s: v for s, v in sizes.items() if ga.graph is not None and ga.graph.symbols and s in ga.graph.symbols}
    forward = ga.upstream.record if ga.upstream is not None else None
    values, _ = _flatten_meta(get_inputs(ga.input_file, seed=seed, forward=forward, sizes=mine or None))
    try:
        outs = run_on_device(ga, values, device, result)[0]
    except ArtifactError:
        raise
    except Exception as e:  # the graph does not run at these sizes: its result, said
        result.error = exception_line(e)
        return result
    result.shapes = _shapes(outs)
    result.mismatches = layout_mismatches(ga, outs, _outputs_at(ga, sizes))
    result.status = "mismatch" if result.mismatches else "ran"
    return result


def _model_spec(art: Artifact) -> ModelSpec:
    """The manifest's model record as the spec it ran with (its inputs' dims, its seed)."""
    where = art.path / MANIFEST
    try:
        spec = ModelSpec.model_validate({**art.manifest.model.model_dump(), "passes": []})
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        first = " ".join(str(e).split())[:160]
        raise ArtifactError(f"{where}: its model record is not a spec this aotpipe reads ({first}); "
                            "replay at other sizes with --inputs random") from None
    loaded = [inp.name or f"input {i}" for i, inp in enumerate(spec.inputs) if inp.data is not None]
    if loaded:
        raise ArtifactError(f"{where}: input {loaded[0]} is loaded from data:, which a replay does not read; "
                            "replay at other sizes with --inputs random")
    return spec


def _replay_drawn(art: Artifact, kinds: list[str], dims: dict[str, DimRecord], by_dim: dict[str, int],
                  by_symbol: dict[str, int], checked: SizeCheckRecord | str | None, device: str | None,
                  environment: tuple[list[str], str | None]) -> list[GraphReplay]:
    """The graphs `kinds` on inputs bound as the size checks bind them (see the module), each
    compared with `checked`'s outputs where there is one ("example": the graph's own recorded
    outputs). A backward's forward runs too."""
    spec = _model_spec(art)
    make = capture_mode(spec.mode).function("example_inputs")
    args, kwargs = draw_user_inputs(spec, dims, by_dim, make)
    names = user_input_names(args, kwargs, [inp.name or f"arg{i}" for i, inp in enumerate(spec.inputs)])
    user = dict(zip(names, pytree.tree_leaves((args, kwargs)), strict=True))
    needed = set(kinds)
    for k in kinds:
        parsed = parse_graph_key(k)
        if art.graphs[k].kind == GraphKind.BACKWARD and parsed is not None:
            needed.add(graph_key("forward", parsed.subgraph))
    state: dict[str, Any] = {}
    for k in needed:
        state.update(art.graphs[k].model_tensors())
    outs: dict[str, list[Any]] = {}
    results = {}
    for k in sorted(needed, key=key_order):
        ga = art.graphs[k]
        result = results[k] = GraphReplay(ga.name, "error", "drawn")
        try:
            saved = None
            if ga.kind == GraphKind.BACKWARD:
                parsed = parse_graph_key(k)
                saved = outs.get(graph_key("forward", parsed.subgraph if parsed is not None else 0))
                if saved is None:
                    raise ValueError("the forward graph did not run")
            outs[k] = run_on_device(ga, bind_at_sizes(ga, state, user, by_symbol, saved), device, result)[0]
        except ArtifactError:
            raise
        except Exception as e:  # the graph does not run at these sizes: its result, said
            result.error = exception_line(e)
            continue
        on_cpu = outs[k] if checked is None else [_cpu(o) for o in outs[k]]
        _judge(result, ga, on_cpu, _outputs_at(ga, by_symbol), checked, *environment)
    return [results[k] for k in kinds]


def _judge(result: GraphReplay, ga: GraphArtifact, outs: list[Any], outputs: list[OutputRecord],
           checked: SizeCheckRecord | str | None, differs: list[str], unrecorded: str | None) -> None:
    """`result`'s status: against the outputs the capture recorded at these sizes (`checked`),
    else its outputs' layouts against the recorded symbolic ones. `differs` and `unrecorded`:
    why bits cannot match here, and why it cannot be told (replay_graph's environment rules)."""
    result.shapes = _shapes(outs)
    expected = ga.expected_outputs() if checked == "example" else \
        _checked_outputs(checked, ga.name) if isinstance(checked, SizeCheckRecord) else None
    if expected is None:
        result.mismatches = layout_mismatches(ga, outs, outputs)
        result.status = "mismatch" if result.mismatches else "ran"
        return
    unjudged: list[str] = []
    elsewhere = bool(differs) or unrecorded is not None
    problems, errors, identical = compare_recorded(ga, outs, expected, elsewhere, unjudged, outputs,
                                                   records_only=_SUMS_ONLY)
    result.environment = list(differs) + ([unrecorded] if unrecorded is not None and not identical else [])
    result.errors, result.bit_identical = errors, identical
    result.max_abs_error = max((e.max_abs_error for e in errors), default=0.0 if identical else None)
    result.mismatches = problems or unjudged
    result.status = "mismatch" if problems else "unverified" if unjudged else \
        "close" if result.environment else "match"


# Why an output at other sizes is judged by its sampled sums alone (compare_recorded).
_SUMS_ONLY = ("all the size check records of it besides its digest: replay it where it was made, at its "
              "recorded thread count")


def _checked_outputs(checked: SizeCheckRecord, key: str) -> list[Expected] | None:
    """The outputs a size check recorded for graph `key`, as replay compares them: each
    tensor's digest and sampled summary, each scalar's value; None where it recorded none."""
    digests = checked.digests.get(key)
    if digests is None:
        return None
    summaries, values = checked.summaries.get(key, []), checked.values.get(key, [])
    out = []
    for i, d in enumerate(digests):
        s = summaries[i] if i < len(summaries) else None
        v = values[i] if i < len(values) else None
        out.append(Expected(d, s, value=v, has_value=v is not None or (d is None and s is None)))
    return out
