"""Capture mode `dynamo`: torch.compile with a capturing backend, then AOTAutograd per subgraph.

What functorch's graph_dumper_aot did (a dynamo backend that hands each subgraph to
AOTAutograd and dumps its forward, backward and joint graphs), rebuilt on the APIs export
mode uses, so the graphs are described alike:

- The model runs once under ``torch.compile(backend=...)`` (static shapes, dynamo reset
  before and after). The backend keeps each subgraph dynamo compiles, with why dynamo
  ended it (``compile_subgraph_reason``: a graph break, or the return), and hands dynamo
  the subgraph's own code to run, recording the values the subgraph is called with: a
  later subgraph's inputs are activations the model computed, which only running gives.
  Code dynamo cannot trace (data-dependent control flow, ``print``, an explicit
  ``graph_break()``) runs eagerly between subgraphs; torch.export refuses such models.
- Dynamo lifts the parameters and buffers a subgraph reads as graph inputs. They are
  mapped back to the model's names (by identity with the model's tensors) and registered on
  the subgraph's module again, so every graph describes them as param and buffer inputs,
  stored as weights, and names their gradients.
- training (forward, backward, joint): the model in train mode; each subgraph's module
  goes through AOTAutograd's joint export with descriptors and the default partitioner,
  as in export mode, but without a loss: a subgraph's outputs are activations, so the joint
  takes one tangent per differentiable output (what torch.compile's backward receives) and
  also gives the gradients of the activations it takes. The tangents bound are each output's
  loss weights (tensors.tangent), so the gradients are those of the weighted loss, which no
  normalised output makes constant.
- inference: a second compile, of the model in eval mode under no_grad (what
  torch.compile runs for inference: eval-mode batch norm and dropout, and no autograd
  bookkeeping); each of its subgraphs is exported (torch.export, non-strict) and decomposed
  to core ATen as in export mode. Subgraph i's inference graph is the i-th subgraph of that
  compile: the two compiles break at the same places unless the model's code depends on
  the mode (a note says when their counts differ).

Subgraph 0's graphs are keyed "inference", "forward", ...; subgraph i's "forward_<i>"
(aotpipe.format.graph_keys), folders ``<model>_<kind>_<i>``, indices per model.

What the model computes outside its subgraphs (ops no subgraph ran, tensors no subgraph made:
:func:`outside_graphs`) makes the capture partial (CapturedGraphs.outside_graphs, the
manifest's capture.outside_graphs); a whole one is checked by running its subgraphs alone,
fed as recorded (:func:`_composed`), against the eager model.

The reference a subgraph's graphs are checked against is its own dynamo graph run eagerly
(float32, and float64 on demand): the whole model's outputs and gradients are not any one
subgraph's. :func:`subgraph_references` gives them to the checks.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import linecache
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._python_dispatch
import torch.utils._pytree as pytree

from aotpipe.capture import dynamic as dynamic_capture
from aotpipe.capture import export as _export
from aotpipe.capture.ctc import ctc_loss_formulated
from aotpipe.capture.custom_ops import replace_calls
from aotpipe.capture.hints import chain_text, config_hint_applies, where_in_model
from aotpipe.capture.rnn import recurrent_decompositions
from aotpipe.capture.torch_branches import static_library_branches
from aotpipe.errors import CaptureError, exception_line
from aotpipe.format.graph_keys import graph_key, key_order
from aotpipe.format.ir import CapturedGraph, CapturedGraphs, Subgraph
from aotpipe.format.records import GraphBreakRecord, OutsideGraphs, Partition
from aotpipe.format.source_files import relative_file
from aotpipe.format.vocabulary import TRAINING_KINDS, GraphKind
from aotpipe.models.eager import EagerReference, SubgraphReference
from aotpipe.models.sources import user_input_names
from aotpipe.runtime.determinism import run_reproducibly
from aotpipe.runtime.tensors import tangent
from aotpipe.spec.modes import DEFAULT_LOSS, DYNAMO_OPTIONS, DynamicDims

MODE = "dynamo"
# How this mode captures; recorded in the manifest and part of the fingerprint.
OPTIONS = DYNAMO_OPTIONS

# The note a whole capture gets once _check_together passed: the stored subgraphs alone, no eager code between them.
_TOGETHER = ("checked: the {n} subgraph(s) alone, each fed the outputs of those before it as recorded (no code "
             "between them), reproduce the eager model's outputs ({mode})")
# The note of a partial one: no claim that the subgraphs reproduce the model.
_PARTIAL = ("partial ({mode}): part of the model ran outside the graphs{where}: {what}; the graphs alone do not "
            "compute the model, so they were not checked against it as a whole")
# ATen ops the eager run makes that a dynamo graph does not, without computing anything:
# autograd's bookkeeping.
_BOOKKEEPING = frozenset({"aten.detach.default"})
# An op eager runs that dynamo traces as others (each at least once in the graph in its place):
# unpacking a tensor (`q, k, v = t`) runs unbind in eager, and t[0], t[1], ... in dynamo's graph.
_REWRITTEN = {"aten.unbind.int": "aten.select.int"}
# Ops that read a tensor's value into Python (a branch's condition, a size, a constant): not
# tensor computation outside the graphs, but the graphs are those of the example's path.
_VALUE_READS = frozenset({"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default"})


class _Outputs(torch.nn.Module):
    """Holds a subgraph's module as ``.model`` (names read "model.<param>" in AOTAutograd's
    descriptors, as export's loss wrapper makes them) and returns its outputs as they are."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        return self.model(*args)


@dataclass
class _Traced:
    """One subgraph as dynamo compiled it, and what it was called with the first time."""

    gm: torch.fx.GraphModule
    reason: Any  # torch._dynamo's GraphCompileReason
    state_names: list[str | None]  # per placeholder: the model's parameter or buffer it is
    sources: list[str | None]  # per placeholder: where dynamo read it ("L['h']")
    values: list[Any] | None = None  # per placeholder: the value of the first call
    model_inputs: list[str | None] = field(default_factory=list)  # per placeholder: the model input it is


@dataclass
class _Lifted:
    """A subgraph's module with parameters and buffers registered again, and its user inputs."""

    module: torch.fx.GraphModule
    user_names: list[str]
    user_values: list[Any]


