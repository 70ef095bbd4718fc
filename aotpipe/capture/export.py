"""Capture mode `export`: torch.export (non-strict), then AOTAutograd for training graphs.

- inference: ``torch.export.export`` of the model in eval mode, decomposed to core ATen.
- joint: the model is exported again in train mode; its unlifted module, wrapped so that it
  returns a scalar loss, goes through AOTAutograd's joint export with descriptors, which
  names every input (parameter, buffer, user input, tangent) and output (user output,
  mutated input, gradient). Exporting first matters: AOTAutograd on the raw model trips
  on data-dependent code that torch.export handles (transformers' Llama).
- forward / backward: the joint graph split by functorch's default partitioner; the split
  is recorded as a :class:`Partition`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import logging
import operator
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._functorch._aot_autograd.graph_compile as graph_compile
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_compile_joint_with_descriptors, aot_export_joint_with_descriptors
from torch._functorch.partitioners import default_partition
from torch._higher_order_ops.effects import _get_effect, _register_effectful_op
from torch._library.simple_registry import singleton
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx._pytree import tree_flatten_spec
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import CheckpointPolicy

from aotpipe.capture import custom_ops, unbacked
from aotpipe.capture import dynamic as dynamic_capture
from aotpipe.capture.ctc import ctc_loss_formulated
from aotpipe.capture.cumulative_bn import cumulative_factors_specialised
from aotpipe.capture.layouts import pin_batch_norm_layouts, pin_group_norm_layouts
from aotpipe.capture.rnn import kept_whole, recurrent_decompositions
from aotpipe.capture.torch_branches import static_library_branches
from aotpipe.errors import CaptureError
from aotpipe.format.ir import (
    CapturedGraph,
    CapturedGraphs,
    GraphInput,
    GraphOutput,
    Partition,
    TensorMeta,
    size_expr,
    size_hint,
)
from aotpipe.format.source_files import relative_file
from aotpipe.format.vocabulary import GRAPH_KINDS, TRAINING_KINDS, GraphKind
from aotpipe.models.eager import NoLossError, model_loss
from aotpipe.models.sources import user_input_names
from aotpipe.models.train_step import autocast_in
from aotpipe.runtime.determinism import derived_seed, op_draws_random
from aotpipe.runtime.tensors import ones, value_range
from aotpipe.spec.modes import DEFAULT_LOSS, EXPORT_OPTIONS, DynamicDims

# How this mode captures; recorded in the manifest and part of the fingerprint.
OPTIONS = EXPORT_OPTIONS

_INPUT_KIND_ROLE = {
    InputKind.PARAMETER: "param",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
    InputKind.USER_INPUT: "user",
}


class _Loss(torch.nn.Module):
    """Wraps a module so that it returns its training loss (eager.model_loss of kind `kind`)."""

    def __init__(self, model: torch.nn.Module, kind: str = DEFAULT_LOSS):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        try:
            return model_loss(self.model(*args, **kwargs), self.kind)
        except NoLossError as e:
            raise CaptureError(str(e)) from None


def _meta_of(node: torch.fx.Node) -> TensorMeta | None:
    val = node.meta.get("val")
    return TensorMeta.of(val) if isinstance(val, torch.Tensor) else None


def _scalar_type(node: torch.fx.Node) -> type | None:
    val = node.meta.get("val")
    if isinstance(val, (bool, torch.SymBool)):
        return bool
    if isinstance(val, (int, torch.SymInt)):
        return int
    if isinstance(val, (float, torch.SymFloat)):
        return float
    return None


def _flat_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` whose placeholders and outputs are flat (no pytree codegen).

    The graph is copied; the module's tensors are shared, not deep-copied: a joint graph
    may hold fake or meta tensor constants (transformers' vision-language models), whose
    deepcopy fails ("Attempted to set the storage of a tensor on device meta ...").
    """
    with warnings.catch_warnings():
        # deepcopy of a pytree-codegen graph trips a torch-internal LeafSpec deprecation
        warnings.simplefilter("ignore", FutureWarning)
        graph = copy.deepcopy(gm.graph)
    # The flat codegen set before the module is made: GraphModule() generates its code once
    # (a 6K-node graph's python_code takes about a second), not once more after.
    graph.set_codegen(torch.fx.graph.CodeGen())
    return torch.fx.GraphModule(gm, graph)


def _observed_range(t: torch.Tensor) -> tuple[int, int] | None:
    """[min, max + 1) of an integer tensor, None for other dtypes, empty tensors, and tensors
    without values (meta or fake: mode meta)."""
    return value_range(t)


def _embedding_ranges(gm: torch.fx.GraphModule) -> dict[str, tuple[int, int]]:
    """Placeholders used as embedding indices -> [0, table size)."""
    out: dict[str, tuple[int, int]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            weight, indices = node.args[0], node.args[1]
            if isinstance(indices, torch.fx.Node) and indices.op == "placeholder":
                rows = weight.meta["val"].shape[0]
                out[indices.name] = (0, int(rows))
    return out


def capture_export(*args: Any, **kwargs: Any) -> CapturedGraphs:
    """Trace `model` on the example inputs into the requested graph kinds (see _capture)."""
    with warnings.catch_warnings():
        # torch-internal deprecation noise from deep-copying pytree specs; not the user's concern
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        ctc_notes: list[str] = []  # the CTC loss as static-shape ATen (capture/ctc.py)
        with recurrent_decompositions(), unrendered_tracing(), checks_without_effect_tokens(), \
                ctc_loss_formulated(ctc_notes):
            captured = _capture(*args, **kwargs)  # LSTM/GRU/RNN as plain ATen (capture/rnn.py)
        captured.notes.extend(ctc_notes)
        return captured


def effectful_checks() -> list[torch._ops.OpOverload]:
    """ATen ops torch registers as ordered effects that return nothing and write nothing:
    checks that only raise (``aten._linalg_check_errors``, which linalg.inv, solve, cholesky,
    lu_factor, tensorinv and tensorsolve call on their ``info`` output) and ``aten._print``."""
    found = list(_MADE_PLAIN)  # those checks_without_effect_tokens deregistered, while it does
    for qualname, entry in list(singleton._data.items()):
        if entry.effect.effect is None or not qualname.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, qualname.split("::", 1)[1].split(".")[0], None)
        for overload in (packet.overloads() if packet is not None else []):
            op = getattr(packet, overload)
            if not op._schema.returns and not op._schema.is_mutable and op not in found:
                found.append(op)
    return found


_MADE_PLAIN: list[torch._ops.OpOverload] = []


@contextlib.contextmanager
def checks_without_effect_tokens() -> Iterator[None]:
    """While capturing, the :func:`effectful_checks` are plain graph nodes that dead-code
    elimination keeps, not ordered effects.

    As effects, functionalisation threads an effect token through the graph
    (``with_effects(token, aten._linalg_check_errors, info, ...)``): an extra input and output
    of every graph that aotpipe's format has no role for, so every linalg model failed. A
    check has no output and changes nothing, so its order against other ops does not matter
    (only that it runs): kept as a node, it raises on a singular or non-positive-definite
    input as eager does.
    """
    ops = effectful_checks()
    saved = [(op, _get_effect(op)) for op in ops]
    impure = torch.fx.node._side_effectful_functions
    added = [op for op in ops if op not in impure]
    for op in ops:
        _register_effectful_op(op, None)
    impure.update(added)
    made_plain = [op for op in ops if op not in _MADE_PLAIN]
    _MADE_PLAIN.extend(made_plain)
    try:
        yield
    finally:
        del _MADE_PLAIN[len(_MADE_PLAIN) - len(made_plain):]
        impure.difference_update(added)
        for op, effect in saved:
            _register_effectful_op(op, effect)


