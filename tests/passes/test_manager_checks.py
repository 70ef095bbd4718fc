"""The pass manager's checks, each planted against: a pass that changes the results, one that
leaves a graph that does not run, one that raises or leaves an invalid graph (left out when
optional, failing the model when required), and a pass's records. Fast: one small mlp,
captured once per module, and planted passes registered for the test."""

import dataclasses

import pytest
import torch

import aotpipe.passes as passes
from aotpipe.capture import capture_export
from aotpipe.capture.binding import graph_inputs
from aotpipe.models import zoo
from aotpipe.models.eager import model_state
from aotpipe.passes import FreezeOptions, PassInfo
from aotpipe.passes.base import PassError, PassResult
from aotpipe.passes.manager import apply_passes, chain_name, diagnose_chain, run_chain, run_chain_leaving_out, untimed
from aotpipe.runtime.execution import run_graph
from aotpipe.spec import PassStep
from tests.passes.helpers import graph_of

aten = torch.ops.aten
INFERENCE = frozenset({"inference"})


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return graph_of(zoo.mlp(in_features=4, hidden=8, out_features=3), torch.randn(2, 4))


def _output(g):
    return next(n for n in g.gm.graph.nodes if n.op == "output")


def scale_output(factor):
    """A pass that multiplies the first output by `factor` (a new node: no node of the graph
    before it diverges)."""
    def run(g, options):
        graph = g.gm.graph
        out = _output(g)
        first, *rest = out.args[0]
        with graph.inserting_before(out):
            scaled = graph.call_function(aten.mul.Tensor, (first, factor))
        out.args = ((scaled, *rest),)
        return PassResult(g, modified=True, stats={"scaled": 1, "untouched": 0})
    return run


def relu_to_neg(g, options):
    """A pass that makes the first relu a neg: the node `relu` diverges."""
    n = next(n for n in g.gm.graph.nodes if n.target is aten.relu.default)
    n.target = aten.neg.default
    return PassResult(g, modified=True)


def no_output(g, options):
    """A pass that leaves an invalid graph (the first relu takes a value made after it): lint fails."""
    relu = next(n for n in g.gm.graph.nodes if n.target is aten.relu.default)
    relu.args = (_output(g).args[0][0],)
    return PassResult(g, modified=True)


def _raising(*args):
    raise ValueError("planted at run time")


def fails_when_run(g, options):
    """A pass that leaves a graph that lints but raises when run."""
    n = next(n for n in g.gm.graph.nodes if n.target is aten.relu.default)
    n.target = _raising
    return PassResult(g, modified=True)


def extra_output(g, options):
    out = _output(g)
    out.args = ((*out.args[0], out.args[0][0]),)
    return PassResult(g, modified=True)


def nothing(g, options):
    return PassResult(g, modified=False, stats={"looked": 3})


def raises_pass_error(g, options):
    raise PassError("planted: the pass's own words")


def register(monkeypatch, name, fn, *, optional=True, needs=(), kinds=INFERENCE):
    monkeypatch.setitem(passes.PASSES, name, PassInfo(name, fn, FreezeOptions, kinds, "planted", needs=needs,
                                                      optional=optional))
    return PassStep(name, FreezeOptions())


# ---------------------------------------------------------------------------------------
# run_chain, checking each pass


def test_a_pass_that_changes_the_results_is_caught_and_named(mlp, monkeypatch):
    steps = [register(monkeypatch, "ok_pass", nothing), register(monkeypatch, "scale", scale_output(1.01))]
    with pytest.raises(PassError) as e:
        run_chain(mlp.copy(), steps)
    msg = str(e.value)
    assert msg.startswith("pass 'scale' (passes before it: ok_pass) changed the results: output 0")
    assert "first diverging node" not in msg  # the node that changed is new: nothing before it diverged


def test_a_pass_within_float_noise_passes_with_its_error_recorded(mlp, monkeypatch):
    steps = [register(monkeypatch, "scale", scale_output(1 + 2 ** -20))]
    final, (rec,) = run_chain(mlp.copy(), steps)
    expected = run_graph(mlp.gm, mlp.values)[0]
    assert rec.max_abs_error == pytest.approx(expected.abs().max().item() * 2 ** -20, rel=0.5)
    assert rec.max_abs_error > 0
    assert (rec.name, rec.nodes_before, rec.nodes_after, rec.modified) == ("scale", len(mlp.gm.graph.nodes),
                                                                         len(mlp.gm.graph.nodes) + 1, True)
    assert rec.stats == {"scaled": 1, "untouched": 0} and rec.seconds >= 0 and rec.options == {
        "cse": True, "fold": True, "graphs": ["inference"]}


