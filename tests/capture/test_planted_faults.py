"""Each check of a written artefact, shown to catch the fault it exists for.

A fault is planted in the captured graph (or in the loader) and the run must report it,
by the check that exists for it, with its message: the forward-backward-joint chain, the
written graph rebuilt node for node, mutated buffers against eager, and a gradient wrong by
less than a loose tolerance would see, which only the float64 rule catches.
"""

from __future__ import annotations

import json
import sys
import textwrap

import torch
from click.testing import CliRunner

import aotpipe.artifact.load
import aotpipe.capture
from aotpipe.cli import main


def _run(tmp_path, models):
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: t
        models:
    """) + textwrap.indent(textwrap.dedent(models), "  "))
    # In this process: the faults are planted by patching, which worker processes would not see.
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json", "--executor", "local"])
    assert r.output.startswith("{"), r.output
    (m,) = json.loads(r.output)["models"]
    return r.exit_code, m


MLP = "- {name: m, source: aotpipe.zoo:mlp, args: {in_features: 8, hidden: 16}, inputs: [{shape: [4, 8]}]}"


def _plant(monkeypatch, change):
    """Capture as usual, then `change(captured_graphs)` before anything is written."""
    real = aotpipe.capture.capture_export

    def planted(*args, **kwargs):
        cap = real(*args, **kwargs)
        change(cap)
        return cap

    monkeypatch.setattr(aotpipe.capture, "capture_export", planted)


def _scale_output(g, index: int, factor: float) -> None:
    """Graph `g`'s output `index` multiplied by `factor`, in the graph itself."""
    out = next(n for n in g.gm.graph.nodes if n.op == "output")
    values = list(out.args[0])
    with g.gm.graph.inserting_before(out):
        values[index] = g.gm.graph.call_function(torch.ops.aten.mul.Tensor, (values[index], factor))
    out.args = (tuple(values),)
    g.gm.recompile()


def _grad_index(g, target: str) -> int:
    return next(o.index for o in g.outputs if o.role == "grad" and o.target == target)


def test_a_joint_graph_that_is_not_forward_then_backward_fails_the_chain(tmp_path, monkeypatch):
    # The joint is checked against eager only through the chain: with the chain off, a wrong
    # joint would be written and pass.
    def wrong_joint(cap):
        joint = cap.graphs["joint"]
        _scale_output(joint, _grad_index(joint, "layers.0.weight"), 2.0)

    _plant(monkeypatch, wrong_joint)
    code, m = _run(tmp_path, MLP)
    assert (code, m["status"], m["stage"]) == (1, "failed", "verify")
    assert "chain: gradient of layers.0.weight: differs from the joint graph's (max abs error" in m["error"]
    # Only the chain saw it: every check against eager passed.
    assert m["checks"]["failed"] == 0 and m["checks"]["run"] > 0


def test_a_written_graph_that_does_not_rebuild_the_captured_one_fails(tmp_path, monkeypatch):
    # A change that computes the same values (a dead node) is seen only by comparing the
    # loaded graph with the captured one node for node.
    real = aotpipe.artifact.load.graph_from_json

    def with_a_dead_node(*args, **kwargs):
        gm = real(*args, **kwargs)
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(x):
            gm.graph.call_function(torch.ops.aten.neg.default, (x,))
        gm.recompile()
        return gm

    monkeypatch.setattr(aotpipe.artifact.load, "graph_from_json", with_a_dead_node)
    code, m = _run(tmp_path, MLP)
    assert (code, m["status"], m["stage"]) == (1, "failed", "verify")
    assert "inference graph: graph.json does not rebuild the captured graph exactly (node \"%1 call_function " \
           "aten.neg.default ('%0',) {}\", captured '%1 placeholder" in m["error"], m["error"]
    assert m["checks"]["failed"] == 0


RUNNING_NORM = ("- {name: m, source: aotpipe.zoo:running_norm, args: {features: 8}, inputs: [{shape: [4, 8]}], "
                "graphs: [inference]}")


def _mutation_index(g, target: str) -> int:
    return next(o.index for o in g.outputs if o.role == "mutation" and o.target == target)


