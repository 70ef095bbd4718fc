"""Find the first node of a failing graph whose compiled result leaves the bound; write a repro.

A prefix of the graph is its nodes up to one node, returning every value that leaves the
prefix (used by a later node, or an output of the graph) and that node's own. Each prefix is
compiled with the backend and each of its values checked by the whole graph's rule
(aotpipe.runtime.accuracy's against the prefix run in float64, within the multiplier of its float32
run's error, plus the floor) at the value's own scale (:func:`node_check`): the floor's
absolute part (accuracy.ABS_FLOOR) would pass any error on a value much smaller than it (a
gradient of 1e-8 off by 100%), and the bisection would then name a later node, where that
error grew past it.
A node whose value is wrong makes every prefix that returns it, or a value computed from it,
fail; bisection over the tensor-valued nodes, in graph order, finds the first prefix that
fails: its last node is the culprit. That prefix (its unused inputs dropped) is written as an
artefact of one inference graph, with its inputs and reference outputs, which `aotpipe
replay` and `aotpipe bench` take like any other.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from aotpipe.artifact.ops import op_name as qualified
from aotpipe.artifact.provenance import node_origin
from aotpipe.artifact.writer import write_model
from aotpipe.checks.written import check_written
from aotpipe.corpus.bench.backends import Backend, compile_graph
from aotpipe.corpus.bench.graph import (
    Lazy,
    as_list,
    copy_inputs,
    graph_inputs,
    judge,
    loaded,
    nth,
    reference64,
    seeded_call,
    to_float64,
)
from aotpipe.corpus.bench.noise import sequential_run, sequential_twin
from aotpipe.errors import exception_line
from aotpipe.format.ir import CapturedGraph, CapturedGraphs, GraphInput, GraphOutput, TensorMeta
from aotpipe.format.vocabulary import GraphKind
from aotpipe.pipeline.executors.base import Failure, Resources, Task
from aotpipe.pipeline.executors.process import ProcessExecutor
from aotpipe.runtime import accuracy
from aotpipe.runtime.determinism import run_reproducibly
from aotpipe.runtime.execution import run_graph, runnable


@dataclass
class Located:
    """Where a failing graph first goes wrong, and the repro written for it."""
    artifact: str
    graph: str
    found: bool
    reason: str  # why not found, or the failing check at the culprit
    node: Optional[str] = None
    op: Optional[str] = None
    input_shapes: list[str] = field(default_factory=list)
    output_shape: Optional[str] = None
    module_path: Optional[str] = None
    position: Optional[str] = None  # "k of n" tensor-valued nodes
    prefixes_tried: int = 0
    repro: Optional[str] = None
    minimized: Any = None  # bench --minimize: minimize.Minimized

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        head = f"located {self.artifact} {self.graph}: "
        if not self.found:
            return [head + f"no faulty node found ({self.reason})"]
        return [head + f"first faulty node {self.node} ({self.op}), {self.position} tensor nodes, "
                       f"{self.prefixes_tried} prefixes compiled",
                f"    inputs {', '.join(self.input_shapes) or 'none'} -> {self.output_shape}; "
                f"module {self.module_path or 'unknown (the artefact records no module path)'}",
                f"    {self.reason}",
                *(self.minimized.lines() if self.minimized is not None else []),
                *([f"    repro: {self.repro}"] if self.repro else
                  [] if self.minimized is not None and self.minimized.repro else ["    repro: not written"])]


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    return type(v).__name__ if not isinstance(v, (int, float, bool)) else repr(v)


def op_name(n: torch.fx.Node) -> str:
    known = qualified(n.target)
    if known:
        return known
    t = n.target
    name = getattr(t, "name", None)
    if callable(name):
        return f"aten.{name()}" if not name().startswith(("aten", "prims")) else name()
    return getattr(t, "__name__", str(t))


def module_path(n: torch.fx.Node) -> Optional[str]:
    """The module the node came from: graph.json's origin (its module path and class, and the
    source line that called the op), else the graph's own nn_module_stack."""
    origin = node_origin(n)
    if origin is not None and origin.module is not None:
        where = origin.module or "the model itself"
        cls = f" ({origin.module_class})" if origin.module_class else ""
        src = f", {origin.source}" if origin.source else ""
        return f"{where}{cls}{src}"
    stack = n.meta.get("nn_module_stack")
    if isinstance(stack, dict) and stack:
        last = list(stack.values())[-1]
        if isinstance(last, tuple) and last:
            return str(last[0])
    return None