def test_a_changed_node_is_named_as_the_first_that_diverges(mlp, monkeypatch):
    steps = [register(monkeypatch, "neg", relu_to_neg)]
    with pytest.raises(PassError, match=r"pass 'neg' \(passes before it: none\) changed the results: .*; "
                                        r"first diverging node: relu \(neg.default\): "):
        run_chain(mlp.copy(), steps)


def test_a_pass_that_adds_an_output_is_caught(mlp, monkeypatch):
    with pytest.raises(PassError, match=r"pass 'extra' \(passes before it: none\) changed the results: 2 outputs, "
                                        r"1 before$"):
        run_chain(mlp.copy(), [register(monkeypatch, "extra", extra_output)])


def test_a_pass_that_leaves_a_graph_that_does_not_run_is_caught(mlp, monkeypatch):
    with pytest.raises(PassError, match=r"^pass 'bad' \(passes before it: none\) left a graph that does not run: "
                                        r"ValueError: planted at run time$"):
        run_chain(mlp.copy(), [register(monkeypatch, "bad", fails_when_run)])


def test_a_pass_that_leaves_an_invalid_graph_or_raises_is_caught(mlp, monkeypatch):
    with pytest.raises(PassError, match=r"^pass 'broken' \(passes before it: none\) failed: "):
        run_chain(mlp.copy(), [register(monkeypatch, "broken", no_output)])
    with pytest.raises(PassError, match=r"^planted: the pass's own words$"):  # a PassError is its own message
        run_chain(mlp.copy(), [register(monkeypatch, "own", raises_pass_error)])


def test_each_pass_is_checked_against_the_graph_before_it_not_the_first(mlp, monkeypatch):
    # Two passes each within noise of the graph before them: both pass, whatever they add up to.
    step = register(monkeypatch, "scale", scale_output(1 + 2 ** -20))
    final, records = run_chain(mlp.copy(), [step, step, step])
    assert [r.nodes_before for r in records] == [len(mlp.gm.graph.nodes) + i for i in range(3)]
    assert all(r.nodes_after == r.nodes_before + 1 for r in records)


def test_the_graph_passed_in_is_left_as_it_was_when_each_pass_is_checked(mlp, monkeypatch):
    g = mlp.copy()
    before = len(g.gm.graph.nodes)
    final, _ = run_chain(g, [register(monkeypatch, "scale", scale_output(1.0))])
    assert len(g.gm.graph.nodes) == before and len(final.gm.graph.nodes) == before + 1


def test_without_checking_each_pass_a_changed_result_is_not_looked_for(mlp, monkeypatch):
    final, (rec,) = run_chain(mlp.copy(), [register(monkeypatch, "scale", scale_output(2.0))], check_each=False)
    assert rec.max_abs_error is None and rec.nodes_after == rec.nodes_before + 1
    torch.testing.assert_close(run_graph(final.gm, final.values)[0], 2 * run_graph(mlp.gm, mlp.values)[0])
    with pytest.raises(PassError, match="failed: "):  # linted all the same
        run_chain(mlp.copy(), [register(monkeypatch, "broken", no_output)], check_each=False)


def test_a_chain_out_of_order_is_refused_before_any_pass_runs(mlp, monkeypatch):
    ran = []
    register(monkeypatch, "first", lambda g, o: ran.append(1) or nothing(g, o))
    steps = [register(monkeypatch, "second", nothing, needs=("first",))]
    for chain in (run_chain, lambda g, s: run_chain_leaving_out(g, s, "inference")):
        with pytest.raises(PassError, match=r"^pass 'second' needs 'first' before it in the chain"):
            chain(mlp.copy(), steps)
    assert ran == []


def test_a_pass_is_refused_a_graph_kind_it_does_not_take(mlp, monkeypatch):
    step = register(monkeypatch, "train_only", nothing, kinds=frozenset({"forward", "joint"}))
    with pytest.raises(PassError, match=r"^pass 'train_only' \(passes before it: none\) cannot take a inference "
                                        r"graph; it accepts forward, joint$"):
        run_chain(mlp.copy(), [step])


# ---------------------------------------------------------------------------------------
# A run: run_chain_leaving_out


