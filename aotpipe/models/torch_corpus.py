"""Models from torch's own test databases: ``torch-op:NAME`` and ``torch-module:NAME`` sources.

- ``torch-op:NAME``: an entry of ``torch.testing._internal.common_methods_invocations.op_db``
  (an OpInfo). NAME is the OpInfo's ``name``, then ``.`` and its ``variant_test_name`` when it
  has one: ``nn.functional.conv2d``, ``max.reduction_with_dim``.
- ``torch-module:NAME``: an entry of ``torch.testing._internal.common_modules.module_db``
  (a ModuleInfo), by its ``name``: ``nn.Linear``, ``nn.TransformerEncoderLayer``.

``args: {sample: K}`` picks the K-th sample (default 0) of what the entry's sample function
gives on CPU in float32 (``requires_grad=True`` where the entry supports autograd; modules in
training mode). The sample's non-tensor arguments are baked into the model (an op is wrapped
in a small nn.Module; a module gets the sample's constructor arguments); its tensors, nested
ones (a TensorList) flattened in pytree order, become the model's positional example inputs,
each requiring grad where the sample's does. The samples are drawn with torch's and Python's
random generators seeded from the pipeline seed and the source, so the same pipeline gives
the same inputs on any machine with the same torch; the artefact stores them.

Importing torch's test databases takes seconds: this module imports them only when a
source of theirs is used. The databases are fixed tables inside torch: naming an entry
runs no code the artefact chose, so these sources rebuild like the builtin zoo.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
import random
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
import torch.utils._pytree as pytree

from aotpipe.errors import SourceError, exception_line
from aotpipe.runtime.determinism import derived_seed

OP_PREFIX = "torch-op:"
MODULE_PREFIX = "torch-module:"
PREFIXES = (OP_PREFIX, MODULE_PREFIX)
ARGS = ("sample",)  # the only argument these sources take


def is_corpus_source(source: Any) -> bool:
    """Whether `source` names an entry of torch's op or module database (by its form)."""
    return isinstance(source, str) and source.startswith(PREFIXES)