def _values(gm: torch.fx.GraphModule, inputs: list[Any]) -> dict[str, tuple[bool, str]]:
    """Per node, from one eager run: whether its value is a tensor, and its description
    (dtype and shape); values are freed as the run goes, as a plain run frees them."""
    out: dict[str, tuple[bool, str]] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            v = super().run_node(n)
            out[n.name] = (isinstance(v, torch.Tensor), _describe(v))
            return v

    with torch.no_grad():
        Keep(gm).run(*inputs)
    return out


def prefix(gm: torch.fx.GraphModule, upto: torch.fx.Node, tensors: set[str], *,
           drop_unused: bool = False) -> torch.fx.GraphModule:
    """The graph's nodes up to `upto`, returning the tensor values that leave the prefix and
    `upto`'s own. With `drop_unused`, placeholders the prefix does not use are left out."""
    nodes = list(gm.graph.nodes)
    end = nodes.index(upto)
    inside = {n for n in nodes[: end + 1] if n.op != "output"}
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in nodes[: end + 1]:
        if n.op == "output":
            continue
        if drop_unused and n.op == "placeholder" and not any(u in inside for u in n.users):
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    outs = []
    for n in nodes[: end + 1]:
        if n.op in ("placeholder", "get_attr", "output") or n.name not in tensors:
            continue
        if n is upto or any(u not in inside for u in n.users):
            outs.append(env[n])
    g.output(tuple(outs))
    return torch.fx.GraphModule(gm, g)


# How many bytes of node values a locate keeps from one whole-graph run per reference (float32,
# the second sample; float64 is kept up to twice this): a prefix whose values were all kept is
# checked against them, any other runs itself.
KEEP_BYTES = 1 << 30


class _Kept(torch.fx.Interpreter):
    """One run of a graph keeping (a copy of) the values of the nodes named, up to a budget."""
    def __init__(self, gm: torch.fx.GraphModule, keep: set[str], budget: int):
        super().__init__(gm)
        self.keep, self.budget, self.used = keep, budget, 0
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        v = super().run_node(n)
        if n.name in self.keep and isinstance(v, torch.Tensor):
            size = v.numel() * v.element_size()
            if self.used + size <= self.budget:
                self.values[n.name] = v.detach().clone()  # a later in-place op may overwrite it
                self.used += size
        return v


def _kept_values(gm: Any, inputs: list[Any], keep: set[str], budget: int) -> dict[str, torch.Tensor]:
    """The values of `keep`'s nodes from one run of `gm`, as run_graph runs it (its run guard's
    checked forms, seeded, deterministic kernels)."""
    gm = runnable(gm, inputs)
    if not isinstance(gm, torch.fx.GraphModule):
        return {}
    interp = _Kept(gm, keep, budget)

    def run() -> Any:
        with torch.no_grad():
            return interp.run(*inputs)

    run_reproducibly(run)
    return interp.values