def capture_dynamo(*args: Any, **kwargs: Any) -> CapturedGraphs:
    """Compile `model` with a capturing backend into per-subgraph graphs (see _capture)."""
    with warnings.catch_warnings():
        # torch-internal deprecation noise (pytree specs, dynamo config); not the user's concern
        warnings.filterwarnings("ignore", category=FutureWarning)
        # allow_rnn: dynamo otherwise skips nn.LSTM/GRU/RNN modules (runs them eagerly, uncaptured);
        # traced, they decompose into plain ATen (capture/rnn.py).
        # linalg's checks as plain nodes, not effect tokens (export.checks_without_effect_tokens)
        # the CTC loss as static-shape ATen (capture/ctc.py)
        # torch's own branches on tensor values, static (capture/torch_branches.py): while dynamo
        # compiles and while each subgraph is traced to ATen (aten.cov's kernel is needed then)
        notes: list[str] = []
        with recurrent_decompositions(), torch._dynamo.config.patch(allow_rnn=True), \
                _export.checks_without_effect_tokens(), ctc_loss_formulated(notes), static_library_branches(notes):
            captured = _capture(*args, **kwargs)
        captured.notes.extend(n for n in notes if n not in captured.notes)
        return captured


def _capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    graphs: list[str],
    input_names: list[str],
    int_ranges: dict[str, tuple[int, int]] | None = None,
    dynamic: DynamicDims | None = None,
) -> CapturedGraphs:
    """The requested graph kinds of every subgraph torch.compile makes of `model`.

    Subgraph i's graphs are keyed by kind for i = 0 and "<kind>_<i>" after; each forward's
    partition contract pairs it with its backward. Raises CaptureError (one line) when
    dynamo fails or compiles no graph.

    With `dynamic` (named dimensions), each is marked dynamic on the model's inputs over its
    range, so dynamo's graph keeps it symbolic; the one graph is then exported with the same
    dimensions (its sizes read from the inputs) and its graphs written as export's are. A
    model dynamo splits into several graphs is refused: the graphs after a break take values
    whose sizes no input names.
    """
    if dynamic is not None and dynamic.auto:
        raise CaptureError("dims: auto: mode dynamo takes named dimensions only; use mode export or auto for "
                           "dims: auto")
    start = time.perf_counter()
    model_names = user_input_names(args, kwargs, input_names)
    model_values = pytree.tree_leaves((args, kwargs))
    ranges = dict(int_ranges or {})
    for n, v in zip(model_names, model_values):
        if n not in ranges and isinstance(v, torch.Tensor):
            r = _export._observed_range(v)
            if r is not None:
                ranges[n] = r
    # The model's own user inputs keep their names in every subgraph that takes them.
    input_name_of = {id(v): n for n, v in zip(model_names, model_values) if isinstance(v, torch.Tensor)}
    notes: list[str] = []
    materialised = _export.materialise_lazy_modules(model, args, kwargs)  # Lazy* modules: one eager call
    if materialised:
        notes.append(materialised)
    captured: dict[str, CapturedGraph] = {}
    subgraphs: dict[int, Subgraph] = {}
    inputs: dict[str, list[Any]] = {}
    breaks: list[GraphBreakRecord] = []
    counts: dict[str, int] = {}

    def subgraph(i: int) -> Subgraph:
        return subgraphs.setdefault(i, Subgraph(i, {}))

    outside: list[OutsideGraphs] = []

    def compiled(grad: bool) -> list[_Traced]:
        c = _compile(model, args, kwargs, input_name_of, grad=grad, dynamic=dynamic, user_names=model_names)
        if dynamic is not None and len(c.traced) != 1:
            raise CaptureError(f"dims: dynamo split the model into {len(c.traced)} graphs "
                               f"({_break_text(_breaks(c.traced)).strip(' ()') or 'graph breaks'}); sizes stay "
                               "symbolic only in a one-graph capture: remove the graph break, or remove dims for "
                               "this model")
        mode = "training" if grad else "inference"
        found = _breaks(c.traced)
        if c.outside is not None:
            outside.append(c.outside)
            notes.append(_PARTIAL.format(mode=mode, where=_break_text(found), what=c.outside.text()))
        else:
            notes.append(_TOGETHER.format(n=len(c.traced), mode=mode))
        if c.value_reads:
            notes.append(f"{mode}: value(s) read outside the graphs ({', '.join(c.value_reads)}): a branch or a "
                         "constant decided on the example's values; the graphs are those of its path")
        return c.traced

    if "inference" in graphs:
        model.eval()
        traced = compiled(False)
        counts["inference"] = len(traced)
        breaks = _breaks(traced)
        for i, t in enumerate(traced):
            lifted = _lift(t, i)
            key = graph_key("inference", i)
            g, values = _inference_graph(lifted, ranges, key, dynamic, notes)
            captured[key], inputs[key] = g, values
            sg = subgraph(i)
            sg.keys["inference"] = key
            sg.reference["inference"] = (lifted.module, lifted.user_values)

    if set(TRAINING_KINDS) & set(graphs):
        model.train()
        traced = compiled(True)
        counts["training"] = len(traced)
        breaks = _breaks(traced)
        for i, t in enumerate(traced):
            lifted = _lift(t, i)
            sg = subgraph(i)
            static = _static_mask_writes(lifted)
            if static:
                notes.append(f"subgraph {i}: {static} boolean-mask write(s) x[mask] = v captured as "
                             "x.copy_(where(mask, v, x)) (same values and gradients, static shapes)")
            try:
                outs = _outputs(lifted)
            except RuntimeError as e:
                if _LEAF_IN_PLACE not in str(e):
                    raise
                cloned = _clone_grad_inputs(lifted)
                notes.append(f"subgraph {i} writes in place into input(s) that require grad ({', '.join(cloned)}: "
                             "activations of the subgraph before), which autograd allows only on a copy; its "
                             "training graphs copy them first")
                outs = _outputs(lifted)
            copied = _copy_aliasing_outputs(lifted, outs)
            if copied:
                notes.append(f"subgraph {i}: output(s) {', '.join(map(str, copied))} share memory with another "
                             "output or an intermediate value; the training graphs return copies, so each "
                             "output has its own tangent")
            differentiable = any(isinstance(t, torch.Tensor) and t.requires_grad for t in outs)
            sg.reference["training"] = (lifted.module, lifted.user_values)
            if not differentiable:
                notes.append(f"subgraph {i}: no output requires grad; it has no forward, backward or joint graph")
                continue
            try:
                joint, fw, bw, contract = _training_graphs(lifted, ranges, i, notes, dynamic)
            except _export.NothingToDifferentiate as e:
                notes.append(f"subgraph {i}: {e}; it has no forward, backward or joint graph")
                continue
            _every_output_has_its_tangent(joint, lifted, outs, i)
            sg.contract = contract
            for kind, g in (("forward", fw), ("backward", bw), ("joint", joint)):
                if kind in graphs:
                    key = graph_key(kind, i)
                    captured[key], sg.keys[kind] = g, key
                    if kind != "backward":
                        inputs[key] = _bind(g, lifted)
        model.eval()

    if len(counts) == 2 and counts["inference"] != counts["training"]:
        notes.append(f"the eval-mode compile made {counts['inference']} subgraphs, the train-mode one "
                     f"{counts['training']}: inference subgraph i is the i-th of the former")
    for b in breaks:
        notes.append(f"graph break after subgraph {b.subgraph}: {b.reason}" + (f" ({b.where})" if b.where else ""))
    ordered = {k: captured[k] for k in sorted(captured, key=key_order)}
    sgs = [subgraphs[i] for i in sorted(subgraphs)]
    for sg in sgs:  # within a subgraph: another's user input of the same name may be another value
        _export._share_embedding_ranges({k: ordered[k] for k in sg.keys.values()})
    first = sgs[0].contract if sgs else None
    if dynamic is not None:
        _export._note_reshaped_views(ordered, notes)
        dynamic_capture.record_symbols(list(ordered.values()), dynamic)
        dynamic_capture.freeze(list(ordered.values()))
    return CapturedGraphs(
        model=name,
        mode=MODE,
        graphs=ordered,
        contract=first if {GraphKind.FORWARD, GraphKind.BACKWARD} & set(ordered) else None,
        seconds=time.perf_counter() - start,
        options=dict(OPTIONS),
        notes=notes,
        user_inputs=model_names,
        subgraphs=sgs,
        graph_breaks=breaks,
        inputs=inputs,
        outside_graphs=outside,
    )