def test_an_optional_pass_that_leaves_an_invalid_graph_is_left_out_and_the_chain_goes_on(mlp, monkeypatch):
    steps = [register(monkeypatch, "a", nothing), register(monkeypatch, "broken", no_output),
             register(monkeypatch, "c", scale_output(1.0))]
    final, records, ran, left = run_chain_leaving_out(mlp.copy(), steps, "inference")
    assert [s.name for s in ran] == [r.name for r in records] == ["a", "c"]
    assert all(r.max_abs_error is None for r in records)
    (lo,) = left
    assert (lo.record.graph, lo.record.name, lo.record.left_out, lo.record.chain) == ("inference", "broken", [], "a+c")
    assert lo.record.error.startswith("pass 'broken' (passes before it: a) failed: ")
    final.gm.graph.lint()


def test_a_required_pass_that_leaves_an_invalid_graph_fails(mlp, monkeypatch):
    steps = [register(monkeypatch, "a", nothing), register(monkeypatch, "broken", no_output, optional=False)]
    with pytest.raises(PassError, match=r"^pass 'broken' \(passes before it: a\) failed: "):
        run_chain_leaving_out(mlp.copy(), steps, "inference")


def test_passes_left_out_with_a_failed_one_are_named_in_its_record_even_through_another(mlp, monkeypatch):
    steps = [register(monkeypatch, "base", raises_pass_error), register(monkeypatch, "mid", nothing, needs=("base",)),
             register(monkeypatch, "top", nothing, needs=("mid",)), register(monkeypatch, "free", nothing)]
    final, records, ran, left = run_chain_leaving_out(mlp.copy(), steps, "forward")
    assert [s.name for s in ran] == ["free"]
    assert [(lo.record.name, lo.record.left_out, lo.record.chain, lo.record.graph) for lo in left] == [
        ("base", ["mid", "top"], "free", "forward")]
    assert lo_error(left) == "planted: the pass's own words"


def lo_error(left):
    return left[0].record.error


def test_when_every_pass_is_left_out_the_chain_is_none(mlp, monkeypatch):
    final, records, ran, left = run_chain_leaving_out(mlp.copy(), [register(monkeypatch, "x", no_output)], "inference")
    assert (records, ran, left[0].record.chain) == ([], [], None)
    assert final.gm.graph is not None and len(final.gm.graph.nodes) == len(mlp.gm.graph.nodes)


def test_a_run_records_each_pass_unchecked_with_its_counts(mlp, monkeypatch):
    steps = [register(monkeypatch, "scale", scale_output(1.0)), register(monkeypatch, "idle", nothing)]
    _, records, _, _ = run_chain_leaving_out(mlp.copy(), steps, "inference")
    n = len(mlp.gm.graph.nodes)
    assert [(r.nodes_before, r.nodes_after, r.modified, r.stats) for r in records] == [
        (n, n + 1, True, {"scaled": 1, "untouched": 0}), (n + 1, n + 1, False, {"looked": 3})]
    assert untimed(records[0]).model_dump() == {k: v for k, v in records[0].model_dump().items() if k != "seconds"}
    assert chain_name([PassStep("a", None), PassStep("b", None)]) == "a+b" and chain_name([]) == ""


# ---------------------------------------------------------------------------------------
# diagnose_chain


def test_diagnosis_names_the_pass_at_fault_or_says_the_errors_add_up(mlp, monkeypatch):
    steps = [register(monkeypatch, "idle", nothing), register(monkeypatch, "scale", scale_output(1.01))]
    assert diagnose_chain(mlp.copy(), steps).startswith("pass 'scale' (passes before it: idle) changed the results")
    assert diagnose_chain(mlp.copy(), steps[:1]) == (
        "every pass is within float noise of the graph before it: the passes' errors add up")


# ---------------------------------------------------------------------------------------
# apply_passes: a model's chain over its captured graphs


@pytest.fixture(scope="module")
def capture():
    torch.manual_seed(0)
    model = zoo.mlp(in_features=4, hidden=8, out_features=3).eval()
    x = torch.randn(2, 4)
    cap = capture_export(model, (x,), {}, name="m", graphs=["inference"], input_names=["x"])
    inputs = graph_inputs(cap, model_state(model, cap.constants), {cap.user_inputs[0]: x})
    return cap, inputs