class References:
    """The float32, float64 and sequential-sum values of a graph's nodes, each from one run of
    the whole graph (made when first needed) and reused by every prefix the bisection checks;
    a prefix some of whose values were not kept (over KEEP_BYTES) is run by itself."""
    def __init__(self, gm: torch.fx.GraphModule, inputs: list[Any], keep: set[str]):

        self.gm, self.inputs = gm, inputs
        self.runs = {"f32": 0, "f64": 0, "seq": 0}

        def counted(kind: str, make: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                self.runs[kind] += 1
                return make()
            return run

        def wide() -> Optional[dict[str, torch.Tensor]]:
            try:
                g, w = to_float64(gm, copy_inputs(inputs))
                return _kept_values(g, w, keep, 2 * KEEP_BYTES)
            except Exception:
                return None  # the graph does not run in float64: the floor alone decides

        def seq() -> Optional[dict[str, torch.Tensor]]:
            try:

                args = copy_inputs(inputs)
                twin = sequential_twin(runnable(gm, args))
                return None if twin is None else _kept_values(twin, args, keep, KEEP_BYTES)
            except Exception:
                return None  # no second sample

        self.f32 = Lazy(counted("f32", lambda: _kept_values(gm, copy_inputs(inputs), keep, KEEP_BYTES)))
        self.f64 = Lazy(counted("f64", wide))
        self.seq = Lazy(counted("seq", seq))

    @staticmethod
    def _pick(values: dict[str, torch.Tensor], names: list[str]) -> Optional[list[Any]]:
        return [values[n] for n in names] if all(n in values for n in names) else None

    def expected(self, pm: torch.fx.GraphModule, names: list[str]) -> list[Any]:
        kept = self._pick(self.f32(), names)
        return kept if kept is not None else run_graph(pm, copy_inputs(self.inputs))

    def reference(self, pm: torch.fx.GraphModule, names: list[str]) -> Optional[list[Any]]:
        values = self.f64()
        if values is None:
            return None  # the graph does not run in float64: the floor alone decides
        kept = self._pick(values, names)
        return kept if kept is not None else reference64(pm, copy_inputs(self.inputs))

    def sequential(self, pm: torch.fx.GraphModule, names: list[str]) -> Optional[list[Any]]:
        values = self.seq()
        if values is None:
            return None
        kept = self._pick(values, names)
        return kept if kept is not None else sequential_run(pm, copy_inputs(self.inputs))


# The most a value is scaled up by to be judged at its own scale: 2**100 keeps the largest
# float32 value it can scale (one whose RMS is below 1) finite.
MAX_SCALE_EXP = 100


def own_scale(t: Any) -> int:
    """k such that 2**k times `t` has an RMS (over its finite elements) in [1, 2): 0 for a value
    whose RMS is 1 or more, or 0, or that is no float32 / float64 tensor (a half type's small
    values are subnormal already), at most MAX_SCALE_EXP."""
    if not (isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64, torch.complex64,
                                                          torch.complex128)):
        return 0
    v = t.detach().cpu()
    v = (torch.view_as_real(v.resolve_conj()) if v.is_complex() else v).double()
    v = v[torch.isfinite(v)]
    rms = float(v.pow(2).mean().sqrt()) if v.numel() else 0.0
    if not 0.0 < rms < 1.0:
        return 0
    return min(MAX_SCALE_EXP, -math.floor(math.log2(rms)))


def node_check(actual: Any, expected: Any, ref: Callable[[], Any], seq: Optional[Callable[[], Any]],
               what: str) -> accuracy.Check:
    """One value of a prefix judged by the whole graph's rule (aotpipe.corpus.bench.graph.judge) at the
    value's own scale: the values (the backend's, eager float32's, the float64 reference and
    the second sample) times 2**k (:func:`own_scale` of eager's), so that the rule's absolute
    floor counts relative to the value; exact in floating point, so every other part of the
    rule (the multiplier of eager's error, the relative floor, within noise) is unchanged. The
    check's figures are given back at the value's scale; a failing one's line says so."""
    k = own_scale(expected)
    if k == 0:
        return judge(actual, expected, ref, seq, what)[0]
    s = 2.0 ** k

    def up(v: Any) -> Any:
        return v * s if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()) else v

    c, _ = judge(up(actual), up(expected), lambda: up(ref()), None if seq is None else (lambda: up(seq())), what)
    c.error, c.eager_error, c.bound = (None if x is None else x / s for x in (c.error, c.eager_error, c.bound))
    if not c.passed and c.error is not None and c.bound is not None:
        against = "the float64 eager model" if c.method == "fp64" else "eager float32"
        c.detail = (f"RMS error {c.error:.3g} against {against}, over {c.bound:.3g}: the whole graph's rule at the "
                    f"value's own scale (times 2**{k}, its RMS then 1 to 2)"
                    + (f"; eager float32's own error {c.eager_error:.3g}" if c.eager_error is not None else ""))
    return c


def _check_prefix(pm: torch.fx.GraphModule, refs: References, backend: Any, user: Any,
                  roles: list[str]) -> tuple[bool, str]:
    """(the prefix passes, the last failing value's line), each value judged by
    :func:`node_check`."""
    names = [a.name for a in pm.graph.output_node().args[0]]
    expected = refs.expected(pm, names)
    args = copy_inputs(refs.inputs)
    fn, free = compile_graph(backend, pm, args, roles, user)
    actual = as_list(seeded_call(lambda: fn([args[i] for i in free])))
    ref = Lazy(lambda: refs.reference(pm, names))
    seq = Lazy(lambda: refs.sequential(pm, names))
    checks = [node_check(a.detach() if isinstance(a, torch.Tensor) else a, e, nth(ref, i), nth(seq, i),
                         f"node {names[i]}")
              for i, (a, e) in enumerate(zip(actual, expected))]
    failed = [c for c in checks if not c.passed]
    return (not failed), (failed[-1].line() if failed else "")


