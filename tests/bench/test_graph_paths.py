"""bench_graph's other paths, in process on the committed mlp artefact: a graph that draws
random numbers checked on a seeded call, where a compile's failure is told from the compiled
code's, and what the result records of each time taken, on a planted clock."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aotpipe.corpus.bench import graph as graph_mod
from aotpipe.corpus.bench.graph import GraphTask, Timing, bench_graph
from aotpipe.runtime.determinism import RNG_SEED

from .test_graph import MLP, PLANTED, _patched_compile, _scaled

OTHER = f"{PLANTED}:fails_to_compile"  # any backend but eager: compile_graph is planted below


def _seeded_draw() -> float:
    return torch.rand((), generator=torch.Generator().manual_seed(RNG_SEED)).item()


def _right_only_when_seeded(fn):
    """The compiled graph, 0.1% off on output 0 unless torch's generator is seeded as aotpipe
    seeds a graph's runs (its first draw is the seeded generator's)."""
    def run(args):
        out = list(fn(args))
        return out if torch.rand(()).item() == _seeded_draw() else _scaled(out, 0)
    return run


def test_a_graph_that_draws_random_numbers_is_checked_on_a_call_seeded_as_the_loaded_graphs(monkeypatch):
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: True)
    _patched_compile(monkeypatch, _right_only_when_seeded)
    before = torch.get_rng_state()
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=2, threads=1))
    assert (r.status, r.reason) == ("pass", "8 outputs within the bound"), r.reason
    assert r.speedup is not None
    # a graph that draws nothing is checked on its first call, unseeded
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: False)
    torch.set_rng_state(before)
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=2, threads=1))
    assert r.status == "fail_accuracy" and r.failed_outputs[0].startswith("output 0 (user output[0])"), r.reason


def test_a_seeded_call_that_raises_is_a_runtime_error_named_by_the_backends_exception(monkeypatch):
    def second_call_fails(fn):
        calls = [0]

        def run(args):
            calls[0] += 1
            if calls[0] > 1:
                raise RuntimeError("the seeded call failed")
            return fn(args)
        return run

    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: True)
    _patched_compile(monkeypatch, second_call_fails)
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=2, threads=1))
    assert (r.status, r.reason) == ("runtime_error", "RuntimeError: the seeded call failed")
    assert r.speedup is None and r.failed_outputs == [] and r.wall_s >= r.in_backend_s > 0


class InductorError(Exception):
    """Named as inductor's own: is_compile_error knows it by its name."""


def _raise_in(filename: str, exc: BaseException):
    """A compile_graph that raises `exc` from code whose file is `filename`."""
    def compile_graph(*args, **kwargs):
        exec(compile("raise exc", filename, "exec"), {"exc": exc})
    return compile_graph


@pytest.mark.parametrize("backend, filename, exc, status", [
    # the compiler's own exception: a compile error, wherever it was raised, for eager too
    ("eager", "kernel.py", InductorError("lowering"), "compile_error"),
    # another exception through dynamo's compile path: a compile error of a compiling backend
    (OTHER, "/torch/_dynamo/convert_frame.py", ValueError("guard"), "compile_error"),
    (OTHER, "/torch/_dynamo/output_graph.py", ValueError("guard"), "compile_error"),
    # ... but eager compiles nothing: there it is the graph failing to run
    ("eager", "/torch/_dynamo/convert_frame.py", ValueError("guard"), "runtime_error"),
    # elsewhere: the compiled code failing to run
    (OTHER, "/torch/_inductor/kernel.py", ValueError("guard"), "runtime_error"),
])
def test_a_first_call_that_raises_is_a_compile_error_only_from_the_compiler(monkeypatch, backend, filename, exc,
                                                                             status):
    monkeypatch.setattr(graph_mod, "compile_graph", _raise_in(filename, exc))
    r = bench_graph(GraphTask(MLP, "mlp", "inference", backend, rounds=2, threads=1))
    assert (r.status, r.reason) == (status, f"{type(exc).__name__}: {exc}")