def _fresh(capture):
    import copy

    cap, inputs = capture
    cap = copy.copy(cap)
    cap.derived = {}
    return cap, {k: list(v) for k, v in inputs.items()}


def test_apply_passes_adds_the_derived_graph_its_inputs_and_what_the_chain_did(capture, monkeypatch):
    cap, inputs = _fresh(capture)
    steps = [register(monkeypatch, "scale", scale_output(1.0)), None, register(monkeypatch, "idle", nothing)]
    out = apply_passes(type("Spec", (), {"passes": steps})(), cap, inputs)
    assert (out.problems, out.left_out, out.skipped, out.tracebacks) == ([], [], [], [])
    assert list(cap.derived) == list(out.runs) == list(out.diagnose) == ["inference.scale+idle"]
    d = cap.derived["inference.scale+idle"]
    assert (d.base, d.chain, d.graph.kind) == ("inference", "scale+idle", "inference")
    assert [s.name for s in d.steps] == [s.name for s in out.runs["inference.scale+idle"].steps] == ["scale", "idle"]
    assert not hasattr(d.steps[0], "seconds") or "seconds" not in d.steps[0].model_dump()
    assert inputs["inference.scale+idle"] is not None and len(d.graph.outputs) == len(cap.graphs["inference"].outputs)
    assert [o.meta.shape if o.meta is not None else None for o in d.graph.outputs] == [
        o.meta.shape if o.meta is not None else None for o in cap.graphs["inference"].outputs]
    assert out.diagnose["inference.scale+idle"]().startswith("every pass is within float noise")


def test_apply_passes_fails_the_model_on_a_required_pass_and_leaves_out_an_optional_one(capture, monkeypatch):
    cap, inputs = _fresh(capture)
    spec = type("Spec", (), {"passes": [register(monkeypatch, "must", no_output, optional=False)]})()
    out = apply_passes(spec, cap, inputs)
    assert out.problems == [f"inference graph: {out.problems[0].split(': ', 1)[1]}"]
    assert out.problems[0].startswith("inference graph: pass 'must' (passes before it: none) failed: ")
    assert len(out.tracebacks) == 1 and "Traceback" in out.tracebacks[0] and cap.derived == {} and out.runs == {}

    cap, inputs = _fresh(capture)
    spec = type("Spec", (), {"passes": [register(monkeypatch, "may", no_output), register(monkeypatch, "idle", nothing)]})()
    out = apply_passes(spec, cap, inputs)
    assert out.problems == [] and [s.name for s in out.skipped] == ["may"] and list(cap.derived) == ["inference.idle"]

    cap, inputs = _fresh(capture)
    spec = type("Spec", (), {"passes": [register(monkeypatch, "may", no_output)]})()
    out = apply_passes(spec, cap, inputs)  # every pass left out: no derived graph
    assert [s.name for s in out.skipped] == ["may"] and cap.derived == {} and out.runs == {}


def test_apply_passes_skips_a_graph_without_inputs_or_not_selected(capture, monkeypatch):
    cap, inputs = _fresh(capture)
    del inputs["inference"]
    out = apply_passes(type("Spec", (), {"passes": [register(monkeypatch, "idle", nothing)]})(), cap, inputs)
    assert cap.derived == {} and out.runs == {}
    cap, inputs = _fresh(capture)
    training = PassStep(register(monkeypatch, "idle", nothing).name, FreezeOptions(graphs=("forward", "joint")))
    out = apply_passes(type("Spec", (), {"passes": [training]})(), cap, inputs)
    assert cap.derived == {} and out.runs == {}
    out = apply_passes(type("Spec", (), {"passes": [training, PassStep("idle", FreezeOptions())]})(), cap, inputs)
    assert list(cap.derived) == ["inference.idle"]  # the chain for inference: the steps that select it


def addmm_alpha(alpha):
    """A pass that scales the first addmm's product by `alpha` (the node `addmm` itself diverges)."""
    def run(g, options):
        n = next(n for n in g.gm.graph.nodes if n.target is aten.addmm.default)
        n.kwargs = {**n.kwargs, "alpha": alpha}
        return PassResult(g, modified=True)
    return run


def test_a_node_one_percent_off_is_named_as_where_the_results_depart(mlp, monkeypatch):
    with pytest.raises(PassError, match=r"changed the results: .*; first diverging node: addmm \(addmm.default\): "):
        run_chain(mlp.copy(), [register(monkeypatch, "alpha", addmm_alpha(1.01))])


