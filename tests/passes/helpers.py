"""Build a GraphUnderPass from a tiny inline module, as capture would."""

import torch

from aotpipe.capture import capture_export
from aotpipe.capture.binding import backward_inputs, bind_inputs
from aotpipe.models.eager import model_state
from aotpipe.passes import PASSES, parse_pass_entry
from aotpipe.passes.base import GraphUnderPass
from aotpipe.runtime.execution import run_graph


def graph_of(model, *args, kind="inference"):
    model.eval()
    names = [f"arg{i}" for i in range(len(args))]
    graphs = ["inference"] if kind == "inference" else ["forward", "backward", "joint"]
    cap = capture_export(model, args, {}, name="t", graphs=graphs, input_names=names)
    g = cap.graphs[kind]
    bound = {k: bind_inputs(cap.graphs[k], model_state(model, cap.constants), dict(zip(cap.user_inputs, args)))
             for k in cap.graphs if k != "backward"}
    values = backward_inputs(cap, "backward", bound["forward"]) if kind == "backward" else bound[kind]
    return GraphUnderPass(g.gm, kind, list(g.inputs), list(g.outputs), values)


def apply(name, g, **options):
    step = parse_pass_entry({name: options} if options else name)[1]
    return PASSES[name].function(g.copy(), step.options)


def ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def count(gm, op):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is op)


def outputs(g):
    return run_graph(g.gm, g.values)


def assert_same_results(before, after):
    new, old = outputs(after), outputs(before)
    assert len(new) == len(old), f"{len(new)} outputs, {len(old)} before"
    for a, b in zip(new, old):
        torch.testing.assert_close(a, b)