def materialise_lazy_modules(model: torch.nn.Module, args: tuple, kwargs: dict) -> str | None:
    """Give `model`'s lazy modules (nn.LazyLinear, LazyConv*, LazyBatchNorm*, ...) their
    parameters by one eager call on the example inputs, as every user of them does before
    anything else; a note naming them, or None where there were none.

    Until then their parameters are ``UninitializedParameter``s, which no trace can read.
    The call runs in eval mode without gradients, on copies of the inputs (a model may update
    them in place), and leaves the model's other buffers and the global generator as they
    were. The new parameters are drawn from a generator seeded from the model's weight seed
    (the one :func:`aotpipe.models.sources.build_model` set), so the same seed gives the same weights.
    """
    lazy = [(n, type(m).__name__) for n, m in model.named_modules()
            if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()]
    if not lazy:
        return None
    saved = {n: b.detach().clone() for n, b in model.named_buffers()
             if not isinstance(b, torch.nn.parameter.UninitializedBuffer)}
    training = model.training
    seed = derived_seed(torch.initial_seed(), "lazy modules")
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            model.eval()
            call_args, call_kwargs = copy.deepcopy((args, kwargs))
            model(*call_args, **call_kwargs)
    except Exception as e:
        raise CaptureError(f"materialising the lazy module(s) {', '.join(n or 'model' for n, _ in lazy[:4])} by one "
                           f"eager call failed: {e.__class__.__name__}: {_first_line(e)}") from e
    finally:
        model.train(training)
        _restore_buffers(model, saved)
    kinds = sorted({k for _, k in lazy})
    names = ", ".join(n or "model" for n, _ in lazy[:6]) + (" ..." if len(lazy) > 6 else "")
    return (f"lazy module(s) materialised by one eager call on the example inputs before capture "
            f"({', '.join(kinds)}: {names}); their parameters drawn from a generator seeded from the model's seed")


@contextlib.contextmanager
def unrendered_tracing() -> Iterator[None]:
    """While capturing, torch renders no graph as Python text that nobody reads:

    - the GraphModules torch makes while tracing (make_fx's, the partitioner's) generate
      their code only when first called or read, and most never are;
    - AOTAutograd does not render the joint, forward and backward graphs for its logs
      (``print_readable`` of each, done whether logging is on or not).

    In a BERT-4L capture these renderings were about a tenth of the CPU time. No graph
    changes: the graphs kept are made afresh by :func:`_flat_graph`, which renders them.
    """
    saved = graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs
    graph_compile._log_joint_graph = lambda *a, **k: None
    graph_compile._log_fw_bw_graphs = lambda *a, **k: (None, None)
    try:
        with _use_lazy_graph_module(True):
            yield
    finally:
        graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs = saved


def _capture(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    graphs: list[str],
    input_names: list[str],
    int_ranges: dict[str, tuple[int, int]] | None = None,
    loss: str = DEFAULT_LOSS,
    dynamic: DynamicDims | None = None,
    step_autocast: str | None = None,
) -> CapturedGraphs:
    """Trace `model` on the example inputs into the requested graph kinds; the training
    graphs differentiate `loss` (eager.model_loss) of its outputs. With `dynamic`, the sizes it
    names stay symbolic in every graph (capture/dynamic.py). With `step_autocast` (a dtype's
    name), also the joint a train_step is built from, traced under torch.autocast in it."""
    start = time.perf_counter()
    int_ranges = dict(int_ranges or {})
    user_names = user_input_names(args, kwargs, input_names)
    user_values = pytree.tree_leaves((args, kwargs))
    for n, v in zip(user_names, user_values):
        if n not in int_ranges and isinstance(v, torch.Tensor):
            r = _observed_range(v)
            if r is not None:
                int_ranges[n] = r
    notes: list[str] = []
    # keywords_named: a forward's **kwargs spelled out, which torch.export's dynamic_shapes needs
    named = dynamic_capture.keywords_named(model, kwargs) if dynamic is not None else contextlib.nullcontext()
    # none_generator_dropped: rand/randn/randint(..., generator=None) at symbolic sizes
    factories = dynamic_capture.none_generator_dropped() if dynamic is not None else contextlib.nullcontext()
    # static_library_branches: torch's own branches on tensor values, static (capture/torch_branches.py)
    origins_on = dynamic_capture.guard_origins() if dynamic is not None else contextlib.nullcontext(None)
    with named, factories, model_reseeds() as reseeds, static_library_branches(notes), origins_on as origins:
        shapes = dynamic_capture.export_shapes(model, args, kwargs, user_names, dynamic) if dynamic is not None \
            else None
        if origins is not None:
            origins.aliases = dynamic_capture.positional_names(model, len(args), user_names)
        captured, contract, constants = _capture_graphs(model, args, kwargs, graphs, user_names, user_values,
                                                        int_ranges, notes, loss, shapes, dynamic, origins,
                                                        step_autocast)
    step_joint = captured.pop(STEP_JOINT, None)
    dims_report: list[str] = []
    if dynamic is not None:
        _note_reshaped_views(captured, notes)
        dynamic_capture.record_symbols(list(captured.values()), dynamic)
        dynamic_capture.freeze(list(captured.values()))
        if dynamic.auto:
            dims_report = dynamic_capture.auto_report(list(captured.values()), user_names, user_values,
                                                      origins or dynamic_capture.GuardOrigins())
    _refuse_reseeded_draws(reseeds, captured)
    _share_embedding_ranges(captured)
    checks = set(effectful_checks())
    kept = sorted({target_name_of(n.target) for g in captured.values() for n in g.gm.graph.nodes
                   if n.op == "call_function" and n.target in checks})
    if kept:
        notes.append(f"{', '.join(kept)} (an ordered effect in torch: a check with no output) captured as a plain "
                     "node, without effect tokens; it raises on invalid input as eager does")
    ordered: dict[str, CapturedGraph] = {k: captured[k] for k in GRAPH_KINDS if k in captured}
    return CapturedGraphs(
        model=name,
        mode="export",
        graphs=ordered,
        contract=contract if {GraphKind.FORWARD, GraphKind.BACKWARD} & set(ordered) else None,
        seconds=time.perf_counter() - start,
        options={**OPTIONS, "loss": loss},
        notes=notes,
        constants=constants,
        user_inputs=user_names,
        dims_report=dims_report,
        step_joint=step_joint,
    )


def _capture_graphs(model: torch.nn.Module, args: tuple, kwargs: dict, graphs: list[str], user_names: list[str],
                    user_values: list[Any], int_ranges: dict[str, tuple[int, int]], notes: list[str],
                    loss: str, shapes: Any = None, dynamic: DynamicDims | None = None,
                    origins: dynamic_capture.GuardOrigins | None = None, step_autocast: str | None = None,
                    ) -> tuple[dict[str, CapturedGraph], Partition | None, dict[str, torch.Tensor]]:
    """The graphs `_capture` asks for (and under key STEP_JOINT, with `step_autocast`, the
    joint under autocast), the partition contract (None without training graphs) and the
    constants the graphs lift."""

    def hinted() -> tuple[Any, list[str]]:
        assert dynamic is not None
        return dynamic_capture.export_shapes(model, args, kwargs, user_names, dynamic, hints=True), user_names

    materialised = materialise_lazy_modules(model, args, kwargs)
    if materialised:
        notes.append(materialised)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    constants: dict[str, torch.Tensor] = {}
    captured: dict[str, CapturedGraph] = {}
    contract = None

    if "inference" in graphs:
        model.eval()
        ep = _views_to_reshapes(_library_ops_to_aten(
            _export(model, args, kwargs, "inference", notes, shapes, dynamic, origins, hinted), notes))
        constants.update({k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)})
        captured["inference"] = _inference_graph(ep, user_names, int_ranges, state, user_values)

    if set(TRAINING_KINDS) & set(graphs):
        model.train()
        with cumulative_factors_specialised(model, notes):  # BatchNorm(momentum=None): capture/cumulative_bn.py
            exported = _export(model, args, kwargs, "training", notes, shapes, dynamic, origins, hinted)
        ep_train = _views_to_reshapes(_library_ops_to_aten(exported, notes, training=True))
        joint, fw, bw, contract, no_grad = _training_graphs(
            ep_train, args, kwargs, user_names, int_ranges, state, constants, loss, notes)
        tied = _tied_names(model)
        got_grad = {t for t in contract.grad_of if t is not None}
        really_none = [n for n in no_grad if not (tied.get(n, set()) & got_grad)]
        tied_only = [n for n in no_grad if n not in really_none]
        if really_none:
            notes.append(f"{len(really_none)} parameter(s) get no gradient: {', '.join(really_none[:8])}"
                         + (" ..." if len(really_none) > 8 else ""))
        for n in tied_only:
            twin = sorted(tied[n] & got_grad)[0]
            notes.append(f"{n} is tied to {twin}: the graph's gradient for both is {twin}'s")
        for kind, g in (("joint", joint), ("forward", fw), ("backward", bw)):
            if kind in graphs:
                captured[kind] = g
        if step_autocast is not None:
            captured[STEP_JOINT] = _autocast_joint(ep_train, args, kwargs, user_names, int_ranges, state, constants,
                                                   loss, step_autocast)
        model.eval()
    return captured, contract, constants