def test_outputs_on_the_meta_device_are_compared_by_shape_and_dtype():
    from aotpipe.passes.manager import _compare

    real = torch.ones(2, 3)
    assert _compare([real], [torch.empty(2, 3, device="meta")]) == (0.0, [])
    assert _compare([real], [torch.empty(2, 4, device="meta")]) == (
        0.0, ["output 0: torch.float32[2, 4], was torch.float32[2, 3]"])
    assert _compare([real], [torch.empty(2, 3, dtype=torch.float64, device="meta")])[1] == [
        "output 0: torch.float64[2, 3], was torch.float32[2, 3]"]
    worst, problems = _compare([real, real], [real + 0.5, real])
    assert worst == 0.5 and len(problems) == 1 and problems[0].startswith("output 0")


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return y.relu(), y.sum()


@pytest.fixture(scope="module")
def two_graphs():
    """A capture of two inference graphs: "inference" (two outputs, a relu) and "inference_1"
    (a linear alone, as a dynamo capture's later subgraph), with their inputs."""
    torch.manual_seed(0)
    graphs, inputs = {}, {}
    for key, model in (("inference", TwoOutputs()), ("inference_1", torch.nn.Linear(4, 2))):
        model.eval()
        x = torch.randn(2, 4)
        cap = capture_export(model, (x,), {}, name="m", graphs=["inference"], input_names=["x"])
        graphs[key] = cap.graphs["inference"]
        inputs[key] = graph_inputs(cap, model_state(model, cap.constants), {cap.user_inputs[0]: x})["inference"]
    cap.graphs = graphs
    return cap, inputs


def break_relu(g, options):
    """Leaves an invalid graph where there is a relu; does nothing where there is none."""
    if any(n.target is aten.relu.default for n in g.gm.graph.nodes):
        return no_output(g, options)
    return nothing(g, options)


def spec(*steps):
    return type("Spec", (), {"passes": list(steps)})()


@pytest.mark.parametrize("first", ["has no inputs", "fails a required pass", "leaves every pass out"])
def test_apply_passes_goes_on_to_the_next_graph_whatever_became_of_the_first(two_graphs, monkeypatch, first):
    cap, inputs = _fresh(two_graphs)
    if first == "has no inputs":
        del inputs["inference"]
    step = register(monkeypatch, "br", break_relu, optional=first != "fails a required pass")
    out = apply_passes(spec(step), cap, inputs)
    assert list(cap.derived) == ["inference_1.br"]
    assert len(out.problems) == (first == "fails a required pass") == len(out.tracebacks)
    assert [(s.graph, s.name) for s in out.skipped] == ([("inference", "br")] if first == "leaves every pass out" else [])


def test_apply_passes_collects_what_each_graph_left_out(two_graphs, monkeypatch):
    cap, inputs = _fresh(two_graphs)
    out = apply_passes(spec(register(monkeypatch, "bad", no_output_anywhere), register(monkeypatch, "idle", nothing)),
                       cap, inputs)
    assert [(s.graph, s.name, s.chain) for s in out.skipped] == [("inference", "bad", "idle"),
                                                                 ("inference_1", "bad", "idle")]
    assert list(cap.derived) == ["inference.idle", "inference_1.idle"]


def no_output_anywhere(g, options):
    out = _output(g)
    first = next(n for n in g.gm.graph.nodes if n.op == "call_function")
    first.args = (out.args[0][0],) + tuple(first.args[1:])  # used before it is made
    return PassResult(g, modified=True)


def test_a_required_pass_s_traceback_is_kept_for_v(two_graphs, monkeypatch):
    cap, inputs = _fresh(two_graphs)
    out = apply_passes(spec(register(monkeypatch, "must", break_relu, optional=False)), cap, inputs)
    (tb,) = out.tracebacks
    assert tb.startswith("Traceback (most recent call last):\n  File ") and "PassError: pass 'must'" in tb


def test_the_derived_graph_runs_and_keeps_each_output_s_index_role_and_target(two_graphs, monkeypatch):
    cap, inputs = _fresh(two_graphs)
    apply_passes(spec(register(monkeypatch, "idle", nothing)), cap, inputs)
    d, base = cap.derived["inference.idle"], cap.graphs["inference"]
    assert [(o.index, o.role, o.target) for o in d.graph.outputs] == [(o.index, o.role, o.target) for o in base.outputs]
    assert len(d.graph.outputs) == 2 and d.graph.inputs == base.inputs
    assert [o.meta for o in d.graph.outputs] == [o.meta for o in base.outputs]  # from the nodes' values, the same
    torch.testing.assert_close(run_graph(d.graph.gm, inputs["inference.idle"]), run_graph(base.gm, inputs["inference"]))
    assert inputs["inference.idle"] == inputs["inference"]