# ---------------------------------------------------------------------------------------
# compiling


@contextlib.contextmanager
def _fresh_dynamo() -> Iterator[None]:
    """Dynamo with nothing cached from an earlier compile, before and after (reproducible:
    the same model compiles to the same subgraphs whatever ran before)."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def _state_kept(model: torch.nn.Module | None, inputs: list[Any]) -> Iterator[None]:
    """The model's parameters and buffers (if a model is given), and the example inputs, as they
    were after a run that may change them (batch norm's running statistics): capture leaves them
    as it found them."""
    state = [] if model is None else [*model.parameters(), *model.buffers()]
    saved = [(t, t.detach().clone()) for t in [*state, *inputs] if isinstance(t, torch.Tensor)]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, before in saved:
                t.copy_(before)


@dataclass
class _Call:
    """One call of a subgraph while the model ran: where each of its values came from (see
    _provenance) and what it returned (kept alive, so that identities stay unique)."""

    traced: int  # index into the compile's subgraphs
    sources: list[tuple[Any, ...]]
    state: list[Any]  # per placeholder: the parameter or buffer as this call read it, else None
    outputs: list[Any] = field(default_factory=list)


@dataclass
class _Compiled:
    traced: list[_Traced]
    outside: OutsideGraphs | None  # None: every tensor the model computed came from a graph
    value_reads: list[str]  # value-reading ops run outside the graphs ("aten._local_scalar_dense.default x1")


class _OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops that run under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _marked_dynamic(names: list[str], values: list[Any], dynamic: DynamicDims | None) -> Iterator[None]:
    """Each named dimension marked dynamic over its range on the model's input tensors while
    dynamo compiles (it refuses, naming the line, where the model fixes the size); unmarked after."""
    marked = []
    for name, value in zip(names, values, strict=False):
        dims = dynamic.inputs.get(name, ()) if dynamic is not None else ()
        for d, dim in enumerate(dims):
            if dim is not None and isinstance(value, torch.Tensor) and d < value.dim():
                lo, hi = dynamic.ranges[dim]  # type: ignore[union-attr]
                torch._dynamo.mark_dynamic(value, d, min=lo, max=hi)
                marked.append(value)
    try:
        yield
    finally:
        for value in marked:
            for attr in _DYNAMO_MARKS:
                value.__dict__.pop(attr, None)


# what torch._dynamo.mark_dynamic sets on a tensor
_DYNAMO_MARKS = ("_dynamo_dynamic_indices", "_dynamo_dynamic_range", "_dynamo_hint_overrides", "_specialize_on",
                 "_has_dynamo_dim_marking")


def _compile(model: torch.nn.Module, args: tuple, kwargs: dict, input_name_of: dict[int, str], *,
             grad: bool, dynamic: DynamicDims | None = None, user_names: list[str] | None = None) -> _Compiled:
    """Every subgraph dynamo compiles while the model runs once, in order of first call, and
    what the model computed outside them (see outside_graphs).

    `input_name_of` names the model's own inputs by identity: a subgraph that takes one
    calls it by its pipeline name."""
    names = {}
    for n, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), n)  # a tied tensor: the name named_parameters gives first
    traced: list[_Traced] = []
    calls: list[_Call] = []
    made: dict[int, tuple[int, int]] = {}  # id of a tensor a call returned -> (call, output index)
    inputs_at = {id(t): i for i, t in enumerate(pytree.tree_leaves((args, kwargs))) if isinstance(t, torch.Tensor)}
    in_graphs = _OpCount()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        replace_calls(gm)  # libraries' custom ops, as ATen (capture/custom_ops.py)
        entry = _Traced(gm, getattr(gm, "compile_subgraph_reason", None),
                        [names.get(id(x)) if isinstance(x, torch.Tensor) else None for x in example_inputs],
                        # now: dynamo drops the placeholders' grapharg once the backend returns
                        [_source_name(n) for n in gm.graph.nodes if n.op == "placeholder"])
        index = len(traced)
        traced.append(entry)

        def run(*values: Any) -> Any:
            if entry.values is None:
                # Parameters as they are (a forward does not change them); everything else as it
                # is now: an earlier subgraph may have updated a buffer a later one reads.
                entry.values = [v if isinstance(v, torch.nn.Parameter) else _snapshot(v) for v in values]
                entry.model_inputs = [input_name_of.get(id(v)) if isinstance(v, torch.Tensor) else None
                                      for v in values]
            call = _Call(index, [_provenance(v, state is not None, made, inputs_at) for v, state
                                 in zip(values, entry.state_names)],
                         [None if state is None else (v if isinstance(v, torch.nn.Parameter) else _snapshot(v))
                          for v, state in zip(values, entry.state_names)])
            with in_graphs:
                out = gm.forward(*values)
            call.outputs = pytree.tree_leaves(out)
            for j, o in enumerate(call.outputs):
                if isinstance(o, torch.Tensor):
                    made.setdefault(id(o), (len(calls), j))
            calls.append(call)
            return out

        return run

    compiled = torch.compile(model, backend=backend, dynamic=False)
    what = "training" if grad else "inference"
    leaves = pytree.tree_leaves((args, kwargs))
    origins_on = dynamic_capture.guard_origins() if dynamic is not None else contextlib.nullcontext(None)
    try:
        with _fresh_dynamo(), _state_kept(model, leaves), _torch_logs_quiet(), torch.set_grad_enabled(grad), \
                _marked_dynamic(user_names or [], leaves, dynamic), origins_on as origins:
            if origins is not None:
                origins.aliases = dynamic_capture.positional_names(model, len(args), user_names or [])
            together = run_reproducibly(lambda: compiled(*args, **kwargs))
    except CaptureError:
        raise
    except Exception as e:
        refusal = _dims_refusal(e, dynamic, origins, what)
        if refusal is not None:
            raise refusal from None
        raise CaptureError(f"torch.compile ({what}) failed: {_cause_line(e)}") from None
    if not traced:
        raise CaptureError("torch.compile captured no graph: the model runs no tensor operation dynamo can trace")
    for i, t in enumerate(traced):
        if t.values is None:  # compiled, never called: cannot happen in one run, but say so if it does
            raise CaptureError(f"torch.compile: subgraph {i} was compiled but never ran")
    results = [_provenance(v, False, made, inputs_at) for v in pytree.tree_leaves(together)]
    expected, eager_ops = _eager_run(model, args, kwargs, grad)
    outside = outside_graphs(eager_ops, in_graphs.ops, calls, results, "training" if grad else "inference")
    reads = sorted(op for op in (eager_ops - in_graphs.ops) if op in _VALUE_READS)
    if outside is None:
        _check_together(expected, _composed(traced, calls, results, args, kwargs, grad), len(traced), grad)
    return _Compiled(traced, outside, [f"{op} x{(eager_ops - in_graphs.ops)[op]}" for op in reads])


def _dims_refusal(e: BaseException, dynamic: DynamicDims | None, origins: Any, what: str) -> CaptureError | None:
    """Dynamo's refusal of a dimension marked dynamic, as export's (`dims: NAME (...) cannot be
    dynamic ...`); None for another error."""
    if dynamic is None:
        return None
    cause: BaseException | None = e
    while cause is not None:
        refusal = dynamic_capture.specialisation_error(cause, dynamic, origins or dynamic_capture.GuardOrigins(),
                                                       f"dynamo, {what}")
        if refusal is not None:
            return refusal
        cause = cause.__cause__ or cause.__context__
    return None


def _provenance(value: Any, state: bool, made: dict[int, tuple[int, int]], inputs_at: dict[int, int]
                ) -> tuple[Any, ...]:
    """Where a value a subgraph took (or the model returned) came from: ("state",) a parameter
    or buffer, ("input", i) the model's i-th input, ("output", call, j) the j-th output of an
    earlier call, ("value", v) a number or None (as recorded), ("glue",) a tensor no graph made."""
    if state:
        return ("state",)
    if not isinstance(value, torch.Tensor):
        return ("value", value)
    if id(value) in made:
        return ("output", *made[id(value)])
    if id(value) in inputs_at:
        return ("input", inputs_at[id(value)])
    return ("glue",)


def outside_graphs(eager_ops: collections.Counter[str], graph_ops: collections.Counter[str], calls: list[_Call],
                   results: list[tuple[Any, ...]], compile: str) -> OutsideGraphs | None:
    """What the model computed outside its subgraphs (None: nothing), from one run of each:

    - ops: the ATen ops the eager model ran, less those the subgraphs ran (counted by op),
      less autograd's bookkeeping (detach) and reads of a value into Python (a branch's
      condition: the graphs are those of the example's path, not less of the model);
    - values: each tensor a subgraph took, or the model returned, that is neither a model
      input, a parameter or buffer, nor an output of a subgraph run before.

    Either makes the capture partial: its outputs depend on code no stored graph holds."""
    surplus, extra = eager_ops - graph_ops, graph_ops - eager_ops
    for op, instead in _REWRITTEN.items():  # dynamo traced the same computation as other ops
        if surplus[op] and extra[instead] >= surplus[op]:
            del surplus[op]
    ops = {op: n for op, n in sorted(surplus.items()) if op not in _BOOKKEEPING and op not in _VALUE_READS}
    values = [f"subgraph {c.traced} input {k}" for c in calls for k, src in enumerate(c.sources) if src == ("glue",)]
    values += [f"model output {k}" for k, src in enumerate(results) if src == ("glue",)]
    if not ops and not values:
        return None
    return OutsideGraphs(compile=compile, ops=ops, values=values)


def _break_text(breaks: list[GraphBreakRecord]) -> str:
    if not breaks:
        return ""
    b = breaks[0]
    more = f" (and {len(breaks) - 1} more break(s))" if len(breaks) > 1 else ""
    return f" after subgraph {b.subgraph}'s graph break ({b.reason}" + (f" at {b.where}" if b.where else "") + ")" + more


def _eager_run(model: torch.nn.Module, args: tuple, kwargs: dict, grad: bool) -> tuple[Any, collections.Counter[str]]:
    """The eager model's outputs, and the ATen ops it ran (by name), from one run."""
    count = _OpCount()
    with _state_kept(model, pytree.tree_leaves((args, kwargs))), torch.set_grad_enabled(grad):
        def run() -> Any:
            with count:
                return model(*args, **kwargs)
        out = run_reproducibly(run)
    return out, count.ops


def _composed(traced: list[_Traced], calls: list[_Call], results: list[tuple[Any, ...]], args: tuple, kwargs: dict,
              grad: bool) -> list[Any]:
    """The model's outputs (pytree leaves) from its subgraphs alone: each call run again in
    order on the model's inputs, the parameters and buffers as that call read them, and the
    outputs of the calls before it, as the run recorded where each value came from. No code
    between them runs (so a model whose outputs need such code is partial: outside_graphs)."""
    leaves = pytree.tree_leaves((args, kwargs))
    outs: list[list[Any]] = []

    def value(src: tuple[Any, ...], state: Any) -> Any:
        kind = src[0]
        if kind == "state":
            return state.detach().clone() if not isinstance(state, torch.nn.Parameter) else state
        if kind == "input":
            return leaves[src[1]]
        if kind == "output":
            return outs[src[1]][src[2]]
        if kind == "value":
            return src[1]
        raise CaptureError("a subgraph's input was made by no graph: the capture is partial")  # outside_graphs said so

    def run() -> list[Any]:
        for c in calls:
            vals = [value(src, st) for src, st in zip(c.sources, c.state)]
            outs.append(pytree.tree_leaves(traced[c.traced].gm.forward(*vals)))
        return [value(src, None) for src in results]

    with _state_kept(None, leaves), torch.set_grad_enabled(grad):
        return run_reproducibly(run)


def _check_together(expected: Any, composed: Any, count: int, grad: bool) -> None:
    """That the subgraphs alone, composed as recorded (_composed, no eager code between them),
    give the eager model's outputs `expected`: each subgraph's graphs are checked against their
    own subgraph, so this closes the chain from the graphs to the model. Raises CaptureError
    naming the first output that differs."""
    got_leaves, expected_leaves = pytree.tree_leaves(composed), pytree.tree_leaves(expected)
    mode = "training" if grad else "inference"
    if len(got_leaves) != len(expected_leaves):
        raise CaptureError(f"dynamo's {count} subgraph(s) composed ({mode}) return {len(got_leaves)} values, "
                           f"the eager model {len(expected_leaves)}: the subgraphs do not reproduce the model")
    for i, (got, want) in enumerate(zip(got_leaves, expected_leaves)):
        if isinstance(want, torch.Tensor):
            try:
                torch.testing.assert_close(got, want, equal_nan=True)
            except AssertionError as e:
                detail = next((ln.strip() for ln in str(e).splitlines() if "difference" in ln), exception_line(e))
                raise CaptureError(f"dynamo's {count} subgraph(s) composed ({mode}) do not reproduce the "
                                   f"model: output {i} differs from eager ({detail})") from None


@contextlib.contextmanager
def _torch_logs_quiet() -> Iterator[None]:
    """torch's loggers silent: dynamo logs a traceback for a failing fake-tensor op before
    it raises, and the error reaches the user as one line, never a traceback."""
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _cause_line(e: BaseException) -> str:
    """The error in one line: what dynamo says, with its explanation (which holds what the
    model's code raised: "... got RuntimeError('a and b must have same reduction dim ...')")."""
    line = exception_line(e)
    explanation = next((ln.strip().removeprefix("Explanation:").strip() for ln in str(e).splitlines()
                        if ln.strip().startswith("Explanation:")), None)
    return f"{line}: {explanation}"[:400] if explanation else line


def _snapshot(v: Any) -> Any:
    """A copy of a value a subgraph is called with, as it is now (a later op may change it)."""
    if not isinstance(v, torch.Tensor):
        return v
    copy_ = v.detach().clone()  # clone keeps the strides of a dense tensor
    return copy_.requires_grad_(v.requires_grad) if copy_.is_floating_point() or copy_.is_complex() else copy_


def _breaks(traced: list[_Traced]) -> list[GraphBreakRecord]:
    """The graph breaks that ended subgraphs, each with its reason and the user code line."""
    out = []
    for i, t in enumerate(traced):
        r = t.reason
        if r is None or not getattr(r, "graph_break", False):
            continue
        reason = (str(getattr(r, "reason", "")).strip().splitlines() or ["graph break"])[0]
        where, code = None, None
        stack = list(getattr(r, "user_stack", None) or [])
        if stack:
            frame = stack[-1]
            # The file by its import name, not its path: artefacts carry no paths (same bytes on every machine).
            func = frame.name.removeprefix("torch_dynamo_resume_in_")  # dynamo's name for the code after a break
            func = re.sub(r"_at_[0-9]+$", "", func)
            where = f"{relative_file(frame.filename)}:{frame.lineno} in {func}"
            code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip() or None
        out.append(GraphBreakRecord(subgraph=i, reason=reason, where=where, code=code))
    return out


# ---------------------------------------------------------------------------------------
# parameters back in place


def _source_name(node: torch.fx.Node) -> str | None:
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    return name if isinstance(name, str) else None


# The last name of a source: L['h'] -> h, L['kwargs']['mask'] -> mask, L['self'].scale -> scale.
_LAST_NAME = re.compile(r"(?:\['([A-Za-z_][A-Za-z0-9_]*)'\]|\.([A-Za-z_][A-Za-z0-9_]*))$")


def _lift(t: _Traced, index: int) -> _Lifted:
    """Subgraph `t` as a module taking only its user inputs: every placeholder dynamo lifted
    from the model's parameters and buffers is a get_attr of that tensor again, registered
    under the model's name (the model's own parameters, its buffers as the subgraph saw them)."""
    gm = torch.fx.GraphModule(t.gm, copy.deepcopy(t.gm.graph))
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(t.state_names):
        raise CaptureError(f"subgraph {index}: {len(placeholders)} placeholders, dynamo gave "
                           f"{len(t.state_names)} example inputs")
    assert t.values is not None
    first_body = next((n for n in graph.nodes if n.op != "placeholder"), None)
    sizes = _size_reads(placeholders)
    user_names, user_values = [], []
    for node, source, state_name, value, model_input in zip(placeholders, t.sources, t.state_names, t.values,
                                                            t.model_inputs):
        if node in sizes:  # a symbolic size dynamo passes as an input: read from the tensor that has it
            with graph.inserting_before(first_body):
                read = graph.call_function(torch.ops.aten.sym_size.int, sizes[node])
            read.meta = dict(node.meta)
            node.replace_all_uses_with(read)
            graph.erase_node(node)
            continue
        if state_name is None:
            user_names.append(model_input if model_input is not None and model_input not in user_names
                              else _user_name(source, node.name, user_names))
            user_values.append(value)
            continue
        try:
            _assign(gm, state_name, value)
        except (KeyError, AttributeError) as e:  # a submodule named like a GraphModule attribute ("graph")
            raise CaptureError(f"subgraph {index}: cannot register {state_name} on its graph module "
                               f"({exception_line(e)})") from None
        with graph.inserting_before(first_body):
            attr = graph.get_attr(state_name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return _Lifted(gm, user_names, user_values)


def _size_reads(placeholders: list[torch.fx.Node]) -> dict[torch.fx.Node, tuple[torch.fx.Node, int]]:
    """Each placeholder dynamo added for a symbolic size (a dimension marked dynamic), and the
    (tensor placeholder, dimension) whose size it is: the graph reads it there instead, so it
    takes tensors only and export's dimensions on them name it."""
    out: dict[torch.fx.Node, tuple[torch.fx.Node, int]] = {}
    tensors = [n for n in placeholders if isinstance(n.meta.get("example_value"), torch.Tensor)]
    for node in placeholders:
        value = node.meta.get("example_value")
        if not isinstance(value, torch.SymInt):
            continue
        expr = value.node.expr
        found = next(((t, d) for t in tensors for d, size in enumerate(t.meta["example_value"].shape)
                      if isinstance(size, torch.SymInt) and size.node.expr == expr), None)
        if found is None:
            raise CaptureError(f"dims: dynamo's graph takes the size {expr} as an input that no input tensor has")
        out[node] = found
    return out


def _user_name(source: str | None, fallback: str, taken: list[str]) -> str:
    """A subgraph user input's name: the local variable dynamo read it from ("h" for L['h'])."""
    m = _LAST_NAME.search(source or "")
    name = (m.group(1) or m.group(2)) if m else fallback
    while name in taken:
        name += "_"
    return name


def _assign(root: torch.nn.Module, path: str, tensor: torch.Tensor) -> None:
    """Register `tensor` on `root` at dotted `path` (a parameter stays a parameter)."""
    *owners, leaf = path.split(".")
    mod = root
    for part in owners:
        if part not in mod._modules:
            mod.add_module(part, torch.nn.Module())
        mod = mod._modules[part]
    if leaf in mod._parameters or leaf in mod._buffers:
        return  # tied: the same tensor under this name already
    if isinstance(tensor, torch.nn.Parameter):
        mod.register_parameter(leaf, tensor)
    else:
        mod.register_buffer(leaf, tensor)


# ---------------------------------------------------------------------------------------
# graphs of one subgraph


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _exported(lifted: _Lifted, values: tuple, what: str, dynamic: DynamicDims | None,
              notes: list[str] | None) -> torch.export.ExportedProgram:
    """torch.export of the lifted subgraph; with `dynamic`, its inputs' named dimensions as the
    model's (the one graph's user inputs are the model's, by name)."""
    if dynamic is None:
        return _export._export(lifted.module, values, {}, what)
    names = lifted.user_names

    def hinted() -> tuple[Any, list[str]]:
        return dynamic_capture.export_shapes(lifted.module, values, {}, names, dynamic, hints=True), names

    shapes = dynamic_capture.export_shapes(lifted.module, values, {}, names, dynamic)
    with dynamic_capture.guard_origins() as origins:
        return _export._export(lifted.module, values, {}, what, notes, shapes, dynamic, origins, hinted)


def _inference_graph(lifted: _Lifted, ranges: dict[str, tuple[int, int]], key: str,
                     dynamic: DynamicDims | None = None, notes: list[str] | None = None
                     ) -> tuple[CapturedGraph, list[Any]]:
    """The subgraph's inference graph (export, core ATen) and its real inputs."""
    values = tuple(_detached(v) for v in lifted.user_values)
    with torch.no_grad():
        ep = _exported(lifted, values, f"inference of {key}" if key != "inference" else "inference", dynamic, notes)
    g = _export._inference_graph(ep, lifted.user_names, _ranges(lifted, ranges), _state(lifted.module))
    by_name = dict(zip(lifted.user_names, values))
    state = _state(lifted.module)
    bound = []
    for gi in g.inputs:
        if gi.role == "user":
            bound.append(by_name[gi.target])
        elif gi.role == "constant":
            bound.append(ep.constants[gi.target])
        else:
            bound.append(state[gi.target].detach())
    return g, bound


def _detached(v: Any) -> Any:
    return v.detach() if isinstance(v, torch.Tensor) else v


def _ranges(lifted: _Lifted, ranges: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Integer ranges of the subgraph's user inputs: the pipeline's for the model's inputs,
    else the values seen."""
    out = {}
    for n, v in zip(lifted.user_names, lifted.user_values):
        r = ranges.get(n) if n in ranges else (_export._observed_range(v) if isinstance(v, torch.Tensor) else None)
        if r is not None:
            out[n] = r
    return out


def _example(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else node


def _static_mask_writes(lifted: _Lifted) -> int:
    """Rewrite each ``x[mask] = v`` of the subgraph (mask a boolean tensor over x's leading
    dims, v one value broadcast to every selected row) as ``x.copy_(where(mask, v, x))``;
    returns how many. The index form selects rows by ``nonzero``, whose output size depends
    on the values, which AOTAutograd's tracing cannot give (DynamicOutputShapeException);
    the where form computes the same values and gradients with static shapes."""
    import operator

    graph = lifted.module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not operator.setitem or len(node.args) != 3:
            continue
        x, mask, v = node.args
        xv, mv, vv = _example(x), _example(mask), _example(v)
        if not (isinstance(xv, torch.Tensor) and isinstance(mv, torch.Tensor) and mv.dtype == torch.bool
                and 0 < mv.dim() <= xv.dim() and tuple(mv.shape) == tuple(xv.shape[:mv.dim()])):
            continue
        rest = xv.dim() - mv.dim()
        if isinstance(vv, torch.Tensor) and (vv.dim() > rest or tuple(vv.shape) != tuple(xv.shape[xv.dim() - vv.dim():])):
            continue  # one value per selected row: not a broadcast write
        with graph.inserting_before(node):
            m = graph.call_method("reshape", (mask, tuple(mv.shape) + (1,) * rest))
            w = graph.call_function(torch.where, (m, v, x))
            graph.call_method("copy_", (x, w))
        graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        lifted.module.recompile()
    return count


_LEAF_IN_PLACE = "a leaf Variable that requires grad is being used in an in-place operation"


def _clone_grad_inputs(lifted: _Lifted) -> list[str]:
    """Make `lifted` clone each user input that requires grad before using it; their names.

    For a subgraph that writes into such an input in place (autograd's _LEAF_IN_PLACE
    error). A later subgraph's user inputs are the earlier one's activations: in the model,
    tensors autograd made, which may be written in place (wav2vec2-style models write a
    learned embedding into masked time steps of their hidden states). Here they are leaves
    that require grad, which autograd refuses to see written in place. A copy's gradient is
    the input's, the gradient of the value the subgraph was given.
    """
    graph = lifted.module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    names = []
    for node, name, value in zip(placeholders, lifted.user_names, lifted.user_values):
        if not (isinstance(value, torch.Tensor) and value.requires_grad):
            continue
        with graph.inserting_after(placeholders[-1]):
            copy_ = graph.call_method("clone", (node,))
        node.replace_all_uses_with(copy_, delete_user_cb=lambda user: user is not copy_)
        names.append(name)
    graph.lint()
    lifted.module.recompile()
    return names


def _outputs(lifted: _Lifted) -> list[Any]:
    """The subgraph's outputs (pytree leaves) from one run with grad enabled: which require
    grad (none: it has no backward), and which share memory (_copy_aliasing_outputs)."""
    with torch.enable_grad():
        return pytree.tree_leaves(lifted.module(*lifted.user_values))


def _storage(t: torch.Tensor) -> Any:
    return torch.multiprocessing.reductions.StorageWeakRef(t.untyped_storage())


def _copy_aliasing_outputs(lifted: _Lifted, outs: list[Any]) -> list[int]:
    """Return a copy in place of each output that is a view, or the same tensor as an
    earlier output, unless it views one of the subgraph's user inputs; returns their indices.

    AOTAutograd makes such an output outside the graph, from the output or intermediate it
    views, and gives the joint no tangent for it: torch.compile's autograd adds its gradient
    around the compiled graph. A saved backward graph has no "around": a consumer binding a
    tangent per output would get the gradient without that output's part (GroupViT returns
    logits_per_text = logits_per_image.t() and lost its share), and two views of one
    intermediate make AOTAutograd add the intermediate as an output of no user role. A copy
    is its own tensor, with its own tangent. Views of user inputs stay as they are: their
    gradient is the input's own, and AOTAutograd decides whether the joint takes a tangent
    for them (the reference's loss has the outputs that have one: tangent_outputs).
    """
    inputs = {_storage(v) for v in lifted.user_values if isinstance(v, torch.Tensor)}
    seen: set[Any] = set()
    copy_at = []
    for i, t in enumerate(outs):
        if not isinstance(t, torch.Tensor):
            continue
        key = _storage(t)
        if key in inputs:
            continue
        if t._is_view() or key in seen:
            copy_at.append(i)
        seen.add(key)
    if not copy_at:
        return []
    graph = lifted.module.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    flat, spec = pytree.tree_flatten(output.args[0])
    if len(flat) != len(outs):
        raise CaptureError(f"the subgraph's output node has {len(flat)} values, its run gave {len(outs)}")
    with graph.inserting_before(output):
        for i in copy_at:
            flat[i] = graph.call_method("clone", (flat[i],))
    output.args = (pytree.tree_unflatten(flat, spec),)
    graph.lint()
    lifted.module.recompile()
    return copy_at


def _training_graphs(lifted: _Lifted, ranges: dict[str, tuple[int, int]], index: int,
                     notes: list[str], dynamic: DynamicDims | None = None
                     ) -> tuple[CapturedGraph, CapturedGraph, CapturedGraph, Partition]:
    """The subgraph's joint, forward and backward graphs (a tangent per output); with `dynamic`,
    traced from the fake inputs of its export with those dimensions, so they keep them symbolic."""
    constants: dict[str, torch.Tensor] = {}
    state = _state(lifted.module)
    module, values = lifted.module, tuple(lifted.user_values)
    if dynamic is not None:
        ep = _exported(lifted, values, f"training of subgraph {index}", dynamic, notes)
        module, values = ep.module(), _export._fake_user_inputs(ep, values, {})[0]
    joint, fw, bw, contract, no_grad = _export.training_graphs(
        module, values, {}, lifted.user_names, _ranges(lifted, ranges), state,
        constants, _Outputs, notes, real_user_values=list(lifted.user_values) if dynamic is not None else None)
    if no_grad:
        notes.append(f"subgraph {index}: {len(no_grad)} parameter(s) get no gradient: {', '.join(no_grad[:8])}"
                     + (" ..." if len(no_grad) > 8 else ""))
    return joint, fw, bw, contract


def _every_output_has_its_tangent(joint: CapturedGraph, lifted: _Lifted, outs: list[Any], index: int) -> None:
    """Raise CaptureError unless the joint takes a tangent for each output that requires grad
    and shares no memory with a user input: after _copy_aliasing_outputs, AOTAutograd has no
    reason to make any of them outside the graph, and a backward without its tangent would
    give gradients without that output's part."""
    inputs = {_storage(v) for v in lifted.user_values if isinstance(v, torch.Tensor)}
    have = {_output_index(gi.target) for gi in joint.inputs if gi.role == "tangent"}
    missing = [i for i, t in enumerate(outs) if isinstance(t, torch.Tensor) and t.requires_grad
               and _storage(t) not in inputs and i not in have]
    if missing:
        raise CaptureError(f"subgraph {index}: the joint takes no tangent for output(s) "
                           f"{', '.join(map(str, missing))}, so its gradients would leave them out")


def _bind(g: CapturedGraph, lifted: _Lifted) -> list[Any]:
    """A training graph's real inputs: the subgraph's tensors by target, user inputs by name,
    loss weights for tangents (tensors.tangent)."""
    state = {**_state(lifted.module)}
    by_name = dict(zip(lifted.user_names, lifted.user_values))
    out: list[Any] = []
    for gi in g.inputs:
        if gi.role in ("param", "buffer", "constant"):
            out.append(state[gi.target].detach())
        elif gi.role == "user":
            out.append(_detached(by_name[gi.target]))
        elif gi.role == "tangent":
            assert gi.meta is not None
            out.append(tangent(gi.meta.shape, gi.meta.stride, gi.meta.dtype))
        else:
            raise CaptureError(f"{g.kind} graph: cannot bind input {gi.name} ({gi.role})")
    return out


# ---------------------------------------------------------------------------------------
# references for the checks, and auto


def subgraph_references(captured: CapturedGraphs) -> dict[int, Any]:
    """Per subgraph, the reference its graphs are checked against: its own dynamo graphs run
    eagerly (see eager.SubgraphReference). Empty for a capture without subgraphs."""
    out = {}
    for sg in captured.subgraphs:
        by_mode = {}
        for mode, (module, values) in sg.reference.items():
            names = _names_of(captured, sg, mode, values)
            # the joint takes each output's loss weights as its tangent: the weighted loss's gradient
            by_mode[mode] = EagerReference(module, tuple(values), {}, None, names, loss="weighted",
                                           loss_outputs=tangent_outputs(captured, sg))
        out[sg.index] = SubgraphReference(by_mode)
    return out


def tangent_outputs(captured: CapturedGraphs, sg: Subgraph) -> frozenset[int] | None:
    """The outputs of subgraph `sg` its joint (or backward) takes a tangent for, by index;
    None if it has neither graph."""
    g = captured.graphs.get(sg.keys.get("joint", "")) or captured.graphs.get(sg.keys.get("backward", ""))
    if g is None:
        return None
    return frozenset(_output_index(gi.target) for gi in g.inputs if gi.role == "tangent")


def _output_index(target: str | None) -> int:
    m = re.fullmatch(r"output\[(\d+)\]", target or "")
    if m is None:
        raise CaptureError(f"a tangent names {target!r}, not an output of the subgraph")
    return int(m.group(1))


def _names_of(captured: CapturedGraphs, sg: Subgraph, mode: str, values: list[Any]) -> list[str]:
    kind = "inference" if mode == "inference" else "forward"
    g = captured.graphs.get(sg.keys.get(kind, ""))
    if g is None:
        return [f"input{i}" for i in range(len(values))]
    return [gi.target or gi.name for gi in g.inputs if gi.role == "user"]


def capture_auto(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    graphs: list[str],
    input_names: list[str],
    int_ranges: dict[str, tuple[int, int]] | None = None,
    loss: str = DEFAULT_LOSS,
    export: Callable[..., CapturedGraphs] | None = None,
    dynamic: DynamicDims | None = None,
    step_autocast: str | None = None,
) -> CapturedGraphs:
    """capture_export (differentiating `loss`; given `step_autocast`: a train_step's joint), or
    where its tracing fails, capture_dynamo (which has no loss: a tangent per output); where the
    model itself raises on its inputs, or a config hint applies (capture/hints.py), export's
    error alone; the capture says why it fell back (CapturedGraphs.fallback, a note, the
    manifest's capture.fallback). `export`: the export capture to try first (the one the caller
    uses for mode export; capture_export by default)."""
    export = export or _export.capture_export
    try:
        with _torch_logs_quiet():  # export's failure is expected here: its own logs are noise
            return export(model, args, kwargs, name=name, graphs=graphs, input_names=input_names,
                          int_ranges=int_ranges, loss=loss, **({"dynamic": dynamic} if dynamic is not None else {}),
                          **({"step_autocast": step_autocast} if step_autocast is not None else {}))
    except Exception as e:  # export's failure: dynamo may still capture the model, if tracing failed
        if isinstance(e, CaptureError) and str(e).startswith("dims: "):
            raise  # a range the model cannot take: its one line says what to change (dynamo's capture is static)
        why = str(e) if isinstance(e, CaptureError) else exception_line(e)
        where = where_in_model(chain_text(e))
        if where and where not in why:
            why += f" at {where}"
        if not _export.is_tracing_failure(e) or config_hint_applies(chain_text(e), model):
            # the model raises on its inputs, or a setting of its config is what to change:
            # dynamo would fail again, and its error would only bury export's
            raise CaptureError(f"export failed: {why}") from e
    named = dynamic if dynamic is not None and not dynamic.auto else None
    static = "dims: auto" if dynamic is not None and dynamic.auto else None
    try:
        try:
            cap = capture_dynamo(model, args, kwargs, name=name, graphs=graphs, input_names=input_names,
                                 int_ranges=int_ranges, **({"dynamic": named} if named is not None else {}))
        except CaptureError as e:
            if named is None or not str(e).startswith("dims: "):
                raise
            # dynamo splits the model, or refuses a range (in a frame after a graph break, say):
            # its graphs at the example's sizes, said so (the model is not dynamic ok, but auto's
            # promise is to capture it)
            static = str(e).removeprefix("dims: ").split("; ", 1)[0]
            cap = capture_dynamo(model, args, kwargs, name=name, graphs=graphs, input_names=input_names,
                                 int_ranges=int_ranges)
    except CaptureError as e:  # both reasons: export's is often the one to act on
        raise CaptureError(f"export failed: {why}; dynamo failed: {e}") from e
    cap.fallback = why
    cap.static_sizes = static
    cap.notes.insert(0, f"export failed ({why}); captured with dynamo"
                     + ("" if dynamic is None else f" at the example sizes ({static}): every dimension static"
                        if static else ", its one graph exported with the same dimensions"))
    return cap