# _capture_graphs' key for a train_step's joint under autocast (CapturedGraphs.step_joint).
STEP_JOINT = "step_joint"


def _autocast_joint(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict, user_names: list[str],
                    int_ranges: dict[str, tuple[int, int]], state: dict[str, torch.Tensor],
                    constants: dict[str, torch.Tensor], loss: str, dtype: str) -> CapturedGraph:
    """The joint graph of the training program `ep` traced by AOTAutograd under torch.autocast in
    `dtype`: autocast is a dispatch key below export's pre-dispatch program, so export's ops
    (linear, conv2d, matmul) meet it as eager's do, and the joint holds its casts as explicit
    ``_to_copy`` nodes, forward and backward (a cast's gradient cast back to the parameter's
    dtype). The loss is float32 (eager.model_loss under autocast)."""
    with autocast_in(dtype, (state, args, kwargs)):
        return _training_graphs(ep, args, kwargs, user_names, int_ranges, state, constants, loss)[0]


def _share_embedding_ranges(captured: dict[str, CapturedGraph]) -> None:
    """Give every graph's index inputs the range of the embedding table they index.

    An embedding's indices must lie in [0, rows). The range is found where the graph
    calls aten.embedding on a placeholder, and applied to the same user input (or
    buffer) in every graph, so random inputs for any of them stay in bounds.
    """
    by_target: dict[tuple[str, str | None], tuple[int, int]] = {}
    for g in captured.values():
        emb = _embedding_ranges(g.gm)
        for gi in g.inputs:
            if gi.name in emb:
                by_target[(gi.role, gi.target)] = emb[gi.name]
    for g in captured.values():
        g.inputs = [
            dataclasses.replace(gi, int_range=by_target[(gi.role, gi.target)])
            if (gi.role, gi.target) in by_target and gi.meta is not None else gi
            for gi in g.inputs
        ]


def _tied_names(model: torch.nn.Module) -> dict[str, set[str]]:
    """Parameter name -> the other names of the same tensor (tied weights)."""
    by_id: dict[int, set[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), set()).add(n)
    return {n: names - {n} for names in by_id.values() for n in names if len(names) > 1}


# What a model may call in forward to re-seed or reset the global generator.
_RESEEDING = ("manual_seed", "seed", "set_rng_state")


@contextlib.contextmanager
def model_reseeds() -> Iterator[list[str]]:
    """While active, each call the model's own code makes to torch.manual_seed, torch.seed or
    torch.set_rng_state (or their torch.random names) is listed, as "torch.manual_seed at
    file.py:LINE". Calls from torch and from aotpipe itself are not the model's."""
    calls: list[str] = []
    originals = {(owner, n): getattr(owner, n) for owner in (torch, torch.random) for n in _RESEEDING}

    def recording(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*a: Any, **k: Any) -> Any:
            frame = sys._getframe(1)
            file = frame.f_code.co_filename
            if not file.startswith((_TORCH_DIR, _AOTPIPE_DIR)):
                where = f"torch.{name} at {relative_file(file)}:{frame.f_lineno}"
                if where not in calls:
                    calls.append(where)
            return fn(*a, **k)
        return call

    for (owner, n), fn in originals.items():
        setattr(owner, n, recording(n, fn))
    try:
        yield calls
    finally:
        for (owner, n), fn in originals.items():
            setattr(owner, n, fn)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_AOTPIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _refuse_reseeded_draws(reseeds: list[str], captured: dict[str, CapturedGraph]) -> None:
    """One line for a model that re-seeds the generator inside forward and whose graphs draw
    random numbers: the seeding runs once, while tracing, and is not in the graph, so the
    graph's draws (dropout masks) continue the caller's generator where eager's restart."""
    if not reseeds:
        return
    for kind, g in captured.items():
        draw = next((n for n in g.gm.graph.nodes if n.op == "call_function" and op_draws_random(n.target)), None)
        if draw is not None:
            raise CaptureError(
                f"the model re-seeds the random generator inside forward ({', '.join(reseeds[:2])}) and its {kind} "
                f"graph draws random numbers ({target_name_of(draw.target)}): a graph cannot re-seed, so its draws "
                "would differ from eager's; seed once before calling the model, or capture graphs: [inference] only")


RANDOM_BRANCH = "the model branches on a random number it draws"  # capture/hints.py reads this


class RandomBranch(RuntimeError):
    """A guard on a random draw (LayerDrop): each draw takes another branch, so no one graph
    reproduces the model."""


