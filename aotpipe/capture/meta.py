"""Capture mode `meta`: the model's shapes without its memory.

The model is built on the meta device (no parameter storage), its parameters, buffers and
example inputs are then wrapped as fake tensors that say they live on the target device
("cpu"), and capture_export traces it as it would the real model: torch.export, then
AOTAutograd's joint and the default partitioner, all on fake tensors. Because the fake
tensors claim the target device, the model's code takes the branches it takes on that
device, factory ops in the graphs name it, and every TensorMeta records it: the graphs
and their metadata are the ones a real capture on that device gives (the tests check
this), while a Llama-3-70B-size model costs well under 2 GiB.

What cannot be known without values:
- integer input ranges: taken from the caller's `int_ranges` (the pipeline's low/high),
  from real example inputs when given, from the embedding tables the inputs index, or
  else left unrecorded (random replays then draw [0, 2));
- integer buffers' ranges (position ids, ...) are not recorded;
- a model whose forward reads a value (``.item()``, data-dependent control flow on a
  tensor's contents) fails with one CaptureError line.

The artefact holds metadata only (no blobs): write it with ``inputs=None`` and check it
with :func:`aotpipe.checks.meta.check_meta_written`, which loads each graph back and runs it on fake inputs
built from its records (shapes, dtypes, strides of every output); ``aotpipe replay
--inputs random`` materialises what it needs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch._functorch._aot_autograd.graph_compile as graph_compile
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module

from aotpipe.capture import export as _export_mod
from aotpipe.errors import CaptureError, SourceError, exception_line
from aotpipe.format.ir import CapturedGraphs
from aotpipe.models.inputs_data import is_structured
from aotpipe.models.sources import build_model, user_input_names
from aotpipe.runtime.global_state import preserved
from aotpipe.spec.modes import DEFAULT_LOSS, META_OPTIONS

MODE = "meta"
OPTIONS = META_OPTIONS


# ---------------------------------------------------------------------------------------
# building on meta


def build_on_meta(spec: Any, base_dir: Optional[Path] = None) -> torch.nn.Module:
    """The model of a ModelSpec built on the meta device: no parameter or buffer storage.

    For ``hf:`` and ``module:callable`` sources alike (any code that creates its tensors
    without naming a device). A source whose construction reads values (``.item()``,
    loading a checkpoint) cannot be built on meta: a SourceError says so.
    """
    with preserved():
        try:
            with torch.device("meta"):
                model = build_model(spec, base_dir)
        except SourceError as e:
            raise SourceError(f"building {spec.source} on the meta device failed: {e}") from e
        except Exception as e:
            raise SourceError(f"building {spec.source} on the meta device failed (mode meta needs a model "
                              f"whose construction reads no tensor values): {exception_line(e)}") from e
    real = [n for n, t in _named_tensors(model) if not t.is_meta]
    if real:
        raise SourceError(f"{spec.source} built on the meta device still holds real tensors ({', '.join(real[:4])}"
                          + (" ..." if len(real) > 4 else "") + "): its code names a device; mode meta needs it not to")
    return model


def _named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))


def meta_example_inputs(spec: Any, base_dir: Any = None) -> tuple[tuple, dict]:
    """The example inputs of a ModelSpec as meta tensors (shapes and dtypes only; an input's
    data is not read); all positional for a structured spec (inputs_data.is_structured)."""
    if is_structured(spec):
        return tuple(torch.empty(tuple(inp.shape), dtype=getattr(torch, inp.dtype), device="meta")
                     for inp in spec.inputs), {}
    args, kwargs = [], {}
    for inp in spec.inputs:
        t = torch.empty(tuple(inp.shape), dtype=getattr(torch, inp.dtype), device="meta")
        if inp.name is None:
            args.append(t)
        else:
            kwargs[inp.name] = t
    return tuple(args), kwargs


# ---------------------------------------------------------------------------------------
# fake tensors on the target device


def fake_like(mode: FakeTensorMode, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (meta, fake or real) as a fake tensor of `mode` that says it is on `device`."""
    if isinstance(t, FakeTensor):
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")  # re-home into `mode`
    elif not t.is_meta:
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    with torch._C._DisableTorchDispatch():  # the constructor itself must not dispatch
        return FakeTensor(mode, t, device)


