"""Cut a graph that crashes, does not compile, or raises with a backend down to the few nodes
that still do: bench --minimize for failures that are not values outside the bound.

Such a failure can take the process with it (a segfault in a backend's compiler), so every try
runs in a fresh subprocess (:func:`try_graph`: the graph and its inputs handed over in a private
temporary file, at most TRY_SECONDS): its status is what the bench would say (crashed with its
signal, timeout, compile_error or runtime_error with the exception's type). A try fails "the
same way" as the whole graph when its status and exception type are the same.

First the culprit: the prefixes of the graph (locate.prefix) bisected to the first that fails
the same way; its last node is it. Then the cut around it (minimize.cut, depth 0 to
minimize.MAX_DEPTH, every value from outside fed the whole graph's eager value), the first that
fails the same way, written as the repro artefact and its standalone script as minimize.py
writes them, and tried once more as written (loaded back): one that no longer fails is refused.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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

TRY_SECONDS = 120.0  # one try: a fresh process, the compile and one call
FAILURES = ("crashed", "timeout", "compile_error", "runtime_error")


@dataclass(frozen=True)
class Outcome:
    """How one try ended: a bench status, the exception's type (errors), its line."""
    status: str
    error: str = ""
    line: str = ""

    def same(self, other: Outcome) -> bool:
        return (self.status, self.error) == (other.status, other.error)


def try_graph(gm: torch.fx.GraphModule, args: list[Any], backend: str, timeout: float = TRY_SECONDS) -> Outcome:
    """`gm` compiled with `backend` and called once on `args`, in a fresh subprocess."""
    fresh = torch.fx.GraphModule(gm, gm.graph)  # its own code and constants, none of the loader's run guards
    with tempfile.TemporaryDirectory(prefix="aotpipe-try-") as tmp:
        given, out = Path(tmp) / "graph.pt", Path(tmp) / "outcome.json"
        torch.save((fresh, copy_inputs(args)), given)
        try:
            run = subprocess.run([sys.executable, "-m", __name__, str(given), backend, str(out)], capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Outcome("timeout", "", f"did not return within {timeout:g} s")
        if run.returncode < 0:
            try:
                name = signal.Signals(-run.returncode).name
            except ValueError:
                name = f"signal {-run.returncode}"
            return Outcome("crashed", "", f"{name}, in the backend's compile or run")
        if not out.is_file():
            lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
            return Outcome("crashed", "", lines[-1] if lines else f"exit status {run.returncode}")
        return Outcome(**json.loads(out.read_text()))


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
    """The culprit of a failing graph, bisected in subprocess tries, and its cut as a repro."""
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
    """minimize.cut_down, each cut and the written repro tried in a fresh process."""
    def fails(cm: torch.fx.GraphModule, args: list[Any]) -> tuple[bool, str]:
        o = try_graph(cm, args, task.backend)
        return o.same(whole), f"{o.status}: {o.line}"

    def still(folder: Path) -> tuple[bool, str]:
        ga = load(folder).graphs["inference"]
        assert isinstance(ga.module, torch.fx.GraphModule)  # loaded without trust_code: from graph.json
        return fails(ga.module, ga.saved_inputs())

    return cut_down(gm, culprit, inputs, task, fails, still,
                    f"on which {task.backend} fails: {whole.status}: {whole.line}")


def main(argv: list[str] | None = None) -> int:
    given, backend, out = argv if argv is not None else sys.argv[1:]
    _child(Path(given), backend, Path(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
