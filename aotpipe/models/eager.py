"""The eager model as the reference graphs are checked against: float32, and float64 on demand.

Runs are reproducible (:func:`aotpipe.runtime.determinism.reproducible`): seeded, so dropout draws
the same masks as the graphs do, and with deterministic kernels. Training runs route
``scaled_dot_product_attention`` through its math backend, as training capture does, so
that eager and graph draw attention dropout from the same ops in the same order. The
float64 model (``model.double()``, floating inputs cast likewise) is built only when a
check needs it: most outputs are settled by the float32 run alone.

Eager takes the branch the trace took where a library branches on whether it is being
traced (:func:`traced_branches`): otherwise eager and graph compute different functions and
the check compares nothing meaningful.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.utils._python_dispatch
import torch.utils._pytree as pytree
from torch.nn.attention import SDPBackend, sdpa_kernel

from aotpipe.errors import exception_line
from aotpipe.format.limits import OpKwargs
from aotpipe.runtime.determinism import RunLog, run_reproducibly
from aotpipe.runtime.global_state import preserved
from aotpipe.runtime.tensors import loss_weights
from aotpipe.spec.modes import DEFAULT_LOSS, LOSSES


class NoLossError(ValueError):
    """The model's output has no floating-point tensor to build a loss from."""


def output_weights(t: torch.Tensor) -> torch.Tensor:
    """The fixed, non-uniform weights of `t`'s elements in the "weighted" loss, in `t`'s dtype
    (tensors.loss_weights: 1 + sum over dimensions d of ((3 i_d + d) mod 7) / 8)."""
    return loss_weights(t.shape, t.dtype, t.device)


def model_loss(out: Any, kind: str = DEFAULT_LOSS) -> torch.Tensor:
    """The training loss capture differentiates, over every floating-point output (and the
    real part of every complex one): the sum
    of its elements weighted by :func:`output_weights` ("weighted", the default), their sum
    ("sum"), or their mean ("mean": the seed of each gradient is 1/numel, as a mean-reduced
    training loss has, and a big vocabulary's logits stay small). Under torch.autocast a
    half-precision output is reduced in float32."""
    if kind not in LOSSES:
        raise ValueError(f"unknown loss {kind!r}; one of {', '.join(LOSSES)}")
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and (t.is_floating_point()
                                                                                      or t.is_complex())]
    if not leaves:
        raise NoLossError("the model has no floating-point output to build a loss from (nor a complex one)")

    def reduce(t: torch.Tensor) -> torch.Tensor:
        if t.dtype in (torch.bfloat16, torch.float16) and torch.is_autocast_enabled(t.device.type):
            t = t.float()  # under autocast (a mixed-precision train_step), the loss in float32, as AMP's recipes
        if t.is_complex():
            # its real part (view_as_real's first component): the loss is real, and its gradient
            # with respect to the output is then the real weights, the tangent a dynamo joint
            # takes for it (tensors.tangent); the imaginary part gets its gradient where it
            # mixes into the real part (an fft, a product of complex numbers)
            t = torch.view_as_real(t.resolve_conj())[..., 0]
        if kind == "weighted":
            return (t * output_weights(t)).sum()
        return t.sum() if kind == "sum" else t.mean()

    loss = reduce(leaves[0])
    for t in leaves[1:]:
        loss = loss + reduce(t)
    return loss


def sum_loss(out: Any) -> torch.Tensor:
    """The sum of every floating-point output (`loss: sum`; tools/hf_zoo.py's eager screen)."""
    return model_loss(out, "sum")