def _fakeify_model(model: torch.nn.Module, mode: FakeTensorMode, device: torch.device) -> None:
    """Replace every parameter and buffer by a fake tensor on `device`, in place; tied
    tensors stay tied (one fake for one original)."""
    memo: dict[int, torch.Tensor] = {}
    for sub in model.modules():
        for n, p in list(sub._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = torch.nn.Parameter(fake_like(mode, p.data, device), requires_grad=p.requires_grad)
            sub._parameters[n] = memo[id(p)]
        for n, b in list(sub._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                memo[id(b)] = fake_like(mode, b, device)
            sub._buffers[n] = memo[id(b)]


@contextlib.contextmanager
def _patched(owner: Any, name: str, make: Any) -> Iterator[None]:
    """`owner.name` replaced by `make(original)` for the duration (nothing if it has no `name`)."""
    orig = getattr(owner, name, None)
    if orig is None:
        yield
        return
    setattr(owner, name, make(orig))
    try:
        yield
    finally:
        setattr(owner, name, orig)


def _flat_graph_in_place(orig: Any) -> Any:
    """capture_export's _flat_graph without its deepcopy: every graph it flattens is owned
    by the capture (an ExportedProgram's, AOTAutograd's joint and partitions), and the
    partitioner only reads the joint. Proposed for export.py itself (see the report)."""

    def flat(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        # A lazy one over the same graph (make_fx's class is named after the traced function;
        # module.py's is GraphModule): mode meta never runs its captured graphs, so their
        # Python code (seconds for a 70B-size joint graph) is made only if something asks.
        gm = _LazyGraphModule(gm, gm.graph)
        gm.graph.set_codegen(torch.fx.graph.CodeGen())
        gm.recompile()  # lazy: marks the code stale
        return gm

    return flat


@contextlib.contextmanager
def _fast_capture() -> Iterator[None]:
    """What makes a 70B-size capture affordable, scoped to this capture:
    - GraphModules made while tracing (make_fx, the partitioner, split_module) generate
      and compile their Python code only when first called (most never are);
    - AOTAutograd does not render the joint, forward and backward graphs as text for its
      logs (print_readable of a 23K-node joint graph, whether logging is on or not);
    - the graphs capture_export flattens are not deep-copied first. (A stopgap: replacing
      export.py's own helper for the duration; export mode keeps its copy until it is shown
      to give the same artefacts without it.)
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(_use_lazy_graph_module(True))
        stack.enter_context(_patched(graph_compile, "_log_joint_graph", lambda orig: lambda *a, **k: None))
        stack.enter_context(_patched(graph_compile, "_log_fw_bw_graphs", lambda orig: lambda *a, **k: (None, None)))
        stack.enter_context(_patched(_export_mod, "_flat_graph", _flat_graph_in_place))
        yield


def capture_meta(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    graphs: list[str],
    input_names: list[str],
    int_ranges: dict[str, tuple[int, int]] | None = None,
    device: str | torch.device = "cpu",
    loss: str = DEFAULT_LOSS,
) -> CapturedGraphs:
    """capture_export's graphs of a model built on meta (see build_on_meta), on fake tensors.

    `args`/`kwargs` may be meta, fake or real tensors; only their shapes and dtypes are
    used (and, for real integer ones, their observed range when `int_ranges` has none).
    The model's parameters and buffers are replaced in place by fake tensors on `device`.
    Every TensorMeta, node value and factory op of the result names `device`.
    """
    device = torch.device(device)
    int_ranges = dict(int_ranges or {})
    user_names = user_input_names(args, kwargs, input_names)
    for n, v in zip(user_names, pytree.tree_leaves((args, kwargs))):
        if isinstance(v, torch.Tensor) and not v.is_meta and not isinstance(v, FakeTensor) and n not in int_ranges:
            r = _export_mod._observed_range(v)
            if r is not None:
                int_ranges[n] = r
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    _fakeify_model(model, mode, device)
    by_id: dict[int, torch.Tensor] = {}

    def conv(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in by_id:
            by_id[id(x)] = fake_like(mode, x, device)
        return by_id[id(x)]

    fargs, fkwargs = pytree.tree_map(conv, (tuple(args), dict(kwargs)))
    with _fast_capture():
        try:
            captured = _export_mod.capture_export(model, fargs, fkwargs, name=name, graphs=graphs,
                                                  input_names=input_names, int_ranges=int_ranges, loss=loss)
        except CaptureError as e:
            raise CaptureError(_explain(str(e))) from e
        except Exception as e:  # outside capture_export's own wrapping (its range reads)
            raise CaptureError(_explain(f"meta capture failed: {exception_line(e)}")) from e
    _check_no_values(captured)
    captured.mode = MODE
    captured.options = {**OPTIONS, "loss": loss}
    return captured


_VALUE_READS = ("DataDependentOutputException", "_local_scalar_dense", "GuardOnDataDependentSymNode",
                "data-dependent", "item()", "Cannot copy out of meta tensor", "meta tensors")


def _explain(line: str) -> str:
    line = line.splitlines()[0] if line else line
    if any(k in line for k in _VALUE_READS):
        return (f"{line[:240]} -- the model reads a tensor's value (.item(), data-dependent control flow), "
                "which mode meta cannot give; use mode export")
    return line


def _check_no_values(captured: CapturedGraphs) -> None:
    """Every graph is metadata only: no tensor attribute (its value would be a fake)."""
    for kind, g in captured.graphs.items():
        for node in g.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(g.gm, node.target, None) if "." not in node.target else g.gm.get_buffer(node.target)
                if isinstance(value, torch.Tensor):
                    raise CaptureError(f"the {kind} graph keeps a tensor constant ({node.target}) whose value a "
                                       "meta capture cannot know; use mode export")
    if captured.constants:
        captured.notes.append(_constants_note(captured.constants))


_CONSTANTS_NOTE = "tensor constants without values (replays draw them at random): "
_NOTED_CONSTANTS = 4  # the first names, sorted, that the note gives


def _constants_note(names: Any) -> str:
    return _CONSTANTS_NOTE + ", ".join(sorted(names)[:_NOTED_CONSTANTS])


def join_notes(parts: list[list[str]]) -> list[str]:
    """The notes one capture of a model's graph kinds gives, from the notes of captures of
    some of them each (aotpipe.pipeline.job's second process, writer.join_parts): each part's notes in
    turn, less those an earlier part has, and the constants note last, once, naming the
    first constants of all the parts (the first names of each part's include them)."""
    out: list[str] = []
    constants: set[str] = set()
    for part in parts:
        earlier = set(out)
        for n in part:
            if n.startswith(_CONSTANTS_NOTE):
                constants.update(n[len(_CONSTANTS_NOTE):].split(", "))
            elif n not in earlier:
                out.append(n)
    return out + ([_constants_note(constants)] if constants else [])