def _retype_first_output(val):
    """A pass that puts `val` as the recorded value of the graph's first output."""
    def run(g, options):
        first = _output(g).args[0][0]
        first.meta["val"] = val
        return PassResult(g, modified=True)
    return run


def test_a_derived_output_s_layout_is_its_node_s_value_unless_that_is_on_meta(two_graphs, monkeypatch):
    # the planted values stand: after a real pass fill_vals would set the node's true layout (test_manager.py)
    monkeypatch.setattr("aotpipe.passes.manager.fill_vals", lambda gm: 0)
    cap, inputs = _fresh(two_graphs)
    apply_passes(spec(register(monkeypatch, "f64", _retype_first_output(torch.zeros(2, 3, dtype=torch.float64)))),
                 cap, inputs)
    metas = [o.meta for o in cap.derived["inference.f64"].graph.outputs]
    assert (metas[0].dtype, metas[0].shape) == (torch.float64, (2, 3))
    assert metas[1] == cap.graphs["inference"].outputs[1].meta
    cap, inputs = _fresh(two_graphs)
    apply_passes(spec(register(monkeypatch, "m", _retype_first_output(torch.zeros(5, dtype=torch.float64,
                                                                                   device="meta")))), cap, inputs)
    assert cap.derived["inference.m"].graph.outputs[0].meta == cap.graphs["inference"].outputs[0].meta


def bare_output(g, options):
    """A pass that leaves the graph's one output as a bare node (not a tuple)."""
    out = _output(g)
    out.args = (out.args[0][0],)
    return PassResult(g, modified=True)


def test_a_derived_graph_whose_output_is_a_bare_node_is_read(two_graphs, monkeypatch):
    cap, inputs = _fresh(two_graphs)
    del inputs["inference"]
    apply_passes(spec(register(monkeypatch, "bare", bare_output)), cap, inputs)
    (o,) = cap.derived["inference_1.bare"].graph.outputs
    assert (o.meta.shape, o.meta.dtype) == ((2, 2), torch.float32)


def test_times_are_rounded_to_a_tenth_of_a_millisecond(two_graphs, monkeypatch):
    import itertools
    from types import SimpleNamespace

    import aotpipe.passes.manager as manager

    ticks = itertools.count(1)  # no tick is 0: a sum of two ticks is no difference of them
    monkeypatch.setattr(manager, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.123456))
    cap, inputs = _fresh(two_graphs)
    del inputs["inference_1"]
    out = apply_passes(spec(register(monkeypatch, "idle", nothing)), cap, inputs)
    run = out.runs["inference.idle"]
    assert run.steps[0].seconds == 0.1235  # the pass: one tick
    assert run.seconds == 0.3704  # the chain: three ticks (start, the pass's two)


def _relu_strided(x):
    """relu with the same values in another layout (transposed, made contiguous, transposed back)."""
    return torch.relu(x).t().contiguous().t()


def test_a_node_whose_layout_alone_changed_is_not_named_as_diverging(mlp, monkeypatch):
    def restride_then_scale(g, options):
        next(n for n in g.gm.graph.nodes if n.target is aten.relu.default).target = _relu_strided
        return scale_output(1.01)(g, options)

    with pytest.raises(PassError) as e:
        run_chain(mlp.copy(), [register(monkeypatch, "restride", restride_then_scale)])
    assert "changed the results" in str(e.value) and "first diverging node" not in str(e.value)



def test_an_output_on_meta_does_not_stop_the_outputs_after_it_being_compared():
    from aotpipe.passes.manager import _compare

    real = torch.ones(2, 3)
    worst, problems = _compare([real, real], [torch.empty(2, 3, device="meta"), real + 0.5])
    assert worst == 0.5 and len(problems) == 1 and problems[0].startswith("output 1")


def test_outputs_that_are_not_tensors_are_compared_as_values():
    from aotpipe.passes.manager import _compare

    assert _compare([3, None], [3, None]) == (0.0, [])
    assert _compare([3], [4]) == (0.0, ["output 0: 4 != eager's 3"])