def test_a_graph_that_drops_a_buffer_mutation_fails(tmp_path, monkeypatch):
    def drop_running_mean(cap):
        g = cap.graphs["inference"]
        i = _mutation_index(g, "running_mean")
        out = next(n for n in g.gm.graph.nodes if n.op == "output")
        out.args = (tuple(v for j, v in enumerate(out.args[0]) if j != i),)
        g.gm.recompile()
        g.outputs = [type(o)(j, o.role, o.target, o.meta) for j, o in enumerate(x for x in g.outputs if x.index != i)]

    _plant(monkeypatch, drop_running_mean)
    code, m = _run(tmp_path, RUNNING_NORM)
    assert (code, m["status"], m["stage"]) == (1, "failed", "verify")
    assert "new value of running_mean: the eager model changes this buffer; the graph does not return it" \
        in m["error"]
    assert m["checks"]["failed"] == 1 and m["checks"]["skipped"] == 0


def test_a_graph_that_mutates_a_buffer_wrongly_fails(tmp_path, monkeypatch):
    def wrong_running_mean(cap):
        g = cap.graphs["inference"]
        _scale_output(g, _mutation_index(g, "running_mean"), 0.5)

    _plant(monkeypatch, wrong_running_mean)
    code, m = _run(tmp_path, RUNNING_NORM)
    assert (code, m["status"], m["stage"]) == (1, "failed", "verify")
    assert "new value of running_mean: RMS error " in m["error"]
    assert m["checks"]["failed"] == 1


def test_the_buffer_checks_run_on_a_model_that_mutates_buffers(tmp_path):
    # small_cnn's two train-mode batch norms update running_mean, running_var and
    # num_batches_tracked: each is checked against eager, in the forward (and the joint
    # through the chain), none skipped.
    code, m = _run(tmp_path, "- {name: m, source: aotpipe.zoo:small_cnn, args: {channels: 4}, "
                             "inputs: [{shape: [2, 3, 8, 8]}], graphs: [forward, backward]}")
    assert code == 0 and m["status"] == "ok", m
    manifest = json.loads((tmp_path / "out" / "t" / "m" / "manifest.json").read_text())
    mutated = sorted(i["what"] for i in manifest["graphs"]["forward"]["checks"]["items"]
                     if i["what"].startswith("new value of"))
    assert mutated == sorted(f"new value of bn{i}.{b}" for i in (1, 2)
                             for b in ("num_batches_tracked", "running_mean", "running_var"))
    assert m["checks"]["skipped"] == 0


class Wide(torch.nn.Module):
    """A linear layer wide enough that eager float32's own error is far below the floor."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(x)


def test_a_gradient_wrong_by_4e_5_is_caught_only_by_the_float64_rule(tmp_path, monkeypatch):
    # fc.weight's gradient scaled by 1 + 4e-5: over the float-noise floor (1e-5 of its RMS),
    # so the float64 reference is asked for, and far over eager float32's own error against
    # it. A loose element-wise check (rtol = atol = 1e-4) would pass it.
    factor = 1 + 4e-5
    monkeypatch.setitem(sys.modules, "planted_models", sys.modules[__name__])

    def slightly_wrong(cap):
        for kind in ("backward", "joint"):
            g = cap.graphs[kind]
            _scale_output(g, _grad_index(g, "fc.weight"), factor)

    _plant(monkeypatch, slightly_wrong)
    code, m = _run(tmp_path, "- {name: m, source: planted_models:Wide, inputs: [{shape: [16, 64]}], "
                             "graphs: [forward, backward, joint]}")
    assert (code, m["status"], m["stage"]) == (1, "failed", "verify")
    manifest = json.loads((tmp_path / "out" / "t" / "m" / "manifest.json").read_text())
    (item,) = [i for i in manifest["graphs"]["backward"]["checks"]["items"] if i["what"] == "gradient of fc.weight"]
    assert (item["passed"], item["method"]) == (False, "fp64")
    assert item["error"] > item["bound"] and item["ratio"] > 10
    assert "gradient of fc.weight: RMS error" in m["error"] and "against the float64 eager model, over" in m["error"]