def _fresh(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


@dataclass(frozen=True)
class LocateTask:
    """What a worker needs to locate one failing graph (picklable)."""
    artifact: str
    label: str
    graph: str
    backend: str
    inputs: str
    seed: int
    out_dir: str
    trust_ops: tuple[str, ...] = ()
    verb: str = "bench --locate"  # the command that wrote the repro, for its note

    def __call__(self) -> Located:
        return locate_graph(self)


def locate_graph(task: LocateTask, then: Callable[..., Any] | None = None) -> Located:
    """Bisect one failing graph to its first faulty node and write the prefix as a repro; with
    `then` (minimize.py's), first `then(gm, culprit, inputs, tensors, backend, task)`, whose result
    is kept as the Located's `minimized`: the prefix is written only where it wrote no repro."""
    res = Located(task.label, task.graph, False, "")
    art = loaded(task.artifact, task.trust_ops)
    ga = art.graphs[task.graph]
    gm = ga.module
    if not isinstance(gm, torch.fx.GraphModule):
        res.reason = "the graph is not an FX graph"
        return res
    backend = Backend(task.backend)
    inputs = graph_inputs(ga, task.inputs, task.seed)
    found = first_faulty_node(res, gm, inputs, [r.role for r in ga.record.inputs], backend, backend.resolve())
    if found is None:
        return res
    culprit, tensors = found
    if then is not None:
        res.minimized = then(gm, culprit, inputs, tensors, backend, task)
        if res.minimized.repro is not None:
            return res
    try:
        res.repro = str(write_repro(gm, culprit, tensors, ga, inputs, task))
    except Exception as e:
        res.reason += f" (the repro could not be written: {exception_line(e)})"
    return res


def first_faulty_node(res: Located, gm: torch.fx.GraphModule, inputs: list[Any], roles: list[str], backend: Backend,
                      user: Any) -> Optional[tuple[torch.fx.Node, set[str]]]:
    """Bisect `gm` (run on `inputs`, whose roles are `roles`) compiled with `backend` to the
    first tensor-valued node whose prefix fails, filling in `res` (found, node, op, shapes,
    module, the failing check, prefixes tried; or why none was found); (that node, the names
    of the tensor-valued nodes) or None."""
    values = _values(gm, copy_inputs(inputs))
    tensors = {k for k, (is_tensor, _) in values.items() if is_tensor}
    candidates = [n for n in gm.graph.nodes if n.op == "call_function" and n.name in tensors]
    if not candidates:
        res.reason = "the graph computes no tensor"
        return None
    refs = References(gm, inputs, tensors)
    tried = 0
    memo: dict[int, tuple[bool, str]] = {}

    def fails(i: int) -> tuple[bool, str]:
        nonlocal tried
        if i not in memo:
            tried += 1
            try:
                ok, line = _check_prefix(prefix(gm, candidates[i], tensors), refs, backend, user, roles)
            except Exception as e:  # the prefix does not compile or run: not this kind of fault
                ok, line = True, f"prefix failed to run: {exception_line(e)}"
            memo[i] = (not ok, line)
        return memo[i]

    last = len(candidates) - 1
    if not fails(last)[0]:
        res.reason = "the graph's prefixes all pass: the fault needs the whole graph (its outputs as one)"
        res.prefixes_tried = tried
        return None
    lo, hi = 0, last  # fails(hi) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid)[0]:
            hi = mid
        else:
            lo = mid + 1
    culprit = candidates[hi]
    res.found, res.node, res.op = True, culprit.name, op_name(culprit)
    res.reason = fails(hi)[1]
    res.position = f"{hi + 1} of {len(candidates)}"
    res.prefixes_tried = tried
    res.input_shapes = [values.get(a.name, (False, "?"))[1] if isinstance(a, torch.fx.Node) else _describe(a)
                        for a in culprit.args if isinstance(a, (torch.fx.Node, int, float, bool))]
    res.output_shape = values[culprit.name][1]
    res.module_path = module_path(culprit)
    return culprit, tensors


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "graph"


def write_repro(gm: torch.fx.GraphModule, culprit: torch.fx.Node, tensors: set[str], ga: Any,
                inputs: list[Any], task: LocateTask) -> Path:
    """Write the culprit's prefix as an artefact of one inference graph under `task.out_dir`."""
    pm = prefix(gm, culprit, tensors, drop_unused=True)
    kept = {n.name for n in pm.graph.nodes if n.op == "placeholder"}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    g_inputs, values = [], []
    for n, rec, v in zip(placeholders, ga.record.inputs, inputs):
        if n.name not in kept:
            continue
        role = rec.role if rec.role in ("param", "buffer", "constant", "user") else "user"
        g_inputs.append(_graph_input(n.name, role, rec.target if role != "user" else n.name, v))
        values.append(_fresh(v))
    return write_graph(pm, g_inputs, values, f"{task.label}-{task.graph}-{culprit.name}", task,
                       f"the prefix of {task.label} {task.graph} up to node {culprit.name} ({op_name(culprit)}), which "
                       f"{task.backend} computes outside the bound")


def _graph_input(name: str, role: str, target: str | None, v: Any) -> GraphInput:
    meta = TensorMeta.of(v) if isinstance(v, torch.Tensor) else None
    return GraphInput(name, role, target, meta, None if isinstance(v, torch.Tensor) else type(v))


def write_graph(pm: torch.fx.GraphModule, g_inputs: list[GraphInput], values: list[Any], name: str, task: Any,
                what: str, *, source: str | None = None, case: Any = None,
                sign: Callable[[Path], None] | None = None) -> Path:
    """Write `pm` on `values` (its inputs, as `g_inputs` records them) as an artefact of one
    inference graph named `name` under `task.out_dir`, its outputs recorded; its folder.
    `source`: the model record's (default: the graph it was cut from); `case`: the manifest's
    records.CaseRecord (ops --cases); `sign`: signs the folder as it is written."""
    outs = run_graph(pm, [_fresh(x) for x in values])
    g_outputs = [GraphOutput(i, "user", None, TensorMeta.of(o) if isinstance(o, torch.Tensor) else None)
                 for i, o in enumerate(outs)]
    name = _safe(name)
    captured = CapturedGraphs(model=name, mode="export",
                              graphs={"inference": CapturedGraph(GraphKind.INFERENCE, pm, g_inputs, g_outputs)},
                              contract=None, seconds=0.0, notes=[f"aotpipe {task.verb}: {what}"], case=case)
    memory = {"inference": [_fresh(x) for x in values]}

    def check(folder: Path) -> Any:
        return check_written(folder, memory_inputs=memory, codes={}, eager=None, verify=False).outcome

    fingerprint = hashlib.sha256(pm.code.encode()).hexdigest()
    written = write_model(Path(task.out_dir), captured,
                          model_record={"name": name, "source": source or f"bench-repro:{task.label}:{task.graph}"},
                          fingerprint=fingerprint, inputs={"inference": values}, save_values="full", check=check,
                          sign=sign)
    return written.path


def locate_failures(bench: Any, out_dir: Path, *, timeout_s: float, trust_ops: Sequence[str] = (),
                    threads: Optional[int] = None, task: type[LocateTask] = LocateTask,
                    errors: type[LocateTask] | None = None) -> list[Located]:
    """Locate every fail_accuracy graph of a bench, each in a worker; repros under `out_dir`.
    `task`: what each worker does (minimize.MinimizeTask: then cut the culprit down); `errors`:
    what it does for a graph that crashed, did not compile or raised (crashes.CrashTask), if
    anything."""
    statuses = ("fail_accuracy",) + (("crashed", "compile_error", "runtime_error") if errors is not None else ())
    failing = [r for r in bench.results if r.status in statuses and r.collectives is None]
    # A distributed rank's graph runs with its world (ranks.py): not bisected here.
    ranks = [Located(r.artifact, r.graph, False, "a distributed rank's graph: --locate does not bisect one yet (its "
                     "collectives run with its world's ranks)")
             for r in bench.results if r.status in statuses and r.collectives is not None]
    tasks = [(task if r.status == "fail_accuracy" or errors is None else errors)(
        r.path, r.artifact, r.graph, bench.backend, r.inputs, r.seed, str(out_dir.resolve()), tuple(trust_ops))
        for r in failing]
    out: list[Optional[Located]] = [None] * len(tasks)

    def done(i: int, outcome: Any) -> None:
        if isinstance(outcome, Failure):
            outcome = Located(tasks[i].label, tasks[i].graph, False, outcome.reason)
        out[i] = outcome

    ProcessExecutor(workers=1, timeout_s=timeout_s, threads=threads, cwd=Path.cwd()).run(
        [Task(f"locate {t.label} {t.graph}", t, Resources(timeout_s=timeout_s)) for t in tasks],
        on_start=lambda i: None, on_done=done)
    return [x for x in out if x is not None] + ranks