def test_the_worst_error_counts_only_tensors_of_the_same_shape_on_both_sides():
    from aotpipe.passes.manager import _compare

    worst, problems = _compare([torch.ones(2, 3)], [torch.ones(2, 4)])
    assert worst == 0.0 and problems == ["output 0: float32[2, 4] != eager's float32[2, 3]"]
    worst, problems = _compare([None], [torch.ones(2)])
    assert worst == 0.0 and problems == ["output 0: the graph gives a value, eager gives None"]


class FourOutputs(torch.nn.Module):
    def forward(self, x):
        return x + 1, x + 2, x + 3, x + 4


def scale_every_output(factor):
    def run(g, options):
        graph = g.gm.graph
        out = _output(g)
        with graph.inserting_before(out):
            out.args = (tuple(graph.call_function(aten.mul.Tensor, (o, factor)) for o in out.args[0]),)
        return PassResult(g, modified=True)
    return run


def test_a_pass_that_changes_many_outputs_is_reported_with_the_first_three_joined_by_semicolons(monkeypatch):
    g = graph_of(FourOutputs(), torch.ones(2, 3))
    with pytest.raises(PassError) as e:
        run_chain(g, [register(monkeypatch, "double", scale_every_output(2.0))])
    head, listed = str(e.value).split(" changed the results: ")
    assert head == "pass 'double' (passes before it: none)"
    assert [p.split(":")[0] for p in listed.split("; ")] == ["output 0", "output 1", "output 2"]


def test_without_checking_each_pass_every_pass_runs_on_the_graph_itself_and_nothing_is_run(mlp, monkeypatch):
    import aotpipe.passes.manager as manager

    def never(*args):
        raise AssertionError("a graph was run")

    monkeypatch.setattr(manager, "run_graph", never)
    g = mlp.copy()
    steps = [register(monkeypatch, "scale", scale_output(1.0)), register(monkeypatch, "idle", nothing)]
    final, records = run_chain(g, steps, check_each=False)
    assert [r.name for r in records] == ["scale", "idle"]
    assert final.gm is g.gm  # no copy: the graph before each pass is not kept


def test_a_chain_s_pass_times_are_their_own_durations(mlp, monkeypatch):
    import itertools
    from types import SimpleNamespace

    import aotpipe.passes.manager as manager

    ticks = itertools.count(1)
    monkeypatch.setattr(manager, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.123456))
    for check_each in (True, False):
        _, (rec,) = run_chain(mlp.copy(), [register(monkeypatch, "idle", nothing)], check_each=check_each)
        assert rec.seconds == 0.1235


def _frozen_capture(two_graphs):
    """A capture whose one inference graph holds its weights as constants (freeze run on it)."""
    from aotpipe.format.ir import CapturedGraph
    from aotpipe.passes import PASSES

    cap, inputs = _fresh(two_graphs)
    base = cap.graphs["inference_1"]
    from aotpipe.passes.base import GraphUnderPass

    g = GraphUnderPass(base.gm, "inference", list(base.inputs), list(base.outputs), list(inputs["inference_1"]))
    frozen = PASSES["freeze"].function(g.copy(), FreezeOptions()).graph
    cap.graphs = {"inference": CapturedGraph("inference", frozen.gm, frozen.inputs, frozen.outputs)}
    return cap, {"inference": frozen.values}


def _constants(gm):
    return {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}


def double_constants_in_place(g, options):
    """A misbehaving pass: writes into the graph's constant tensors instead of replacing them."""
    for t in _constants(g.gm).values():
        t.mul_(2)
    return PassResult(g, modified=True)


def test_a_pass_that_writes_into_constants_leaves_the_captured_graph_as_it_was(two_graphs, monkeypatch):
    cap, inputs = _frozen_capture(two_graphs)
    gm = cap.graphs["inference"].gm
    kept = {k: v.clone() for k, v in _constants(gm).items()}
    assert kept
    out = apply_passes(spec(register(monkeypatch, "inplace", double_constants_in_place)), cap, inputs)
    for k, v in _constants(gm).items():
        torch.testing.assert_close(v, kept[k], rtol=0, atol=0)
    out.diagnose["inference.inplace"]()  # the replay works on its own copy too
    for k, v in _constants(gm).items():
        torch.testing.assert_close(v, kept[k], rtol=0, atol=0)


