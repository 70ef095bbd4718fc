"""The backends `aotpipe bench` can run a graph through, by name.

A backend is what ``torch.compile(backend=...)`` takes: ``(GraphModule, example_inputs) ->
callable``. ``eager`` runs the loaded graph as it is (no compile); ``aot_eager`` and
``inductor`` are torch's own; ``inductor-freezing`` is inductor with
``torch._inductor.config.freezing`` on, the graph's parameters and buffers bound to the
module as constants it may fold (inference graphs only); ``module:callable`` is a user's
backend, imported only because the user named it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch._inductor.config as inductor_config
import torch.fx

from aotpipe.errors import AotpipeError

BUILTIN = ("eager", "aot_eager", "inductor", "inductor-freezing")
# Graph kinds a backend can take; the others are left out of a bench with a note.
INFERENCE_ONLY = {"inductor-freezing"}
# Input roles inductor-freezing binds as constants.
FROZEN_ROLES = ("param", "buffer", "constant")


@dataclass(frozen=True)
class Backend:
    """A backend named on the command line: builtin, or "module:callable"."""

    name: str

    @property
    def inference_only(self) -> bool:
        return self.name in INFERENCE_ONLY

    def resolve(self) -> Optional[Callable[..., Any]]:
        """The torch.compile backend callable for a user backend (imported now); None for a builtin."""
        if self.name in BUILTIN:
            return None
        return import_backend(self.name)


def parse_backend(name: str) -> Backend:
    """A Backend for `name`; an unknown name is the user's error, listing the valid ones."""
    if name in BUILTIN or (":" in name and all(name.split(":", 1))):
        return Backend(name)
    raise AotpipeError(f"--backend {name!r} is not a backend; use one of {', '.join(BUILTIN)} "
                       "or module:callable (a torch.compile backend of yours)")


def import_backend(name: str) -> Callable[..., Any]:
    """The callable `module:callable` names; a user error if it cannot be imported or called."""
    module, _, attr = name.partition(":")
    try:
        with _current_folder_importable():
            mod = importlib.import_module(module)
    except Exception as e:
        raise AotpipeError(f"--backend {name!r}: cannot import {module!r} ({type(e).__name__}: {e}); "
                           "is it on PYTHONPATH?") from None
    fn: Any = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise AotpipeError(f"--backend {name!r}: {module!r} has no {attr!r}")
    if not callable(fn):
        raise AotpipeError(f"--backend {name!r}: {attr!r} is a {type(fn).__name__}, not a callable "
                           "(GraphModule, example_inputs) -> callable")
    return fn


@contextlib.contextmanager
def _current_folder_importable() -> Iterator[None]:
    """The current folder on sys.path while a user backend is imported, as it is in the bench's
    workers (started from it): the ``aotpipe`` script's own sys.path starts at its bin folder."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


class _Frozen(torch.nn.Module):
    """A graph with some of its inputs bound as the module's own (frozen) parameters, so that
    inductor's freezing treats them as constants; the others are the call's arguments."""

    def __init__(self, gm: torch.nn.Module, inputs: list[Any], bound: list[int]):
        super().__init__()
        self.gm = gm
        self.n = len(inputs)
        self.bound = bound
        self.free = [i for i in range(len(inputs)) if i not in set(bound)]
        for k, i in enumerate(bound):
            self.register_parameter(f"c{k}", torch.nn.Parameter(inputs[i].detach(), requires_grad=False))

    def forward(self, *free: Any) -> Any:
        args: list[Any] = [None] * self.n
        for k, i in enumerate(self.bound):
            args[i] = getattr(self, f"c{k}")
        for i, v in zip(self.free, free):
            args[i] = v
        return self.gm(*args)


@contextlib.contextmanager
def _freezing() -> Iterator[None]:
    with inductor_config.patch(freezing=True):
        yield


def compile_graph(backend: Backend, gm: torch.nn.Module, inputs: list[Any], roles: list[str],
                  user: Optional[Callable[..., Any]] = None, dynamic: bool = False
                  ) -> tuple[Callable[[list[Any]], Any], list[int]]:
    """(a function of the flat inputs that runs the compiled graph, the inputs it still takes).

    torch.compile compiles on the first call: callers time that call as the compile.
    `roles` are the inputs' roles (inputs.json); inductor-freezing binds the parameters,
    buffers and constants among them. `dynamic` is torch.compile's: False (a bench at the
    captured sizes) compiles every size static; bench --sizes (sizes.py) passes True, and
    marks the dimensions static in the artefact static on the inputs it calls with."""
    if backend.name == "eager":
        fwd = gm.forward if isinstance(gm, torch.fx.GraphModule) else gm
        return _no_grad(fwd), list(range(len(inputs)))
    torch._dynamo.reset()  # one graph's guards and caches do not count against the next
    if backend.name.startswith("inductor"):
        # As torch's own accuracy runners do: random ops call ATen's, so that a graph that
        # draws (dropout) draws what the loaded graph does under the same seed.
        inductor_config.fallback_random = True
    if backend.name == "inductor-freezing":
        bound = [i for i, r in enumerate(roles) if r in FROZEN_ROLES and isinstance(inputs[i], torch.Tensor)]
        module = _Frozen(gm, inputs, bound)
        compiled = torch.compile(module, backend="inductor", dynamic=dynamic)

        def run_frozen(args: list[Any]) -> Any:
            with _freezing(), torch.no_grad():
                return compiled(*args)

        return run_frozen, module.free
    target = user if user is not None else backend.name
    compiled = torch.compile(gm, backend=target, dynamic=dynamic)
    return _no_grad(compiled), list(range(len(inputs)))


def _no_grad(fn: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """`fn` on a list of arguments, without autograd (as the loaded graph is run)."""

    def run(args: list[Any]) -> Any:
        with torch.no_grad():
            return fn(*args)

    return run


def is_compile_error(e: BaseException) -> bool:
    """Whether an exception on the first call of a compiled graph is the compiler's (dynamo or a
    backend failing to compile), rather than the compiled code's failing to run."""
    mod = type(e).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor")) or type(e).__name__ in (
        "BackendCompilerFailed", "InductorError", "LoweringException", "CppCompileError")