def op_entry_name(op: Any) -> str:
    """The name an OpInfo goes by here: its name, then '.' and its variant_test_name if any."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def op_table() -> dict[str, Any]:
    """op_db by entry name (imports torch's test database: seconds, once per process).

    op_db's random operators (normal, uniform, randn, rrelu, dropout...) call the op through
    ``wrapper_set_seed``, which seeds the global generator with a fixed seed before each call so
    that torch's tests can compare two eager calls. A re-seed inside forward is not part of an
    operator's graph: capture keeps the op and drops the re-seed, and the graph then draws other
    numbers than the eager model it is checked against. Here the op is called as it is, with the
    run's own seeding (aotpipe.runtime.determinism), so eager and graph draw the same numbers."""
    from torch.testing._internal import common_methods_invocations as cmi  # seconds to import: on use only

    cmi.wrapper_set_seed = _without_reseed  # looked up when an op_db lambda is called
    return {op_entry_name(op): op for op in cmi.op_db}


def _without_reseed(op: Any, *args: Any, **kwargs: Any) -> Any:
    """op_db's ``wrapper_set_seed(op, ...)`` less its re-seed: ``op(...)``."""
    return op(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def module_table() -> dict[str, Any]:
    """module_db by ModuleInfo name (imports torch's test database: seconds, once per process)."""
    from torch.testing._internal.common_modules import module_db  # seconds to import: on use only

    return {m.name: m for m in module_db}


def _split(source: str) -> tuple[str, str]:
    kind = "op" if source.startswith(OP_PREFIX) else "module"
    return kind, source[len(OP_PREFIX if kind == "op" else MODULE_PREFIX):]


def entry(source: str) -> tuple[str, Any]:
    """('op' | 'module', the OpInfo or ModuleInfo) a source names; a SourceError naming close
    matches when the database has no such entry."""
    kind, name = _split(source)
    try:
        table = op_table() if kind == "op" else module_table()
    except ImportError as e:  # torch's test databases import expecttest, which plain torch does not install
        raise SourceError(f"{source!r}: torch's test databases need {e.name or 'a module'} ({exception_line(e)}); "
                          "install the extra: pip install 'aotpipe[corpus]' -c constraints.txt") from None
    info = table.get(name)
    if info is None:
        close = difflib.get_close_matches(name, list(table), n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else \
            f"; see tools/torch_corpus.py or pipelines/torch-{kind}s.yaml for every name"
        db = "op_db" if kind == "op" else "module_db"
        raise SourceError(f"{source!r}: torch's {db} has no entry {name!r}{hint}")
    return kind, info


def source_problem(source: str) -> Optional[str]:
    """None when the source names an entry of torch's database, else what is wrong."""
    try:
        entry(source)
    except SourceError as e:
        return str(e)
    return None


def sample_index(args: dict[str, Any]) -> int:
    """The sample `args` asks for (default 0)."""
    return int(args.get("sample", 0))


def args_problem(args: dict[str, Any]) -> Optional[tuple[str, str]]:
    """(argument name, message) when `args` is not {sample: K} with K a non-negative integer."""
    for name, value in args.items():
        if name not in ARGS:
            return name, f"torch-op and torch-module sources take no argument {name!r}; they take: sample"
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return name, f"sample must be a non-negative integer (the sample's index), not {value!r}"
    return None


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's, Python's and numpy's global generators seeded with `seed`, and restored
    afterwards (sample functions draw from all three)."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


@functools.lru_cache(maxsize=8)
def _samples(source: str, seed: int, upto: Optional[int] = None) -> tuple[Any, ...]:
    """The first `upto` samples (all when None) of the source's entry on CPU in float32,
    drawn with `seed`: an op's sample function is a generator, drawn no further than asked
    (the K-th sample is the same however many follow it). Cached: hand them out through
    :func:`_copied`."""
    kind, info = entry(source)
    if torch.float32 not in _cpu_dtypes(kind, info):
        raise SourceError(f"{source!r} does not support float32 on CPU; torch's database lists no such sample")
    try:
        with _seeded(seed), torch.device("cpu"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the sample functions' own deprecation warnings
            if kind == "op":
                # set_seed=False: OpInfo would reseed before each sample, from the name of the unittest
                # method on the stack (another seed under a test runner than here) or a fixed one.
                drawn = info.sample_inputs("cpu", torch.float32, requires_grad=bool(info.supports_autograd),
                                           set_seed=False)
            else:
                drawn = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                                training=True)
            return tuple(itertools.islice(drawn, upto))
    except SourceError:
        raise
    except Exception as e:
        raise SourceError(f"{source!r}: torch's sample function failed: {exception_line(e)}") from None


def _cpu_dtypes(kind: str, info: Any) -> set:
    return set(info.supported_dtypes("cpu")) if kind == "op" else set(info.dtypes)


def inputs_seed(spec: Any) -> int:
    """The seed a spec's samples are drawn with: the pipeline seed and the source, so every
    model naming one entry shares its draw (one sample list per entry, K-th of the same list)."""

    return derived_seed(spec.seed, spec.source, "inputs")


def sample_count(source: str, seed: int) -> int:
    """How many samples the source's entry has (drawn with `seed`)."""
    return len(_samples(source, seed))


def _copied(x: Any) -> Any:
    """A fresh copy of a sample's tensor: same sizes, strides, dtype and values, a leaf that
    requires grad where the sample's tensor does (cached samples are never handed out)."""
    if not isinstance(x, torch.Tensor):
        return x
    t = x.detach()
    if t.layout == torch.strided:
        try:
            out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype).copy_(t)
        except RuntimeError:  # overlapping strides (an expanded tensor): a dense copy
            out = t.clone()
    else:
        out = t.clone()
    if x.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


class TensorSlot:
    """Where one of the model's tensor inputs goes in a sample's call (compared by type: the
    eager checks deep-copy the model, and with it every slot)."""

    def __repr__(self) -> str:
        return "<tensor input>"


class SampleCall(torch.nn.Module):
    """A callable applied to one sample: the sample's tensors are its positional inputs (in
    pytree order of (input, args, kwargs)); its other arguments are baked into `template`,
    a TensorSlot where each tensor goes."""

    def __init__(self, fn: Optional[Callable[..., Any]], template: tuple[tuple, dict],
                 module: Optional[torch.nn.Module] = None):
        super().__init__()
        self.fn = fn if module is None else None  # a module is held (and called) as `module` only
        self.module = module  # the module called (its parameters and buffers are the model's)
        self.template = template

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        args, kwargs = pytree.tree_map(lambda x: next(it) if isinstance(x, TensorSlot) else x, self.template)
        return (self.module or self.fn)(*args, **kwargs)


def _call_parts(kind: str, info: Any, sample: Any) -> tuple[Any, Any]:
    """(args, kwargs) of the call the sample makes (an op's input first)."""
    if kind == "op":
        return (sample.input, *sample.args), dict(sample.kwargs)
    return tuple(sample.forward_input.args), dict(sample.forward_input.kwargs)


def _flatten(args: Any, kwargs: Any) -> tuple[list[torch.Tensor], tuple[tuple, dict]]:
    """The call's tensors in pytree order, and the call with a TensorSlot in place of each."""
    tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    return tensors, pytree.tree_map(lambda x: TensorSlot() if isinstance(x, torch.Tensor) else x, (args, kwargs))


def _sample(spec: Any) -> tuple[str, Any, Any]:
    kind, info = entry(spec.source)
    k = sample_index(spec.args)
    # A module's sample function returns its whole list at once: one cache entry for all of them.
    samples = _samples(spec.source, inputs_seed(spec), k + 1 if kind == "op" else None)
    if k >= len(samples):
        samples = _samples(spec.source, inputs_seed(spec))
        raise SourceError(f"{spec.source!r} has {len(samples)} sample(s) on CPU in float32; "
                          f"use sample: 0 to {len(samples) - 1}")
    return kind, info, samples[k]


def build_model(spec: Any) -> torch.nn.Module:
    """The model a spec's sample calls: the op wrapped with the sample's non-tensor arguments,
    or the module built from the sample's constructor arguments (wrapped only when its
    forward takes more than plain positional tensors)."""
    kind, info, sample = _sample(spec)
    args, kwargs = _call_parts(kind, info, sample)
    _, template = _flatten(args, kwargs)
    if kind == "op":
        return SampleCall(info.op, template)
    ctor = sample.constructor_input
    c_args, c_kwargs = pytree.tree_map(_copied, (tuple(ctor.args), dict(ctor.kwargs)))
    try:
        module = info.module_cls(*c_args, **c_kwargs)
    except Exception as e:
        raise SourceError(f"{spec.source!r} sample {sample_index(spec.args)}: building {info.name} failed: "
                          f"{exception_line(e)}") from None
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return module
    return SampleCall(None, template, module=module)


def example_inputs(spec: Any) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """The sample's tensors, copied, as positional inputs (nested ones flattened)."""
    kind, info, sample = _sample(spec)
    tensors, _ = _flatten(*_call_parts(kind, info, sample))
    return tuple(_copied(t) for t in tensors), {}


def eager_problem(spec: Any) -> Optional[str]:
    """Why the spec's sample cannot be run: its entry lacks float32 on CPU, the sample does
    not exist, or eager fails on it (the model built and called once, in training mode when
    training graphs are asked for); None when it runs."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a module's constructor warnings (nested tensors, deprecations)
            model = build_model(spec)
            args, kwargs = example_inputs(spec)
    except SourceError as e:
        return str(e)
    training = any(k != "inference" for k in spec.graphs)
    try:
        with torch.random.fork_rng(devices=[]), (contextlib.nullcontext() if training else torch.no_grad()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.train(training)(*args, **kwargs)
    except Exception as e:
        return (f"{spec.source!r} sample {sample_index(spec.args)}: eager fails on CPU in float32 "
                f"({exception_line(e, 160)}); pick another sample or remove the model")
    return None


def differentiable(spec: Any) -> bool:
    """Whether eager's output on the sample has a gradient to give (a floating-point output
    with a grad_fn): what training graphs need."""
    model = build_model(spec)
    args, kwargs = example_inputs(spec)
    with torch.random.fork_rng(devices=[]):
        out = model.train()(*args, **kwargs)
    return any(isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
               for t in pytree.tree_leaves(out))