def model_state(model: torch.nn.Module, constants: Optional[dict[str, torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """Parameters, buffers (all names, tied ones too) and lifted constants, detached."""
    out = {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: b.detach() for n, b in model.named_buffers(remove_duplicate=False)})
    out.update({n: c.detach() for n, c in (constants or {}).items()})
    return out


@dataclass
class EagerRun:
    """What one eager run gave: tensor outputs in pytree order, state after, gradients."""

    outputs: list[torch.Tensor]
    state: dict[str, torch.Tensor]
    mutated: list[str]  # buffers and user inputs whose value the run changed
    loss: Optional[torch.Tensor] = None
    grads: dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    nondeterministic: list[str] = field(default_factory=list)
    # the float32 training run: the autograd.Function classes whose own backward its gradient ran
    custom_backwards: list[str] = field(default_factory=list)


def custom_backwards(loss: torch.Tensor) -> list[str]:
    """The torch.autograd.Function subclasses (module.qualname) in `loss`'s autograd graph:
    each has a backward of its own, which autograd runs instead of differentiating its forward."""
    found: list[str] = []
    seen: set[int] = set()
    todo = [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            cls = node._forward_cls  # type: ignore[attr-defined]
            name = f"{cls.__module__}.{cls.__qualname__}"
            if name not in found:
                found.append(name)
        todo.extend(n for n, _ in node.next_functions)
    return found


def _to64(x: Any) -> Any:
    """`x` in float64, or complex128 for a complex tensor; anything else as it is."""
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        # still a leaf that requires grad where `x` was one, so its gradient is kept
        wide = torch.complex128 if x.is_complex() else torch.float64
        return x.detach().to(wide).requires_grad_(x.requires_grad)
    return x


def _model_to64(model: torch.nn.Module) -> torch.nn.Module:
    """``model.double()``, and its complex parameters and buffers in complex128 (which
    ``double()`` leaves in complex64): the reference of a complex output is complex128."""
    model = model.double()
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_complex() and t.dtype != torch.complex128:
                t.data = t.data.to(torch.complex128)
    return model


def nudge(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` with each float32/float64 element moved one ulp up or down (by `gen`); others as they are."""
    if t.dtype not in (torch.float32, torch.float64) or not t.numel():
        return t
    up = torch.rand(t.shape, generator=gen) < 0.5
    inf = torch.tensor(math.inf, dtype=t.dtype)
    return torch.nextafter(t, torch.where(up, inf, -inf))


# transformers' note when the eager run took the branch a trace takes instead of its shortcut.
CAUSAL_MASK_NOTE = ("eager reference built the causal mask as traced graphs do (transformers skips it in eager "
                    "for an all-ones attention mask, which changes the function where attention sets "
                    "is_causal=False)")


@contextlib.contextmanager
def traced_branches(notes: list[str]) -> Any:
    """Eager takes the branches a trace takes where a library decides by the tensors' values:

    - ``transformers.masking_utils._ignore_causal_mask_sdpa``: in eager, for an all-ones (or
      absent) attention mask, transformers returns no mask and relies on SDPA's
      ``is_causal``; traced (export, dynamo) it always builds the mask. Models whose
      attention modules set ``is_causal=False`` (Aimv2's text tower, Gemma with
      bidirectional attention) then attend bidirectionally in eager and causally in the
      graph. Here eager builds the mask too; `notes` says when the shortcut would have fired.

    Nothing is changed unless the library is already imported (a model of it was built).
    """
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "_ignore_causal_mask_sdpa", None)
    if original is None:
        yield
        return

    def as_traced(*args: Any, **kwargs: Any) -> bool:
        if original(*args, **kwargs) and CAUSAL_MASK_NOTE not in notes:
            notes.append(CAUSAL_MASK_NOTE)
        return False

    masking._ignore_causal_mask_sdpa = as_traced
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = original


_IN_PLACE_DRAWS = frozenset(getattr(torch.ops.aten, n).default if hasattr(getattr(torch.ops.aten, n), "default")
                             else getattr(torch.ops.aten, n).float
                             for n in ("uniform_", "normal_", "exponential_", "cauchy_", "log_normal_", "geometric_"))


class Float32Draws(torch.utils._python_dispatch.TorchDispatchMode):
    """While active (the float64 reference run): random numbers are drawn in float32 and cast
    up, so that the float64 model draws exactly the numbers the float32 run draws.

    A float64 draw is another number (53 random bits, not 24) and may take the generator
    another number of steps: a model that draws its own noise (GroupViT's gumbel noise in its
    logits' dtype, Uniform/Normal distributions, dropout masks) would otherwise compute
    another function in float64, and the float64 rule would compare different functions.
    Covered: factory draws given a float64 dtype (rand, randn, normal, ...), *_like draws of
    a float64 tensor, in-place draws into one (uniform_, normal_, bernoulli_, ...),
    native_dropout (its mask drawn as the float32 run draws it, the product kept in float64),
    and other functional draws from float64 parameters (bernoulli(p), normal(mean, std)),
    whose parameters are rounded to float32 as the float32 run has them.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[OpKwargs] = None) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
            return func(*args, **kwargs)
        if func is torch.ops.aten.native_dropout.default and args[0].dtype == torch.float64:
            x, p, train = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("train")
            if not train:
                return func(*args, **kwargs)
            # contiguous, as the CPU kernel makes its mask: the draws fill it in memory order
            keep = torch.empty(x.shape, dtype=torch.float32, device=x.device).bernoulli_(1 - p)
            scale = 1.0 / (1 - p) if p < 1 else 0.0
            return x * keep.to(torch.float64) * scale, keep.bool()
        first = args[0] if args else None
        name = func._schema.name.split("::")[-1]  # rand_like, bernoulli_, ...
        if isinstance(first, torch.Tensor) and first.dtype == torch.float64 and func._schema.is_mutable:
            if func in _IN_PLACE_DRAWS or name == "bernoulli_":
                tmp = torch.empty_like(first, dtype=torch.float32)
                func(tmp, *args[1:], **kwargs)
                first.copy_(tmp)
                return first
            return func(*args, **kwargs)
        if kwargs.get("dtype") == torch.float64:  # rand(size, dtype=float64), normal(..., dtype=...)
            return func(*args, **{**kwargs, "dtype": torch.float32}).to(torch.float64)
        if name.endswith("_like") and isinstance(first, torch.Tensor) and first.dtype == torch.float64 \
                and kwargs.get("dtype") is None:
            return func(torch.empty_like(first, dtype=torch.float32), *args[1:], **kwargs).to(torch.float64)
        if not func._schema.is_mutable and any(isinstance(t, torch.Tensor) and t.dtype == torch.float64
                                               for t in pytree.tree_leaves((args, kwargs))):
            # bernoulli(p), normal(mean, std), poisson(rates), ...: parameters as the float32 run has them
            a, k = pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64
                                   else t, (args, kwargs))
            return pytree.tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32
                                   else t, func(*a, **k))
        return func(*args, **kwargs)


class EagerReference:
    """Eager runs of one model on its example inputs, made once each and only when asked for."""

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict,
                 constants: Optional[dict[str, torch.Tensor]] = None, user_names: Optional[list[str]] = None,
                 loss: str = DEFAULT_LOSS, loss_outputs: Optional[frozenset[int]] = None):
        self.model, self.args, self.kwargs = model, args, kwargs
        self.loss = loss  # the training loss, as capture differentiated it (model_loss)
        # A dynamo subgraph's: the outputs (indices of the output's pytree leaves) its joint
        # takes a tangent for; the others are left out of the loss. AOTAutograd makes an
        # output that views a user input outside the graph (or not: it decides), and then the
        # graph's backward gives no gradient through it (autograd adds that part around a
        # compiled graph). None: every output.
        self.loss_outputs = loss_outputs
        self.constants = constants or {}
        self.user_names = user_names or []  # names of the (args, kwargs) leaves: user-input mutations
        self._runs: dict[tuple[str, bool, int], Optional[EagerRun]] = {}
        self.errors: dict[tuple[str, bool], str] = {}
        self.notes: list[str] = []  # where eager was made to take the traced branch (traced_branches)

    def run(self, mode: str, fp64: bool = False, nudged: int = 0) -> Optional[EagerRun]:
        """The `mode` ("inference" or "training") run, in float64 if `fp64`; None if it failed.
        `nudged` k > 0: a float32 run on inputs, parameters and buffers each moved by one ulp, up or
        down as a generator seeded with k draws: another sample of eager's rounding noise
        (accuracy.eager_error)."""
        key = (mode, fp64, nudged)
        if key not in self._runs:
            try:
                self._runs[key] = self._run(mode, fp64, nudged)
            except Exception as e:  # a model that cannot run in float64, say: the check says so
                self._runs[key] = None
                self.errors[(mode, f"nudged {nudged}") if nudged else (mode, fp64)] = exception_line(e)
        return self._runs[key]

    def _run(self, mode: str, fp64: bool, nudged: int = 0) -> EagerRun:
        model = copy.deepcopy(self.model)
        args, kwargs = copy.deepcopy((self.args, self.kwargs))  # a model may mutate its inputs
        constants = dict(self.constants)
        if fp64:
            model = _model_to64(model)
            args, kwargs = pytree.tree_map(_to64, (args, kwargs))
            constants = {k: _to64(v) for k, v in constants.items()}
        elif nudged:
            gen = torch.Generator().manual_seed(nudged)
            with torch.no_grad():
                for t in [*model.parameters(), *model.buffers(), *pytree.tree_leaves((args, kwargs))]:
                    if isinstance(t, torch.Tensor):
                        t.data.copy_(nudge(t.data, gen))
        before = {n: b.detach().clone() for n, b in model.named_buffers(remove_duplicate=False)}
        users = {n: t for n, t in zip(self.user_names, pytree.tree_leaves((args, kwargs))) if isinstance(t, torch.Tensor)}
        before.update({n: t.detach().clone() for n, t in users.items() if n not in before})
        training = mode == "training"
        model.train(training)
        log = RunLog()
        pristine = copy.deepcopy((args, kwargs)) if self.user_names else None
        functions: list[str] = []

        def run() -> tuple[Any, Optional[torch.Tensor]]:
            if pristine is not None:  # a repeated attempt starts from unmutated inputs
                for dst, src in zip(pytree.tree_leaves((args, kwargs)), pytree.tree_leaves(pristine)):
                    if isinstance(dst, torch.Tensor):
                        dst.data.copy_(src)
            with contextlib.ExitStack() as stack:
                stack.enter_context(traced_branches(self.notes))
                if fp64:
                    stack.enter_context(Float32Draws())
                if training:
                    stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
                    model.zero_grad(set_to_none=True)
                    for t in users.values():
                        t.grad = None
                    out = model(*args, **kwargs)
                    loss = model_loss(_only(out, self.loss_outputs), self.loss)
                    if not fp64 and not nudged:  # the same Functions in every run: list them once
                        functions[:] = custom_backwards(loss)
                    loss.backward()
                    return out, loss
                stack.enter_context(torch.no_grad())
                return model(*args, **kwargs), None

        out, loss = run_reproducibly(run, log=log)
        outputs = [t.detach() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        state = {**{n: t.detach() for n, t in users.items()}, **model_state(model, constants)}
        mutated = [n for n, b in [*model.named_buffers(remove_duplicate=False), *users.items()]
                   if n in before and not _same(before[n], b)]
        grads = {n: (p.grad.detach() if p.grad is not None else None)
                 for n, p in model.named_parameters(remove_duplicate=False)} if training else {}
        if training:  # user inputs that require grad (a dynamo subgraph's activations) have one too
            grads.update({n: (t.grad.detach() if t.grad is not None else None)
                          for n, t in users.items() if t.requires_grad and n not in grads})
        return EagerRun(outputs, state, mutated, loss.detach() if loss is not None else None, grads,
                        log.nondeterministic, functions)


def _only(out: Any, indices: Optional[frozenset[int]]) -> Any:
    """The leaves of `out` at `indices` (all of `out` for None)."""
    return out if indices is None else [t for i, t in enumerate(pytree.tree_leaves(out)) if i in indices]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


class SubgraphReference:
    """The reference of one dynamo subgraph: its own dynamo graph run eagerly, per mode.

    The inference and training graphs of a subgraph come from two compiles (eval and no
    grad, train), each with its own dynamo graph and inputs: one EagerReference each, with
    the interface the checks use (``run`` and ``errors``).
    """

    def __init__(self, by_mode: dict[str, EagerReference]):
        self.by_mode = by_mode

    def run(self, mode: str, fp64: bool = False, nudged: int = 0) -> Optional[EagerRun]:
        ref = self.by_mode.get(mode)
        return ref.run(mode, fp64, nudged) if ref is not None else None

    @property
    def errors(self) -> dict[tuple[str, bool], str]:
        out = {(mode, fp64): f"no {mode} dynamo graph for this subgraph"
               for mode in ("inference", "training") if mode not in self.by_mode for fp64 in (False, True)}
        for ref in self.by_mode.values():
            out.update(ref.errors)
        return out



# ---------------------------------------------------------------------------------------
# the example inputs, tried eagerly before capture


class _FailingCall(torch.overrides.TorchFunctionMode):
    """Records the torch function (F.linear, torch.cat, Tensor.view, ...) whose call raised,
    with its arguments: the innermost call to raise, as torch functions see it."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: Optional[tuple[Any, tuple, dict]] = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except Exception:
            if self.failed is None:
                self.failed = (func, args, kwargs)
            raise


def _func_name(func: Any) -> str:
    """`func` as a user knows it: F.linear, torch.cat, Tensor.view."""
    try:
        name = torch.overrides.resolve_name(func) or getattr(func, "__name__", str(func))
    except Exception:
        name = getattr(func, "__name__", str(func))
    return name.replace("torch.nn.functional.", "F.").replace("torch.Tensor.", "Tensor.")


def _compute_dtype(model: torch.nn.Module) -> Optional[torch.dtype]:
    """The floating dtype of the model's parameters (or buffers), if it has one."""
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point():
            return t.dtype
    return None


def _shape_fix(func: Any, args: tuple, kwargs: OpKwargs, x: torch.Tensor) -> str:
    """What shape `func` wants of its input `x`, where a known op says it by its weight."""
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    name = getattr(func, "__name__", "")
    if isinstance(weight, torch.Tensor) and name == "linear" and weight.dim() == 2:
        return f"its last size must be {weight.shape[1]} (the layer's in_features)"
    if isinstance(weight, torch.Tensor) and name.startswith("conv") and weight.dim() >= 3:
        spatial = weight.dim() - 2
        groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
        channels = weight.shape[1] * (groups if isinstance(groups, int) else 1)
        if name.startswith("conv_transpose"):
            channels = weight.shape[0]
        return (f"it must be [N, {channels}, {', '.join('*' * spatial)}] (or unbatched [{channels}, "
                f"{', '.join('*' * spatial)}]) for this {spatial}-d convolution")
    if name == "embedding" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        rows = weight.shape[0]
        if x.is_floating_point():
            return f"it must be an integer tensor of indices (dtype: int64, high: {rows})"
        return f"its values must lie in [0, {rows}), the table's rows: set high: {rows} or less"
    return "give it the shape and dtype the model expects"


def layout_problem(model: torch.nn.Module, args: tuple, kwargs: dict, names: list[str]) -> Optional[str]:
    """One line when an example input, parameter or buffer is not a strided (dense) tensor, else None.

    aotpipe captures, writes and checks strided tensors only. A sparse input is refused here,
    before capture: in torch 2.13 `ExportedProgram.run_decompositions` on a program with a
    sparse CSR input that needs grad aborts the whole process (a C++ terminate in
    functionalization, "layout_impl is only implemented for TensorImpl subclasses"), which no
    Python handler can turn into an error (benchmarks/torch_repros/).
    """
    leaves = pytree.tree_leaves((args, kwargs))
    for i, t in enumerate(leaves):
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:
            name = names[i] if i < len(names) else f"input {i}"
            return (f"input '{name}' is a {str(t.layout).removeprefix('torch.')} tensor: aotpipe captures dense "
                    "(strided) tensors only (torch.export's decompositions abort the process on a sparse input "
                    "that needs grad); pass it as .to_dense(), or leave this model out")
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            if t.layout != torch.strided:
                return (f"{kind} '{name}' is a {str(t.layout).removeprefix('torch.')} tensor: aotpipe captures "
                        "dense (strided) tensors only; make it dense (.to_dense()), or leave this model out")
    return None


def input_problem(model: torch.nn.Module, args: tuple, kwargs: dict, names: list[str]) -> Optional[str]:
    """None when the model runs (eval mode, no grad) on its example inputs; else one line that
    names the input at fault where one is, with what would fix it.

    Capture traces the model on these inputs, so a wrong dtype or shape otherwise shows up as
    a torch tracing error, or, where tracing lets it through, as a written graph that does not
    run. An input is at fault for its dtype when the same run with it cast to the model's own
    floating dtype works; for its shape when the torch call that raised was given it. The
    model's state, its inputs and the RNG are as before.

    `names` are the example inputs' names, in (args, kwargs) leaf order.
    """
    if any(torch.nn.parameter.is_lazy(p) for p in model.parameters()):
        return None  # capture materialises lazy modules itself, and says so
    # clones: a model may change its inputs in place, and capture needs them as they are
    originals, spec = pytree.tree_flatten((args, kwargs))
    leaves = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in originals]
    args, kwargs = pytree.tree_unflatten(leaves, spec)
    named = {i: n for i, n in enumerate(names)}
    first = _try_run(model, args, kwargs)
    if first is None:
        return None
    error, failing, module = first
    said = f"{_func_name(failing[0])}: {error}" if failing is not None else error
    if module is not None:
        said = f"in {module[0]} ({type(module[1]).__name__}), {said}"
    at_fault = [i for i, t in enumerate(leaves) if failing is not None and isinstance(t, torch.Tensor)
                and _reaches(failing[1:], leaves, i)]
    if not at_fault and module is not None:  # a module's own check (BatchNorm's rank) on an example input
        at_fault = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and _reaches((module[2], {}), leaves, i)]
    compute = _compute_dtype(model)
    if compute is not None:
        candidates = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.dtype != compute
                      and t.dtype != torch.bool and (t.is_floating_point() or i in at_fault)]
        for i in candidates[:4]:
            cast = [t.detach().to(compute) if j == i else t.detach().clone() if isinstance(t, torch.Tensor) else t
                    for j, t in enumerate(originals)]
            a, k = pytree.tree_unflatten(cast, spec)
            if _try_run(model, a, k) is None:
                was = str(leaves[i].dtype).removeprefix("torch.")
                want = str(compute).removeprefix("torch.")
                return (f"input {named.get(i, i)!r} is {was}, but the model computes in {want} ({said}); "
                        f"set its dtype: {want}")
    if at_fault:
        i = at_fault[0]
        t = leaves[i]
        fix = _shape_fix(failing[0], failing[1], failing[2], t) if failing is not None else \
            "give it the shape and dtype the model expects"
        return (f"input {named.get(i, i)!r} (shape {list(t.shape)}, {str(t.dtype).removeprefix('torch.')}) does "
                f"not fit the model: {said}; {fix}")
    rank = re.search(r"expected (\d+)D input \(got (\d+)D input\)", error)  # torch's words for a rank check
    if rank is not None:
        want, got = int(rank.group(1)), int(rank.group(2))
        same = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.dim() == got]
        if len(same) == 1:
            i, shape = same[0], list(leaves[same[0]].shape)
            fix = f"add the batch dimension: shape {[1] + shape}" if want == got + 1 else f"give it {want} dimensions"
            return f"input {named.get(i, i)!r} has {got} dimensions (shape {shape}), where {want} are wanted ({said}); {fix}"
    return (f"the model does not run on its example inputs ({said}); check the inputs' shapes and dtypes against "
            "what its forward expects")


def _reaches(call_args: tuple[tuple, dict], leaves: list[Any], i: int) -> bool:
    """Whether example input `i` (or a view of it) is among the (args, kwargs) of a call."""
    target = leaves[i]
    for a in pytree.tree_leaves(call_args):
        while isinstance(a, torch.Tensor):
            if a is target:
                return True
            a = a._base
    return False


_MISSING = object()


def _try_run(model: torch.nn.Module, args: tuple, kwargs: dict) -> Optional[tuple[str, Optional[tuple], Optional[tuple]]]:
    """None if the model runs on (args, kwargs) in eval mode without grad; else (the error in one
    line, the failing torch call if one was seen, the innermost module running when it raised
    as (name, module, its positional args)). The model is left as it was: each module's
    train/eval mode and other attributes (a flag set, a cache added), its parameters and
    buffers (changed in place or replaced), the RNG. A model may change its own weights in an
    eval forward (RWKV rescales two weights per block and sets `layers_are_rescaled`): left
    so, capture would trace another model than the one eager checks it against. The
    parameters are copied for that (the float64 reference costs a float64 copy of them
    later)."""
    attrs = [(m, dict(vars(m))) for m in model.modules()]  # `training` among them
    buffers: dict[str, tuple[torch.nn.Module, str, torch.Tensor, int, torch.Tensor | None]] = {}
    for name, b in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        owner, _, leaf = name.rpartition(".")
        buffers[name] = (model.get_submodule(owner), leaf, b, b._version, None if b.is_meta else b.detach().clone())
    recorder = _FailingCall()
    entered: list[tuple[str, torch.nn.Module, tuple]] = []  # modules whose forward has not returned

    def enter(name: str) -> Callable[..., None]:
        def pre(m: torch.nn.Module, a: tuple) -> None:
            entered.append((name, m, a))
        return pre

    def leave(m: torch.nn.Module, a: tuple, out: Any) -> None:
        if entered and entered[-1][1] is m:
            entered.pop()

    hooks = [h for name, m in model.named_modules() if name
             for h in (m.register_forward_pre_hook(enter(name)), m.register_forward_hook(leave))]
    try:
        with preserved(), torch.no_grad():
            model.eval()
            try:
                with recorder:
                    model(*args, **kwargs)
                return None
            except Exception as e:
                failed = exception_line(e), recorder.failed, entered[-1] if entered else None
            for h in hooks:
                h.remove()
            # again without the recorder: a torch function mode changes what some code does
            # (torch.cond runs eagerly through torch.compile, which refuses an active mode)
            model(*args, **kwargs)
            return None
    except Exception:
        return failed
    finally:
        for h in hooks:
            h.remove()
        for m, before in attrs:  # the same objects back (the _parameters and _buffers dicts among them)
            for key in [k for k in vars(m) if k not in before]:
                delattr(m, key)
            for key, value in before.items():
                if vars(m).get(key, _MISSING) is not value:
                    vars(m)[key] = value
        with torch.no_grad():
            for module, leaf, b, version, saved in buffers.values():
                where = module._parameters if isinstance(b, torch.nn.Parameter) and leaf in module._parameters \
                    else module._buffers
                if where.get(leaf) is not b:
                    where[leaf] = b
                if b._version != version and saved is not None:
                    b.copy_(saved)
