"""A whole training step as one functional graph: forward, loss, backward, clipping and the
optimizer's update (graph kind ``train_step``).

How it is traced, and why so. torch.export cannot capture a backward, and dynamo over
``loss.backward(); opt.step()`` breaks the graph at ``backward``. AOTAutograd's joint graph,
which the capture already has and checks, computes the loss and every gradient; the step
is that joint followed by the torch optimizer's own ``step()``, traced together by
``make_fx`` over ``functionalize`` (AOTAutograd's own machinery), so that:

- the gradients inside the step are the joint's, op for op (the checks compare them with
  the backward graph's);
- the update is torch's code for the optimizer, not a rewrite of it: the class and
  arguments of the pipeline's ``optimizer:`` (foreach and fused kernels included), traced
  as torch.compile traces an optimizer (``torch.compiler`` says it is compiling while the
  optimizer steps: its step count stays a tensor, not a Python float baked into the graph);
- nothing is written in place at the boundary: parameters, buffers and state come in and
  their new values go out (functionalize turns the optimizer's in-place updates into
  functional ops), so a backend can run the graph twice in a row and chain steps.

The trace runs on real tensors (the step is run once while traced): sizes a model computes
from values are then the example's, as the training graphs' are (capture/unbacked.py).
The profiler's record_function markers torch puts around ``step()`` are left out of the
graph. A capture with named dims (symbolic sizes) is refused by the config: the step is
traced at the example sizes only.

Inputs, in order: parameters (role param), buffers (buffer), lifted constants (constant),
the optimizer state (role state, target ``<parameter>:<key>``), the user inputs (user).
Outputs: the loss (user), each parameter's new value (param), each buffer the step
changes (mutation), each state entry's new value (state), each parameter's gradient as
backward gave it, before clipping (grad).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from aotpipe.errors import CaptureError, exception_line
from aotpipe.format.ir import CapturedGraph, CapturedGraphs, GraphInput, GraphOutput, TensorMeta
from aotpipe.format.limits import OpKwargs
from aotpipe.format.vocabulary import GraphKind
from aotpipe.models.train_step import CASTS, LR_TARGET, StepStart, lr_schedule, make_optimizer, state_target, warm_start
from aotpipe.runtime.global_state import preserved
from aotpipe.runtime.tensors import tangent
from aotpipe.spec.optim import LR_RANGE, STATE_RANGES, OptimizerSpec

_PROFILER_MARKS = ("profiler._record_function_enter_new", "profiler._record_function_exit")


@dataclasses.dataclass
class TrainStep:
    """A captured train_step graph and its real inputs (the warm start's values)."""

    graph: CapturedGraph
    inputs: list[Any]


def capture_train_step(joint: CapturedGraph, start: StepStart, constants: dict[str, torch.Tensor],
                       user: dict[str, Any], spec: OptimizerSpec) -> TrainStep:
    """The train_step graph of a model whose joint graph is `joint` (export's: primals, then
    one tangent for the loss), starting from `start` (models.train_step.warm_start), its
    lifted `constants` and user inputs `user` by name, updating with the optimizer `spec`."""
    primals = [gi for gi in joint.inputs if gi.role != "tangent"]
    tangents = [gi for gi in joint.inputs if gi.role == "tangent"]
    if any(gi.meta is None for gi in tangents) or any(gi.role not in ("param", "buffer", "constant", "user")
                                                     for gi in primals):
        raise CaptureError("train_step: the joint graph takes inputs other than parameters, buffers, constants, "
                           "user inputs and tangents; a train step is made from export's joint only")
    params = [gi for gi in primals if gi.role == "param"]
    missing = [gi.target for gi in params if gi.target not in start.params]
    if missing:
        raise CaptureError(f"train_step: the joint graph's parameter(s) {', '.join(map(str, missing[:3]))} are not "
                           "the model's")
    # A tied parameter is one input of the joint, its gradient output named by any of its names
    # (export names the one it kept): found by the tensor's every name.
    aliases: dict[int, list[str]] = {}
    for n, p in start.model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    names_of = {n: ns for ns in aliases.values() for n in ns}
    grad_of = {o.target: o.index for o in joint.outputs if o.role == "grad"}
    grad_at: dict[str, int] = {}
    for gi in params:
        found = [grad_of[a] for a in names_of.get(str(gi.target), [str(gi.target)]) if a in grad_of]
        if found:
            grad_at[str(gi.target)] = found[0]
    new_buffer_at = {o.target: o.index for o in joint.outputs if o.role == "mutation"}
    loss_at = next((o.index for o in joint.outputs if o.role == "user"), None)
    if loss_at is None:
        raise CaptureError("train_step: the joint graph has no loss output")
    names = [str(gi.target) for gi in params]
    keys = [sorted(start.state.get(n, {})) for n in names]
    joint_gm = joint.gm

    def step(param_values: list[torch.Tensor], rest: list[Any], states: list[list[torch.Tensor]],
             lr: list[torch.Tensor]) -> tuple[list[Any], ...]:
        values = iter(param_values)
        others = iter(rest)
        flat = [next(values) if gi.role == "param" else next(others) for gi in primals]
        flat += [tangent(gi.meta.shape, gi.meta.stride, gi.meta.dtype) for gi in tangents if gi.meta is not None]
        outs = joint_gm(*flat)
        new_params = [p.clone() for p in param_values]
        opt = make_optimizer(new_params, spec)
        for group in opt.param_groups:  # a scheduled learning rate: the step's input (role lr)
            if lr:
                group["lr"] = lr[0]
        grads: list[Any] = []
        for p, name, k, st in zip(new_params, names, keys, states, strict=False):
            g = outs[grad_at[name]] if name in grad_at else None
            p.grad = g.clone() if g is not None else None
            grads.append(g)
            if k:
                opt.state[p] = {key: t.clone() for key, t in zip(k, st, strict=False)}
        # torch.compile's path: the step count a tensor; a tensor where an op takes a number, and
        # foreach calls, rewritten (_TensorScalars)
        with torch.compiler._compile_session_context(), _TensorScalars():
            if spec.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([p for p in new_params if p.grad is not None], spec.clip_grad_norm)
            opt.step()
        new_states = [[opt.state[p][key] for key in k] for p, k in zip(new_params, keys, strict=False)]
        new_buffers = [outs[i] for i in new_buffer_at.values()]
        return [outs[loss_at]], new_params, new_buffers, new_states, [g for g in grads if g is not None]

    param_values = [start.params[n] for n in names]
    rest = [_value(gi, start, constants, user) for gi in primals if gi.role != "param"]
    states = [[start.state[n][key] for key in k] for n, k in zip(names, keys, strict=False)]
    rates = lr_schedule(spec, spec.warmup_steps + 1)
    # float64: the rate as the Python number eager's scheduler sets (the ops cast it as they cast that)
    lr = [torch.tensor(rates[-1], dtype=torch.float64)] if rates is not None else []
    try:
        with preserved():
            gm = make_fx(functionalize(step, remove="mutations_and_views"), tracing_mode="real",
                         decomposition_table=cast(Any, core_aten_decompositions()))(param_values, rest, states, lr)
    except CaptureError:
        raise
    except Exception as e:
        raise CaptureError(f"train_step: tracing the step failed: {exception_line(e)}") from e
    # flat placeholders, as every graph the writer takes (make_fx keeps the step's nested lists),
    # in a plain GraphModule (make_fx names its class after the function traced)
    gm.graph.set_codegen(torch.fx.graph.CodeGen())
    gm = torch.fx.GraphModule(gm, gm.graph)
    _drop_profiler_marks(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    described = [gi for gi in primals if gi.role == "param"] + [gi for gi in primals if gi.role != "param"]
    described += [GraphInput("", "state", state_target(n, k), TensorMeta.of(start.state[n][k]),
                             int_range=STATE_RANGES.get(k)) for n, ks in zip(names, keys, strict=True) for k in ks]
    described += [GraphInput("", "lr", LR_TARGET, TensorMeta.of(t), int_range=LR_RANGE) for t in lr]
    if len(described) != len(placeholders):
        raise CaptureError(f"train_step: the traced step has {len(placeholders)} inputs, {len(described)} described")
    _name_placeholders(gm, placeholders, described)
    inputs = [dataclasses.replace(gi, name=node.name) for node, gi in zip(placeholders, described, strict=True)]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    roles = ([("user", "loss")] + [("param", n) for n in names] + [("mutation", t) for t in new_buffer_at]
             + [("state", state_target(n, k)) for n, ks in zip(names, keys, strict=False) for k in ks]
             + [("grad", n) for n in names if n in grad_at and joint_outputs_value(joint, grad_at[n])])
    flat_out = list(out_node.args[0])
    if len(flat_out) != len(roles):
        raise CaptureError(f"train_step: the traced step has {len(flat_out)} outputs, {len(roles)} described")
    outputs = [GraphOutput(i, role, target, TensorMeta.of(a.meta["val"]) if isinstance(a, torch.fx.Node)
                           and isinstance(a.meta.get("val"), torch.Tensor) else None)
               for i, ((role, target), a) in enumerate(zip(roles, flat_out, strict=False))]
    graph = CapturedGraph(GraphKind.TRAIN_STEP, gm, inputs, outputs)
    values = [*param_values, *rest, *[t for st in states for t in st], *lr]
    return TrainStep(graph, values)


class _TensorScalars(torch.overrides.TorchFunctionMode):
    """What the optimizer (and clip_grad_norm_) call while the step is traced, made traceable
    and loadable:

    - under torch.compile's path the step count (and so Adam's step size, Adagrad's learning
      rate) is a 0-d tensor where ``addcdiv_(..., value=)``, ``addcmul_`` and
      ``add_(..., alpha=)`` take a Python number, which would read the tensor's value
      (``.item()``) into the graph as a constant; as dynamo does for these
      (torch/_dynamo/variables/torch.py, handle_addcdiv), such a call is computed from its
      parts instead: ``self + t1 / t2 * value``, written back in place for the in-place forms;
    - a ``torch._foreach_<op>`` call (foreach: true, and clip_grad_norm_'s norms) is made as
      the per-tensor ``<op>`` calls it stands for, in list order: the loader admits no
      ``_foreach_`` op (artifact/ops.py: optimiser-specific), and torch's CPU foreach kernels
      are loops over the same per-tensor ops. A list argument gives each call its element;
      anything else is given to every call.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name.startswith("_foreach_"):
            return _per_tensor(name, args, dict(kwargs or {}))
        return _scalar_tensors(func, args, dict(kwargs or {}))


# The ops whose `value=` scales a combination of two tensors: the combination.
_SCALED: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "addcdiv": lambda a, b: a / b, "addcmul": lambda a, b: a * b}


def _scalar_tensors(func: Any, args: tuple, kwargs: OpKwargs) -> Any:
    """`func(*args, **kwargs)`, a tensor `value=` or `alpha=` computed from the parts (_TensorScalars)."""
    name = getattr(func, "__name__", "")
    base = name.rstrip("_")
    in_place = name.endswith("_") and not name.startswith("_")
    if base in _SCALED and isinstance(kwargs.get("value"), torch.Tensor) and len(args) == 3:
        out = args[0] + _SCALED[base](args[1], args[2]) * kwargs.pop("value")
    elif base in ("add", "sub") and isinstance(kwargs.get("alpha"), torch.Tensor) and len(args) == 2:
        scaled = args[1] * kwargs.pop("alpha")
        out = args[0] + scaled if base == "add" else args[0] - scaled
    else:
        return func(*args, **kwargs)
    return args[0].copy_(out) if in_place else out


def _per_tensor(name: str, args: tuple, kwargs: OpKwargs) -> Any:
    """A ``torch._foreach_<op>[_]`` call as the per-tensor calls it stands for (_TensorScalars)."""
    op = name.removeprefix("_foreach_")
    in_place = op.endswith("_")
    op = op.rstrip("_")
    lists = [a for a in args if isinstance(a, (list, tuple))]
    n = len(lists[0]) if lists else 0
    if op in ("addcdiv", "addcmul") and len(args) == 4:  # the scale(s): value=, a list, or one tensor of them
        scales = args[3]
        if isinstance(scales, torch.Tensor) and scales.dim() == 1:
            scales = list(scales.unbind(0))
        args, kwargs = args[:3], {**kwargs, "value": scales}
    if op == "norm":  # _foreach_norm(tensors, ord=2, dtype=None): each a vector norm
        ord_ = args[1] if len(args) > 1 else kwargs.pop("ord", 2)
        return [torch.linalg.vector_norm(t, ord_, **kwargs) for t in args[0]]
    if isinstance(args[0], (int, float)) and op == "pow":  # _foreach_pow(scalar, exponents)
        return [torch.pow(args[0], e) for e in args[1]]
    method = getattr(torch.Tensor, op + "_", None) if in_place else None  # maximum_ has none: written back
    fn = method if method is not None else getattr(torch, op)
    out = []
    for i in range(n):
        def pick(a: Any, i: int = i) -> Any:
            return a[i] if isinstance(a, (list, tuple)) else a
        value = _scalar_tensors(fn, tuple(pick(a) for a in args), {k: pick(v) for k, v in kwargs.items()})
        if in_place and method is None:
            args[0][i].copy_(value)
        out.append(value)
    return args[0] if in_place else out  # torch's in-place foreach calls return their first list


_PREFIX = {"param": "p_", "buffer": "b_", "constant": "c_", "state": "s_", "user": "", "lr": ""}


def _name_placeholders(gm: torch.fx.GraphModule, placeholders: list[torch.fx.Node],
                       described: list[GraphInput]) -> None:
    """Name each input after what it is (``p_layers_0_weight``, ``s_layers_0_weight_exp_avg``,
    the user input's name), as torch.export names a program's, not make_fx's ``states_17``."""
    taken = {n.name for n in gm.graph.nodes if n.op != "placeholder"}
    for node, gi in zip(placeholders, described, strict=True):
        base = re.sub(r"\W", "_", _PREFIX.get(gi.role, "") + str(gi.target)) or "arg"
        base = base if base[0].isalpha() or base[0] == "_" else f"_{base}"
        name, k = base, 1
        while name in taken or keyword.iskeyword(name):
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        node.name = node.target = name
    gm.recompile()


def joint_outputs_value(joint: CapturedGraph, index: int) -> bool:
    """Whether the joint's output `index` is a tensor (a parameter with no gradient gives None)."""
    return joint.outputs[index].meta is not None


def _value(gi: GraphInput, start: StepStart, constants: dict[str, torch.Tensor], user: dict[str, Any]) -> Any:
    if gi.role == "buffer":
        return start.buffers[str(gi.target)]
    if gi.role == "constant":
        return constants[str(gi.target)]
    return user[str(gi.target)]


def _lowered(gm: torch.fx.GraphModule, dtype: str) -> str:
    """What autocast made of a step: how many of its ops compute in `dtype`, and which kinds."""
    want = getattr(torch, dtype)
    ops = [n for n in gm.graph.nodes if n.op == "call_function"
           and getattr(n.target, "__name__", "").split(".")[0] not in CASTS]  # as LoweredOps counts them
    low = [n for n in ops if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dtype == want]
    kinds = sorted({getattr(n.target, "__name__", str(n.target)).split(".")[0] for n in low})
    if not low:
        return f"no op of the step computes in {dtype} (the model has none that autocast lowers)"
    shown = ", ".join(kinds[:8]) + (" ..." if len(kinds) > 8 else "")
    return f"{len(low)} of the step's {len(ops)} ops compute in {dtype} ({shown})"


def _drop_profiler_marks(gm: torch.fx.GraphModule) -> None:
    """Take out the record_function markers torch's Optimizer.step puts around the update
    (profiler ops with effects: kept by dead-code elimination, and no backend's business)."""
    marks = [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(_PROFILER_MARKS)]
    for node in reversed(marks):  # the exits first: they take the enter's handle
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def add_train_step(captured: CapturedGraphs, model: torch.nn.Module, args: tuple, kwargs: dict, loss: str,
                   spec: OptimizerSpec, user: dict[str, Any], keep_joint: bool) -> list[Any]:
    """Capture the train_step graph of a model export captured (with its joint graph) into
    `captured`, under key train_step; its real inputs. The joint is dropped after unless
    `keep_joint` (the pipeline asked for it too)."""
    if captured.mode != "export" or captured.subgraphs:
        why = f" (export failed: {captured.fallback})" if captured.fallback else ""
        raise CaptureError(f"train_step: a train step is made from export's joint graph, and this model was captured "
                           f"by {captured.mode}{why}; use mode export, or leave train_step out of graphs")
    if not any(p.requires_grad for p in model.parameters()):
        raise CaptureError(f"train_step: {type(model).__name__} has no parameter for the optimizer to update (torch: "
                           "optimizer got an empty parameter list); leave train_step out of graphs")
    joint = captured.graphs.get(GraphKind.JOINT) if spec.autocast is None else captured.step_joint
    if joint is None:
        under = f" under autocast {spec.autocast}" if spec.autocast is not None else ""
        raise CaptureError(f"train_step: the capture made no joint graph{under} to build the step from")
    start = warm_start(model, args, kwargs, loss, spec)
    made = capture_train_step(joint, start, captured.constants, user, spec)
    if spec.autocast is not None:
        captured.notes.append(f"train_step: autocast {spec.autocast}: {_lowered(made.graph.gm, spec.autocast)}; "
                              "its gradients are checked against eager's under autocast, not against the float32 "
                              "backward graph's")
    captured.graphs[GraphKind.TRAIN_STEP] = made.graph
    captured.inputs[GraphKind.TRAIN_STEP] = made.inputs
    if not keep_joint:
        del captured.graphs[GraphKind.JOINT]
    captured.notes.append(f"train_step: {spec.describe()}; the warm-up loss {start.losses[-1]:.6g}")
    captured.step_start = start
    return made.inputs
