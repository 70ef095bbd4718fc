"""The one line a refused range becomes, read from torch's own refusal texts (as torch 2.13
words them, kept here verbatim): export's named dimension, dynamo's marked size, the guard
solver's conclusion; which dimension, torch's reason, the model's line, and the fix. No
capture runs: each branch of the reading is held by a text that takes it."""

from aotpipe.capture import dynamic as dynamic_capture
from aotpipe.capture.dynamic import GuardOrigin, GuardOrigins, solver_specialised, specialisation_error
from aotpipe.spec.modes import DynamicDims

DYN = DynamicDims(ranges={"batch": (1, 64), "seq": (4, 64)},
                  inputs={"arg0": ("batch", None), "input_ids": ("batch", "seq")})

CONSTANT = ("Constraints violated (batch)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
            "  - You marked batch as dynamic but your code specialized it to be a constant (4). If you're using "
            "mark_dynamic, either remove it or use maybe_mark_dynamic.\n")
GUARD = ("Constraints violated (batch)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
         "  - Not all values of batch = L['x'].size()[0] in the specified range batch <= 64 satisfy the generated "
         "guard 2 <= L['x'].size()[0] and L['x'].size()[0] <= 8.\n"
         "Suggested fixes:\n  batch = Dim('batch', max=8)\n")
SOLVER = ("Specializations unexpectedly required (seq)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
          "  - solving the guards generated for seq = L['input_ids'].size()[1] resulted in a specialized value of "
          "16.\n\nSuggested fixes:\n  seq = 16\n")
DYNAMO = ("Constraints violated (L['x'].size()[0])! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
          "  - You marked L['x'].size()[0] as dynamic but your code specialized it to be a constant (4). If "
          "you're using mark_dynamic, either remove it or use maybe_mark_dynamic.\n\nUser stack:\n"
          "  File \"/srv/models/outer.py\", line 30, in forward\n    return self.inner(x)\n"
          "  File \"/srv/models/m.py\", line 4, in forward\n    return self.fc(x).view(4, -1)\n")


def _origins() -> GuardOrigins:
    o = GuardOrigins(aliases={"x": "arg0"})
    o.sources = {"arg0.size(0)": "s0", "input_ids.size(1)": "s1"}
    o.guards = [GuardOrigin("Eq(s0, s2)", frozenset({"s0", "s2"}), "m.py:2 (`a = x + y`)"),
                GuardOrigin("s0 <= 8", frozenset({"s0"}), "m.py:18 (`if x.shape[0] > 8:`)"),
                GuardOrigin("Eq(s0, 4)", frozenset({"s0"}), "m.py:10 (`return self.fc(x).view(4, -1)`)"),
                GuardOrigin("Eq(s1, s3)", frozenset({"s1", "s3"}), "mask.py:1 (`m[:, -n:]`)"),
                GuardOrigin("Eq(Mod(s1, 32), s1)", frozenset({"s1"}), "scan.py:65 (`x.reshape(b, -1, 32)`)")]
    return o


def test_a_size_the_model_fixes_names_the_line_that_fixed_it():
    e = specialisation_error(RuntimeError(CONSTANT), DYN, _origins(), "inference")
    assert str(e) == ("dims: batch (arg0.size(0), input_ids.size(0)) cannot be dynamic in [1, 64] (inference): the "
                      "model fixes it to 4 at m.py:10 (`return self.fc(x).view(4, -1)`); make batch static (write 4 "
                      "in the shape), or change the model so it reads the size from the input")


def test_a_guard_names_its_bound_the_line_and_the_narrower_range_in_yaml():
    e = specialisation_error(RuntimeError(GUARD), DYN, _origins(), "training")
    assert str(e) == ("dims: batch (arg0.size(0), input_ids.size(0)) cannot be dynamic in [1, 64] (training): the "
                      "model only runs for 2 <= arg0.size(0) and arg0.size(0) <= 8. at m.py:18 (`if x.shape[0] > 8:`); "
                      "narrow the range (batch: {max: 8} under dims:), or make batch static")


def test_the_solvers_conclusion_is_read_and_named_by_the_guard_it_cannot_simplify():
    assert solver_specialised(RuntimeError(SOLVER)) == ["seq"]
    assert solver_specialised(RuntimeError(CONSTANT)) == [] and solver_specialised(RuntimeError(GUARD)) == []
    e = specialisation_error(RuntimeError(SOLVER), DYN, _origins(), "inference")
    assert str(e).startswith("dims: seq (input_ids.size(1)) cannot be dynamic in [4, 64] (inference): the model "
                             "fixes it to 16 at ")
    # a guard it cannot simplify, not the equality of two inputs' sequence lengths that came first
    assert "at scan.py:65 (`x.reshape(b, -1, 32)`)" in str(e) and "mask.py" not in str(e)


def test_dynamos_marked_size_is_named_as_the_pipeline_names_it_at_the_innermost_frame_of_its_stack():
    e = specialisation_error(RuntimeError(DYNAMO), DYN, _origins(), "dynamo, inference")
    assert str(e) == ("dims: batch (arg0.size(0), input_ids.size(0)) cannot be dynamic in [1, 64] (dynamo, "
                      "inference): the model fixes it to 4 at m.py:4 (`return self.fc(x).view(4, -1)`); "
                      "make batch static (write 4 in the shape), or change the model so it reads the size from the "
                      "input")


def test_another_error_is_not_a_refused_range():
    assert specialisation_error(RuntimeError("shape mismatch: [4, 8] and [8, 3]"), DYN, _origins(), "inference") is None


