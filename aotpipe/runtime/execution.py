"""Running a graph: plainly, or node by node keeping a summary of every node's value.

Both run under :func:`aotpipe.runtime.determinism.reproducible` (seeded generator for graphs that
draw random numbers, deterministic kernels) and without autograd, and restore the caller's
generator state and settings afterwards.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.fx

from aotpipe.runtime.determinism import RunLog, draws_random, run_reproducibly
from aotpipe.runtime.global_state import preserved

# gm.meta key: what makes a graph ready to run on given inputs, as (module, inputs) -> module.
# The loader puts its fake-tensor check there on every graph it builds from an artefact
# (artifact/precheck.py), so that every run here goes through it; capture's own graphs have none.
RUN_GUARD = "aotpipe_run_guard"


def runnable(module: Any, inputs: list[Any]) -> Any:
    """What to run for `module` on `inputs`: the module as its run guard makes it, else itself."""
    guard = module.meta.get(RUN_GUARD) if isinstance(module, torch.fx.GraphModule) else None
    return module if guard is None else guard(module, inputs)


def _seeds(module: torch.nn.Module) -> bool:
    if not isinstance(module, torch.fx.GraphModule):
        return True  # imported module.py: cannot tell, seed to be safe
    cached = module.__dict__.get("_aotpipe_draws_random")
    if cached is None:
        cached = module.__dict__["_aotpipe_draws_random"] = draws_random(module)
    return cached


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_graph(module: torch.nn.Module, inputs: list[Any], log: Optional[RunLog] = None) -> list[Any]:
    """Run a graph on flat inputs (seeded as at capture, deterministic kernels); outputs as a list."""
    # A GraphModule's forward directly: its __call__ wrapper prints the generated code and a
    # traceback to stderr when the graph raises, though the caller reports the error itself.
    # A graph from an artefact: propagated on fake tensors first, run with checked forms.
    module = runnable(module, inputs)
    fn = module.forward if isinstance(module, torch.fx.GraphModule) else module

    def run() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    with preserved():  # the caller's grad mode and generators, whatever the graph does
        return as_list(run_reproducibly(run, seed=_seeds(module), log=log))


class _Summarising(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, summarise: Callable[[torch.Tensor], Any],
                 skip: Optional[Callable[[torch.fx.Node], bool]] = None):
        super().__init__(gm)
        self.summarise = summarise
        self.skip = skip
        self.summaries: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        r = super().run_node(n)
        # A summary now: a later in-place op may overwrite the tensor itself.
        if n.op != "output" and not (self.skip and self.skip(n)):
            if isinstance(r, torch.Tensor) and r.layout != torch.strided:
                pass  # a weight the loader packed for this CPU (artifact/prepack.py): opaque, and a constant
            elif isinstance(r, torch.Tensor):
                self.summaries[n.name] = self.summarise(r)
            elif isinstance(r, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in r):
                # A tuple per tuple (None for its non-tensors): records.TupleSummary in a trace.
                self.summaries[n.name] = tuple(self.summarise(x) if isinstance(x, torch.Tensor) else None
                                               for x in r)
        return r


def layouts_of(gm: torch.fx.GraphModule, inputs: list[Any], summarise: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
    """Per node, `summarise` of its value, from a plain run: no deterministic kernels (which
    fill every new tensor, ~10% at real size) and no seeding, for what passes need to know
    of values' shapes and layouts, never of their contents. The caller's RNG is kept."""
    interp = _Summarising(runnable(gm, inputs), summarise)
    with preserved(), torch.no_grad():
        interp.run(*inputs)
    return interp.summaries


def run_with_summaries(
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    summarise: Callable[[torch.Tensor], Any],
    log: Optional[RunLog] = None,
    skip: Optional[Callable[[torch.fx.Node], bool]] = None,
) -> tuple[list[Any], dict[str, Any]]:
    """The graph's outputs and, per node (but those `skip` says), `summarise` of its value:
    the one per-node interpreter."""
    gm = runnable(gm, inputs)
    interps: list[_Summarising] = []

    def run() -> Any:
        interps.append(_Summarising(gm, summarise, skip))  # afresh if a first attempt stopped midway
        with torch.no_grad():
            return interps[-1].run(*inputs)

    with preserved():
        out = run_reproducibly(run, seed=draws_random(gm), log=log)
    return as_list(out), interps[-1].summaries