class Clock:
    """A planted perf_counter: each read moves it on by the next of `steps`."""
    def __init__(self, *steps: float):
        self.steps, self.now = list(steps), 1000.0

    def __call__(self) -> float:
        self.now += self.steps.pop(0)
        return self.now


def _planted_timing(monkeypatch, calls):
    def time_interleaved(eager, backend, rounds, clock, peers=None):
        calls.append((rounds, clock))
        return Timing((2e-3, 1e-4), (1e-3, 2e-4), 2.0, 1.5, 2.5, True, 7.0)
    monkeypatch.setattr(graph_mod, "time_interleaved", time_interleaved)


def test_the_result_adds_up_the_compile_the_seeded_call_and_the_timed_calls(monkeypatch):
    calls = []
    _planted_timing(monkeypatch, calls)
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: True)
    # reads: start, before the compile, after it, before the seeded call, after it, the end
    monkeypatch.setattr(graph_mod, "time", SimpleNamespace(perf_counter=Clock(0, 1, 2, 4, 8, 16)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=3, threads=1))
    assert r.status == "pass" and calls == [(3, graph_mod.CLOCKS["cpu"])]
    assert (r.compile_s, r.in_backend_s, r.wall_s) == (2.0, 2.0 + 8.0 + 7.0, 31.0)
    assert (r.eager_s, r.eager_iqr, r.backend_s, r.backend_iqr) == (2e-3, 1e-4, 1e-3, 2e-4)
    assert (r.speedup, r.speedup_low, r.speedup_high, r.verdict, r.noisy) == (2.0, 1.5, 2.5, "faster", True)


def test_without_a_seeded_call_the_backend_time_is_the_compile_and_the_timed_calls(monkeypatch):
    calls = []
    _planted_timing(monkeypatch, calls)
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: False)
    monkeypatch.setattr(graph_mod, "time", SimpleNamespace(perf_counter=Clock(0, 1, 2, 4)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=3, threads=1))
    assert r.status == "pass" and (r.compile_s, r.in_backend_s, r.wall_s) == (2.0, 9.0, 7.0)


def test_a_failure_reports_the_time_taken_up_to_it(monkeypatch):
    real = graph_mod.compile_graph
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: True)
    # a seeded call that fails: start, the compile, the seeded call's start, the end

    def fails_when_seeded(fn):
        calls = [0]

        def run(args):
            calls[0] += 1
            if calls[0] > 1:
                raise RuntimeError("seeded")
            return fn(args)
        return run
    _patched_compile(monkeypatch, fails_when_seeded)
    monkeypatch.setattr(graph_mod, "time", SimpleNamespace(perf_counter=Clock(0, 1, 2, 4, 8)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=3, threads=1))
    assert r.status == "runtime_error" and (r.compile_s, r.in_backend_s, r.wall_s) == (2.0, 2.0, 15.0)
    # a compile that fails: start, before and after it, the end
    monkeypatch.setattr(graph_mod, "compile_graph", _raise_in("kernel.py", InductorError("x")))
    monkeypatch.setattr(graph_mod, "time", SimpleNamespace(perf_counter=Clock(0, 1, 2, 4)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=3, threads=1))
    assert r.status == "compile_error" and (r.compile_s, r.in_backend_s, r.wall_s) == (2.0, 2.0, 7.0)
    # outputs that do not match in number: start, the compile, the end
    monkeypatch.setattr(graph_mod, "compile_graph", real)
    _patched_compile(monkeypatch, lambda fn: (lambda args: fn(args)[:-1]))
    monkeypatch.setattr(graph_mod, "draws_random", lambda gm: False)
    monkeypatch.setattr(graph_mod, "time", SimpleNamespace(perf_counter=Clock(0, 1, 2, 4)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=3, threads=1))
    assert r.status == "fail_accuracy" and (r.compile_s, r.in_backend_s, r.wall_s) == (2.0, 2.0, 7.0)


def test_the_auto_clock_follows_the_tasks_thread_count_not_torchs(monkeypatch):
    calls = []
    _planted_timing(monkeypatch, calls)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    r = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=2))
    assert (r.clock, r.threads) == ("wall", 1) and calls == [(2, graph_mod.CLOCKS["wall"])]
    r = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1, clock="wall"))
    assert r.clock == "wall" and calls[-1] == (2, graph_mod.CLOCKS["wall"])


