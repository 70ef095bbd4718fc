"""Bench one graph in a worker: compile it with a backend, check it, time it.

Correctness is the project's rule (aotpipe.runtime.accuracy.compare): the backend's output against a
float64 run of the same graph, within the multiplier of the loaded graph's own float32 error
against that run, plus the floor; where that fails, the same rule with a second float32 sample
as the scale, the loaded graph with its sums accumulated sequentially (aotpipe.corpus.bench.noise; see
:func:`judge`). Speed is the compiled graph against the loaded graph run eagerly, in
interleaved rounds after warm-up (see :func:`time_interleaved`).

A worker keeps the artefact it loaded last (:func:`loaded`), so the graphs of one artefact,
benched one after another, load it once; each graph's saved inputs are read once and copied
for each use; the float64 reference and the second sample are run only when an output needs
them.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from aotpipe.artifact.load import load
from aotpipe.corpus.bench.backends import Backend, compile_graph, is_compile_error
from aotpipe.corpus.bench.noise import sequential_run
from aotpipe.errors import exception_line
from aotpipe.models.eager import Float32Draws, nudge
from aotpipe.replay.inputs import _flatten_meta, get_inputs
from aotpipe.replay.run import expand_outputs
from aotpipe.runtime import accuracy
from aotpipe.runtime.determinism import RNG_SEED, draws_random
from aotpipe.runtime.execution import run_graph
from aotpipe.runtime.global_state import preserved

STATUSES = ("pass", "fail_accuracy", "compile_error", "runtime_error", "timeout", "crashed", "skipped")
FAILURES = ("fail_accuracy", "compile_error", "runtime_error", "timeout", "crashed")

WARMUP = 3  # warm-up calls of the compiled graph before it is timed
# Of the loaded graph run eagerly: it has run once already (the float32 reference), so one more
# call warms it; that call's time also sets how many calls a sample makes.
EAGER_WARMUP = 1
ROUNDS = 10
NOISY = 0.2  # IQR / median of the per-round ratios over which a timing is repeated, then marked noisy
SAMPLE_S = 2e-3  # a timed sample lasts at least this long (calls per sample chosen to fit)
MAX_CALLS = 200
# How a timed sample is measured: wall time, or the process's CPU time (all its threads), which
# a loaded machine's preemptions do not inflate; with one intra-op thread it is the wall time
# the sample would take on an idle machine. "auto": cpu with one intra-op thread, else wall
# (with several, CPU time counts the threads' spinning at each parallel region's barrier).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK_CHOICES = ("auto", "wall", "cpu")
# The speedup's interval: a distribution-free CONFIDENCE interval of the median per-round ratio
# (eager sample / backend sample, timed side by side in one round), widened by BAND either way:
# the error that round-to-round spread does not show (which side runs in a warmer cache, the
# worker's memory layout). Measured with eager against itself (the truth is 1.0x) on a 2-core
# machine under load (docs/bench.md, tests/bench/test_timing.py): every graph's interval held
# 1.0, its median ratio within 1/(1 + BAND) .. 1 + BAND. A speedup whose interval holds 1.0 is
# reported "within noise", not as a number.
CONFIDENCE = 0.95
BAND = 0.10
# GraphNet's tolerance levels t (graph_net_bench: range(-10, 3 error kinds + 2)).
GRAPHNET_T = tuple(range(-10, 5))


@dataclass
class GraphResult:
    """One graph benched: status and one-line reason, timings, and what failed by how much."""
    artifact: str
    graph: str
    kind: str
    status: str
    reason: str = ""
    compile_s: float | None = None  # the first call of the compiled graph (torch.compile compiles then)
    eager_s: float | None = None  # median per call, the loaded graph run eagerly
    backend_s: float | None = None  # median per call, the compiled graph
    eager_iqr: float | None = None
    backend_iqr: float | None = None
    speedup: float | None = None  # the median per-round ratio eager / backend
    # The speedup's interval (CONFIDENCE, widened by BAND) and what it supports: "faster" (the
    # interval above 1.0), "slower" (below), or "within noise" (it holds 1.0).
    speedup_low: float | None = None
    speedup_high: float | None = None
    verdict: str = ""
    noisy: bool = False
    clock: str = ""  # how samples were timed: wall | cpu
    threads: int | None = None  # the worker's intra-op threads when it timed them
    failed_outputs: list[str] = field(default_factory=list)
    worst_ratio: float | None = None  # the worst output's error as a share of its bound
    # Outputs that pass only with the second sample (float32 summed sequentially) as the scale.
    rescaled: list[str] = field(default_factory=list)
    # GraphNet: the least tolerance level t at which every output is allclose to eager float32
    # at GraphNet's atol/rtol for t (None: not even at t = 4, or the graph did not run).
    graphnet_t: int | None = None
    wall_s: float = 0.0  # the whole task in the worker
    in_backend_s: float = 0.0  # of which compiling and running the compiled graph
    nodes: int = 0
    detail: str | None = None  # e.g. the worker's last lines, for a crash
    path: str = ""  # the model folder
    inputs: str = "saved"  # saved | random
    seed: int = 0
    # bench --sizes (sizes.py): the point this row is of (dimension -> size; None: the graph's
    # inputs as captured), its place in the order given (the graph is compiled at point 0), and
    # how many graphs dynamo compiled on the point's first call (None for eager, which does not
    # compile). compile_s is then that first call's time.
    sizes: dict[str, int] | None = None
    point: int | None = None
    compiles: int | None = None
    # A distributed rank's graph (ranks.py): how its collectives ran: "recorded" (each replaced
    # by the result a run of its world recorded; not timed) or "gloo" (executed with its world's
    # ranks in local processes); None for a graph without them.
    collectives: str | None = None
    # A per-op case (aotpipe ops --cases; its manifest's `case`): its op and the corpus calls it
    # stands for, by which the per-op scores weigh it. None for any other graph.
    case_op: str | None = None
    case_calls: int | None = None

    @property
    def recompiled(self) -> bool | None:
        """Whether the backend compiled again at this point: a --sizes row after the first whose
        first call compiled (None for the first point, eager, and a bench without --sizes)."""
        if self.compiles is None or not self.point:
            return None
        return self.compiles > 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.sizes is not None:
            d["recompiled"] = self.recompiled
        return d


@dataclass(frozen=True)
class GraphTask:
    """What a worker needs to bench one graph (picklable)."""
    artifact: str  # the model folder
    label: str  # how the artefact is named in results (relative to the bench's PATH)
    graph: str
    backend: str
    inputs: str = "saved"  # saved | random
    seed: int = 0
    rounds: int = ROUNDS
    trust_ops: tuple[str, ...] = ()
    clock: str = "auto"  # auto | wall | cpu (the process's CPU time: see CLOCKS)
    threads: int | None = None  # the worker's intra-op threads (None: torch's default)

    def __call__(self) -> GraphResult:
        return bench_graph(self)


@dataclass
class Prepared:
    """A graph ready to bench: the module run eagerly and compiled, its inputs (copied for each
    use), and each input's role (inputs.json's; the inputs of :func:`bench_graph`'s `prepare`
    may add their own)."""
    module: torch.fx.GraphModule
    saved: list[Any]
    roles: list[str]


@dataclass
class Peers:
    """The other ranks of a world whose copies of a graph a bench runs in step with this one
    (bench --collectives gloo: ranks.py). Every decision a rank takes from what it measured
    (how many calls a timed sample makes, whether to time again, whether to go on after a
    failure) is the world's, so that no rank calls a collective the others do not."""
    most: Callable[[int], int]  # the largest of a value over the world's ranks

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank."""
        return self.most(int(flag)) > 0


def graph_inputs(ga: Any, inputs: str, seed: int) -> list[Any]:
    """Fresh inputs of a loaded graph: its saved ones, or random ones like them."""
    if inputs == "saved" and ga.has_saved_values:
        return ga.saved_inputs()

    forward = ga.upstream.record if ga.upstream is not None else None
    flat, _ = _flatten_meta(get_inputs(ga.input_file, seed=seed, forward=forward))
    return flat


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def to_float64(gm: torch.fx.GraphModule, inputs: list[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """A float64 copy of a graph and its inputs: float32 tensors (parameters, buffers,
    constants, inputs) widened, and float32 where an op names it (a factory's dtype, a cast:
    an upsampling's backward makes its zeros so); ops that name another dtype keep it."""
    g = copy.deepcopy(gm)
    g.double()
    wide = lambda a: torch.float64 if a is torch.float32 else a  # noqa: E731
    for n in g.graph.nodes:
        if n.op == "call_function":
            n.args = torch.fx.node.map_aggregate(n.args, wide)
            n.kwargs = torch.fx.node.map_aggregate(n.kwargs, wide)
    g.recompile()
    for n in g.graph.nodes:
        if n.op == "get_attr":
            owner, _, name = n.target.rpartition(".")
            mod = g.get_submodule(owner) if owner else g
            v = getattr(mod, name, None)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
                setattr(mod, name, v.double())
    widened = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return g, widened


def reference64(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[Any] | None:
    """The graph's outputs in float64 (None where the graph does not run so: the rule then
    falls back to the float-noise floor alone)."""
    try:
        g, wide = to_float64(gm, inputs)
        with Float32Draws():  # a graph that draws (dropout) draws the float32 run's numbers
            return run_graph(g, wide)
    except Exception:
        return None


class Lazy:
    """A value computed on first use, then kept (None stays None: it is not computed again)."""
    def __init__(self, make: Callable[[], Any]):
        self._make: Callable[[], Any] | None = make
        self._value: Any = None

    def __call__(self) -> Any:
        if self._make is not None:
            make, self._make = self._make, None
            self._value = make()
        return self._value


def nth(values: Callable[[], list[Any] | None], i: int) -> Callable[[], Any]:
    def get() -> Any:
        v = values()
        return None if v is None or i >= len(v) else v[i]
    return get


# The inputs a further noise sample nudges: those the model's own run takes (EagerReference.run
# nudges the model's inputs, parameters and buffers), and a backward's tangents. Not a backward's
# saved activations: they are functions of the forward's inputs, and moving one alone computes
# another function (a conv's bias gradient before a batch norm, zero in exact arithmetic for
# consistent activations, is no longer zero: the sample would be no float32 noise of this graph).
NUDGED_ROLES = ("user", "param", "buffer", "constant", "tangent")


def nudged_run(gm: Any, inputs: list[Any], k: int, roles: Sequence[str]) -> list[Any] | None:
    """A further sample of the loaded graph's float32 noise, as the capture's checks take one of
    the eager model's (EagerReference.run's `nudged`): the graph run with its inputs of
    NUDGED_ROLES (`roles`: each input's) each moved one ulp up or down, seeded by `k`; None
    where it does not run so."""
    gen = torch.Generator().manual_seed(k)
    try:
        return run_graph(gm, [nudge(x, gen) if isinstance(x, torch.Tensor) and role in NUDGED_ROLES else x
                              for x, role in zip(copy_inputs(inputs), roles)])
    except Exception:
        return None


def judge(actual: Any, expected: Any, ref: accuracy.Reference, seq: Callable[[], Any] | None,
          what: str, samples: Sequence[Callable[[], Any]] = ()) -> tuple[accuracy.Check, bool]:
    """(the check, whether it passed only by the second sample) of one output.

    The project's rule first (accuracy.compare: the scale is eager float32's own error against
    float64). Where it fails on the float64 comparison, the same rule again with `seq()`, the
    loaded graph run in float32 with its sums accumulated sequentially, standing for eager
    float32: the backend's error against float64 within the multiplier of that run's error
    plus the floor (or within the floor of that run). Either sample is a valid float32
    evaluation of the graph; an output passes if it is as accurate as one of them allows.
    `samples`: further float32 runs of the same value (nudged_run), taken by the project's rule
    only while it fails (accuracy.compare), as the capture's checks take them: a value zero in
    exact arithmetic has no correct digit, and one draw of eager's noise can be small by chance."""
    c = accuracy.compare(actual, expected, ref, what=what, samples=samples)
    if c.passed or c.method != "fp64" or seq is None:
        return c, False
    s = seq()
    r = ref() if callable(ref) else ref
    if s is None or r is None:
        return c, False
    c2 = accuracy.compare(actual, s, r, what=what)
    if c2.passed:
        if c2.method == "fp64":
            c2.detail = (f"error {c2.error:.3g} against float64 within {c2.bound:.3g}, the bound with float32 summed "
                         f"sequentially as the scale (its error {c2.eager_error:.3g}); eager float32's own "
                         f"{c.eager_error:.3g} gives {c.bound:.3g}")
        else:
            c2.detail = (f"within the float-noise floor {c2.bound:.3g} of float32 summed sequentially; eager "
                         f"float32's own error {c.eager_error:.3g} against float64 gives {c.bound:.3g}")
        return c2, True
    if c2.method == "fp64" and c2.bound is not None:
        c.detail = (f"{c.detail}; over {c2.bound:.3g} too with float32 summed sequentially as the scale "
                    f"(its error {c2.eager_error:.3g})")
    return c, False


def check_outputs(actual: list[Any], expected: list[Any], ref: Callable[[], list[Any] | None] | None,
                  labels: list[str], seq: Callable[[], list[Any] | None] | None = None,
                  samples: Sequence[Callable[[], list[Any] | None]] = ()
                  ) -> tuple[list[accuracy.Check], list[str]]:
    """(each output of the backend judged against the loaded graph's, the labels of those that
    passed only by the second sample). `ref` and `seq` give every output's float64 reference
    and second sample, `samples` further float32 runs (nudged_run), each computed on first use
    (None: there is none)."""
    checks, rescaled = [], []
    for i, (a, e) in enumerate(zip(actual, expected)):
        r = None if ref is None else nth(ref, i)
        c, by_seq = judge(a.detach() if isinstance(a, torch.Tensor) else a, e, r,
                          None if seq is None else nth(seq, i), labels[i], [nth(s, i) for s in samples])
        checks.append(c)
        if by_seq:
            rescaled.append(labels[i])
    return checks, rescaled


def graphnet_tolerance(actual: list[Any], expected: list[Any]) -> int | None:
    """The least GraphNet tolerance level t at which every output is allclose to eager's, at
    GraphNet's (rtol, atol) for t and the output's dtype (graph_net_bench/datatype_tolerance_config:
    float32 10**(t*5.886/5), 10**t; float16 10**(t*3/5), 10**t; bfloat16 10**(t*1.796/5),
    10**t; float64 10**(t*7/5) both; other dtypes must be equal)."""
    exps = {torch.float16: (3 / 5, 1.0), torch.bfloat16: (1.796 / 5, 1.0), torch.float32: (5.886 / 5, 1.0),
            torch.float64: (7 / 5, 7 / 5)}
    for t in GRAPHNET_T:
        ok = True
        for a, e in zip(actual, expected):
            if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
                ok = accuracy.exact_equal(a, e)
            elif a.shape != e.shape or a.dtype != e.dtype:
                ok = False
            elif e.dtype in exps:
                rexp, aexp = exps[e.dtype]
                ok = torch.allclose(a.detach().cpu(), e.cpu(), rtol=10 ** (t * rexp), atol=10 ** (t * aexp),
                                    equal_nan=True)
            else:
                ok = torch.equal(a.detach().cpu(), e.cpu())
            if not ok:
                break
        if ok:
            return t
    return None


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[1], q[2] - q[0]


def median_interval(xs: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free `confidence` interval of the median of `xs`: the order statistics
    x(k) and x(n+1-k) with the largest k whose two tails, each P(Binomial(n, 1/2) < k), stay
    within (1 - confidence) / 2; (min, max) where n is too small for any k."""
    s = sorted(xs)
    n = len(s)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n  # P(Binomial(n, 1/2) <= k)
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return s[k - 1], s[n - k]


def verdict(low: float, high: float) -> str:
    """What a speedup interval supports: faster, slower, or within noise (it holds 1.0)."""
    return "faster" if low > 1.0 else "slower" if high < 1.0 else "within noise"


@dataclass
class Timing:
    """Eager against the backend, timed in interleaved rounds."""
    eager: tuple[float, float]  # (median, IQR) per call
    backend: tuple[float, float]
    speedup: float  # the median of the per-round ratios eager / backend
    low: float  # its CONFIDENCE interval, widened by BAND
    high: float
    noisy: bool  # the ratios' IQR / median stayed over NOISY after a second, longer try
    in_backend_s: float  # seconds spent in the backend

    @property
    def verdict(self) -> str:
        return verdict(self.low, self.high)


def time_interleaved(eager: Callable[[], Any], backend: Callable[[], Any], rounds: int,
                     clock: Callable[[], float] = time.perf_counter, peers: Peers | None = None) -> Timing:
    """Eager against the backend, each warmed up (the backend WARMUP calls, eager EAGER_WARMUP:
    the caller has run it once already), then timed in `rounds` rounds, each timing one sample
    of each side by side (which goes first alternates), a sample being enough calls to last
    SAMPLE_S. The speedup is the median of the rounds' ratios, so that what slows a whole
    round (another process, a frequency change) cancels out of it; its interval is the
    median's CONFIDENCE interval widened by BAND. If the ratios' IQR / median is over NOISY,
    the timing is taken again with twice the rounds; if it is still over, it is noisy. With
    `peers`, the calls per sample and whether to time again are the world's (the most calls,
    again where any rank's timing was noisy), outside the timed samples."""
    in_backend = 0.0
    one = 0.0
    for k in range(max(WARMUP, EAGER_WARMUP)):
        if k < EAGER_WARMUP:
            t0 = clock()
            eager()
            one = clock() - t0
        if k < WARMUP:
            t0 = clock()
            backend()
            in_backend += clock() - t0
    one = max(one, 1e-7)
    calls = max(1, min(MAX_CALLS, int(SAMPLE_S / one)))
    if peers is not None:
        calls = peers.most(calls)

    def sample(fn: Callable[[], Any]) -> float:
        t0 = clock()
        for _ in range(calls):
            fn()
        return (clock() - t0) / calls

    result: Timing | None = None
    for attempt in (1, 2):
        es, bs = [], []
        for r in range(rounds * attempt):
            if r % 2:
                b = sample(backend)
                es.append(sample(eager))
            else:
                es.append(sample(eager))
                b = sample(backend)
            bs.append(b)
            in_backend += b * calls
        # A sample too short for the clock to tick (0 s) is left out of the ratios.
        ratios = [e / b for e, b in zip(es, bs) if e > 0 and b > 0] or [1.0]
        mid, iqr = _median_iqr(ratios)
        lo, hi = median_interval(ratios)
        result = Timing(_median_iqr(es), _median_iqr(bs), mid, lo / (1 + BAND), hi * (1 + BAND),
                        iqr > NOISY * mid, 0.0)
        if not (result.noisy if peers is None else peers.any(result.noisy)):
            break
    assert result is not None
    result.in_backend_s = in_backend
    return result


def resolve_clock(clock: str, threads: int | None) -> str:
    """The clock "auto" stands for: cpu with one intra-op thread, wall otherwise."""
    if clock != "auto":
        return clock
    return "cpu" if (threads if threads is not None else torch.get_num_threads()) == 1 else "wall"


def _labels(record: Any) -> list[str]:
    out = []
    for i, rec in enumerate(record.outputs):
        target = f" {rec.target}" if rec.target else ""
        out.append(f"output {i} ({rec.role}{target})")
    return out


_LOADED: dict[tuple[Any, ...], Any] = {}


def loaded(folder: str, trust_ops: tuple[str, ...]) -> Any:
    """The artefact at `folder`, loaded once per worker while its graphs are benched one after
    another: the worker keeps the last one it loaded (one, so that its memory is bounded),
    and loads it again if its manifest changed since."""
    m = Path(folder) / "manifest.json"
    try:
        st = m.stat()
        stamp: Any = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    key = (str(Path(folder).resolve()), tuple(trust_ops), stamp)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load(folder, trust_ops=trust_ops)
    return _LOADED[key]


def copy_inputs(inputs: list[Any]) -> list[Any]:
    """A fresh copy of a graph's inputs for one run, their strides and aliasing kept (one
    deepcopy: views of one storage stay views of one new storage)."""
    return copy.deepcopy(inputs)


def bench_graph(task: GraphTask, prepare: Callable[[Any], Prepared] | None = None,
                peers: Peers | None = None) -> GraphResult:
    """Load one graph of an artefact and bench it (runs in a worker process).

    `prepare`: what is benched of the loaded graph (default: its module on its inputs, saved or
    random); `peers`: the ranks this one runs in step with (bench --collectives gloo)."""
    start = time.perf_counter()
    art = loaded(task.artifact, task.trust_ops)
    ga = art.graphs[task.graph]
    res = GraphResult(task.label, task.graph, ga.kind, "skipped", path=task.artifact, inputs=task.inputs,
                      seed=task.seed)
    failed = False
    try:
        backend = Backend(task.backend)
        user = backend.resolve()
        prepared = prepare(ga) if prepare is not None else Prepared(
            ga.module, graph_inputs(ga, task.inputs, task.seed), [r.role for r in ga.record.inputs])
        module, saved = prepared.module, prepared.saved  # saved: read (a backward's: its forward run) once
        # Loaded without trust_code: every graph is a GraphModule rebuilt from graph.json.
        assert isinstance(module, torch.fx.GraphModule)
        res.nodes = len(module.graph.nodes)
        expected = expand_outputs(ga.record, run_graph(module, copy_inputs(saved)))
    except Exception as e:
        res.reason = f"the loaded graph does not run eagerly: {exception_line(e)}"
        failed = True
    if _stopped(peers, failed, res, "skipped", "the loaded graph does not run eagerly"):
        res.wall_s = time.perf_counter() - start
        return res

    args = copy_inputs(saved)
    t0 = time.perf_counter()
    try:
        fn, free = compile_graph(backend, module, args, prepared.roles, user)
        first = fn([args[i] for i in free])
    except Exception as e:
        res.status = compile_failure(backend, e)
        res.reason = failure_line(e)
        failed = True
    res.compile_s = time.perf_counter() - t0
    res.in_backend_s = res.compile_s
    if _stopped(peers, failed, res, "runtime_error", "it does not compile and run"):
        res.wall_s = time.perf_counter() - start
        return res
    ran = check_first(res, ga, module, fn, free, args, saved, expected, first, prepared.roles, peers)
    if peers is not None:
        ran = not peers.any(not ran)
    if ran:
        del expected, first
        time_graph(res, task, module, fn, free, args, saved, peers)
    res.wall_s = time.perf_counter() - start
    return res


def _stopped(peers: Peers | None, failed: bool, res: GraphResult, status: str, what: str) -> bool:
    """Whether the bench of a graph stops here: it `failed` (`res` says how), or (in step with
    `peers`) another rank's copy did, which `res` then says with `status`."""
    if peers is None or not peers.any(failed) or failed:
        return failed
    res.status, res.reason = status, f"another rank of its world stopped the bench: there, {what}"
    return True


def compile_failure(backend: Backend, e: BaseException) -> str:
    """The status of an exception on a compiled graph's first call: compile_error where it is
    the compiler's, else runtime_error."""
    return "compile_error" if is_compile_error(e) or backend.name != "eager" and _in_compile(e) else "runtime_error"


def check_first(res: GraphResult, ga: Any, module: torch.fx.GraphModule, fn: Callable[[list[Any]], Any],
                free: list[int], args: list[Any], saved: list[Any], expected: list[Any], first: Any,
                roles: Sequence[str], peers: Peers | None = None) -> bool:
    """Judge the compiled graph's first outputs (`first`, on `args`) against the loaded graph's
    (`expected`, on `saved`; `roles`: each input's) into `res`: its status, reason and error
    figures; whether it ran (so that it is timed next: a graph that fails the check is timed
    too). With `peers`, every reference is run, in one order, whether an output needs it or
    not: each run calls the graph's collectives, which every rank must call alike."""

    def widened() -> list[Any] | None:
        out = reference64(module, copy_inputs(saved))
        return None if out is None else expand_outputs(ga.record, out)

    def sequential() -> list[Any] | None:
        out = sequential_run(module, copy_inputs(saved))
        return None if out is None else expand_outputs(ga.record, out)

    def nudged_sample(k: int) -> Callable[[], list[Any] | None]:
        def run() -> list[Any] | None:
            out = nudged_run(module, saved, k, roles)
            return None if out is None else expand_outputs(ga.record, out)
        return run

    ref, seq = Lazy(widened), Lazy(sequential)
    samples = [Lazy(nudged_sample(k)) for k in range(1, accuracy.NOISE_SAMPLES)]
    if peers is not None:
        for lazy in (ref, seq, *samples):
            lazy()
    if draws_random(module):
        # Checked on a run seeded as the loaded graph's runs are (execution.run_graph).
        try:
            t0 = time.perf_counter()
            first = seeded_call(lambda: fn([args[i] for i in free]))
            res.in_backend_s += time.perf_counter() - t0
        except Exception as e:
            res.status, res.reason = "runtime_error", failure_line(e)
            return False
    actual = expand_outputs(ga.record, as_list(first))
    if len(actual) != len(expected):
        res.status, res.reason = "fail_accuracy", f"{len(actual)} outputs, the loaded graph gives {len(expected)}"
        return False
    checks, res.rescaled = check_outputs(actual, expected, ref, _labels(ga.record), seq, samples)
    failed = [c for c in checks if not c.passed]
    ratios = [c.error / c.bound for c in checks if c.error is not None and c.bound]
    res.worst_ratio = max(ratios, default=None)
    res.graphnet_t = graphnet_tolerance(actual, expected)
    if failed:
        res.status = "fail_accuracy"
        res.failed_outputs = [c.line() for c in failed]
        res.reason = f"{len(failed)} of {len(checks)} outputs outside the bound; {failed[0].line()}"
    else:
        res.status = "pass"
        res.reason = f"{len(checks)} outputs within the bound"
        if res.rescaled:
            first_rescaled = next(c for c in checks if c.what == res.rescaled[0])
            res.reason += (f"; {len(res.rescaled)} of them only with float32 summed sequentially as the scale, "
                           f"{first_rescaled.what}: {first_rescaled.detail}")
    return True


def time_graph(res: GraphResult, task: GraphTask, module: torch.fx.GraphModule, fn: Callable[[list[Any]], Any],
               free: list[int], args: list[Any], saved: list[Any], peers: Peers | None = None) -> None:
    """Time the compiled graph (on `args`) against the loaded graph run eagerly (on a copy of
    `saved`) into `res`; a call that fails makes it a runtime_error."""
    eager_args = copy_inputs(saved)
    backend_args = [args[i] for i in free]
    fwd = module.forward

    def run_eager() -> Any:
        with torch.no_grad():
            return fwd(*eager_args)

    def run_backend() -> Any:
        return fn(backend_args)

    try:
        res.clock, res.threads = resolve_clock(task.clock, task.threads), torch.get_num_threads()
        t = time_interleaved(run_eager, run_backend, task.rounds, clock=CLOCKS[res.clock], peers=peers)
        (res.eager_s, res.eager_iqr), (res.backend_s, res.backend_iqr) = t.eager, t.backend
        res.speedup, res.speedup_low, res.speedup_high, res.verdict = t.speedup, t.low, t.high, t.verdict
        res.noisy = t.noisy
        res.in_backend_s += t.in_backend_s
    except Exception as e:
        res.status, res.reason = "runtime_error", f"a later call failed: {failure_line(e)}"


def seeded_call(fn: Callable[[], Any]) -> Any:
    """`fn()` with torch's generator seeded as aotpipe seeds a graph's runs; the caller's
    generator state is restored after."""
    with preserved():
        torch.manual_seed(RNG_SEED)
        return fn()


def failure_line(e: BaseException) -> str:
    """One line for an exception from torch.compile, naming the backend's own exception where
    dynamo wrapped it (BackendCompilerFailed keeps it as inner_exception)."""
    line = exception_line(e)
    inner = getattr(e, "inner_exception", None) or e.__cause__
    if inner is not None and inner is not e:
        line = f"{type(e).__name__}: {exception_line(inner)}"
    return line


def _in_compile(e: BaseException) -> bool:
    """Whether an exception came through torch.compile's compile path (its traceback passes
    through dynamo's convert_frame or a backend's compile)."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "_dynamo/convert_frame" in name or "_dynamo/output_graph" in name:
            return True
        tb = tb.tb_next
    return False


def result_from_failure(task: GraphTask, kind: str, reason: str, detail: str | None) -> GraphResult:
    """The result of a graph whose worker did not return: timed out, or died."""
    status = "timeout" if reason.startswith("timed out") else "crashed"
    return GraphResult(task.label, task.graph, kind, status, reason, detail=detail, path=task.artifact,
                       inputs=task.inputs, seed=task.seed)


def artefact_label(folder: Path, root: Path) -> str:
    """How results name an artefact: its folder relative to the bench's PATH (its name if PATH is it)."""
    try:
        rel = folder.resolve().relative_to(root.resolve())
    except ValueError:
        return folder.name
    return rel.as_posix() if rel.parts else folder.name
