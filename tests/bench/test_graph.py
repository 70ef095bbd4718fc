"""One graph benched (and located) in-process, as a worker does it, on the small committed mlp
artefact (tests/data/format_v2/mlp) with planted backends: each status and its reason."""

from __future__ import annotations

from pathlib import Path

import torch

from aotpipe.corpus.bench import graph as graph_mod
from aotpipe.corpus.bench.graph import (
    GraphTask,
    _in_compile,
    artefact_label,
    bench_graph,
    failure_line,
    result_from_failure,
)
from aotpipe.corpus.bench.locate import LocateTask, locate_graph
from aotpipe.pipeline.executors.base import Failure

MLP = str(Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp")
PLANTED = "tests.bench.backends"


def benched(graph: str, backend: str = "eager") -> graph_mod.GraphResult:
    return bench_graph(GraphTask(MLP, "mlp", graph, backend, rounds=2, threads=1))


def test_eager_passes_each_graph_with_its_output_count_timing_and_labels():
    r = benched("forward")
    assert (r.status, r.reason, r.kind) == ("pass", "8 outputs within the bound", "forward")
    assert r.nodes == 19 and r.graphnet_t == -10 and r.worst_ratio == 0.0 and r.failed_outputs == []
    assert r.speedup > 0 and r.speedup_low <= r.speedup <= r.speedup_high and r.verdict
    assert (r.clock, r.threads) == ("cpu", torch.get_num_threads()) and r.compile_s >= 0 and r.wall_s >= r.in_backend_s > 0
    assert (r.path, r.inputs, r.seed) == (MLP, "saved", 0)


def test_a_wrong_value_fails_accuracy_naming_the_output_and_its_bound():
    r = benched("inference", f"{PLANTED}:first_relu_doubled")
    assert r.status == "fail_accuracy"
    assert r.reason.startswith("1 of 1 outputs outside the bound; output 0 (user): RMS error "), r.reason
    assert "against the float64 eager model" in r.reason
    assert r.failed_outputs == [r.reason.split("; ", 1)[1]] and r.worst_ratio > 1000
    assert r.speedup is not None  # a failing graph is timed all the same


def test_a_backend_that_cannot_compile_is_compile_error_with_its_own_message():
    r = benched("backward", f"{PLANTED}:fails_to_compile")
    assert r.status == "compile_error" and r.speedup is None
    assert r.reason == "BackendCompilerFailed: NotImplementedError: no lowering for this graph"
    assert r.compile_s is not None and r.in_backend_s == r.compile_s


def _patched_compile(monkeypatch, wrap):
    real = graph_mod.compile_graph

    def compile_graph(*args, **kwargs):
        fn, free = real(*args, **kwargs)
        return wrap(fn), free

    monkeypatch.setattr(graph_mod, "compile_graph", compile_graph)


def test_a_backend_that_returns_fewer_outputs_fails_accuracy_naming_both_counts(monkeypatch):
    _patched_compile(monkeypatch, lambda fn: (lambda args: fn(args)[:-1]))
    r = benched("forward")
    assert r.status == "fail_accuracy" and r.reason == "7 outputs, the loaded graph gives 8", r.reason


def test_a_compiled_graph_that_raises_when_called_is_a_runtime_error(monkeypatch):
    def broken(fn):
        def run(args):
            raise RuntimeError("out of bounds in kernel 3")
        return run
    _patched_compile(monkeypatch, broken)
    r = benched("inference")
    assert r.status == "runtime_error" and r.reason == "RuntimeError: out of bounds in kernel 3", r.reason


def test_a_later_call_that_fails_is_a_runtime_error_after_the_check(monkeypatch):
    def second_call_fails(fn):
        calls = [0]

        def run(args):
            calls[0] += 1
            if calls[0] > 1:
                raise RuntimeError("stale buffer")
            return fn(args)
        return run
    _patched_compile(monkeypatch, second_call_fails)
    r = benched("inference")
    assert r.status == "runtime_error" and r.reason == "a later call failed: RuntimeError: stale buffer", r.reason


def test_a_graph_that_does_not_run_eagerly_is_skipped(monkeypatch):
    def run_graph(*a, **k):
        raise ValueError("needs a GPU")
    monkeypatch.setattr(graph_mod, "run_graph", run_graph)
    r = benched("inference")
    assert r.status == "skipped" and r.reason == "the loaded graph does not run eagerly: ValueError: needs a GPU", r.reason


def test_a_worker_that_did_not_return_is_timeout_or_crashed():
    task = GraphTask(MLP, "mlp", "inference", "eager")
    t = result_from_failure(task, "inference", "timed out after 60 s", None)
    c = result_from_failure(task, "inference", "the worker died (SIGSEGV)", "last lines")
    assert (t.status, t.reason, t.graph) == ("timeout", "timed out after 60 s", "inference")
    assert (c.status, c.detail, c.path, c.artifact, c.kind) == ("crashed", "last lines", MLP, "mlp", "inference")


def test_failure_line_names_the_exception_dynamo_wrapped():
    class Wrapped(Exception):
        pass
    e = Wrapped("backend failed")
    e.inner_exception = KeyError("aten.foo")
    assert failure_line(e) == "Wrapped: KeyError: 'aten.foo'"
    assert failure_line(RuntimeError("plain")) == "RuntimeError: plain"


def test_locate_names_the_first_wrong_node_of_an_artefact_and_writes_its_prefix(tmp_path):
    loc = locate_graph(LocateTask(MLP, "mlp", "inference", f"{PLANTED}:first_relu_doubled", "saved", 0,
                                  str(tmp_path)))
    assert loc.found and loc.node == "relu" and loc.op == "aten.relu.default", loc.lines()
    assert loc.position == "3 of 8" and loc.input_shapes == ["float32[4, 16]"]
    assert loc.reason.startswith("node relu: RMS error 0.524 against the float64 eager model")
    repro = Path(loc.repro)
    assert repro == tmp_path / "mlp-inference-relu" and (repro / "manifest.json").is_file()
    again = bench_graph(GraphTask(str(repro), "r", "inference", f"{PLANTED}:first_relu_doubled", rounds=2))
    assert again.status == "fail_accuracy"
    assert bench_graph(GraphTask(str(repro), "r", "inference", "eager", rounds=2)).status == "pass"


def test_locate_of_a_graph_that_passes_finds_nothing(tmp_path):
    loc = locate_graph(LocateTask(MLP, "mlp", "inference", "eager", "saved", 0, str(tmp_path)))
    assert not loc.found and loc.repro is None and list(tmp_path.iterdir()) == []


class InlineExecutor:
    """The process executor's interface, running each task here: what the parent side decides."""
    made: list[dict] = []

    def __init__(self, **kwargs):
        InlineExecutor.made.append(kwargs)

    def run(self, tasks, *, on_start, on_done):
        for i, t in enumerate(tasks):
            on_start(i)
            on_done(i, t.fn() if t.name.endswith("inference") else Failure("timed out after 5 s"))


def test_locate_failures_locates_each_graph_that_failed_accuracy_and_no_other(monkeypatch, tmp_path):
    from aotpipe.corpus.bench import locate as locate_mod
    from aotpipe.corpus.bench.run import Bench

    monkeypatch.setattr(locate_mod, "ProcessExecutor", InlineExecutor)
    InlineExecutor.made.clear()
    backend = f"{PLANTED}:first_relu_doubled"
    rs = [graph_mod.GraphResult("mlp", g, g, status, path=MLP) for g, status in
          (("inference", "fail_accuracy"), ("forward", "fail_accuracy"), ("backward", "compile_error"),
           ("joint", "pass"))]
    found = locate_mod.locate_failures(Bench(backend, rs, {}, 1.0), tmp_path / "r", timeout_s=5, threads=1)
    assert [(x.graph, x.found, x.node) for x in found] == [("inference", True, "relu"), ("forward", False, None)]
    assert found[1].reason == "timed out after 5 s" and found[1].artifact == "mlp"
    assert found[0].repro == str(tmp_path / "r" / "mlp-inference-relu")
    assert InlineExecutor.made == [{"workers": 1, "timeout_s": 5, "threads": 1, "cwd": Path.cwd()}]
    assert found[0].to_json()["node"] == "relu" and found[0].to_json()["position"] == "3 of 8"


def test_a_compile_error_is_told_from_the_compiled_codes_failure_by_where_it_was_raised():
    def raised_in(filename: str) -> BaseException:
        try:
            exec(compile("raise RuntimeError('x')", filename, "exec"))
        except RuntimeError as e:
            return e
        raise AssertionError

    assert _in_compile(raised_in("/site-packages/torch/_dynamo/convert_frame.py"))
    assert _in_compile(raised_in("/site-packages/torch/_dynamo/output_graph.py"))
    assert not _in_compile(raised_in("/site-packages/torch/_inductor/kernel.py"))
    assert not _in_compile(RuntimeError("never raised"))


def test_tasks_run_as_their_functions_and_artefacts_are_named_by_their_folder(tmp_path):
    r = GraphTask(MLP, "mlp", "inference", "eager", rounds=2)()
    assert r.status == "pass" and r.graph == "inference"
    assert artefact_label(tmp_path / "p" / "mlp", tmp_path) == "p/mlp"
    assert artefact_label(tmp_path, tmp_path) == tmp_path.name
    assert artefact_label(Path("/elsewhere/mlp"), tmp_path) == "mlp"
    task = GraphTask(MLP, "mlp", "inference", "eager", inputs="random", seed=7)
    t = result_from_failure(task, "inference", "timed out after 60 s", None)
    assert (t.inputs, t.seed) == ("random", 7)


def test_the_result_names_the_task_its_label_graph_inputs_and_seed(monkeypatch):
    drawn = []
    real = graph_mod.get_inputs

    def get_inputs(*a, **k):
        drawn.append(k.get("seed"))
        return real(*a, **k)

    monkeypatch.setattr(graph_mod, "get_inputs", get_inputs)
    r = bench_graph(GraphTask(MLP, "models/mlp", "forward", "eager", rounds=2, threads=1))
    assert (r.status, r.artifact, r.graph, r.inputs, r.seed) == ("pass", "models/mlp", "forward", "saved", 0)
    assert drawn == []  # saved inputs: the artefact's own, none drawn
    r = bench_graph(GraphTask(MLP, "models/mlp", "forward", "eager", inputs="random", seed=3, rounds=2, threads=1))
    assert (r.status, r.artifact, r.graph, r.inputs, r.seed) == ("pass", "models/mlp", "forward", "random", 3)
    assert drawn == [3]


def _scaled(outputs, j, by=1.001):
    return None if outputs is None else [o * by if i == j else o for i, o in enumerate(outputs)]


def test_an_output_as_far_off_as_the_sequential_sample_passes_by_it_and_is_listed(monkeypatch):
    # The second sample (the graph with its sums in sequential order) planted 0.1% off on output
    # 0, as the backend is: over eager's bound, within the second sample's.
    real = graph_mod.sequential_run
    monkeypatch.setattr(graph_mod, "sequential_run", lambda gm, inputs: _scaled(real(gm, inputs), 0))
    _patched_compile(monkeypatch, lambda fn: (lambda args: _scaled(list(fn(args)), 0)))
    r = benched("forward")
    assert (r.status, r.rescaled) == ("pass", ["output 0 (user output[0])"]), r.reason
    assert r.reason.startswith("8 outputs within the bound; 1 of them only with float32 summed sequentially as the "
                               "scale, output 0 (user output[0]): within the float-noise floor "), r.reason
    # without the planted second sample, the same backend fails on output 0
    monkeypatch.setattr(graph_mod, "sequential_run", real)
    r = benched("forward")
    assert r.status == "fail_accuracy" and r.failed_outputs[0].startswith("output 0 (user output[0]): RMS error")


def test_an_output_as_far_off_as_a_nudged_sample_passes_by_the_further_samples_seeded_from_one(monkeypatch):
    seeds = []
    real = graph_mod.nudged_run

    def nudged_run(gm, inputs, k, roles):
        seeds.append(k)
        return _scaled(real(gm, inputs, k, roles), 0)

    monkeypatch.setattr(graph_mod, "nudged_run", nudged_run)
    _patched_compile(monkeypatch, lambda fn: (lambda args: _scaled(list(fn(args)), 0)))
    r = benched("forward")
    assert (r.status, r.rescaled, seeds) == ("pass", [], [1]), r.reason
    # a further sample that does not run is left out: the output fails on eager's own
    monkeypatch.setattr(graph_mod, "nudged_run", lambda *a: None)
    r = benched("forward")
    assert r.status == "fail_accuracy" and r.failed_outputs[0].startswith("output 0 (user output[0]): RMS error")


def test_without_a_float64_run_an_output_is_judged_by_the_floor_alone(monkeypatch):
    monkeypatch.setattr(graph_mod, "reference64", lambda gm, inputs: None)
    assert benched("forward").status == "pass"  # eager: within the floor of itself
    _patched_compile(monkeypatch, lambda fn: (lambda args: _scaled(list(fn(args)), 0)))
    r = benched("forward")
    assert r.status == "fail_accuracy"
    assert r.failed_outputs[0].startswith("output 0 (user output[0]): RMS error"), r.failed_outputs
    assert "against eager float32, over the float-noise floor" in r.failed_outputs[0], r.failed_outputs


def test_a_skipped_graph_still_reports_the_time_it_took(monkeypatch):
    import time

    def run_graph(*a, **k):
        raise ValueError("needs a GPU")
    monkeypatch.setattr(graph_mod, "run_graph", run_graph)
    t0 = time.perf_counter()
    r = benched("inference")
    took = time.perf_counter() - t0
    assert r.status == "skipped" and 0 < r.wall_s <= took


def test_check_outputs_takes_further_samples_then_the_second_sample_per_output():
    from aotpipe.corpus.bench.graph import check_outputs

    exact = torch.full((4096,), 0.5, dtype=torch.float64)
    eager = (exact + 1e-7).float()  # eager float32: error 1.19e-7, its bound 5.3e-6
    off = (exact + 4e-6).float()  # a float32 run with error 3.99e-6: the bound 1.31e-5
    backend = (exact + 1e-5).float()
    actual, expected = [3, backend, backend], [3, eager, eager]
    labels = ["output 0", "output 1", "output 2"]
    # output 1 passes by the second sample; output 2 by a further sample of eager's noise
    checks, rescaled = check_outputs(actual, expected, lambda: [None, exact, exact], labels,
                                     seq=lambda: [None, off, None], samples=[lambda: [None, None, off]])
    assert [c.passed for c in checks] == [True, True, True] and rescaled == ["output 1"]
    assert checks[0].method == "exact" and "summed sequentially" in checks[1].detail
    # no second sample, no further ones: both fail on eager's own error
    checks, rescaled = check_outputs(actual, expected, lambda: [None, exact, exact], labels)
    assert [c.passed for c in checks] == [True, False, False] and rescaled == []
    # no float64 run: the floor alone decides
    checks, _ = check_outputs(actual, expected, None, labels)
    assert [(c.passed, c.method) for c in checks] == [(True, "exact"), (False, "floor"), (False, "floor")]


def test_graphnet_tolerance_is_the_least_t_whose_rtol_and_atol_allow_every_output():
    from aotpipe.corpus.bench.graph import graphnet_tolerance

    # float32 at t: rtol 10**(t * 5.886 / 5), atol 10**t. Around 1e6 the rtol decides: 1.0 off
    # is within 1e6 * 10**(-5 * 1.1772) = 1.31 at t = -5, not 1e6 * 10**(-6 * 1.1772) = 0.087.
    big = torch.full((4,), 1e6)
    assert graphnet_tolerance([big + 1.0], [big]) == -5
    # Around 0 the atol decides: 1e-3 off is within 10**-3, not 10**-4.
    assert graphnet_tolerance([torch.full((4,), 1e-3)], [torch.zeros(4)]) == -3
    assert graphnet_tolerance([big.double() + 1.0], [big.double()]) == -4  # float64: 10**(t * 7 / 5) both
    assert graphnet_tolerance([big, 3], [big, 3]) == -10
    assert graphnet_tolerance([big, big.double()], [big, big]) is None  # another dtype: never
    assert graphnet_tolerance([torch.tensor([1, 2])], [torch.tensor([1, 3])]) is None  # integers: equal or never


def test_labels_name_each_output_by_its_role_and_target():
    from types import SimpleNamespace

    from aotpipe.corpus.bench.graph import _labels

    rec = SimpleNamespace(outputs=[SimpleNamespace(role="grad", target="fc.weight"),
                                   SimpleNamespace(role="user", target="")])
    assert _labels(rec) == ["output 0 (grad fc.weight)", "output 1 (user)"]


def test_a_nudged_sample_is_the_same_for_the_same_seed_and_another_for_another():
    from torch.fx.experimental.proxy_tensor import make_fx

    from aotpipe.corpus.bench.graph import nudged_run

    gm = make_fx(lambda x: x * 1.0)(torch.ones(64))
    one, again, two = (nudged_run(gm, [torch.ones(64)], k, ["user"])[0] for k in (1, 1, 2))
    assert torch.equal(one, again) and not torch.equal(one, two)


def test_a_rows_json_is_its_fields_and_says_whether_it_recompiled_only_at_a_size_point():
    from dataclasses import asdict

    from aotpipe.corpus.bench.graph import GraphResult

    plain = GraphResult(artifact="a", graph="g", kind="inference", status="ok")
    assert plain.to_json() == asdict(plain) and "recompiled" not in plain.to_json()
    at_size = GraphResult(artifact="a", graph="g", kind="inference", status="ok", sizes={"batch": 7}, point=1,
                          compiles=2)
    d = at_size.to_json()
    assert d == {**asdict(at_size), "recompiled": at_size.recompiled} and d["recompiled"] is True
    first = GraphResult(artifact="a", graph="g", kind="inference", status="ok", sizes={"batch": 1}, point=0,
                        compiles=1)
    assert first.to_json()["recompiled"] is first.recompiled
