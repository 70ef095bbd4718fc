"""Cut a graph that crashes, does not compile, or raises with a backend down to the few nodes
that still do: bench --minimize for failures that are not values outside the bound.

Such a failure can take the process with it (a segfault in a backend's compiler), so every try
runs in a process of its own (:func:`try_graph`: the graph and its inputs handed over in a private
temporary file, at most TRY_SECONDS): its status is what the bench would say (crashed with its
signal, timeout, compile_error or runtime_error with the exception's type). A try fails "the
same way" as the whole graph when its status and exception type are the same. The processes are
forked from multiprocessing's fork server, which imported torch and this module once, before
any op ran (no thread pool to inherit): a try costs its compile and call, not torch's import
(about 3 s of each try's 4 to 7 s when each was a fresh interpreter).

First the culprit: the prefixes of the graph (locate.prefix) bisected to the first that fails
the same way; its last node is it. Then the cut around it (minimize.cut, depth 0 to
minimize.MAX_DEPTH, every value from outside fed the whole graph's eager value), the first that
fails the same way, written as the repro artefact and its standalone script as minimize.py
writes them, and tried once more as written (loaded back): one that no longer fails is refused.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from aotpipe.artifact.load import load
from aotpipe.corpus.bench.backends import Backend, compile_graph
from aotpipe.corpus.bench.graph import as_list, compile_failure, copy_inputs, failure_line, graph_inputs, loaded
from aotpipe.corpus.bench.locate import Located, LocateTask, _values, op_name, prefix
from aotpipe.corpus.bench.minimize import Minimized, cut_down

TRY_SECONDS = 120.0  # one try: its process, the compile and one call
FAILURES = ("crashed", "timeout", "compile_error", "runtime_error")


@dataclass(frozen=True)
class Outcome:
    """How one try ended: a bench status, the exception's type (errors), its line."""
    status: str
    error: str = ""
    line: str = ""

    def same(self, other: Outcome) -> bool:
        return (self.status, self.error) == (other.status, other.error)


def _context() -> Any:
    """multiprocessing's fork server, preloading torch and this module (once per process).
    A server some other code started before without them still works, only slower."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def try_graph(gm: torch.fx.GraphModule, args: list[Any], backend: str, timeout: float = TRY_SECONDS) -> Outcome:
    """`gm` compiled with `backend` and called once on `args`, in a process of its own."""
    fresh = torch.fx.GraphModule(gm, gm.graph)  # its own code and constants, none of the loader's run guards
    with tempfile.TemporaryDirectory(prefix="aotpipe-try-") as tmp:
        given, out, err = Path(tmp) / "graph.pt", Path(tmp) / "outcome.json", Path(tmp) / "stderr.txt"
        torch.save((fresh, copy_inputs(args)), given)
        proc = _context().Process(target=_forked, args=(str(given), backend, str(out), str(err)), daemon=True)
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            return Outcome("timeout", "", f"did not return within {timeout:g} s")
        code = proc.exitcode
        assert code is not None  # joined and not alive: it has exited
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return Outcome("crashed", "", f"{name}, in the backend's compile or run")
        if not out.is_file():
            text = err.read_text(errors="replace") if err.is_file() else ""
            lines = [ln for ln in text.splitlines() if ln.strip()]
            return Outcome("crashed", "", lines[-1] if lines else f"exit status {code}")
        return Outcome(**json.loads(out.read_text()))


def _forked(given: str, backend: str, out: str, err: str) -> None:
    """A try's process, forked from the server: what it prints to stderr goes to `err` (the
    last line names an exit that wrote no outcome), then :func:`_child`."""
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    _child(Path(given), backend, Path(out))


def _child(given: Path, backend: str, out: Path) -> None:
    """A try's process: the graph compiled and called once; how it ended, written to `out`."""
    # what this process itself wrote a moment ago, in its own private folder: a GraphModule pickles its code
    gm, args = torch.load(given, weights_only=False)
    b = Backend(backend)
    outcome = Outcome("pass")
    try:
        fn, free = compile_graph(b, gm, args, ["user"] * len(args), b.resolve())
        as_list(fn([args[i] for i in free]))
    except Exception as e:
        outcome = Outcome(compile_failure(b, e), type(e).__name__, failure_line(e))
    out.write_text(json.dumps(asdict(outcome)))


@dataclass(frozen=True)
class CrashTask(LocateTask):
    """What a worker needs to cut down one graph that crashes or does not compile (picklable)."""
    verb: str = "bench --minimize"

    def __call__(self) -> Located:
        return minimize_crash(self)


def minimize_crash(task: LocateTask) -> Located:
    """The culprit of a failing graph, bisected in tries of their own processes, and its cut as a repro."""
    res = Located(task.label, task.graph, False, "")
    ga = loaded(task.artifact, task.trust_ops).graphs[task.graph]
    gm = ga.module
    if not isinstance(gm, torch.fx.GraphModule):
        res.reason = "the graph is not an FX graph"
        return res
    inputs = graph_inputs(ga, task.inputs, task.seed)
    whole = try_graph(gm, inputs, task.backend)
    if whole.status not in FAILURES:
        res.reason = f"the graph does not fail by itself in a fresh process ({whole.status})"
        return res
    values = _values(gm, copy_inputs(inputs))
    tensors = {k for k, (is_tensor, _) in values.items() if is_tensor}
    candidates = [n for n in gm.graph.nodes if n.op == "call_function" and n.name in tensors]
    memo: dict[int, bool] = {}

    def fails(i: int) -> bool:
        if i not in memo:
            memo[i] = try_graph(prefix(gm, candidates[i], tensors, drop_unused=False), inputs, task.backend).same(whole)
        return memo[i]

    if not candidates or not fails(len(candidates) - 1):
        res.reason = f"no prefix of the graph fails as the whole does ({whole.line}): the failure needs the whole graph"
        res.prefixes_tried = len(memo)
        return res
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    culprit = candidates[hi]
    res.found, res.node, res.op, res.reason = True, culprit.name, op_name(culprit), f"{whole.status}: {whole.line}"
    res.position, res.prefixes_tried = f"{hi + 1} of {len(candidates)}", len(memo)
    res.input_shapes = [values.get(a.name, (False, "?"))[1] for a in culprit.args if isinstance(a, torch.fx.Node)]
    res.output_shape = values[culprit.name][1]
    res.minimized = _cut_down(gm, culprit, inputs, whole, task)
    return res


def _cut_down(gm: torch.fx.GraphModule, culprit: torch.fx.Node, inputs: list[Any], whole: Outcome,
              task: LocateTask) -> Minimized:
    """minimize.cut_down, each cut and the written repro tried in a process of its own."""
    def fails(cm: torch.fx.GraphModule, args: list[Any]) -> tuple[bool, str]:
        o = try_graph(cm, args, task.backend)
        return o.same(whole), f"{o.status}: {o.line}"

    def still(folder: Path) -> tuple[bool, str]:
        ga = load(folder).graphs["inference"]
        assert isinstance(ga.module, torch.fx.GraphModule)  # loaded without trust_code: from graph.json
        return fails(ga.module, ga.saved_inputs())

    return cut_down(gm, culprit, inputs, task, fails, still,
                    f"on which {task.backend} fails: {whole.status}: {whole.line}")