def none_second_output(g, options):
    out = _output(g)
    out.args = ((out.args[0][0], None),)
    return PassResult(g, modified=True)


def test_a_derived_output_that_is_not_a_node_keeps_its_recorded_layout(two_graphs, monkeypatch):
    cap, inputs = _fresh(two_graphs)
    del inputs["inference_1"]
    apply_passes(spec(register(monkeypatch, "none", none_second_output)), cap, inputs)
    assert [o.meta for o in cap.derived["inference.none"].graph.outputs] == [
        o.meta for o in cap.graphs["inference"].outputs]


def test_an_output_on_meta_before_the_pass_is_compared_by_shape_and_dtype_too():
    from aotpipe.passes.manager import _compare

    assert _compare([torch.empty(2, 3, device="meta")], [torch.ones(2, 3)]) == (0.0, [])
    assert _compare([torch.empty(2, 4, device="meta")], [torch.ones(2, 3)]) == (
        0.0, ["output 0: torch.float32[2, 3], was torch.float32[2, 4]"])


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x * 2


def test_a_derived_graph_keeps_what_a_mutation_output_writes_to(monkeypatch):
    model = CountsCalls().eval()
    x = torch.randn(2, 4)
    cap = capture_export(model, (x,), {}, name="m", graphs=["inference"], input_names=["x"])
    inputs = graph_inputs(cap, model_state(model, cap.constants), {cap.user_inputs[0]: x})
    apply_passes(spec(register(monkeypatch, "idle", nothing)), cap, inputs)
    outputs = cap.derived["inference.idle"].graph.outputs
    assert [(o.index, o.role, o.target) for o in outputs] == [(0, "mutation", "count"), (1, "user", None)]


def test_a_left_out_pass_s_traceback_is_of_the_error_it_raised(mlp, monkeypatch):
    def raises(g, options):
        raise RuntimeError("boom")

    _, _, _, left = run_chain_leaving_out(mlp.copy(), [register(monkeypatch, "r", raises),
                                                       register(monkeypatch, "own", raises_pass_error)], "inference")
    for lo, last in zip(left, ["RuntimeError: boom", "aotpipe.passes.base.PassError: planted: the pass's own words"],
                        strict=True):
        assert lo.traceback.startswith("Traceback (most recent call last):\n  File ")
        assert lo.traceback.splitlines()[-1] == last and "direct cause" not in lo.traceback


def test_a_pass_layout_gets_the_base_graphs_symbols_where_it_is_dense_and_stays_static_where_not():
    from types import SimpleNamespace

    from aotpipe.format.ir import TensorMeta
    from aotpipe.passes.manager import _kept_symbolic

    f32, cpu = torch.float32, torch.device("cpu")
    base = TensorMeta((2, 3, 4), (12, 4, 1), f32, cpu, sym_shape=("s0", 3, "s1"), sym_stride=("3*s1", "s1", 1))
    symbols = {"s0": SimpleNamespace(example=2), "s1": SimpleNamespace(example=4)}
    # a pass's channels-last-like layout at the example: the base's symbolic shape, strides in symbols
    last = TensorMeta((2, 3, 4), (12, 1, 3), f32, cpu)
    kept = _kept_symbolic(last, base, symbols)
    assert kept == dataclasses.replace(last, sym_shape=("s0", 3, "s1"), sym_stride=("3*s1", 1, 3))
    contiguous = TensorMeta((2, 3, 4), (12, 4, 1), f32, cpu)
    assert _kept_symbolic(contiguous, base, symbols).sym_stride == ("s1*3", "s1", 1)
    # not dense (a gap): left static, as the pass recorded it
    gap = TensorMeta((2, 3, 4), (24, 4, 1), f32, cpu)
    assert _kept_symbolic(gap, base, symbols) is gap
    # nothing to take the symbols from, or nothing to give them to
    assert _kept_symbolic(None, base, symbols) is None
    assert _kept_symbolic(last, None, symbols) is last
    static_base = dataclasses.replace(base, sym_shape=None, sym_stride=None)
    assert _kept_symbolic(last, static_base, symbols) is last
    already = dataclasses.replace(last, sym_shape=("s9", 3, 4), sym_stride=(12, 1, 3))
    assert _kept_symbolic(already, base, symbols) is already
    other = TensorMeta((2, 3, 5), (15, 1, 3), f32, cpu)
    assert _kept_symbolic(other, base, symbols) is other
