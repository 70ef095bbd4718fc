"""Cut a located failure down to the few nodes that still fail: bench --minimize.

--locate (locate.py) names the first node whose compiled value leaves the bound and writes the
graph's prefix up to it: for a zoo graph, hundreds of nodes. Minimising keeps the culprit and
as few of its producers as still fail: the cut at depth k is the culprit with its producers up
to k edges back, every value from outside the cut an input fed what the whole graph's eager run
gave it (its layout kept). Depth 0, 1, 2, ... (up to MAX_DEPTH) are tried in turn; the first
whose culprit the backend still computes outside the bound (locate.node_check, the same rule)
is the repro, its sizes then shrunk while it still fails so (shrink.py). A fault that needs more
than MAX_DEPTH producers around it keeps the prefix.

The repro is checked once more as written: loaded back from its files and compiled with the
backend, its culprit must still leave the bound; one that no longer fails is refused (nothing
kept) rather than handed on. Beside the artefact's folder, ``<repro>.py`` runs it with torch
alone (and the backend's module, for a backend of one's own): the graph's code as a module, its
inputs from ``<repro>.inputs.pt``, eager against the backend. A graph that crashes, does not
compile or raises is cut down the same way, each try in a fresh process (crashes.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from aotpipe.artifact.load import load
from aotpipe.corpus.bench.backends import Backend
from aotpipe.corpus.bench.graph import copy_inputs
from aotpipe.corpus.bench.locate import (
    Located,
    LocateTask,
    References,
    _check_prefix,
    _graph_input,
    _kept_values,
    _safe,
    locate_graph,
    op_name,
    write_graph,
)
from aotpipe.corpus.bench.shrink import shrink_sizes
from aotpipe.errors import exception_line

MAX_DEPTH = 3  # producers tried around the culprit before the prefix is kept


@dataclass(frozen=True)
class MinimizeTask(LocateTask):
    """What a worker needs to locate one failing graph and cut its culprit down (picklable)."""
    verb: str = "bench --minimize"

    def __call__(self) -> Located:
        return locate_graph(self, then=minimized_repro)


def cut(gm: torch.fx.GraphModule, culprit: torch.fx.Node, depth: int) -> tuple[torch.fx.GraphModule, list[str]]:
    """(the culprit with its producers up to `depth` edges back, returning the culprit's value;
    the names, in the original graph, of the values it takes as inputs, in order). A producer
    that is a placeholder or get_attr stays an input (its value is the graph's own)."""
    keep: set[torch.fx.Node] = {culprit}
    frontier = [culprit]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for a in n.all_input_nodes:
                if a.op == "call_function" and a not in keep:
                    keep.add(a)
                    nxt.append(a)
        frontier = nxt
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    order = [n for n in gm.graph.nodes if n in keep]
    outside: list[torch.fx.Node] = []
    for n in order:
        for a in n.all_input_nodes:
            if a not in keep and a not in outside:
                outside.append(a)
    for a in outside:
        p = g.placeholder(_safe(a.name))
        p.meta = dict(a.meta)
        env[a] = p
    for n in order:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output((env[culprit],))
    return torch.fx.GraphModule(gm, g), [a.name for a in outside]


@dataclass
class Minimized:
    """A failure cut down: the nodes kept, the depth, the tries, and the repro's files."""
    found: bool
    reason: str
    op: str | None = None
    nodes: int | None = None  # call_function nodes in the repro
    depth: int | None = None  # producers kept around the culprit (None: the prefix was kept)
    tries: int = 0
    repro: str | None = None  # the artefact
    script: str | None = None  # repro.py beside it
    shrunk: list[str] = field(default_factory=list)  # sizes shrunk, "3072 -> 1" (shrink.py)
    shrink_tries: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        if not self.found:
            return [f"    minimised: no ({self.reason})"]
        return [f"    minimised: {self.nodes} node(s), node {self.op} with {self.depth} level(s) of producers, "
                f"{self.tries} cut(s) tried: {self.repro}",
                *([f"    shrunk: {', '.join(self.shrunk)} ({self.shrink_tries} tries)"] if self.shrunk else []),
                f"    standalone: python {self.script}"]


def cut_down(gm: torch.fx.GraphModule, culprit: torch.fx.Node, inputs: list[Any], task: Any,
             fails: Callable[[torch.fx.GraphModule, list[Any]], tuple[bool, str]],
             still: Callable[[Path], tuple[bool, str]], how: str, shrink: bool = False) -> Minimized:
    """The smallest cut around `culprit` (in `gm`, run on `inputs`) that `fails` (a cut and its
    inputs: whether it fails as the graph does, and the line saying how), with `shrink` its
    sizes shrunk while it fails (shrink.py), written as a repro artefact under `task.out_dir`
    with its script beside it; refused (nothing kept) where `still` (the written folder) finds
    it no longer fails. `how`: the failure, for the notes."""
    values = _kept_values(gm, copy_inputs(inputs), {n.name for n in gm.graph.nodes}, 1 << 31)
    placeholders = {n.name: v for n, v in zip([n for n in gm.graph.nodes if n.op == "placeholder"], inputs,
                                              strict=True)}
    out = Minimized(False, "", op=op_name(culprit))
    for depth in range(MAX_DEPTH + 1):
        cm, names = cut(gm, culprit, depth)
        if not all(n in values or n in placeholders for n in names):
            continue  # a value the run did not keep (not a tensor, or over the budget): this cut cannot be fed
        args = [a.clone() if isinstance(a, torch.Tensor) else a
                for a in (values[n] if n in values else placeholders[n] for n in names)]
        out.tries += 1
        failed, out.reason = fails(cm, args)
        if failed:
            out.nodes = sum(1 for n in cm.graph.nodes if n.op == "call_function")
            if shrink:
                smaller = shrink_sizes(cm, args, fails)
                args, out.shrunk, out.shrink_tries = smaller.args, smaller.steps, smaller.tries
            return _written(cm, args, culprit, depth, out, task, still, how)
    out.reason = (f"no cut of up to {MAX_DEPTH} producers around {culprit.name} fails as the graph does: the "
                  "failure needs more of it (the located prefix is the repro)")
    return out


def _written(cm: torch.fx.GraphModule, args: list[Any], culprit: torch.fx.Node, depth: int, out: Minimized,
             task: Any, still: Callable[[Path], tuple[bool, str]], how: str) -> Minimized:
    what = (f"node {culprit.name} ({out.op}) of {task.label} {task.graph} with {depth} level(s) of its producers "
            f"({out.nodes} nodes), {how}")
    g_inputs = [_graph_input(n.name, "user", n.name, v) for n, v in
                zip([n for n in cm.graph.nodes if n.op == "placeholder"], args, strict=True)]
    folder = None
    try:
        folder = write_graph(cm, g_inputs, args, f"{task.label}-{task.graph}-{culprit.name}-min", task, what)
        fails, line = still(folder)
    except Exception as e:
        drop(folder)
        out.reason = f"the minimised repro could not be written and checked: {exception_line(e)}"
        return out
    if not fails:
        drop(folder)
        out.reason = (f"refused: the minimised repro, loaded back, no longer fails with {task.backend} "
                      f"({line or 'every value within the bound'}); no repro kept")
        return out
    out.found, out.depth, out.repro = True, depth, str(folder)
    out.script = str(write_script(folder, cm, args, what, task.backend))
    return out


def still_fails(folder: Path, backend: Backend, user: Any) -> tuple[bool, str]:
    """Whether the repro written at `folder`, loaded back, still fails with `backend` (its one
    output outside the bound); the check's line."""
    ga = load(folder).graphs["inference"]
    gm = ga.module
    assert isinstance(gm, torch.fx.GraphModule)  # loaded without trust_code: rebuilt from graph.json
    args = ga.saved_inputs()
    culprit = gm.graph.output_node().all_input_nodes[0]  # the cut returns its culprit alone
    ok, line = _check_prefix(gm, References(gm, args, {culprit.name}), backend, user,
                             [r.role for r in ga.record.inputs])
    return not ok, line


def minimized_repro(gm: torch.fx.GraphModule, culprit: torch.fx.Node, inputs: list[Any], tensors: set[str],
                    backend: Backend, task: Any) -> Minimized:
    """The smallest cut around `culprit` whose culprit `backend` still computes outside the
    bound (locate's rule), written as a repro (:func:`cut_down`)."""
    user = backend.resolve()

    def fails(cm: torch.fx.GraphModule, args: list[Any]) -> tuple[bool, str]:
        try:
            ok, line = _check_prefix(cm, References(cm, args, {culprit.name}), backend, user, ["user"] * len(args))
        except Exception as e:  # the cut does not compile or run by itself: a wider one may
            return False, exception_line(e)
        return not ok, line

    return cut_down(gm, culprit, inputs, task, fails, lambda folder: still_fails(folder, backend, user),
                    f"which {task.backend} computes outside the bound", shrink=True)


SCRIPT = '''"""A repro aotpipe bench --minimize wrote: {what}.

Runs with torch alone (and the backend's module, for a backend of your own): python {name}
"""
import operator  # noqa: F401  (the graph's code may call it)
from pathlib import Path

import torch
import torch.fx
{backend_import}

{code}

inputs = torch.load(Path(__file__).with_suffix(".inputs.pt"), weights_only=True)
graph = torch.fx.symbolic_trace(Repro())
with torch.no_grad():
    eager = graph(*inputs)
    compiled = torch.compile(graph, backend=BACKEND)(*inputs)
for i, (e, c) in enumerate(zip(eager, compiled)):
    err = (c.double() - e.double()).pow(2).mean().sqrt().item()
    print(f"output {{i}}: {{tuple(e.shape)}} RMS error against eager {{err:.3g}} (eager's RMS "
          f"{{e.double().pow(2).mean().sqrt().item():.3g}})")
'''


def write_script(folder: Path, gm: torch.fx.GraphModule, args: list[Any], what: str, backend: str) -> Path:
    """`<repro>.py` and `<repro>.inputs.pt` beside the repro's folder (a model folder holds only
    what its manifest lists): the graph as a module of torch ops, on the repro's inputs, run
    eagerly and compiled with the backend."""
    body = "\n".join("    " + ln if ln.strip() else ln for ln in gm.code.strip("\n").splitlines())
    code = "class Repro(torch.nn.Module):\n" + body + "\n"
    if ":" in backend:
        module, fn = backend.split(":", 1)
        backend_import = ("import importlib\nimport os\nimport sys\n\nsys.path.insert(0, os.getcwd())  # as aotpipe bench "
                          f"imports it: from the current folder\nBACKEND = getattr(importlib.import_module({module!r}), "
                          f"{fn!r})")
    else:
        backend_import = f"\nBACKEND = {backend!r}"
    path = folder.parent / f"{folder.name}.py"
    torch.save(list(args), path.with_suffix(".inputs.pt"))
    path.write_text(SCRIPT.format(what=what, name=path.name, code=code, backend_import=backend_import))
    return path


def drop(folder: Path | None) -> None:
    """Remove a repro folder that is not kept."""
    if folder is not None and folder.exists():
        shutil.rmtree(folder)