def _graph_with_plain_constants() -> torch.fx.GraphModule:
    """x + a.b.c + top + p, returning k too: constants set as plain attributes after the graph
    was built (as a pass may set them; not buffers, which .double() widens on its own), one
    nested two modules deep, an integer one, a non-tensor one, and a parameter."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    c, top, k, p, n = (g.get_attr(t) for t in ("a.b.c", "top", "k", "p", "n"))
    s = g.call_function(torch.ops.aten.add.Tensor, (x, c))
    s = g.call_function(torch.ops.aten.add.Tensor, (s, top))
    s = g.call_function(torch.ops.aten.add.Tensor, (s, p))
    s = g.call_function(torch.ops.aten.mul.Tensor, (s, n))
    g.output((s, k))
    root = torch.nn.Module()
    root.a = torch.nn.Module()
    root.a.b = torch.nn.Module()
    root.p = torch.nn.Parameter(torch.full((3,), 0.25))
    root.a.b.c, root.top, root.k, root.n = torch.full((3,), 1 / 3), torch.full((3,), 0.1), torch.arange(3), 3
    gm = torch.fx.GraphModule(root, g)  # which makes the tensors buffers
    for owner, name in ((gm.a.b, "c"), (gm, "top"), (gm, "k")):
        object.__setattr__(owner, name, owner._buffers.pop(name))
    return gm


def test_the_float64_copy_widens_float_constants_at_any_depth_and_leaves_the_graph_and_others_alone():
    from aotpipe.corpus.bench.graph import reference64, to_float64

    gm = _graph_with_plain_constants()
    x = torch.full((3,), 0.7)
    g, (wide,) = to_float64(gm, [x])
    assert wide.dtype == torch.float64 and x.dtype == torch.float32
    assert (g.a.b.c.dtype, g.top.dtype, g.p.dtype, g.k.dtype, g.n) == (torch.float64,) * 3 + (torch.int64, 3)
    # the loaded graph is a copy's source only: its own constants stay float32
    assert (gm.a.b.c.dtype, gm.top.dtype, gm.p.dtype) == (torch.float32,) * 3
    out = reference64(gm, [x])
    exact = (torch.tensor(0.7, dtype=torch.float64).float().double() + torch.tensor(1 / 3).double()
             + torch.tensor(0.1).double() + 0.25) * 3
    assert out[0].dtype == torch.float64 and torch.equal(out[0], exact.expand(3)) and torch.equal(out[1], torch.arange(3))


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
                                    for x, y in zip(a, b, strict=True))


def test_random_inputs_are_drawn_with_the_tasks_seed_and_a_backwards_with_its_forwards_record(monkeypatch):
    from aotpipe.corpus.bench.graph import graph_inputs, loaded

    drawn = []
    real = graph_mod.get_inputs

    def get_inputs(path, **kwargs):
        drawn.append((path, kwargs))
        return real(path, **kwargs)

    monkeypatch.setattr(graph_mod, "get_inputs", get_inputs)
    art = loaded(MLP, ())
    bwd, fwd = art.graphs["backward"], art.graphs["forward"]
    saved = graph_inputs(bwd, "saved", 3)
    assert drawn == [] and _same(saved, bwd.saved_inputs())
    three, again, four = (graph_inputs(bwd, "random", s) for s in (3, 3, 4))
    assert _same(three, again) and not _same(three, four) and not _same(three, saved)
    assert all(isinstance(x, torch.Tensor) for x in three) and len(three) == len(saved)
    assert drawn == [(bwd.input_file, {"seed": s, "forward": bwd.upstream.record}) for s in (3, 3, 4)]
    drawn.clear()
    graph_inputs(fwd, "random", 5)
    assert drawn == [(fwd.input_file, {"seed": 5, "forward": None})]


def test_a_worker_loads_an_artefact_again_only_when_its_folder_trusted_ops_or_manifest_change(monkeypatch, tmp_path):
    import os
    import shutil

    from aotpipe.corpus.bench.graph import loaded

    loads = []
    real = graph_mod.load

    def load(folder, **kwargs):
        loads.append((folder, kwargs))
        return real(folder, **kwargs)

    monkeypatch.setattr(graph_mod, "load", load)
    monkeypatch.setattr(graph_mod, "_LOADED", {})
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(MLP, one)
    shutil.copytree(MLP, two)
    for p in (one, two):  # manifests alike in size and time: only the folder tells them apart
        os.utime(p / "manifest.json", ns=(10**18, 10**18))
    a = loaded(str(one), ())
    assert loaded(str(one), ()) is a
    b = loaded(str(two), ())
    assert b is not a and Path(b.path).name == "two"
    assert loaded(str(two), ("mylib",)) is not b
    assert [kw for _, kw in loads] == [{"trust_ops": ()}, {"trust_ops": ()}, {"trust_ops": ("mylib",)}]
    c = loaded(str(two), ())
    os.utime(two / "manifest.json", ns=(2 * 10**18, 2 * 10**18))  # rewritten since: loaded again
    assert loaded(str(two), ()) is not c and len(loads) == 5


def test_the_backend_is_compiled_with_each_inputs_role_as_inputs_json_records_it(monkeypatch):
    seen = []
    real = graph_mod.compile_graph

    def compile_graph(backend, gm, args, roles, user):
        seen.append(roles)
        return real(backend, gm, args, roles, user)

    monkeypatch.setattr(graph_mod, "compile_graph", compile_graph)
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=2, threads=1))
    roles = [x.role for x in graph_mod.loaded(MLP, ()).graphs["forward"].record.inputs]
    assert r.status == "pass" and seen == [roles] and {"user", "param"} <= set(roles)


def test_outputs_of_another_dtype_fail_with_no_worst_ratio_to_report(monkeypatch):
    _patched_compile(monkeypatch, lambda fn: (lambda args: [o.to(torch.int64) for o in fn(args)]))
    r = bench_graph(GraphTask(MLP, "mlp", "inference", "eager", rounds=2, threads=1))
    assert (r.status, r.worst_ratio) == ("fail_accuracy", None)
    assert r.reason.startswith("1 of 1 outputs outside the bound; output 0 (user): int64[4, "), r.reason


def test_without_a_second_sample_an_output_over_eagers_bound_fails(monkeypatch):
    monkeypatch.setattr(graph_mod, "sequential_run", lambda gm, inputs: None)
    monkeypatch.setattr(graph_mod, "nudged_run", lambda *a: None)
    _patched_compile(monkeypatch, lambda fn: (lambda args: _scaled(list(fn(args)), 0)))
    r = bench_graph(GraphTask(MLP, "mlp", "forward", "eager", rounds=2, threads=1))
    assert (r.status, r.rescaled) == ("fail_accuracy", [])
    assert r.reason.startswith("1 of 8 outputs outside the bound; output 0 (user output[0]): RMS error "), r.reason


def test_small_helpers_nth_as_list_and_copy_inputs():
    from aotpipe.corpus.bench.graph import Lazy, as_list, copy_inputs, nth

    # nth: the i-th of the values, None past their end or where there are none
    assert [nth(lambda: [1, 2], i)() for i in (0, 1, 2, 3)] == [1, 2, None, None] and nth(lambda: None, 0)() is None
    # as_list: a graph's outputs as a list; one tensor is one output, not its rows
    t = torch.ones(2, 3)
    assert len(as_list(t)) == 1 and as_list(t)[0] is t and as_list((t, 1)) == [t, 1] and as_list([1]) == [1]
    # copy_inputs: fresh tensors, views of one storage still views of one (new) storage
    base = torch.zeros(4)
    view = base[1:]
    a, b, n = copy_inputs([base, view, 3])
    a[1] = 5.0
    assert base[1] == 0 and b[0] == 5.0 and n == 3
    # Lazy: computed on first use only, None kept as the value
    made = []
    lazy = Lazy(lambda: made.append(1))
    assert lazy() is None and lazy() is None and made == [1]