@contextlib.contextmanager
def _no_fake_state_left(model: torch.nn.Module) -> Iterator[None]:
    """Undo what a trace leaves in the model's state: a model that caches a tensor during
    forward (x-transformers' ALiBi bias, ``register_buffer`` on first use) keeps the trace's
    fake tensor, and the next trace then mixes two fake modes ("fake mode from fake tensor
    input 25 doesn't match mode from fake tensor input 26"). Buffers and tensor attributes
    that became fake are put back as they were, or removed where the trace added them."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    before = [(m, dict(m._buffers), {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)})
              for m in model.modules()]
    try:
        yield
    finally:
        for m, buffers, attrs in before:
            for name, b in list(m._buffers.items()):
                if isinstance(b, fake) and buffers.get(name) is not b:
                    if name in buffers:
                        m._buffers[name] = buffers[name]
                    else:
                        del m._buffers[name]
            for name, v in list(vars(m).items()):
                if isinstance(v, fake) and attrs.get(name) is not v:
                    if name in attrs:
                        setattr(m, name, attrs[name])
                    else:
                        delattr(m, name)


def _dynamic_options(shapes: Any, deferred: bool = False) -> dict[str, Any]:
    """torch.export's keywords for dynamic `shapes` (none for a static capture); `deferred`: a
    guard torch cannot prove over the whole range is kept in the graph as a run-time assertion
    instead of refusing the range (see _export)."""
    if shapes is None:
        return {}
    return {"dynamic_shapes": shapes, **({"prefer_deferred_runtime_asserts_over_guards": True} if deferred else {})}


# The note that says a capture kept a guard as a run-time assertion; the job's size checks
# name it where the assertion fails (pipeline/job.py).
DEFERRED_GUARD = "dims: kept as a run-time assertion, checked at min, max and a random size: "


def _export(model: torch.nn.Module, args: tuple, kwargs: dict, what: str,
            notes: list[str] | None = None, shapes: Any = None, dynamic: DynamicDims | None = None,
            origins: dynamic_capture.GuardOrigins | None = None,
            hinted: Callable[[], tuple[Any, list[str]]] | None = None) -> torch.export.ExportedProgram:
    """torch.export of `model`, its failure one line. With dynamic `shapes`, a range torch
    refuses because a guard on a size would narrow it (not because the model fixes the size) is
    tried once more with the guard kept as a run-time assertion: a guard torch cannot prove
    though it holds (a floor division of the size: a conformer's subsampling) then costs
    nothing, and one that does not hold fails the size checks; the note says which. Where torch's
    guard solver then concludes a named size is a constant the shape environment never made it
    (guards it cannot simplify: a padding to a multiple of 256 in Mamba's chunked scan), the
    export is tried once more with `hinted` shapes (``Dim.DYNAMIC`` over the same ranges) and
    kept only if every named dimension stayed symbolic (_export_solver_overruled); `hinted` makes
    those shapes and gives the user inputs' names."""
    try:
        try:
            return _export_once(model, args, kwargs, notes, shapes)
        except Exception as e:
            refusal = dynamic_capture.specialisation_error(
                e, dynamic, origins or dynamic_capture.GuardOrigins(), what) if dynamic is not None else None
            solved = dynamic_capture.solver_specialised(e)
            if refusal is None or ("the model fixes it to" in str(refusal) and not solved):
                raise
            try:
                ep = _export_once(model, args, kwargs, notes, shapes, deferred=True)
            except Exception as again:
                solved = dynamic_capture.solver_specialised(again)
                if not solved or hinted is None or dynamic is None:
                    raise
                ep = _export_solver_overruled(model, args, kwargs, notes, hinted(), dynamic, solved, again)
            note = DEFERRED_GUARD + str(refusal).split(": ", 1)[1].rsplit("; ", 1)[0]  # without its fix
            if notes is not None and note not in notes:
                notes.append(note)
            return ep
    except Exception as e:
        dims_refusal = dynamic_capture.specialisation_error(
            e, dynamic, origins or dynamic_capture.GuardOrigins(), what) if dynamic is not None else None
        if dims_refusal is not None:
            raise dims_refusal from e
        raise CaptureError(f"torch.export ({what}) failed: {e.__class__.__name__}: {_first_line(e)}") from e


def _export_solver_overruled(model: torch.nn.Module, args: tuple, kwargs: dict, notes: list[str] | None,
                             hinted: tuple[Any, list[str]], dynamic: DynamicDims, solved: list[str],
                             refused: BaseException) -> torch.export.ExportedProgram:
    """The export with guards deferred and each named dimension ``Dim.DYNAMIC`` over its range,
    where the named export was refused only because torch's solver concluded the `solved`
    dimensions are constants. Kept only if the graph keeps every named dimension symbolic (then
    the solver's conclusion was not the shape environment's, and the size checks at min, max
    and a random size test the graphs); else `refused` is raised again."""
    shapes, user_names = hinted
    ep = _export_once(model, args, kwargs, notes, shapes, deferred=True)
    if dynamic_capture.specialised_dims(ep, user_names, dynamic):
        raise refused
    note = (f"dims: torch's guard solver concluded {', '.join(solved)} must be a constant, though the traced "
            "graph keeps it symbolic (guards it cannot simplify, kept as run-time assertions): exported with "
            "each dimension Dim.DYNAMIC over its range; checked at min, max and a random size")
    if notes is not None and note not in notes:
        notes.append(note)
    return ep


def _export_once(model: torch.nn.Module, args: tuple, kwargs: dict, notes: list[str] | None, shapes: Any,
                 deferred: bool = False) -> torch.export.ExportedProgram:
    # On failure torch.export prints the partial graph to stderr; the error is one line here.
    # What it prints on success is passed on.
    printed = io.StringIO()
    options = _dynamic_options(shapes, deferred)
    with contextlib.redirect_stderr(printed), _no_fake_state_left(model):
        decided = False
        try:
            ep = torch.export.export(model, args, kwargs, strict=False, **options)
        except GuardOnDataDependentSymNode as e:
            # A guard on a size computed from the model's own integer buffers (Mimi's padded
            # length compared in SDPA) stops the export before those sizes can be folded.
            ep = _export_deciding_guards(model, args, kwargs, options=options)
            if ep is None:
                raise
            decided, refused = True, e
            printed.seek(0)
            printed.truncate()  # the failed export's partial graph: not the user's concern now
        folded = unbacked.fold_constant_sizes(ep, guards_decided=decided)
        if folded is None and decided and unbacked.branches_on_random_draw(ep):
            raise RandomBranch(f"{RANDOM_BRANCH}: {_first_line(refused)}") from refused
        if folded is None and decided:
            raise refused  # a guard on the input's values (or a parameter's): not a constant size
        if folded is not None:  # sizes that only looked data-dependent: export them static
            ep = torch.export.export(folded[0], args, kwargs, strict=False, **options)
            note = (f"data-dependent sizes computed from the model's own integer buffers "
                    f"({', '.join(folded[1][:6])}{' ...' if len(folded[1]) > 6 else ''}) captured static"
                    + (", after a guard on them stopped torch.export" if decided else ""))
            if notes is not None and note not in notes:
                notes.append(note)
    sys.stderr.write(printed.getvalue())
    return ep


# What auto falls back to dynamo for. torch.export's tracing machinery raises these (or a
# subclass); a model's own error on its inputs comes out as a plain builtin one, which dynamo
# would raise again, after tracing the model once more, and which eager raises too.
_PLAIN_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, AssertionError)
_TRACING_WORDS = re.compile(r"fake|symbolic|sym(int|bool|float)|data.dependent|guard|proxy|export|pytree|unbacked|"
                            r"meta|functionali|trac(e|ing)|dynamo|graph", re.IGNORECASE)


def is_tracing_failure(e: BaseException) -> bool:
    """Whether export's capture failed for a reason of tracing (dynamo may capture the model),
    rather than because the model itself raises on its inputs (a plain shape or dtype error:
    dynamo would fail the same way). Decided from the exception torch.export raised: a plain
    builtin type (exactly RuntimeError, ValueError, ...) whose message names none of tracing's
    machinery is the model's own; anything else, and any failure after torch.export returned
    (decomposition, AOTAutograd, checks of the captured graphs), is tracing's."""
    if isinstance(e, CaptureError) and str(e).startswith("dims: "):
        return False  # the model cannot take a range the pipeline names: dynamo's static capture is not that
    if not (isinstance(e, CaptureError) and str(e).startswith("torch.export (")):
        return True  # a later stage of export's capture failed: the model itself traced
    raised = e.__cause__
    if raised is None or type(raised) not in _PLAIN_ERRORS or raised.__cause__ is not None:
        return True
    return _TRACING_WORDS.search(str(raised)) is not None


# Guards the deciding export may decide before it gives up. Sizes computed from a model's own
# constants take a few (Mimi's encoder: 1); a loop that runs until its output says stop (a
# decoder's end token, SLANet's table structure) decides one per step, each on the data, and
# would unroll to its step limit (SLANeXt: 501 guards, 52 s) only for the fold to refuse it.
MAX_DECIDED_GUARDS = 64


class _TooManyGuards(RuntimeError):
    pass


@contextlib.contextmanager
def _at_most_decided_guards(limit: int) -> Iterator[None]:
    """Stop a real-tensor-propagation trace at its `limit`+1-th decided guard (_TooManyGuards)."""
    shape_env = torch.fx.experimental.symbolic_shapes.ShapeEnv
    log_decided = shape_env._log_real_tensor_propagation  # called once per decided guard
    decided = 0

    def counted(self: Any, orig_expr: Any, unsound_result: Any) -> None:
        nonlocal decided
        decided += 1
        if decided > limit:
            raise _TooManyGuards(f"more than {limit} data-dependent guards decided on the example's values")
        log_decided(self, orig_expr, unsound_result)

    shape_env._log_real_tensor_propagation = counted
    try:
        yield
    finally:
        shape_env._log_real_tensor_propagation = log_decided


def _restore_buffers(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Put back the buffer values `saved` (by name) that a real run of the model changed."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in saved:
                b.copy_(saved[n])


def _export_deciding_guards(model: torch.nn.Module, args: tuple, kwargs: dict,
                            max_guards: int = MAX_DECIDED_GUARDS, options: dict[str, Any] | None = None
                            ) -> torch.export.ExportedProgram | None:
    """torch.export with real-tensor propagation (what ``torch.export.draft_export`` uses, at a
    tenth of its time): each data-dependent guard is decided on the example's values and left in
    the graph as a run-time assertion, for unbacked.fold_constant_sizes to accept only where it
    follows from constants. None if even that fails, or if it decides more than `max_guards`
    guards (a loop on data: see MAX_DECIDED_GUARDS). The model's buffers and the generator are
    left as they were (the real run alongside the trace would advance them)."""
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")  # one warning per decided guard
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with torch.random.fork_rng(devices=[]), _at_most_decided_guards(max_guards), \
                torch._functorch.config.patch(fake_tensor_propagate_real_tensors=True):
            return torch.export.export(model, args, kwargs, strict=False, **(options or {}))
    except Exception:  # noqa: BLE001 - the caller raises the first export's error
        return None
    finally:
        logger.setLevel(level)
        _restore_buffers(model, saved)


def _library_ops_to_aten(ep: torch.export.ExportedProgram, notes: list[str], *, training: bool = False
                         ) -> torch.export.ExportedProgram:
    """`ep` with libraries' custom ops rewritten into ATen where aotpipe has a decomposition
    (capture/custom_ops.py); noted once per capture."""
    try:
        ep, names = custom_ops.decompose(ep, training=training)
    except Exception as e:
        raise CaptureError(f"decomposing custom ops into ATen failed: {e.__class__.__name__}: {_first_line(e)}") from e
    note = f"custom ops decomposed into ATen: {', '.join(names)}"
    if names and note not in notes:
        notes.append(note)
    return ep


def _views_to_reshapes(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`aten.view` -> `aten.reshape` where nothing writes through the view.

    Model code calls ``view`` on tensors that are contiguous in eager (an SDPA kernel's
    output, transposed back); decompositions and AOTAutograd's tracing give some of them
    other strides (the math SDPA's), and the view then fails ("Cannot view a tensor with
    shape ... and strides ..."). ``reshape`` is the same op where a view is possible and a
    copy where it is not, which only differs if something writes into the result in place:
    those views are kept.
    """
    _reshape_views(ep.graph_module, lambda node: True)
    return ep


def _reshape_views(gm: torch.fx.GraphModule, applies: Callable[[torch.fx.Node], bool]) -> int:
    """Each `aten.view` node of `gm` that `applies` picks and nothing writes through made an
    `aten.reshape`; how many."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default and applies(node) \
                and not _written_through(node):
            node.target = torch.ops.aten.reshape.default
            changed += 1
    if changed:
        gm.recompile()
    return changed


def _note_reshaped_views(captured: dict[str, CapturedGraph], notes: list[str]) -> None:
    """Each graph's views of computed values as reshapes (computed_views_to_reshapes), noted once."""
    count = sum(computed_views_to_reshapes(g.gm) for g in captured.values())
    note = ("with symbolic sizes, views of values a graph computes are written as aten.reshape (a view where "
            "the run-time strides allow one, else a copy): torch's shape functions can give such a value other "
            "strides than its kernel does")
    if count and note not in notes:
        notes.append(note)


def computed_views_to_reshapes(gm: torch.fx.GraphModule) -> int:
    """In a graph with symbolic sizes: `aten.view` of a value the graph computes -> `aten.reshape`
    where nothing writes through the view; how many.

    At symbolic sizes torch's shape functions can give a value other strides than its kernel
    gives at run time: ``constant_pad_nd`` that only crops (LongT5's blocks, padded to a multiple
    of 128 and cut back) is a fresh contiguous tensor while tracing and a strided clone when it
    runs, and the view after it then fails ("Cannot view a tensor with shape ... and strides").
    ``reshape`` is that view where one is possible and a copy where not. Views of the graph's
    inputs are kept: their strides are the recorded ones."""
    return _reshape_views(gm, lambda node: bool(node.args) and isinstance(node.args[0], torch.fx.Node)
                          and node.args[0].op != "placeholder")


def _written_through(node: torch.fx.Node, depth: int = 0) -> bool:
    """Whether an in-place op writes into `node`'s value or a view of it (conservatively)."""
    if depth > 32:
        return True
    for user in node.users:
        target = user.target
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                return True
            if target._schema.returns and any(r.alias_info is not None for r in target._schema.returns):
                if _written_through(user, depth + 1):  # a view of a view
                    return True
        elif user.op not in ("output",) and target is not operator.getitem:
            return True  # something we cannot see into
    return False


def target_name_of(op: Any) -> str:
    """`aten._linalg_check_errors.default` for an OpOverload; str() of anything else."""
    return f"{op.namespace}.{op._opname}.{op._overloadname}" if isinstance(op, torch._ops.OpOverload) else str(op)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def _inference_graph(
    ep: torch.export.ExportedProgram,
    user_names: list[str],
    int_ranges: dict[str, tuple[int, int]],
    state: dict[str, torch.Tensor],
    user_values: list[Any] | None = None,
) -> CapturedGraph:
    """The inference graph, decomposed to core ATen; `user_values` (the example inputs) give
    data-dependent sizes their example sizes (capture/unbacked.py)."""
    try:
        ep = ep.run_decompositions(kept_whole(core_aten_decompositions()))  # one call per RNN (capture/rnn.py)
    except Exception as e:
        raise CaptureError(f"decomposing the inference graph failed: {e.__class__.__name__}: {_first_line(e)}") from e
    gm = _flat_graph(ep.graph_module)
    pin_group_norm_layouts(gm)
    pin_batch_norm_layouts(gm)
    sig = ep.graph_signature
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if user_values is not None and unbacked.has_data_dependent_sizes(gm):
        users = iter(user_values)
        bound = [next(users) if spec.kind == InputKind.USER_INPUT else
                 ep.constants[spec.target] if spec.target in ep.constants else state[spec.target]
                 for spec in sig.input_specs]
        unbacked.make_concrete(gm, unbacked.example_values(gm, bound), "inference")
    emb = _embedding_ranges(gm)
    inputs = []
    user_i = 0
    for node, spec in zip(placeholders, sig.input_specs):
        role = _INPUT_KIND_ROLE.get(spec.kind, "other")
        if role == "user":
            target = user_names[user_i] if user_i < len(user_names) else node.name
            user_i += 1
        else:
            target = spec.target
        meta = _meta_of(node)
        rng = None
        if meta is not None and not meta.dtype.is_floating_point and meta.dtype != torch.bool:
            if node.name in emb:
                rng = emb[node.name]
            elif role == "user":
                rng = int_ranges.get(target)
            elif target in state:
                rng = _observed_range(state[target])
            elif role == "constant" and target in ep.constants:
                rng = _observed_range(ep.constants[target])
        inputs.append(GraphInput(node.name, role, target, meta, _scalar_type(node) if meta is None else None, rng))

    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_args = pytree.tree_leaves(out_node.args[0], is_leaf=lambda x: x is None)
    outputs = []
    for i, (arg, spec) in enumerate(zip(out_args, sig.output_specs)):
        meta = _meta_of(arg) if isinstance(arg, torch.fx.Node) else None
        if spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(GraphOutput(i, "user", None, meta))
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION, OutputKind.PARAMETER_MUTATION):
            outputs.append(GraphOutput(i, "mutation", spec.target, meta))
        else:
            outputs.append(GraphOutput(i, spec.kind.name.lower(), spec.target, meta))
    return CapturedGraph(GraphKind.INFERENCE, gm, inputs, outputs)


def _lift_constants_to_buffers(gm: torch.nn.Module) -> set[str]:
    """Register plain tensor attributes as non-persistent buffers; returns their names.

    AOTAutograd fakeifies parameters and buffers only; a plain tensor attribute (a lifted
    constant after torch.export) would meet fake tensors as a real one and fail.
    """
    if not isinstance(gm, torch.fx.GraphModule):  # a module of its own (a distributed rank's): no get_attr nodes
        return set()
    known = set(dict(gm.named_parameters())) | set(dict(gm.named_buffers()))
    lifted = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in known and node.target not in lifted:
            owner_path, _, attr = node.target.rpartition(".")
            owner = gm.get_submodule(owner_path) if owner_path else gm
            value = getattr(owner, attr)
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                delattr(owner, attr)
                owner.register_buffer(attr, value, persistent=False)
                lifted.add(node.target)
    return lifted


def _desc_target(desc: Any) -> tuple[str, str | None]:
    """(role, target) of an AOTAutograd input descriptor."""
    cls = type(desc).__name__
    if cls == "ParamAOTInput":
        return "param", desc.target
    if cls == "BufferAOTInput":
        return "buffer", desc.target
    if cls == "PlainAOTInput":
        return "user", str(desc.idx)
    if cls == "TangentAOTInput":
        return "tangent", f"output[{getattr(desc.output, 'idx', '?')}]"
    return "other", repr(desc)


_WRAPPER_PREFIX = "model."


def _strip(target: str | None) -> str | None:
    return target[len(_WRAPPER_PREFIX):] if target and target.startswith(_WRAPPER_PREFIX) else target


def _training_graphs(
    ep: torch.export.ExportedProgram,
    args: tuple,
    kwargs: dict,
    user_names: list[str],
    int_ranges: dict[str, tuple[int, int]],
    state: dict[str, torch.Tensor],
    constants_out: dict[str, torch.Tensor],
    loss: str = DEFAULT_LOSS,
    notes: list[str] | None = None,
) -> tuple[CapturedGraph, CapturedGraph, CapturedGraph, Partition, list[str]]:
    fake_args, fake_kwargs = _fake_user_inputs(ep, args, kwargs)
    return training_graphs(ep.module(), fake_args, fake_kwargs, user_names, int_ranges, state, constants_out,
                           functools.partial(_Loss, kind=loss), notes, real_user_values=pytree.tree_leaves((args, kwargs)))


def _fake_user_inputs(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args` and `kwargs` with each tensor replaced by the fake tensor torch.export traced it as.

    AOTAutograd then traces in export's fake mode, whose shape environment gives
    data-dependent ops (``nonzero``, ``torch.where(mask)``, boolean indexing) sizes of their
    own (unbacked symbols), as torch.export did; from real inputs it would fakeify them
    afresh without one and fail (DynamicOutputShapeException: aten.nonzero).
    """
    leaves = pytree.tree_leaves((args, kwargs))
    if any(isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in leaves):
        return args, kwargs  # already fake (mode meta), in the fake mode the model's tensors are in
    user_specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    fakes = iter(placeholders[s.arg.name].meta.get("val") for s in user_specs)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    swapped = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            fake = next(fakes, None)
            # compared by example value (size_hint): == on a symbolic size would fix it to the example
            same = isinstance(fake, torch.Tensor) and tuple(size_hint(s) for s in fake.shape) == tuple(leaf.shape)
            swapped.append(fake if same else leaf)
        else:
            swapped.append(leaf)
    return pytree.tree_unflatten(swapped, spec)


class NothingToDifferentiate(CaptureError):
    """The joint has no backward: AOTAutograd saw no gradient to compute."""


def _random_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and op_draws_random(n.target)]


def _hold_unused_multi_outputs(joint: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Give every op of `joint` that returns several values, none of them used, an (unused)
    getitem of its first value; the getitems added, for the caller to erase after partitioning.

    A dropout whose result the model throws away (or uses only for its shape) stays in the joint
    as ``native_dropout``, which returns (output, mask): random ops are impure, so dead-code
    elimination keeps them. torch's default_partition takes a node whose users are all
    getitems for a multi-output op, and asserts that any other is a tensor, so a multi-output
    node with no users at all fails it ("Expected native_dropout to be a tensor"). With one
    getitem it is seen for what it is and left out of the forward; restore_dropped_draws
    then puts the draw back, so the forward consumes the generator as eager does.
    """
    import operator

    added = []
    for node in list(joint.graph.nodes):
        if node.op == "call_function" and not node.users and isinstance(node.meta.get("val"), (tuple, list)):
            with joint.graph.inserting_after(node):
                held = joint.graph.call_function(operator.getitem, (node, 0))
            held.meta.update({k: v for k, v in (("val", node.meta["val"][0]),
                                                ("tensor_meta", (node.meta.get("tensor_meta") or [None])[0]))
                              if v is not None})
            added.append(held)
    return added


def restore_dropped_draws(joint: torch.fx.GraphModule, fw: torch.fx.GraphModule,
                          bw: torch.fx.GraphModule) -> str | None:
    """Put back into `fw` the random draws of the joint that neither partition kept; a note
    saying so, or None when there were none.

    A model may draw random numbers it never uses (BigBird builds a fresh attention module,
    and so initialises its weights, inside forward when the input is too short for block-
    sparse attention). The joint keeps those draws (random ops are impure), so it consumes
    the generator as eager does; the partitioner copies into the forward only what feeds
    its outputs, so the forward skipped them, and every later dropout drew another mask
    than eager's and the joint's. Each dropped draw, with the pure nodes that feed it, goes
    back in joint order: right after the forward's copy of the joint's previous draw, before
    its next one.
    """
    fw_nodes = {n.name: n for n in fw.graph.nodes}
    bw_names = {n.name for n in bw.graph.nodes}
    draws = _random_nodes(joint)
    dropped = [n for n in draws if n.name not in fw_nodes and n.name not in bw_names]
    if not dropped:
        return None
    first_op = next(n for n in fw.graph.nodes if n.op != "placeholder")

    def copy_in(node: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
        for inp in node.all_input_nodes:
            if inp.name not in fw_nodes:
                if inp.op != "call_function":
                    raise CaptureError(f"a random draw the forward graph dropped ({node.name}) reads {inp.name}, "
                                       "which the forward graph does not have")
                copy_in(inp, before)
        # Not before its own inputs: a draw of a value the forward computes later than the
        # previous draw (a dropout of a layer's output that is then thrown away) goes after it.
        at = before
        position = {n: i for i, n in enumerate(fw.graph.nodes)}
        for inp in node.all_input_nodes:
            if position[fw_nodes[inp.name]] >= position[at]:
                at = fw_nodes[inp.name].next
        with fw.graph.inserting_before(at):
            new = fw.graph.node_copy(node, lambda n: fw_nodes[n.name])
        fw_nodes[node.name] = new
        return new

    previous: torch.fx.Node | None = None  # the forward's copy of the last draw seen
    for node in draws:
        if node.name in fw_nodes:
            previous = fw_nodes[node.name]
        elif node.name not in bw_names:
            previous = copy_in(node, previous.next if previous is not None else first_op)
    fw.graph.lint()
    fw.recompile()
    kept = [n.target for n in _random_nodes(fw)] + [n.target for n in _random_nodes(bw)]
    order = "" if kept == [n.target for n in draws] else \
        " (their order differs from the joint's: dropout masks may differ from eager's)"
    return (f"the forward graph keeps {len(dropped)} random draw(s) the model makes but never uses (the "
            f"partitioner had dropped them), so that it consumes the generator as eager does{order}")


@contextlib.contextmanager
def _node_by_node(module: torch.nn.Module) -> Any:
    """While tracing, run `module` (if a GraphModule) node by node with its nodes' metadata
    current, so that the traced nodes keep the module path and source location each came
    from (nn_module_stack, source_fn_stack, stack_trace; torch copies these onto the nodes
    it records, and AOTAutograd copies a forward node's onto its backward nodes as
    fwd_nn_module_stack). Run as generated code, the GraphModule leaves them unset."""
    if not isinstance(module, torch.fx.GraphModule):
        yield
        return

    import inspect

    info = getattr(module.graph._codegen, "pytree_info", None)
    signature = inspect.signature(type(module).forward)

    def flat_inputs(args: tuple, kwargs: dict) -> list[Any]:
        # What the generated forward's first line computes (torch.fx.graph._PyTreeCodeGen).
        if info is None or info.in_spec is None:
            return list(args)
        bound = signature.bind(module, *args, **kwargs)
        values = [bound.arguments[name] for name in info.orig_args]
        spec = info.in_spec
        if (spec.type is tuple and spec.num_children == 2 and spec.child(0).type is tuple
                and spec.child(1).type is dict):
            count = spec.child(0).num_children
            return tree_flatten_spec((values[:count], dict(zip(spec.child(1).context, values[count:]))), spec)
        return tree_flatten_spec(values, spec)

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = torch.fx.Interpreter(module).run(*flat_inputs(args, kwargs), enable_io_processing=False)
        return module.graph.process_outputs(out)

    module.forward = forward  # an instance attribute: the class's generated forward is left alone
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        del module.forward


def _recompute_views(joint: torch.fx.GraphModule) -> None:
    """Tag for recomputing, as its source is, every view of a value tagged to be recomputed in the
    backward (node.meta "recompute": MUST_RECOMPUTE, capture/distributed.py's regathered fsdp2
    parameters): a linear's transposed weight, taken by the model outside the tagged region,
    would otherwise be saved and keep the whole value alive, which the tag is there to free."""
    for node in joint.graph.nodes:  # in order: a view of a view is tagged after its source
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
                not node.target.is_view or "recompute" in node.meta:
            continue
        src = node.args[0] if node.args else None
        if isinstance(src, torch.fx.Node) and src.meta.get("recompute") == CheckpointPolicy.MUST_RECOMPUTE:
            node.meta["recompute"], node.meta["ac_graph_id"] = CheckpointPolicy.MUST_RECOMPUTE, src.meta["ac_graph_id"]


def training_graphs(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    user_names: list[str],
    int_ranges: dict[str, tuple[int, int]],
    state: dict[str, torch.Tensor],
    constants_out: dict[str, torch.Tensor],
    wrap: Callable[[torch.nn.Module], torch.nn.Module],
    notes: list[str] | None = None,
    real_user_values: list[Any] | None = None,
) -> tuple[CapturedGraph, CapturedGraph, CapturedGraph, Partition, list[str]]:
    """Joint, forward and backward graphs of `module` (a GraphModule: plain tensor attributes
    become buffers) wrapped in `wrap`, which holds it as ``.model`` and says what the joint
    differentiates: a sum loss (export) or every output (dynamo, a tangent per output).

    Also the contract that pairs forward and backward, and the parameters that get no gradient.
    """
    constants = _lift_constants_to_buffers(module)
    for target in constants:
        constants_out.setdefault(target, module.get_buffer(target))
    loss_module = wrap(module)
    user_values = pytree.tree_leaves((args, kwargs))
    parts: dict[str, Any] = {}

    def partition(joint_module, joint_inputs, *, num_fwd_outputs, **kw):
        handles = _hold_unused_multi_outputs(joint_module)
        _recompute_views(joint_module)
        try:
            fw, bw = default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        finally:
            for h in handles:
                joint_module.graph.erase_node(h)
        parts.update(fw=fw, bw=bw, num_fwd_outputs=num_fwd_outputs,
                     restored=restore_dropped_draws(joint_module, fw, bw))
        return fw, bw

    try:
        with contextlib.ExitStack() as stack:
            # Route scaled_dot_product_attention through its math composite so autograd
            # differentiates plain ops. Left to the CPU flash kernel, core-ATen decomposition
            # rewrites its forward (whose second output becomes the attention weights) but
            # not its backward (which reads that output as logsumexp): wrong gradients.
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
            stack.enter_context(_node_by_node(module))
            jd = aot_export_joint_with_descriptors(stack, loss_module, args, kwargs, decompositions=core_aten_decompositions())
            joint_gm = _flat_graph(jd.graph_module)
            aot_compile_joint_with_descriptors(jd, partition_fn=partition)
    except CaptureError:
        raise
    except Exception as e:
        raise CaptureError(f"AOTAutograd joint capture failed: {e.__class__.__name__}: {_first_line(e)}") from e

    # Inputs: the joint's placeholders carry descriptors; forward placeholders share names.
    ph_info: dict[str, GraphInput] = {}
    primals, tangents = [], []
    for node in joint_gm.graph.nodes:
        if node.op != "placeholder":
            continue
        role, target = _desc_target(node.meta.get("desc"))
        if role == "other":
            raise CaptureError(f"AOTAutograd joint capture: input {node.name} is {target}, which aotpipe's "
                               "graphs have no role for")
        if role == "user":
            target = user_names[int(target)] if int(target) < len(user_names) else target
        elif role in ("param", "buffer"):
            target = _strip(target)
            if role == "buffer" and target in constants:
                role = "constant"
        meta = _meta_of(node)
        rng = None
        if meta is not None and not meta.dtype.is_floating_point and meta.dtype != torch.bool:
            rng = int_ranges.get(target) if role == "user" else (
                _observed_range(state[target]) if target in state else None)
        if meta is not None and (role == "param" or (role == "user" and _requires_grad(user_values, node))):
            meta = dataclasses.replace(meta, requires_grad=True)
        gi = GraphInput(node.name, role, target, meta, _scalar_type(node) if meta is None else None, rng)
        ph_info[node.name] = gi
        (tangents if role == "tangent" else primals).append(gi)

    joint_out = next(n for n in joint_gm.graph.nodes if n.op == "output")
    joint_out_args = list(joint_out.args[0])
    descs = list(joint_out.meta.get("desc", [None] * len(joint_out_args)))
    joint_outputs = []
    for i, (arg, desc) in enumerate(zip(joint_out_args, descs)):
        out = _output_from_desc(i, arg, desc, user_names)
        if out.role == "other":  # the format has no role for it: say so here, not as the writer's schema error
            raise CaptureError(f"AOTAutograd joint capture: output {i} is {type(desc).__name__} "
                               f"({desc!r}), which aotpipe's graphs have no role for")
        joint_outputs.append(out)

    if "num_fwd_outputs" not in parts:  # AOTAutograd compiled it for inference: no gradient flows
        raise NothingToDifferentiate("AOTAutograd found no gradient to compute (its outputs are views of its "
                                     "inputs, or depend on nothing that requires grad)")
    nfo = parts["num_fwd_outputs"]
    if parts["restored"] and notes is not None:
        notes.append(parts["restored"])
    fw_gm = _flat_graph(parts["fw"])
    bw_gm = _flat_graph(parts["bw"])
    _drop_repeated_checks(fw_gm, bw_gm)
    for gm in (joint_gm, fw_gm, bw_gm):
        pin_group_norm_layouts(gm)
        pin_batch_norm_layouts(gm)
    _saved_in_forward_order(fw_gm, bw_gm, nfo)
    if unbacked.has_data_dependent_sizes(joint_gm):
        _concrete_training_sizes(joint_gm, fw_gm, bw_gm, loss_module, real_user_values or user_values)

    fw_inputs = [ph_info[n.name] for n in fw_gm.graph.nodes if n.op == "placeholder"]
    fw_out_node = next(n for n in fw_gm.graph.nodes if n.op == "output")
    fw_out_args = list(fw_out_node.args[0])
    fw_outputs = []
    saved_names = []
    for i, arg in enumerate(fw_out_args):
        if i < nfo:
            j = joint_outputs[i]
            fw_outputs.append(GraphOutput(i, j.role, j.target, _meta_of(arg) if isinstance(arg, torch.fx.Node) else None))
        else:
            saved_names.append(arg.name if isinstance(arg, torch.fx.Node) else str(arg))
            fw_outputs.append(GraphOutput(i, "saved", None, _meta_of(arg) if isinstance(arg, torch.fx.Node) else None))

    bw_inputs = []
    bw_placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    num_saved = len(fw_out_args) - nfo
    for k, node in enumerate(bw_placeholders):
        if node.name in ph_info and ph_info[node.name].role == "tangent":
            bw_inputs.append(ph_info[node.name])
        else:
            meta = _meta_of(node)
            val = node.meta.get("val")
            sym = size_expr(val) if isinstance(val, torch.SymInt) else None
            bw_inputs.append(GraphInput(node.name, "saved" if meta is not None else "symint",
                                        f"forward_output[{nfo + k}]", meta,
                                        _scalar_type(node) if meta is None else None,
                                        sym_expr=sym if isinstance(sym, str) else None))
    bw_out_node = next(n for n in bw_gm.graph.nodes if n.op == "output")
    bw_out_args = list(bw_out_node.args[0])
    bw_outputs = []
    grad_of: list[str | None] = []
    for i, arg in enumerate(bw_out_args):
        j = joint_outputs[nfo + i] if nfo + i < len(joint_outputs) else None
        target = j.target if j is not None and j.role == "grad" else None
        meta = _meta_of(arg) if isinstance(arg, torch.fx.Node) else None
        bw_outputs.append(GraphOutput(i, "grad" if arg is not None else "none", target, meta))
        grad_of.append(target if arg is not None else None)

    no_grad = [j.target for j in joint_outputs if j.role == "none" and j.target]
    saved_symints = sum(1 for gi in bw_inputs if gi.role == "symint")
    mutated = tuple(o.target for o in fw_outputs if o.role == "mutation")
    contract = Partition(
        num_mutated_inputs=len(mutated),
        num_user_outputs=sum(1 for o in fw_outputs if o.role == "user"),
        num_saved_tensors=num_saved - saved_symints,
        num_saved_symints=saved_symints,
        num_tangents=sum(1 for gi in bw_inputs if gi.role == "tangent"),
        mutated_inputs=list(mutated),
        grad_of=grad_of,
    )
    joint = CapturedGraph(GraphKind.JOINT, joint_gm, primals + tangents, joint_outputs, (len(primals), len(tangents)))
    fw = CapturedGraph(GraphKind.FORWARD, fw_gm, fw_inputs, fw_outputs)
    bw = CapturedGraph(GraphKind.BACKWARD, bw_gm, bw_inputs, bw_outputs)
    return joint, fw, bw, contract, no_grad


def _drop_repeated_checks(fw_gm: torch.fx.GraphModule, bw_gm: torch.fx.GraphModule) -> None:
    """Remove from the backward the checks (:func:`effectful_checks`) the forward makes already.

    The partitioner copies a node it must keep (impure) into both graphs, with what it reads:
    the backward would recompute ``linalg_inv_ex`` only to check its ``info`` again.
    """
    checks = set(effectful_checks())
    fw_checks = {n.name for n in fw_gm.graph.nodes if n.op == "call_function" and n.target in checks}
    repeated = [n for n in bw_gm.graph.nodes if n.op == "call_function" and n.target in checks and n.name in fw_checks]
    if not repeated:
        return
    for node in repeated:
        bw_gm.graph.erase_node(node)
    bw_gm.graph.eliminate_dead_code()
    bw_gm.graph.lint()
    bw_gm.recompile()


def _saved_in_forward_order(fw_gm: torch.fx.GraphModule, bw_gm: torch.fx.GraphModule, nfo: int) -> None:
    """Order the backward's placeholders as the forward returns what it saves.

    The partitioner's forward returns its outputs, the saved tensors, then the saved sizes
    (symbolic ints: a data-dependent model's); its backward takes the sizes first. Whoever
    runs the pair (the checks, replay) hands the forward's saved outputs to the backward in
    the forward's order, so the backward takes them in that order.
    """
    fw_out = next(n for n in fw_gm.graph.nodes if n.op == "output")
    saved = [a.name for a in list(fw_out.args[0])[nfo:] if isinstance(a, torch.fx.Node)]
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in placeholders}
    wanted = [by_name[n] for n in saved if n in by_name]
    wanted += [n for n in placeholders if n not in wanted]
    if wanted == placeholders:
        return
    first_op = next(n for n in bw_gm.graph.nodes if n.op != "placeholder")
    for node in wanted:  # each moved, in turn, to just before the first op: in `wanted` order
        first_op.prepend(node)
    bw_gm.graph.lint()
    bw_gm.recompile()


def _concrete_training_sizes(joint_gm: torch.fx.GraphModule, fw_gm: torch.fx.GraphModule,
                             bw_gm: torch.fx.GraphModule, loss_module: torch.nn.Module, user_values: list[Any]) -> None:
    """Data-dependent sizes in the training graphs made their sizes on the example inputs:
    the joint runs on them (tangents of ones); forward and backward nodes share its names."""
    state = {**dict(loss_module.named_parameters(remove_duplicate=False)),
             **dict(loss_module.named_buffers(remove_duplicate=False))}
    bound = []
    for node in joint_gm.graph.nodes:
        if node.op != "placeholder":
            continue
        desc = node.meta.get("desc")
        role, target = _desc_target(desc)
        if role in ("param", "buffer"):
            bound.append(state[target].detach())
        elif role == "user":
            bound.append(user_values[int(target)])
        elif role == "tangent":
            meta = _meta_of(node)
            bound.append(ones(meta.shape, meta.stride, meta.dtype))
        else:
            raise CaptureError(f"joint graph: cannot bind input {node.name} to find its data-dependent sizes")
    values = unbacked.example_values(joint_gm, bound)
    for kind, gm in (("joint", joint_gm), ("forward", fw_gm), ("backward", bw_gm)):
        unbacked.make_concrete(gm, values, kind)


def _requires_grad(user_values: list[Any], node: torch.fx.Node) -> bool:
    """Whether the user input a joint placeholder stands for requires grad (dynamo: an
    activation a later subgraph takes from an earlier one)."""
    idx = getattr(node.meta.get("desc"), "idx", None)
    value = user_values[idx] if isinstance(idx, int) and idx < len(user_values) else None
    return isinstance(value, torch.Tensor) and value.requires_grad


def _output_from_desc(i: int, arg: Any, desc: Any, user_names: list[str]) -> GraphOutput:
    cls = type(desc).__name__
    meta = _meta_of(arg) if isinstance(arg, torch.fx.Node) else None
    if cls == "PlainAOTOutput":
        return GraphOutput(i, "user", f"output[{desc.idx}]", meta)
    if cls == "InputMutationAOTOutput":
        # a user input updated in place (F.batch_norm's running stats passed as inputs): named
        # like the input, as its placeholder's target is, so checks and replay find it
        return GraphOutput(i, "mutation", _strip(_user_named(_desc_target(desc.mutated_input), user_names)), meta)
    if cls == "GradAOTOutput":
        target = _user_named(_desc_target(desc.grad_of), user_names)  # a user input's gradient: named like it
        return GraphOutput(i, "grad" if arg is not None else "none", _strip(target), meta)
    return GraphOutput(i, "none" if arg is None else "other", None, meta)


def _user_named(desc_target: tuple[str, str | None], user_names: list[str]) -> str | None:
    """The target of a (role, target) descriptor pair, a user input's index replaced by its name."""
    role, target = desc_target
    if role == "user" and target is not None and target.isdigit() and int(target) < len(user_names):
        return user_names[int(target)]
    return target
