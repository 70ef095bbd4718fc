"""An artefact's inference graph written as an exported program (.pt2, a torch.export
archive: `aotpipe export-pt2`). (Reading one as a model to capture is aotpipe/models/pt2_source.py.)

The graph is loaded as replay loads it (rebuilt from graph.json through the allow-list),
wrapped in a module that owns its parameters and buffers (under their recorded names) and
takes the user inputs, exported with torch.export, saved with torch.export.save, loaded
back with torch.export.load and run on the artefact's saved inputs beside the artefact's
own graph: the outputs must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from aotpipe.artifact.fsio import OutputError, describe_os_error
from aotpipe.artifact.load import load
from aotpipe.errors import AotpipeError, ArtifactError, exception_line
from aotpipe.format.graph_keys import parse_graph_key


class _GraphProgram(torch.nn.Module):
    """An inference graph as a module: it owns the graph's parameters and buffers (named as
    recorded: fc.weight) and takes the user inputs; buffers the graph mutates are updated."""

    def __init__(self, gm: torch.nn.Module, record: Any, values: list[Any]) -> None:
        super().__init__()
        self.graph_module = gm
        self._slots: list[tuple[str, Any]] = []  # per graph input: ("user", index) or ("state", name)
        self._mutations: list[tuple[int, str]] = []  # (output index, state name)
        taken: set[str] = set()
        users = 0
        for i, (rec, value) in enumerate(zip(record.inputs, values)):
            if rec.role == "user":
                self._slots.append(("user", users))
                users += 1
                continue
            if rec.role not in ("param", "buffer", "constant") or not isinstance(value, torch.Tensor):
                raise ArtifactError(f"input {i} ({rec.name}) is a {rec.role} {rec.type}; export-pt2 takes "
                                    "parameters, buffers, constants and user inputs only")
            name = self._state_name(rec.target, i, taken)
            self._place(name, value, rec.role)
            self._slots.append(("state", name))
        self.user_inputs = users
        for j, out in enumerate(record.outputs):
            if out.role == "mutation":
                state = next((n for (kind, n), r in zip(self._slots, record.inputs)
                              if kind == "state" and r.target == out.target), None)
                if state is None:
                    raise ArtifactError(f"output {j} mutates {out.target!r}, which is not a buffer of the graph")
                self._mutations.append((j, state))
        self._user_outputs = [j for j, out in enumerate(record.outputs) if out.role == "user"]

    @staticmethod
    def _state_name(target: Optional[str], i: int, taken: set[str]) -> str:
        parts = (target or "").split(".")
        name = target if target and all(p.isidentifier() or p.isdigit() for p in parts) and target not in taken \
            else f"input_{i}"
        taken.add(name)
        return name  # type: ignore[return-value]

    def _place(self, name: str, value: torch.Tensor, role: str) -> None:
        *path, leaf = name.split(".")
        owner: torch.nn.Module = self
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if role == "param":
            owner.register_parameter(leaf, torch.nn.Parameter(value.detach().clone(), requires_grad=False))
        else:
            owner.register_buffer(leaf, value.detach().clone())

    def _state(self, name: str) -> torch.Tensor:
        owner: Any = self
        for part in name.split("."):
            owner = getattr(owner, part)
        return owner

    def forward(self, *user: Any) -> Any:
        args = [user[ref] if kind == "user" else self._state(ref) for kind, ref in self._slots]
        outs = self.graph_module(*args)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        for j, name in self._mutations:
            self._state(name).copy_(outs[j])
        return tuple(outs[j] for j in self._user_outputs)


@dataclass
class ExportResult:
    path: Path
    graph: str
    user_inputs: int
    outputs: int
    parameters: int
    buffers: int
    max_abs_difference: float  # exported program against the artefact's graph, same inputs
    identical: bool


def _inference_key(manifest: Any, graph: Optional[str], where: Path) -> str:
    keys = list(manifest.graphs)
    if graph is None:
        if "inference" not in keys:
            raise AotpipeError(f"{where}: no inference graph (it has: {', '.join(keys)}); export-pt2 writes an "
                               "inference graph: capture one (graphs: [inference, ...])")
        return "inference"
    parsed = parse_graph_key(graph)
    if graph not in keys:
        raise AotpipeError(f"{where}: no graph {graph!r}; it has: {', '.join(keys)}")
    if parsed is None or parsed.kind != "inference":
        raise AotpipeError(f"{where}: graph {graph!r} is not an inference graph; export-pt2 writes inference graphs "
                           "(a training graph's inputs and outputs are not a model's)")
    return graph


def _compare(a: Any, b: Any) -> tuple[float, bool]:
    """(largest absolute difference, every output equal) of two output tuples."""
    a = a if isinstance(a, (list, tuple)) else (a,)
    b = b if isinstance(b, (list, tuple)) else (b,)
    if len(a) != len(b):
        return float("inf"), False
    worst, same = 0.0, True
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return float("inf"), False
            same = same and torch.equal(x, y)
            if x.numel() and (x.is_floating_point() or x.is_complex()):
                worst = max(worst, (x.double() - y.double()).abs().max().item())
            elif not torch.equal(x, y):
                worst = float("inf")
        else:
            same = same and x == y
    return worst, same


def export_pt2(artifact: Path, out: Path, graph: Optional[str] = None) -> ExportResult:
    """Write the artefact's inference graph (or `graph`, an inference graph made by passes)
    to `out` as a torch.export archive, loaded back and checked against the artefact's graph
    on its saved inputs."""
    art = load(artifact)
    key = _inference_key(art.manifest, graph, artifact)
    if (art.manifest.capture.subgraphs or 1) > 1:
        raise AotpipeError(f"{artifact}: captured in {art.manifest.capture.subgraphs} subgraphs (graph breaks); "
                           "export-pt2 writes one whole-model graph: capture with mode: export")
    partial = [o for o in art.manifest.capture.outside_graphs or [] if o.compile == "inference"]
    if partial:  # its graph's outputs are not the model's (CTCLoss: the log-probabilities, not the loss)
        raise AotpipeError(f"{artifact}: partial capture: part of the model ran outside its inference graph "
                           f"({partial[0].text(3)}), so a .pt2 of that graph would not compute the model; not "
                           "exported: make the model capture whole (docs/capture-modes.md#partial-captures)")
    ga = art.graphs[key]
    values = ga.saved_inputs()
    program = _GraphProgram(ga.module, ga.record, values).eval()
    user = tuple(v for v, r in zip(values, ga.record.inputs) if r.role == "user")
    try:
        # Functional ATen, as the artefact's graphs are: buffer updates become the program's
        # buffers_to_mutate (no decompositions: the table is empty).
        ep = torch.export.export(program, user, strict=False).run_decompositions({})
    except Exception as e:
        raise AotpipeError(f"{artifact}: torch.export could not trace the {key} graph: {exception_line(e)}") from e
    out = Path(out)
    try:
        torch.export.save(ep, str(out))
    except OSError as e:
        raise OutputError(describe_os_error(e, out)) from None
    loaded = torch.export.load(str(out)).module()
    # Both run on fresh copies: a graph that mutates a buffer changes its own state.
    reference = _GraphProgram(ga.module, ga.record, ga.saved_inputs()).eval()(*[
        v.clone() if isinstance(v, torch.Tensor) else v for v in user])
    got = loaded(*[v.clone() if isinstance(v, torch.Tensor) else v for v in user])
    worst, same = _compare(got, reference)
    sig = ep.graph_signature
    return ExportResult(out, key, len(user), len(reference), len(sig.parameters), len(sig.buffers), worst, same)