def test_a_guard_the_line_is_looked_for_prefers_one_like_the_reason_and_falls_back_to_the_first():
    import re

    o = _origins()
    assert o.first_on("s0").where == "m.py:2 (`a = x + y`)"
    assert o.first_on("s0", re.compile(r"Eq\(s0, 4\)")).where.startswith("m.py:10")
    assert o.first_on("s0", re.compile(r"nothing like this")).where == "m.py:2 (`a = x + y`)"
    assert o.first_on("s9") is None


def test_torchs_suggested_dim_is_said_as_yaml():
    assert dynamic_capture._yaml_fix("batch = Dim('batch', min=2, max=8)") == "batch: {min: 2, max: 8} under dims:"
    assert dynamic_capture._yaml_fix("batch = Dim('batch', max=8)") == "batch: {max: 8} under dims:"
    assert dynamic_capture._yaml_fix("seq = 16") == "seq = 16"


def test_a_failure_only_where_a_dimension_is_1_says_torch_traced_it_as_2_or_more():
    from aotpipe.checks.sizes import size_one_hint
    from aotpipe.format.records import SizeCheckRecord

    at_1 = SizeCheckRecord(point="min", sizes={"batch": 1, "seq": 4}, problems=["backward graph differs"])
    fine = [SizeCheckRecord(point="max", sizes={"batch": 4, "seq": 64}),
            SizeCheckRecord(point="random", sizes={"batch": 3, "seq": 9})]
    hint = size_one_hint(at_1, [at_1, *fine])
    assert hint == ("; it holds at every other size checked: torch traced batch as 2 or more (sizes 0 and 1 are "
                    "specialised while tracing), so the graphs may not hold at 1: set min: 2 for batch")
    # it fails elsewhere too, or nowhere else was checked, or nothing is at 1, or it passed: no hint
    bad_max = [SizeCheckRecord(point="max", sizes={"batch": 4, "seq": 64}, problems=["differs"]), fine[1]]
    assert size_one_hint(at_1, [at_1, *bad_max]) == ""
    assert size_one_hint(at_1, [at_1]) == ""
    assert size_one_hint(bad_max[0], [at_1, *bad_max]) == ""
    assert size_one_hint(SizeCheckRecord(point="min", sizes={"batch": 1}), [*fine]) == ""


def _asserting(*expressions: str):
    import torch

    from aotpipe.format.ir import CapturedGraph
    from aotpipe.format.records import SymbolRecord
    from aotpipe.format.vocabulary import GraphKind

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for i, e in enumerate(expressions):
        graph.call_function(torch.ops.aten._assert_scalar.default,
                            (True, f"Runtime assertion failed for expression {e} on node 'n{i}'"))
    graph.output(x)
    symbols = {"s0": SymbolRecord(dim="batch", min=1, max=8, example=2),
               "s1": SymbolRecord(dim="seq", min=4, max=64, example=16)}
    return {"inference": CapturedGraph(GraphKind.INFERENCE, torch.fx.GraphModule({}, graph), [], [], symbols=symbols)}


FAILED = ("inference graph does not run: GraphWillNotRun: g.json: node '_assert_scalar_3' (aten._assert_scalar.default) "
          "does not run on these inputs: RuntimeError")


def test_where_every_kept_assertion_holds_is_walked_over_each_range_around_the_example():
    from aotpipe.capture.dynamic import assertion_holds

    # one chunk of 32 padded: fails from 32 up; another bound: only from 5
    graphs = _asserting("Eq((s1 + Mod(32 - Mod(s1, 32), 32))//32, 1)", "Ne(s1 + Mod(32 - Mod(s1, 32), 32), s1)",
                        "s1 >= 5", "s0 >= 1")
    assert assertion_holds([FAILED], graphs) == "it holds for seq in [5, 31]; set seq: {min: 5, max: 31}"
    # a bound on both: each walked with the other at its example
    assert assertion_holds([FAILED], _asserting("s0*s1 <= 64")) == (
        "it holds for batch in [1, 4]; set batch: {max: 4}; it holds for seq in [4, 32]; set seq: {max: 32}")
    # an assertion on a symbol the graphs do not list (one torch replaced by another) is left out
    assert assertion_holds([FAILED], _asserting("s70 <= s1", "s1 <= 31")) == (
        "it holds for seq in [4, 31]; set seq: {max: 31}")
    # holding over every range, another problem, or an expression sympy cannot read: nothing to say
    assert assertion_holds([FAILED], _asserting("s1 >= 1")) == ""
    assert assertion_holds(["inference graph differs from the eager model: ..."], graphs) == ""
    assert assertion_holds([FAILED], _asserting("this is not ( an expression")) == ""
    # torch's own sympy functions, as its assertions print them (PythonMod, FloorDiv)
    assert assertion_holds([FAILED], _asserting("FloorDiv(s1, 32) <= 0", "PythonMod(s0, 8) >= 1")) == (
        "it holds for batch in [1, 7]; set batch: {max: 7}; it holds for seq in [4, 31]; set seq: {max: 31}")
    # torch's Mod is read as torch's, not printed by sympy's rule for its own Mod (which lost the
    # parentheses: s0 % s0*x, false everywhere), as nemotron3_5_transcribe's assertions have it
    assert assertion_holds([FAILED], _asserting("Ne(Mod(s0, s0*((s1//8))), 0)")) == (
        "it holds for seq in [16, 64]; set seq: {min: 16}")
    # a function sympy reads as undefined (not torch's, not math's): that assertion is left out
    assert assertion_holds([FAILED], _asserting("NoSuchFn(s1) <= 0", "s1 <= 31")) == (
        "it holds for seq in [4, 31]; set seq: {max: 31}")
