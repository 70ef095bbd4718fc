"""Replay's verdict, bound by bound: "match" (bit for bit where it was made), "close" (elsewhere,
every output within its evidence's bound), "mismatch", "unverified", "ran", "error".

Fast and in-process: one tiny committed artefact (tests/data/replay_tiny: element-wise ops only,
so its outputs have the same bits on every CPU), its recorded environment set to this machine's,
and graphs standing in for its own (a module that gives chosen outputs), so that each verdict is
decided by one value just inside or just outside a bound. Another device is a stand-in too (there is
no accelerator here): inputs "moved" to it stay on the CPU, and the graph it runs is the test's."""

from __future__ import annotations

import copy
import gc
import json
import math
import operator
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact import input_meta
from aotpipe.artifact.blobs import encode
from aotpipe.artifact.load import Expected, load
from aotpipe.cli import main
from aotpipe.errors import ArtifactError, LimitError
from aotpipe.format import limits, records
from aotpipe.format.records import InputsRecord
from aotpipe.replay import get_inputs, replay, replay_chain, replay_graph
from aotpipe.replay import run as replay_run
from aotpipe.replay.inputs import _entry_record, _flatten_meta
from aotpipe.replay.run import (
    ELSEWHERE_RTOL,
    SAME_RTOL,
    GraphReplay,
    OutputError,
    _departs,
    _grad64,
    _label,
    _numel,
    _same_shape,
    _subgraph,
    chain_key,
    chain_problems,
    compare_recorded,
    copy_mutations_back,
    expand_outputs,
    first_divergence,
    recorded_threads,
)
from aotpipe.runtime import accuracy, evidence
from aotpipe.runtime.determinism import environment, intra_op_threads
from aotpipe.runtime.execution import run_graph, run_with_summaries
from tests.helpers.forge import reseal

TINY = Path(__file__).parent / "data" / "replay_tiny" / "tiny"
ELSEWHERE = ["2 threads, recorded 1"]


def _warm_up() -> None:
    """The first replay in a process costs seconds (torch imports dynamo for its shape checks and
    fills its op tables); paid here, at collection, once. mutmut runs these tests once per mutant in
    a process forked after collection; gc.freeze() keeps pytest's gc.collect() at the end of each
    run from walking torch's whole heap again (4 of every 5 seconds a run took)."""
    replay(load(TINY), graphs=["inference"])
    gc.freeze()


_warm_up()


def _rewrite(folder: Path, rel: str, edit) -> None:
    p = folder / rel
    data = json.loads(p.read_text())
    edit(data)
    p.write_text(json.dumps(data))


def made_here(tmp_path: Path, kinds=("inference", "forward", "backward", "joint")) -> Path:
    """A copy of the tiny artefact with only the graphs `kinds`, that says it was made here
    (this machine's environment at one thread, the count it records): its bits must match."""
    dst = tmp_path / "tiny"
    shutil.copytree(TINY, dst)
    with intra_op_threads(1):
        env = environment().model_dump(mode="json")

    def edit(m):
        m["environment"] = env
        for k in [k for k in m["graphs"] if k not in kinds]:
            shutil.rmtree(dst / m["graphs"].pop(k)["folder"])
            m["verification"].pop(k, None)
        if "forward" not in kinds:
            m["partition"] = None
            m["verification"].pop("chain", None)
        m["files"] = {f: h for f, h in m["files"].items() if (dst / f).exists()}
    _rewrite(dst, "manifest.json", edit)
    assert reseal(dst)
    return dst


@pytest.fixture()
def tiny(tmp_path) -> Path:
    """The tiny artefact's inference graph alone (loads in a third of the time), made here."""
    return made_here(tmp_path, ("inference",))


@pytest.fixture()
def tiny_all(tmp_path) -> Path:
    """The tiny artefact with its four graphs, made here."""
    return made_here(tmp_path)


class Gives(torch.nn.Module):
    """A graph that ignores its inputs and gives these outputs (fresh copies each run)."""

    def __init__(self, *outs):
        super().__init__()
        self.outs = outs

    def forward(self, *inputs):
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in self.outs)


def inference(folder: Path):
    """The tiny artefact's inference graph and the output it recorded (y, returned twice)."""
    ga = load(folder).graphs["inference"]
    y = run_graph(ga.module, ga.saved_inputs())[0]
    return ga, y


def one_ulp_apart(y0: float, bound: float) -> tuple[float, float]:
    """Two float32 values one ulp apart: the last within `bound` of `y0`, the first beyond it."""
    v = torch.tensor(y0 + bound, dtype=torch.float32)
    while float(v) - y0 > bound:
        v = torch.nextafter(v, torch.tensor(-math.inf))
    while float(torch.nextafter(v, torch.tensor(math.inf))) - y0 <= bound:
        v = torch.nextafter(v, torch.tensor(math.inf))
    inside, outside = float(v), float(torch.nextafter(v, torch.tensor(math.inf)))
    assert inside - y0 <= bound < outside - y0
    return inside, outside


def with_first(y: torch.Tensor, value: float) -> torch.Tensor:
    out = y.clone()
    out.view(-1)[0] = value
    return out


# --- the tiny artefact as it is -------------------------------------------------------------


def test_where_it_was_made_every_graph_matches_bit_for_bit(tiny_all):
    results = replay(tiny_all)
    assert [(r.kind, r.status, r.bit_identical, r.environment) for r in results] == \
        [(k, "match", True, []) for k in ("inference", "forward", "backward", "joint")]
    assert all(r.ok and r.max_abs_error == 0.0 and r.mismatches == [] and r.errors == [] for r in results)
    assert all(r.first_divergence is None and r.error is None and r.seconds > 0 for r in results)


def test_at_another_thread_count_the_same_bits_are_close_and_say_why(tiny):
    (r,) = replay(tiny, graphs=["inference"], threads=2)
    assert (r.status, r.environment, r.bit_identical, r.max_abs_error) == ("close", ["2 threads, recorded 1"], True, 0.0)
    assert r.verdict == "close (2 threads, recorded 1)" and r.ok


# --- one output, a value just inside or outside its bound -------------------------------------


def test_an_output_one_ulp_off_where_it_was_made_is_a_mismatch_with_its_error(tiny):
    ga, y = inference(tiny)
    y0 = float(y.view(-1)[0])
    off = with_first(y, float(torch.nextafter(torch.tensor(y0), torch.tensor(math.inf))))
    ga.built = Gives(off, off)
    r = replay_graph(ga)
    assert r.status == "mismatch" and not r.ok and r.bit_identical is False
    err = float(off.view(-1)[0]) - y0
    assert r.max_abs_error == pytest.approx(err, rel=1e-12)
    assert r.mismatches[0] == (f"output 0 (user): not bit-identical to the recorded output; max abs error {err:.3g} "
                               "over 4 sampled elements of 4")
    assert len(r.mismatches) == 2  # the repeated output too
    (e, _) = r.errors
    assert (e.output, e.elements, e.numel, e.bound) == ("output 0 (user)", 4, 4, None)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_elsewhere_a_value_within_the_evidence_bound_is_close_and_one_ulp_beyond_it_a_mismatch(tiny, where):
    ga, y = inference(tiny)
    bound = ga.record.outputs[0].evidence.bound
    y0 = float(y.view(-1)[0])
    inside, outside = one_ulp_apart(y0, bound)
    got = with_first(y, inside if where == "inside" else outside)
    ga.built = Gives(got, got)
    r = replay_graph(ga, environment=ELSEWHERE)
    err = float(got.view(-1)[0]) - y0
    assert r.bit_identical is False and r.environment == ELSEWHERE
    assert r.max_abs_error == pytest.approx(err, rel=1e-12)
    assert [(e.output, e.elements, e.numel, e.bound) for e in r.errors] == \
        [("output 0 (user)", 4, 4, bound), ("output 1 (user)", 4, 4, bound)]
    if where == "inside":
        assert (r.status, r.mismatches, r.ok) == ("close", [], True)
        assert r.verdict == "close (2 threads, recorded 1)" and r.first_divergence is None
    else:
        assert r.status == "mismatch" and not r.ok and r.verdict == "mismatch (2 threads, recorded 1)"
        assert r.mismatches[0].startswith(f"output 0 (user): max abs error {err:.3g} over 4 sampled elements, "
                                          f"over the bound {bound:.3g}")


def test_elsewhere_the_exact_recorded_bits_are_close_with_no_error(tiny):
    ga, y = inference(tiny)
    ga.built = Gives(y, y)
    r = replay_graph(ga, environment=ELSEWHERE)
    assert (r.status, r.bit_identical, r.max_abs_error, r.errors) == ("close", True, 0.0, [])


@pytest.mark.parametrize("recorded_value, now_value, status", [
    (math.inf, -math.inf, "mismatch"),
    (math.inf, math.inf, "close"),
    (math.nan, math.nan, "close"),
    (math.nan, 0.0, "mismatch"),
])
def test_elsewhere_inf_and_nan_must_be_where_and_what_they_were(tiny, recorded_value, now_value, status):
    ga, y = inference(tiny)
    recorded = with_first(y, recorded_value)
    _record_outputs(tiny, recorded)
    ga = load(tiny).graphs["inference"]
    got = with_first(y, now_value)
    # the other elements a little off (within the bound): bits differ, so the evidence judges
    got.view(-1)[1:] += 1e-6
    ga.built = Gives(got, got)
    r = replay_graph(ga, environment=ELSEWHERE)
    assert r.status == status, r.mismatches
    if status == "mismatch":
        assert "NaN or inf in other places than recorded" in r.mismatches[0]
        assert r.to_json()["max_abs_error"] == "inf"


def _record_outputs(folder: Path, y: torch.Tensor) -> None:
    """Rewrite the inference graph's recorded output (digest and evidence) as `y`'s."""
    sample, fields = evidence.record(y)
    blob, data = encode(sample)
    (folder / "blobs" / f"{blob}.safetensors").write_bytes(data)

    def edit(rec):
        out = rec["outputs"][0]
        out["digest"] = accuracy.digest(y)
        out["evidence"] = {**fields, "blob": blob}
    _rewrite(folder, "tiny_inference_0/inputs.json", edit)
    assert reseal(folder)


# --- compare_recorded, output by output -------------------------------------------------------


def recorded(*outs, version=3):
    """A graph artefact as compare_recorded reads it: the output records, and blobs by name."""
    rec = records.parse(InputsRecord, {"format_version": version, "kind": "inference", "values": "full",
                                       "storages": [], "inputs": [],
                                       "outputs": [{"index": i, "role": "user", **o} for i, o in enumerate(outs)]},
                        "test")
    return SimpleNamespace(record=rec, blobs={})


def evidence_of(ga, t: torch.Tensor, bound=None) -> records.Evidence:
    """`t`'s evidence, its sample put in `ga`'s blobs; `bound` instead of the computed one."""
    sample, fields = evidence.record(t)
    blob = encode(sample)[0]
    ga.blobs[blob] = sample
    if bound is not None:
        fields["bound"] = bound
    return records.Evidence.model_validate({**fields, "blob": blob})


T = torch.tensor([[1.0, -2.0], [0.5, 4.0]])


def test_a_count_of_outputs_other_than_recorded_is_one_problem():
    ga = recorded({}, {})
    assert compare_recorded(ga, [T], [Expected(value=T, has_value=True)] * 2) == \
        (["1 outputs, recorded 2"], [], False)


@pytest.mark.parametrize("now, value, version, problem", [
    (3, 3, 3, None),
    (2.5, 2.5, 3, None),
    (math.nan, math.nan, 3, None),
    (True, True, 3, None),
    (3, 4, 3, "output 0 (user): 3, recorded 4; int outputs must be equal, here and elsewhere"),
    (3, 3.0, 3, "output 0 (user): 3, recorded 3.0; int outputs must be equal, here and elsewhere"),
    (True, 1, 3, "output 0 (user): True, recorded 1; bool outputs must be equal, here and elsewhere"),
    (3, None, 3, "output 0 (user): 3, recorded None; int outputs must be equal, here and elsewhere"),
    (3, None, 2, None),  # versions 1 and 2 record no value for an int output
])
@pytest.mark.parametrize("elsewhere", [False, True])
def test_int_float_and_bool_outputs_must_be_equal_here_and_elsewhere(now, value, version, problem, elsewhere):
    ga = recorded({}, version=version)
    problems, errors, identical = compare_recorded(ga, [now], [Expected(value=value, has_value=True)], elsewhere)
    assert problems == ([problem] if problem else []) and errors == []
    assert identical is (problem is None)


def test_a_tensor_where_an_int_was_recorded_is_a_problem():
    problems, _, identical = compare_recorded(recorded({}), [torch.tensor(3)], [Expected(value=3, has_value=True)])
    assert problems == ["output 0 (user): tensor(3), recorded 3; Tensor outputs must be equal, here and elsewhere"]
    assert identical is False


def test_a_recorded_none_must_stay_none():
    ga = recorded({})
    assert compare_recorded(ga, [None], [Expected(has_value=True)]) == ([], [], True)
    problems, errors, identical = compare_recorded(ga, [T], [Expected(has_value=True)])
    assert problems == [f"output 0 (user): {T!r}, recorded None"] and errors == [] and identical is False


def test_a_stored_value_equal_bit_for_bit_matches_nan_included():
    t = torch.tensor([1.0, math.nan, -math.inf])
    assert compare_recorded(recorded({}), [t.clone()], [Expected(value=t, has_value=True)]) == ([], [], True)


@pytest.mark.parametrize("elsewhere", [False, True])
def test_a_stored_value_of_another_shape_or_dtype_is_not_bit_identical(elsewhere):
    ga = recorded({})
    for now in (T.reshape(4), T.double()):
        problems, errors, identical = compare_recorded(ga, [now], [Expected(value=T, has_value=True)], elsewhere)
        err = accuracy.max_abs_error(now, T)
        assert problems == [f"output 0 (user): not bit-identical to the recorded output; max abs error {err:.3g} "
                            "over all 4 elements"]
        assert [(e.max_abs_error, e.elements, e.numel, e.bound) for e in errors] == [(err, 4, 4, None)]
        assert identical is False


def test_a_stored_value_off_where_it_was_made_is_a_problem():
    now = T.clone()
    now[0, 0] += 0.25
    problems, errors, identical = compare_recorded(recorded({}), [now], [Expected(value=T, has_value=True)])
    assert problems == ["output 0 (user): not bit-identical to the recorded output; max abs error 0.25 "
                        "over all 4 elements"]
    assert [(e.output, e.max_abs_error, e.bound) for e in errors] == [("output 0 (user)", 0.25, None)]


@pytest.mark.parametrize("elsewhere", [False, True])
@pytest.mark.parametrize("delta, ok", [(0.25, True), (0.375, False)])
def test_an_op_without_a_deterministic_kernel_may_differ_by_twice_its_measured_spread(elsewhere, delta, ok):
    now = T.clone()
    now[1, 1] += delta  # 4.25 or 4.375: exact in float32
    ga = recorded({})
    problems, errors, _ = compare_recorded(ga, [now], [Expected(value=T, has_value=True, spread=0.125)], elsewhere)
    assert [(e.max_abs_error, e.bound) for e in errors] == [(delta, 0.25)]
    if ok:
        assert problems == []
    elif elsewhere:
        assert problems == [f"output 0 (user): max abs error {delta:.3g} over all 4 elements, over the bound 0.25"]
    else:
        assert problems == [f"output 0 (user): max abs error {delta:.3g}, over twice the run-to-run spread 0.125 "
                            "measured at capture"]


@pytest.mark.parametrize("delta, ok", [(0.5, True), (0.625, False)])
def test_elsewhere_a_stored_value_is_judged_by_its_evidence_bound(delta, ok):
    ga = recorded({})
    now = T.clone()
    now[1, 0] += delta
    ev = evidence_of(ga, T, bound=0.5)
    problems, errors, identical = compare_recorded(ga, [now], [Expected(value=T, has_value=True, evidence=ev)], True)
    assert [(e.max_abs_error, e.elements, e.numel, e.bound) for e in errors] == [(delta, 4, 4, 0.5)]
    assert identical is False and (problems == []) is ok


def test_elsewhere_a_stored_value_without_evidence_gets_the_float_noise_bound_of_its_values():
    bound = evidence.bound(T, None)[0]
    inside, outside = one_ulp_apart(4.0, bound)
    for value, ok in ((inside, True), (outside, False)):
        now = T.clone()
        now[1, 1] = value
        problems, errors, _ = compare_recorded(recorded({}), [now], [Expected(value=T, has_value=True)], True)
        assert errors[0].bound == bound and (problems == []) is ok, (value, problems)


def test_elsewhere_a_measured_spread_wider_than_the_evidence_bound_widens_it():
    ga = recorded({})
    now = T.clone()
    now[0, 1] += 0.5
    e = Expected(value=T, has_value=True, spread=0.25, evidence=evidence_of(ga, T, bound=0.125))
    problems, errors, _ = compare_recorded(ga, [now], [e], True)
    assert problems == [] and errors[0].bound == 0.5


@pytest.mark.parametrize("stride, problem", [
    ([2, 1], None),
    ([1, 2], "output 0: stride [2, 1] != recorded [1, 2]"),
])
def test_an_output_must_keep_its_recorded_strides(stride, problem):
    problems, _, _ = compare_recorded(recorded({"stride": stride, "shape": [2, 2]}), [T],
                                      [Expected(value=T, has_value=True)])
    assert problems == ([problem] if problem else [])


def test_a_two_element_output_with_another_stride_is_a_problem_and_an_empty_one_is_not():
    pair = torch.zeros(4)[::2]
    assert compare_recorded(recorded({"stride": [1]}), [pair], [Expected(value=pair.clone(), has_value=True)])[0] == \
        ["output 0: stride [2] != recorded [1]"]
    empty = torch.zeros(0, 3)
    assert compare_recorded(recorded({"stride": [1, 1]}), [empty], [Expected(value=empty, has_value=True)])[0] == []


def test_strides_of_size_one_dimensions_and_of_one_element_outputs_do_not_count():
    row = torch.ones(1, 3)
    assert compare_recorded(recorded({"stride": [7, 1]}), [row], [Expected(value=row, has_value=True)])[0] == []
    one = torch.ones(1, 1)
    assert compare_recorded(recorded({"stride": [5, 9]}), [one], [Expected(value=one, has_value=True)])[0] == []


# --- outputs recorded by digest ---------------------------------------------------------------


def test_a_digest_met_bit_for_bit_is_a_match_here_and_elsewhere():
    for elsewhere in (False, True):
        assert compare_recorded(recorded({}), [T.clone()], [Expected(digest=accuracy.digest(T))], elsewhere) == \
            ([], [], True)


def test_a_non_tensor_where_a_tensor_was_recorded_is_a_problem():
    problems, errors, identical = compare_recorded(recorded({}), [3], [Expected(digest=accuracy.digest(T))], True)
    assert problems == ["output 0 (user): int, recorded a tensor"] and errors == [] and identical is False


def test_where_it_was_made_a_digest_that_differs_is_a_problem_with_its_sampled_error():
    ga = recorded({"shape": [2, 2]})
    now = T.clone()
    now[0, 0] += 0.125
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T))
    problems, errors, identical = compare_recorded(ga, [now], [e])
    assert problems == ["output 0 (user): not bit-identical to the recorded output; max abs error 0.125 over 4 "
                        "sampled elements of 4"]
    assert [(x.max_abs_error, x.elements, x.numel, x.bound) for x in errors] == [(0.125, 4, 4, None)]
    assert identical is False


def test_a_digest_that_differs_in_shape_says_so_where_it_was_made():
    ga = recorded({"shape": [2, 2]})
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T))
    problems, errors, _ = compare_recorded(ga, [torch.ones(8)], [e])
    assert problems == ["output 0 (user): not bit-identical to the recorded output; 8 elements, recorded 4"]
    assert errors == []


@pytest.mark.parametrize("delta, ok", [(0.5, True), (0.625, False)])
def test_elsewhere_a_digest_that_differs_is_judged_by_its_evidence(delta, ok):
    ga = recorded({"shape": [2, 2]})
    now = T.clone()
    now[1, 1] += delta
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T, bound=0.5))
    problems, errors, identical = compare_recorded(ga, [now], [e], True)
    assert [(x.max_abs_error, x.elements, x.numel, x.bound) for x in errors] == [(delta, 4, 4, 0.5)]
    assert identical is False
    assert problems == ([] if ok else [f"output 0 (user): max abs error {delta:.3g} over 4 sampled elements, "
                                       "over the bound 0.5 (from the float-noise floor); sum of those elements "
                                       f"{3.5 + delta:.8g}, recorded 3.5"])


def test_elsewhere_a_changed_shape_is_a_problem_with_no_error_figure():
    ga = recorded({"shape": [2, 2]})
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T))
    problems, errors, _ = compare_recorded(ga, [torch.ones(2, 3)], [e], True)
    assert problems == ["output 0 (user): 6 elements, recorded 4"] and errors == []


def test_the_element_count_is_the_recorded_shapes_or_else_the_outputs():
    ga = recorded({})  # no recorded shape: the output's own count
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T, bound=1.0))
    now = T + 0.5
    _, errors, _ = compare_recorded(ga, [now], [e], True)
    assert [(x.elements, x.numel) for x in errors] == [(4, 4)]


def test_elsewhere_a_digest_without_evidence_or_sums_cannot_be_judged():
    problems, _, identical = compare_recorded(recorded({}), [T + 1], [Expected(digest=accuracy.digest(T))], True)
    assert problems == ["output 0 (user): not bit-identical, and the artefact records no evidence to judge it by "
                        "elsewhere (format version < 3): replay it where it was made"]
    assert identical is False


def test_where_it_was_made_a_digest_without_evidence_names_the_sampled_sums_that_differ():
    now = T + 1
    e = Expected(digest=accuracy.digest(T), summary=accuracy.sampled_summary(T))
    problems, errors, _ = compare_recorded(recorded({}), [now], [e])
    assert problems == ["output 0 (user): not bit-identical to the recorded output; over the same sampled elements: "
                        f"sum 7.5 != recorded 3.5"]
    assert errors == []
    # without sums, and with sums that agree (bits differ only past the sums' precision)
    assert compare_recorded(recorded({}), [now], [Expected(digest=accuracy.digest(T))])[0] == \
        ["output 0 (user): not bit-identical to the recorded output"]
    e = Expected(digest=accuracy.digest(T), summary=accuracy.sampled_summary(now))
    assert compare_recorded(recorded({}), [now], [e])[0] == ["output 0 (user): not bit-identical to the recorded output"]


# --- format version 2 elsewhere: sums of sampled elements ---------------------------------------


def v2(now: torch.Tensor, recorded_summary, unjudged):
    e = Expected(digest=accuracy.digest(-now), summary=recorded_summary)
    return compare_recorded(recorded({}, version=2), [now], [e], True, unjudged)


def test_v2_sums_within_float_noise_leave_the_output_unverified():
    unjudged: list[str] = []
    problems, errors, identical = v2(T, accuracy.sampled_summary(T), unjudged)
    assert problems == [] and errors == [] and identical is False
    assert unjudged == ["output 0 (user): not bit-identical; its sampled sums are within float noise of the recorded "
                        "ones, all format version 2 records of it: replay it on the machine that made it, or capture "
                        "it again"]
    problems, _, _ = v2(T, accuracy.sampled_summary(T), None)
    assert problems == ["output 0 (user): not bit-identical, and the artefact records too little to judge it"]


@pytest.mark.parametrize("key", ["sum", "abs_sum"])
@pytest.mark.parametrize("share, ok", [(0.99, True), (1.01, False)])
def test_v2_sums_further_apart_than_the_sample_times_the_bound_are_a_mismatch(key, share, ok):
    bound = evidence.bound(T, None)[0]
    slack = 4 * bound
    s = accuracy.sampled_summary(T)
    moved = s.model_copy(update={key: getattr(s, key) + share * slack})
    unjudged: list[str] = []
    problems, _, _ = v2(T, moved, unjudged)
    if ok:
        assert problems == [] and len(unjudged) == 1
    else:
        assert unjudged == [] and len(problems) == 1
        assert problems[0].startswith(f"output 0 (user): not bit-identical; over the same 4 sampled elements, {key} ")
        assert problems[0].endswith(f"over 4 times the element-wise bound {bound:.3g}")


def test_v2_sums_exactly_the_sample_times_the_bound_apart_are_still_float_noise():
    t = torch.tensor([[1.0, -1.0], [2.0, -2.0]])  # sum 0: the recorded sum is the slack itself, exactly
    slack = 4 * evidence.bound(t, None)[0]
    s = accuracy.sampled_summary(t)
    unjudged: list[str] = []
    assert v2(t, s.model_copy(update={"sum": slack}), unjudged)[0] == [] and len(unjudged) == 1
    nudged = math.nextafter(slack, math.inf)
    assert len(v2(t, s.model_copy(update={"sum": nudged}), [])[0]) == 1


def test_v2_a_changed_layout_or_an_integer_output_is_a_mismatch():
    s = accuracy.sampled_summary(T)
    problems, _, _ = v2(T.t(), s, [])
    assert problems == ["output 0 (user): not bit-identical; over the same sampled elements: stride [1, 2] != "
                        "recorded [2, 1]"]
    i = torch.tensor([1, 2, 3])
    problems, _, _ = v2(i, accuracy.sampled_summary(i), [])
    assert problems == ["output 0 (user): not bit-identical; integer and bool outputs must be equal, here and "
                        "elsewhere"]


# --- replay_graph: which comparison, and the verdict it gives -------------------------------------


def test_fewer_or_more_outputs_than_recorded_is_a_mismatch(tiny):
    ga, y = inference(tiny)
    for outs, n in (((y,), 1), ((y, y, y), 3)):
        ga.built = Gives(*outs)
        for how in ({}, {"inputs": "random"}, {"device": "meta"}):
            r = replay_graph(ga, **how)
            assert (r.status, r.mismatches) == ("mismatch", [f"{n} outputs, recorded 2"]), how
            assert r.errors == [] and r.first_divergence is None


def test_a_repeated_output_left_out_is_filled_from_the_one_it_repeats(tiny):
    ga, y = inference(tiny)
    ga.built = Gives(y, None)  # output 1 is recorded as the same as output 0
    assert replay_graph(ga).status == "match"


def test_an_output_of_another_dtype_or_shape_is_a_mismatch_where_it_was_made_and_elsewhere(tiny):
    ga, y = inference(tiny)
    for now in (y.double(), y.reshape(4), y.reshape(2, 2)):
        ga.built = Gives(now, now)
        for env in ([], ELSEWHERE):
            r = replay_graph(ga, environment=env)
            assert r.status == "mismatch" and r.mismatches, (now.dtype, now.shape, env)


def test_a_number_where_a_tensor_was_recorded_is_a_mismatch(tiny):
    ga, _ = inference(tiny)
    ga.built = Gives(7, 7)
    r = replay_graph(ga)
    assert (r.status, r.mismatches) == ("mismatch", ["output 0 (user): int, recorded a tensor",
                                                     "output 1 (user): int, recorded a tensor"])


def test_the_unrecorded_cpu_reason_is_said_only_when_bits_differ(tiny):
    ga, y = inference(tiny)
    why = "the artefact does not say which CPU it was made on"
    ga.built = Gives(y, y)
    r = replay_graph(ga, unrecorded=why)
    assert (r.status, r.environment, r.verdict) == ("match", [], "match")
    off = with_first(y, float(y.view(-1)[0]) + 2 ** -20)
    ga.built = Gives(off, off)
    r = replay_graph(ga, unrecorded=why)
    assert (r.status, r.environment) == ("close", [why]) and r.verdict == f"close ({why})"


def test_a_graph_that_raises_is_an_error_with_its_reason(tiny):
    class Raises(torch.nn.Module):
        def __init__(self, e):
            super().__init__()
            self.e = e

        def forward(self, *inputs):
            raise self.e

    ga, _ = inference(tiny)
    for e in (RuntimeError("boom\nmore"), ValueError("bad value")):
        ga.built = Raises(e)
        for device in (None, "cpu"):
            r = replay_graph(ga, device=device)
            assert (r.status, r.error, r.ok) == ("error", f"{type(e).__name__}: {str(e).splitlines()[0]}", False)
    ga.built = Raises(ArtifactError("the artefact's own problem"))
    with pytest.raises(ArtifactError, match="the artefact's own problem"):
        replay_graph(ga)


def test_an_unknown_device_or_inputs_kind_is_a_user_error(tiny):
    ga, _ = inference(tiny)
    with pytest.raises(ArtifactError, match=r"^--device: 'nowhere' is not a device; use cpu, cuda, cuda:N or meta$"):
        replay_graph(ga, device="nowhere")
    with pytest.raises(ArtifactError, match=r"^--inputs must be saved or random, got 'bogus'$"):
        replay_graph(ga, inputs="bogus")


def test_on_the_cpu_device_the_verdict_is_the_same(tiny):
    ga, y = inference(tiny)
    r = replay_graph(ga, device="cpu")
    assert (r.status, r.bit_identical) == ("match", True)


def test_on_meta_only_shapes_and_dtypes_are_checked(tiny):
    ga = load(tiny).graphs["inference"]
    r = replay_graph(ga, device="meta")
    assert (r.status, r.mismatches, r.bit_identical, r.max_abs_error) == ("ran", [], None, None)
    _, y = inference(tiny)
    for now, shown in ((y.reshape(4), "torch.float32[4]"), (y.double(), "torch.float64[1, 4]")):
        ga.built = Gives(now, now)
        r = replay_graph(ga, device="meta")
        assert r.status == "mismatch"
        assert r.mismatches == [f"output {i}: {shown} != recorded float32[1, 4]" for i in (0, 1)]


def test_random_inputs_run_and_check_shapes_only(tiny):
    ga = load(tiny).graphs["inference"]
    r = replay_graph(ga, inputs="random", seed=3)
    assert (r.status, r.inputs, r.mismatches, r.ok, r.bit_identical) == ("ran", "random", [], True, None)
    _, y = inference(tiny)
    ga.built = Gives(y, y.reshape(2, 2))
    r = replay_graph(ga, inputs="random")
    assert (r.status, r.mismatches) == ("mismatch", ["output 1: torch.float32[2, 2] != recorded float32[1, 4]"])


def test_random_inputs_follow_the_seed(tiny):
    ga = load(tiny).graphs["inference"]
    seen = []

    class Keeps(torch.nn.Module):
        def forward(self, *inputs):
            seen.append([t.clone() for t in inputs])
            return inputs[1], inputs[1]

    ga.built = Keeps()
    for seed in (0, 0, 1):
        replay_graph(ga, inputs="random", seed=seed)
    assert all(torch.equal(a, b) for a, b in zip(seen[0], seen[1], strict=True))
    assert not torch.equal(seen[0][1], seen[2][1])


def test_bench_times_the_graph_only_when_asked(tiny):
    ga = load(tiny).graphs["inference"]
    assert replay_graph(ga).bench_seconds is None
    r = replay_graph(ga, bench=2)
    assert r.status == "match" and r.bench_seconds is not None and r.bench_seconds > 0


# --- where a mismatch first departs from the capture trace ----------------------------------------


def _add_constant(folder: Path, value: float) -> None:
    """The inference graph's `relu(x * scale) + 1.0` made `+ value`, the artefact resealed."""
    p = folder / "tiny_inference_0" / "graph.json"
    text = p.read_text()
    assert text.count('{"node":"relu"},1.0]') == 1
    p.write_text(text.replace('{"node":"relu"},1.0]', f'{{"node":"relu"}},{value!r}]'))
    assert reseal(folder)


def test_a_changed_graph_is_a_mismatch_naming_the_first_node_that_departs(tiny):
    _add_constant(tiny, 1.5)
    (r,) = replay(tiny, graphs=["inference"])
    assert r.status == "mismatch" and r.bit_identical is False
    assert r.first_divergence == "add (add.Tensor): sum of its sampled elements 6.03742707, recorded 4.03742707"


@pytest.mark.parametrize("env, named", [([], True), (ELSEWHERE, False)])
def test_elsewhere_a_node_departs_only_beyond_float_noise(tiny, env, named):
    _add_constant(tiny, 1.00001)  # sums 1e-5 apart: beyond the same machine's slack, within another's
    ga = load(tiny).graphs["inference"]
    rec = ga.record.outputs[0]
    rec.evidence = rec.evidence.model_copy(update={"bound": 0.0})  # so that it is a mismatch elsewhere too
    r = replay_graph(ga, environment=env)
    assert r.status == "mismatch"
    assert (r.first_divergence is not None) is named
    if named:
        assert r.first_divergence.startswith("add (add.Tensor): sum of its sampled elements ")


def test_the_first_departing_node_may_be_a_graph_input(tiny):
    ga = load(tiny).graphs["inference"]
    inputs = ga.saved_inputs()
    assert first_divergence(ga, inputs) is None
    scale, x = inputs
    x.view(-1)[0] += 1.0
    assert first_divergence(ga, inputs).startswith("x (graph input): sum of its sampled elements ")


def test_a_layout_departure_is_named_as_it_is(tiny):
    ga = load(tiny).graphs["inference"]
    scale, x = ga.saved_inputs()
    wide = torch.cat([x, x], dim=1)
    assert first_divergence(ga, [torch.cat([scale, scale]), wide]) == \
        "p_scale (graph input): shape [8] != recorded [4]"


@pytest.mark.parametrize("rtol, named", [(SAME_RTOL, True), (ELSEWHERE_RTOL, False)])
def test_a_node_departs_when_its_sums_are_more_than_rtol_of_their_absolute_sum_apart(tiny, rtol, named):
    ga = load(tiny).graphs["inference"]
    scale, x = ga.saved_inputs()
    x.mul_(1 + 1e-5)
    assert (first_divergence(ga, [scale, x], rtol) is not None) is named


def test_a_node_whose_absolute_sum_departs_says_so_in_words():
    def summary(sum_, abs_sum):
        return records.Summary(shape=[4], stride=[1], dtype="float32", sum=sum_, abs_sum=abs_sum, nonfinite=0)
    assert _departs(summary(1.0, 3.0), summary(1.0, 5.0), SAME_RTOL) == \
        "absolute sum of its sampled elements 3, recorded 5"
    assert _departs(summary(2.0, 5.0), summary(1.0, 5.0), SAME_RTOL) == "sum of its sampled elements 2, recorded 1"
    assert _departs(summary(1.0, 5.0), summary(1.0, 5.0), SAME_RTOL) is None


def test_no_trace_or_no_graph_module_names_no_node(tiny):
    ga = load(tiny).graphs["inference"]
    inputs = ga.saved_inputs()
    inputs[1].add_(1.0)
    trace = ga.trace
    ga.trace = None
    assert first_divergence(ga, inputs) is None
    ga.trace = trace
    ga.built = Gives(inputs[1])
    assert first_divergence(ga, inputs) is None


# --- what a replay says ---------------------------------------------------------------------------


def test_an_output_error_says_over_how_many_elements_and_within_what_bound():
    assert OutputError("output 0 (user)", 0.00012345, 4, 4).line() == \
        "output 0 (user): max abs error 0.000123 over all 4 elements"
    assert OutputError("output 1 (grad w)", 2.5, 1024, 5000, 3.25).line() == \
        "output 1 (grad w): max abs error 2.5 over 1024 sampled elements of 5000, bound 3.25"
    assert OutputError("o", 0.0, 3, 3, 0.0).line() == "o: max abs error 0 over all 3 elements, bound 0"


def test_the_verdict_says_why_bits_could_not_match_beside_close_mismatch_and_unverified():
    for status in ("close", "mismatch", "unverified"):
        assert GraphReplay("inference", status, "saved", environment=["a", "b"]).verdict == f"{status} (a; b)"
        assert GraphReplay("inference", status, "saved").verdict == status
    for status in ("match", "ran", "error"):
        assert GraphReplay("inference", status, "saved", environment=["a"]).verdict == status


@pytest.mark.parametrize("status, ok", [("match", True), ("close", True), ("ran", True), ("mismatch", False),
                                        ("unverified", False), ("error", False)])
def test_only_match_close_and_ran_are_ok(status, ok):
    assert GraphReplay("forward", status, "saved").ok is ok


def test_the_worst_output_is_the_one_nearest_its_bound():
    r = GraphReplay("forward", "close", "saved", errors=[
        OutputError("a", 3.0, 4, 4, 10.0), OutputError("b", 0.5, 4, 4, 1.0), OutputError("c", 0.1, 4, 4, 0.5)])
    assert r.worst().output == "b"
    assert GraphReplay("forward", "match", "saved").worst() is None
    # no bound: the largest error; a zero bound: zero error counts nothing, any other error is infinitely far
    r = GraphReplay("forward", "mismatch", "saved", errors=[OutputError("a", 1.0, 4, 4), OutputError("b", 2.0, 4, 4)])
    assert r.worst().output == "b"
    r = GraphReplay("forward", "mismatch", "saved", errors=[
        OutputError("a", 0.0, 4, 4, 0.0), OutputError("b", 0.5, 4, 4, 1.0)])
    assert r.worst().output == "b"
    r = GraphReplay("forward", "mismatch", "saved", errors=[
        OutputError("a", 1e-9, 4, 4, 0.0), OutputError("b", 5.0, 4, 4, 1.0)])
    assert r.worst().output == "a"


def test_json_says_inf_for_an_infinite_error_or_bound():
    r = GraphReplay("forward", "mismatch", "saved", max_abs_error=math.inf,
                    errors=[OutputError("a", math.inf, 4, 4, math.inf), OutputError("b", 1.5, 4, 4, 2.0)])
    d = r.to_json()
    assert d["max_abs_error"] == "inf"
    assert d["errors"] == [{"output": "a", "max_abs_error": "inf", "elements": 4, "numel": 4, "bound": "inf"},
                           {"output": "b", "max_abs_error": 1.5, "elements": 4, "numel": 4, "bound": 2.0}]
    assert json.loads(json.dumps(d)) == d
    assert GraphReplay("forward", "match", "saved", max_abs_error=0.0).to_json()["max_abs_error"] == 0.0


# --- replay: the artefact's graphs, at its recorded thread count ---------------------------------


def test_an_unknown_graph_or_thread_count_is_a_user_error_naming_what_there_is(tiny_all):
    with pytest.raises(ArtifactError, match=r": no bogus, other graph; it has inference, forward, backward, joint$"):
        replay(tiny_all, graphs=["inference", "bogus", "other"])
    with pytest.raises(ArtifactError, match=r"^--threads must be at least 1, got 0$"):
        replay(tiny_all, threads=0)
    with pytest.raises(ArtifactError, match=r"^--device: 'nowhere' is not a device"):
        replay(tiny_all, device="nowhere")
    (r,) = replay(tiny_all, graphs=["inference"], threads=1)
    assert r.status == "match"


def test_graphs_captured_without_saved_values_replay_on_random_inputs(tiny_all):
    _rewrite(tiny_all, "tiny_inference_0/inputs.json", lambda rec: rec.update(values="none"))
    assert reseal(tiny_all)
    assert [(r.kind, r.inputs, r.status) for r in replay(tiny_all, graphs=["inference", "forward"])] == \
        [("inference", "random", "ran"), ("forward", "random", "ran")]
    (r,) = replay(tiny_all, graphs=["forward"])
    assert (r.inputs, r.status) == ("saved", "match")


def test_replay_runs_at_the_recorded_thread_count_and_says_when_it_is_another(tiny):
    with intra_op_threads(3):
        (r,) = replay(tiny, graphs=["inference"])
        assert r.environment == [] and torch.get_num_threads() == 3
    _rewrite(tiny, "manifest.json", lambda m: m["environment"].update(threads=2))
    assert reseal(tiny)
    (r,) = replay(tiny, graphs=["inference"])
    assert r.environment == []  # ran at the 2 threads it records
    (r,) = replay(tiny, graphs=["inference"], threads=1)
    assert r.environment == ["1 thread, recorded 2"] and r.status == "close"


def test_an_artefact_that_records_no_cpu_is_judged_where_bits_differ(tiny):
    _rewrite(tiny, "manifest.json", lambda m: m["environment"].update(cpu=None))
    assert reseal(tiny)
    (r,) = replay(tiny, graphs=["inference"])
    assert (r.status, r.environment) == ("match", [])
    _add_constant(tiny, 1.0000001)
    (r,) = replay(tiny, graphs=["inference"])
    assert r.status == "close" and len(r.environment) == 1 and "CPU" in r.environment[0]


# --- the command line -------------------------------------------------------------------------------


def cli(*args):
    r = CliRunner().invoke(main, ["replay", *map(str, args), "--no-sandbox", "--json"])
    return r.exit_code, json.loads(r.output) if r.output.startswith("{") else r.output


def test_cli_match_exits_0_with_each_graphs_verdict(tiny_all):
    code, out = cli(tiny_all, "--graph", "inference", "--graph", "joint")
    assert code == 0 and out["ok"] is True
    assert [(g["kind"], g["status"], g["bit_identical"], g["environment"]) for g in out["graphs"]] == \
        [("inference", "match", True, []), ("joint", "match", True, [])]


def test_cli_close_at_another_thread_count_exits_0(tiny):
    code, out = cli(tiny, "--graph", "inference", "--threads", "2")
    assert code == 0 and [(g["status"], g["environment"]) for g in out["graphs"]] == \
        [("close", ["2 threads, recorded 1"])]


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_cli_close_within_the_bound_exits_0_and_mismatch_one_ulp_beyond_it_exits_1(tiny, where):
    _add_constant(tiny, 1.0000001)  # every output one float32 ulp or so from the recorded one
    ga, y = inference(tiny)
    rec_y = run_graph(load(TINY).graphs["inference"].module, ga.saved_inputs())[0]
    err = float((y.double() - rec_y.double()).abs().max())
    assert err > 0
    bound = err if where == "inside" else float(torch.nextafter(torch.tensor(err, dtype=torch.float64),
                                                                torch.tensor(0.0, dtype=torch.float64)))
    _rewrite(tiny, "tiny_inference_0/inputs.json",
             lambda rec: [o["evidence"].update(bound=bound) for o in rec["outputs"] if o.get("evidence")])
    assert reseal(tiny)
    code, out = cli(tiny, "--graph", "inference", "--threads", "2")
    (g,) = out["graphs"]
    assert g["max_abs_error"] == err and g["errors"][0]["bound"] == bound
    if where == "inside":
        assert (code, out["ok"], g["status"], g["mismatches"]) == (0, True, "close", [])
    else:
        assert (code, out["ok"], g["status"]) == (1, False, "mismatch")
        assert g["mismatches"][0].startswith(f"output 0 (user): max abs error {err:.3g} over 4 sampled elements")


def test_cli_bits_off_elsewhere_with_only_sampled_sums_recorded_are_unverified_and_exit_1(tiny):
    _add_constant(tiny, 1.0000001)
    _rewrite(tiny, "tiny_inference_0/inputs.json",
             lambda rec: [o.update(evidence=None) for o in rec["outputs"]])  # what format version 2 records
    assert reseal(tiny)
    code, out = cli(tiny, "--graph", "inference", "--threads", "2")
    (g,) = out["graphs"]
    assert (code, out["ok"], g["status"], g["environment"]) == (1, False, "unverified", ["2 threads, recorded 1"])
    assert g["mismatches"][0].startswith("output 0 (user): not bit-identical; its sampled sums are within float noise")
    code, out = cli(tiny, "--graph", "inference")  # where it was made, bits must match
    assert (code, out["graphs"][0]["status"]) == (1, "mismatch")


def test_cli_mismatch_where_it_was_made_exits_1_naming_the_node(tiny):
    _add_constant(tiny, 1.5)
    code, out = cli(tiny, "--graph", "inference")
    (g,) = out["graphs"]
    assert (code, g["status"], g["max_abs_error"]) == (1, "mismatch", 0.5)
    assert g["first_divergence"] == "add (add.Tensor): sum of its sampled elements 6.03742707, recorded 4.03742707"


def test_cli_prints_the_verdict_and_the_worst_output(tiny):
    _add_constant(tiny, 1.0000001)
    r = CliRunner().invoke(main, ["replay", str(tiny), "--no-sandbox", "--graph", "inference", "--threads", "2"])
    assert r.exit_code == 0
    assert r.output.startswith("inference  close (2 threads, recorded 1) (saved inputs)  output ")


# --- the chain: forward then backward, against the joint graph and the eager model -----------------


def test_the_chain_matches_the_joint_graph_and_counts_what_it_compared(tiny_all):
    c = replay_chain(load(tiny_all), rebuild_source=False)
    assert (c.status, c.compared, c.max_abs_error_vs_joint, c.problems) == ("match", 2, 0.0, [])
    assert (c.max_abs_error_vs_eager, c.eager_within_tolerance) == (None, None)
    assert c.to_json() == {"status": "match", "compared": 2, "max_abs_error_vs_joint": 0.0,
                           "max_abs_error_vs_eager": None, "eager_within_tolerance": None, "problems": []}


def test_the_chain_checks_the_gradients_against_the_eager_model_when_it_can_be_rebuilt(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    c = replay_chain(tiny_all, trust_code=True)
    assert (c.status, c.eager_within_tolerance, c.problems) == ("match", True, [])
    assert c.max_abs_error_vs_eager is not None and c.max_abs_error_vs_eager <= 1e-6
    # without trusting the artefact's code, its source is not rebuilt
    c = replay_chain(tiny_all)
    assert (c.status, c.max_abs_error_vs_eager, c.eager_within_tolerance) == ("match", None, None)


def test_a_gradient_off_the_joint_graphs_and_the_eager_models_is_a_mismatch_naming_it(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    art = load(tiny_all)
    bw = art.graphs["backward"]
    fw_out = run_graph(art.graphs["forward"].module, art.graphs["forward"].saved_inputs())
    grad = run_graph(bw.module, bw.saved_inputs(forward_outputs=fw_out))[0]
    bw.built = Gives(grad + 0.5, None)
    c = replay_chain(art, trust_code=True)
    assert (c.status, c.eager_within_tolerance) == ("mismatch", False)
    assert c.max_abs_error_vs_joint == pytest.approx(0.5, abs=1e-6)
    assert c.problems[0] == "gradient of scale: differs from the joint graph's (max abs error 0.5)"
    assert c.problems[1].startswith("off the eager model: gradient of scale")
    assert c.max_abs_error_vs_eager == pytest.approx(0.5, abs=1e-6)


def test_a_forward_output_off_the_joint_graphs_is_a_mismatch(tiny_all):
    art = load(tiny_all)
    fw = art.graphs["forward"]
    outs = run_graph(fw.module, fw.saved_inputs())
    fw.built = Gives(outs[0] + 0.25, *outs[1:])
    c = replay_chain(art, rebuild_source=False)
    assert c.status == "mismatch" and c.max_abs_error_vs_joint == 0.25
    assert c.problems == ["forward output 0: differs from the joint graph's (max abs error 0.25)"]


def test_chain_problems_count_and_name_missing_forward_outputs():
    contract = records.Partition(num_user_outputs=2, num_mutated_inputs=1, num_saved_tensors=0, num_saved_symints=0,
                                 num_tangents=1, mutated_inputs=["b"], grad_of=["w", None])
    joint = records.parse(InputsRecord, {"format_version": 3, "kind": "joint", "storages": [], "inputs": [],
                                         "outputs": [{"index": 0, "role": "user"}, {"index": 1, "role": "grad",
                                                                                    "target": "w"}]}, "joint")
    g = torch.tensor([1.0, 2.0])
    problems, worst, compared = chain_problems(contract, [g, g], [g.clone(), None], joint, [g, g])
    assert problems == ["forward output 2: missing (the partition contract names 3 forward outputs)"]
    assert (worst, compared) == (0.0, 4)
    problems, worst, compared = chain_problems(contract, [g, g, g], [g + 1, None], joint, [g, g * 3])
    assert problems == ["gradient of w: differs from the joint graph's (max abs error 3)",
                        "forward output 1: differs from the joint graph's (max abs error 4)",
                        "forward output 2: missing (the partition contract names 3 forward outputs)"]
    assert (worst, compared) == (4.0, 4)


def test_graphs_that_do_not_run_give_a_chain_error(tiny_all):
    class Raises(torch.nn.Module):
        def forward(self, *inputs):
            raise RuntimeError("cannot run")

    art = load(tiny_all)
    art.graphs["joint"].built = Raises()
    c = replay_chain(art, rebuild_source=False)
    assert (c.status, c.compared, c.max_abs_error_vs_joint, c.problems) == \
        ("error", 0, math.inf, ["the graphs do not run: RuntimeError: cannot run"])


def test_a_chain_without_a_joint_graph_or_partition_contract_is_a_user_error(tiny_all):
    art = load(tiny_all)
    del art.graphs["joint"]
    with pytest.raises(ArtifactError, match=r"the chain needs forward, backward and joint graphs; joint is missing$"):
        replay_chain(art)
    art = load(tiny_all)
    art.graphs["forward"].record.partition = None
    with pytest.raises(ArtifactError, match=r"tiny_forward_0/inputs.json: no partition contract$"):
        replay_chain(art)


def test_an_eager_comparison_that_fails_is_a_mismatch_saying_why(tiny_all, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the model does not take these inputs")

    monkeypatch.setattr(replay_run, "rebuild_model", broken)
    c = replay_chain(load(tiny_all))
    assert (c.status, c.eager_within_tolerance) == ("mismatch", False)
    assert c.problems == ["the eager comparison failed: RuntimeError: the model does not take these inputs"]
    assert (c.compared, c.max_abs_error_vs_joint) == (2, 0.0)  # what the joint graph's comparison found


def test_the_chain_runs_at_the_recorded_thread_count_or_the_one_asked(tiny_all):
    seen = []
    art = load(tiny_all)
    fw = art.graphs["forward"]

    class Counts(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            seen.append(torch.get_num_threads())
            return tuple(run_graph(self.inner, list(inputs)))

    fw.built = Counts(fw.module)
    with intra_op_threads(3):
        replay_chain(art, rebuild_source=False)
        replay_chain(art, rebuild_source=False, threads=2)
    assert seen == [1, 2]


def test_the_float64_reference_of_a_gradient_is_the_float64_training_runs():
    g = torch.ones(2, dtype=torch.float64)

    class Reference:
        def run(self, mode, fp64=False):
            return SimpleNamespace(grads={"w": g}) if (mode, fp64) == ("training", True) else None

    assert _grad64(Reference(), "w") is g
    assert _grad64(Reference(), "b") is None
    assert _grad64(SimpleNamespace(run=lambda mode, fp64=False: None), "w") is None


def test_chain_keys_and_problem_prefixes_name_the_subgraph():
    assert [chain_key(i) for i in (0, 1, 2)] == ["chain", "chain_1", "chain_2"]
    assert _subgraph(0, {0: {}}) == ""
    assert _subgraph(0, {0: {}, 1: {}}) == "subgraph 0: "
    assert _subgraph(1, {1: {}}) == "subgraph 1: "


# --- get_inputs: random inputs of the recorded layout ---------------------------------------------


def test_random_inputs_have_the_recorded_layout_and_follow_the_seed(tiny):
    folder = tiny / "tiny_inference_0"
    scale, x = get_inputs(folder, seed=5)
    assert (scale.shape, scale.stride(), x.shape, x.stride()) == ((4,), (1,), (1, 4), (4, 1))
    assert scale.dtype == x.dtype == torch.float32 and scale.device.type == "cpu"
    again = get_inputs(folder / "tiny_inference_0.input", seed=5)
    assert all(torch.equal(a, b) for a, b in zip((scale, x), again, strict=True))
    g = torch.Generator().manual_seed(5)
    assert torch.equal(scale, torch.randn(4, generator=g)) and torch.equal(x.reshape(-1), torch.randn(4, generator=g))
    other = get_inputs(folder, seed=6)
    assert not torch.equal(other[0], scale)
    assert all(torch.equal(a, b) for a, b in zip(get_inputs(folder), get_inputs(folder, seed=0), strict=True))


def test_the_joint_graphs_inputs_come_nested_as_primals_and_tangents():
    primals, tangents = get_inputs(TINY / "tiny_joint_0")
    assert [t.shape for t in primals] == [(4,), (1, 4)] and [t.shape for t in tangents] == [()]


def test_inputs_over_the_byte_limit_are_refused_naming_the_record_they_come_from(tmp_path):
    with limits.override(max_bytes=16):
        with pytest.raises(LimitError, match=r"tiny_inference_0/inputs.json: its inputs need 32 bytes in all"):
            get_inputs(TINY / "tiny_inference_0")
        bare = dumper_file(tmp_path, [(torch.Tensor, torch.Size([8]), (1,), torch.float32, CPU)])
        with pytest.raises(LimitError, match=rf"^{bare}: its inputs: storage 0: float32\[8\] needs 32 bytes"):
            get_inputs(bare)


def test_a_joint_graph_comes_nested_by_its_record_or_else_by_its_input_file(tmp_path):
    for drop in ("record", "file"):
        folder = tmp_path / drop / "tiny_joint_0"
        shutil.copytree(TINY / "tiny_joint_0", folder)
        if drop == "record":
            _rewrite(folder, "inputs.json", lambda rec: rec.update(groups=None))
        else:
            p = folder / "tiny_joint_0.input"
            p.write_bytes(input_meta.dumps(_flatten_meta(input_meta.read(p))[0]))
        primals, tangents = get_inputs(folder)
        assert len(primals) == 2 and len(tangents) == 1, drop


def test_random_inputs_on_another_device(tiny):
    scale, x = get_inputs(tiny / "tiny_inference_0", device="meta")
    assert scale.device.type == x.device.type == "meta" and x.shape == (1, 4)


def test_a_folder_must_hold_exactly_one_input_file(tmp_path, tiny):
    with pytest.raises(ArtifactError, match=r": expected one .input file, found 0$"):
        get_inputs(tmp_path)
    folder = tiny / "tiny_inference_0"
    shutil.copy(folder / "tiny_inference_0.input", folder / "other.input")
    with pytest.raises(ArtifactError, match=r": expected one .input file, found 2$"):
        get_inputs(folder)


def test_an_input_file_must_list_as_many_entries_as_inputs_json(tiny):
    folder = tiny / "tiny_inference_0"
    entry = (torch.Tensor, torch.Size([4]), (1,), torch.float32, torch.device("cpu"))
    (folder / "tiny_inference_0.input").write_bytes(input_meta.dumps([entry] * 3))
    with pytest.raises(ArtifactError, match=r"tiny_inference_0.input: 3 entries but inputs.json lists 2 inputs$"):
        get_inputs(folder)


def test_inputs_json_that_cannot_make_inputs_is_a_user_error_in_one_line(tiny):
    _rewrite(tiny, "tiny_inference_0/inputs.json", lambda rec: rec["storages"][1].update(numel=2))
    with pytest.raises(ArtifactError, match=r"tiny_inference_0.input: cannot make inputs from it \(RuntimeError: "):
        get_inputs(tiny / "tiny_inference_0")


def dumper_file(tmp_path, meta) -> Path:
    """An .input file as torch's graph_dumper_aot writes one, with no inputs.json beside it."""
    p = tmp_path / "g_forward_0.input"
    p.write_bytes(input_meta.dumps(meta))
    return p


CPU = torch.device("cpu")


def test_without_inputs_json_each_tensor_gets_a_storage_spanning_its_strides(tmp_path):
    meta = [(torch.Tensor, torch.Size([2, 3]), (1, 4), torch.float32, CPU),  # spans 1 + 1 + 2 * 4 = 10
            (int,), (float,), (bool,),
            (torch.Tensor, torch.Size([3]), (2,), torch.int64, CPU),
            (torch.Tensor, torch.Size([0, 2]), (2, 1), torch.float16, CPU),
            (torch.Tensor, torch.Size([5]), (1,), torch.bool, CPU)]
    a, i, f, b, n, e, flags = get_inputs(dumper_file(tmp_path, meta), seed=2)
    assert (a.shape, a.stride(), a.untyped_storage().nbytes()) == ((2, 3), (1, 4), 10 * 4)
    assert (i, f, b) == (1, 1.0, True) and (type(i), type(f), type(b)) == (int, float, bool)
    assert (n.stride(), n.untyped_storage().nbytes(), n.dtype) == ((2,), 5 * 8, torch.int64)
    assert set(n.tolist()) <= {0, 1}  # no range recorded: [0, 2)
    assert e.shape == (0, 2) and e.dtype == torch.float16
    assert flags.dtype == torch.bool
    # one generator over the storages in order: the first tensor's are the first draws
    g = torch.Generator().manual_seed(2)
    assert torch.equal(a.as_strided((10,), (1,)), torch.randn(10, generator=g))


def test_without_inputs_json_a_joint_file_comes_back_nested(tmp_path):
    t = (torch.Tensor, torch.Size([2]), (1,), torch.float32, CPU)
    primals, tangents = get_inputs(dumper_file(tmp_path, [[t, t], [t]]))
    assert len(primals) == 2 and len(tangents) == 1
    assert primals[0].untyped_storage().data_ptr() != primals[1].untyped_storage().data_ptr()


@pytest.mark.parametrize("entry, message", [
    ([int], "bad input entry [<class 'int'>]"),
    ((), "bad input entry ()"),
    ((str,), "bad scalar entry (<class 'str'>,)"),
    ((torch.Tensor, (2,), (1,)), "an entry is (type, shape, stride, dtype, device), got 3 items"),
    ((torch.Tensor, (2,), (1,), "float32", CPU), "bad dtype float32"),
])
def test_an_input_entry_of_another_form_is_refused_naming_it(entry, message):
    with pytest.raises(ArtifactError) as e:
        _entry_record(0, entry, "g.input")
    assert str(e.value) == f"g.input: {message}"


def test_a_long_input_entry_is_shown_cut_short():
    with pytest.raises(ArtifactError) as e:
        _entry_record(0, [7] * 40, "g.input")
    assert str(e.value) == f"g.input: bad input entry {str([7] * 40)[:60]}"
    with pytest.raises(ArtifactError) as e:
        _entry_record(0, ("s" * 100,), "g.input")
    assert str(e.value) == f"g.input: bad scalar entry ('{'s' * 58}"
    with pytest.raises(ArtifactError) as e:
        _entry_record(0, (torch.Tensor, (2,), (1,), "d" * 100, CPU), "g.input")
    assert str(e.value) == f"g.input: bad dtype {'d' * 40}"


def test_an_input_file_naming_a_device_the_format_does_not_know_is_refused_naming_the_entry(tmp_path):
    p = dumper_file(tmp_path, [(int,), (torch.Tensor, torch.Size([2]), (1,), torch.float32, torch.device("vulkan"))])
    with pytest.raises(ArtifactError, match=rf"^{p}: entry 1: field device: "):
        get_inputs(p)


def test_an_input_entry_becomes_the_record_inputs_json_would_hold():
    assert _entry_record(2, (float,), "w") == {"index": 2, "name": "arg2", "role": "user", "type": "float"}
    assert _entry_record(1, (torch.Tensor, torch.Size([2, 3]), (3, 1), torch.bfloat16, CPU), "w") == \
        {"index": 1, "name": "arg1", "role": "user", "type": "tensor", "shape": [2, 3], "stride": [3, 1],
         "dtype": "bfloat16", "device": "cpu", "storage_offset": 0}


def test_flat_and_nested_metadata():
    assert _flatten_meta([]) == ([], None)
    assert _flatten_meta([(int,), (float,)]) == ([(int,), (float,)], None)
    assert _flatten_meta([[(int,)], [(float,), (bool,)]]) == ([(int,), (float,), (bool,)], [1, 2])
    assert _flatten_meta([[(int,)], (float,)]) == ([[(int,)], (float,)], None)


# --- mutated inputs copied back, repeated outputs re-expanded, shapes with free dimensions ---------


def io_record(inputs, outputs, kind="forward"):
    return records.parse(InputsRecord, {
        "format_version": 3, "kind": kind, "storages": [],
        "inputs": [{"index": i, "type": "tensor", **r} for i, r in enumerate(inputs)],
        "outputs": [{"index": i, **r} for i, r in enumerate(outputs)]}, "inputs.json")


def test_mutation_outputs_are_copied_into_the_inputs_they_name():
    rec = io_record([{"name": "x", "role": "user"}, {"name": "b_running", "role": "buffer", "target": "running"}],
                    [{"role": "mutation", "target": "running"}, {"role": "mutation", "target": "x"},
                     {"role": "user"}, {"role": "mutation", "target": "elsewhere"}, {"role": "mutation", "target": "x"}])
    x, running = torch.zeros(2), torch.zeros(3)
    new_running, new_x, user = torch.full((3,), 2.0), torch.full((2,), 5.0), torch.ones(2)
    done = copy_mutations_back(rec, [x, running], [new_running, new_x, user, torch.ones(1), 7])
    assert done == ["running", "x"]
    assert running.tolist() == [2.0] * 3 and x.tolist() == [5.0] * 2


def test_a_mutation_output_that_does_not_fit_its_input_is_a_user_error():
    rec = io_record([{"name": "x", "role": "user"}], [{"role": "mutation", "target": "x"}])
    for inputs in ([torch.zeros(3)], [4]):
        with pytest.raises(ArtifactError, match=r"^inputs.json: mutation output of 'x' does not fit the input it "
                                                r"names$"):
            copy_mutations_back(rec, inputs, [torch.zeros(2)])


def test_repeated_outputs_are_filled_from_the_output_they_repeat():
    rec = io_record([], [{"role": "user"}, {"role": "user", "same_as": 0}, {"role": "user", "same_as": 0},
                         {"role": "user", "same_as": 9}])
    a, b = torch.ones(1), torch.zeros(1)
    assert expand_outputs(rec, [a, None, b, None]) == [a, a, b, None]
    assert expand_outputs(rec, [a, None]) == [a, a]


@pytest.mark.parametrize("recorded, free, same", [
    ([2, 3], [], True), ([2, 4], [], False), ([2, 4], [1], True), ([5, 3], [1], False), ([2, 3, 1], [], False),
    (None, [], False), ([2], [0], False),
])
def test_a_shape_is_the_recorded_one_but_for_its_data_dependent_dimensions(recorded, free, same):
    assert _same_shape(torch.zeros(2, 3), recorded, free) is same


def test_the_element_count_of_an_output_is_its_recorded_shapes():
    rec = io_record([], [{"role": "user", "shape": [2, 5]}, {"role": "user"}]).outputs
    assert _numel(rec[0], torch.zeros(3)) == 10
    assert _numel(rec[1], torch.zeros(3)) == 3
    assert _numel(rec[1], 7) == 1


def test_outputs_are_labelled_with_their_role_and_target():
    rec = io_record([], [{"role": "user"}, {"role": "grad", "target": "fc.weight"}]).outputs
    assert (_label(0, rec[0]), _label(1, rec[1])) == ("output 0 (user)", "output 1 (grad fc.weight)")


def test_the_recorded_thread_count_is_the_manifests(tiny):
    assert recorded_threads(load(tiny)) == 1
    art = load(tiny)
    art.manifest = art.manifest.model_copy(update={"environment": None})
    assert recorded_threads(art) is None


# --- a backward's saved indices and sizes, from what the forward recorded ---------------------------


N = 64  # elements per saved tensor: enough that a draw outside its range would show


def backward_folder(tmp_path) -> tuple[Path, InputsRecord]:
    """A backward graph's folder (inputs.json and .input) whose saved inputs come from the forward,
    and the forward's record: its outputs' recorded ranges and values."""
    ints = [("idx", 0, [N], [1], None), ("own", 0, [N], [1], [100, 101]), ("far", 9, [N], [1], None),
            ("expanded", 0, [N], [0], None), ("no_range", 3, [N], [1], None), ("empty", 4, [N], [1], None),
            ("just_past", 5, [N], [1], None)]
    inputs, storages, meta = [], [], []
    for name, k, shape, stride, rng in ints:
        inputs.append({"index": len(inputs), "name": name, "role": "saved", "source": "forward", "forward_output": k,
                       "type": "tensor", "shape": shape, "stride": stride, "dtype": "int64", "device": "cpu",
                       "storage_offset": 0, "storage": len(storages), "range": rng})
        storages.append({"dtype": "int64", "device": "cpu", "numel": 1 if stride == [0] else N, "range": rng})
        meta.append((torch.Tensor, torch.Size(shape), tuple(stride), torch.int64, CPU))
    for name, dtype in (("flags", "bool"), ("floats", "float32")):
        inputs.append({"index": len(inputs), "name": name, "role": "saved", "source": "forward", "forward_output": 0,
                       "type": "tensor", "shape": [N], "stride": [1], "dtype": dtype, "device": "cpu",
                       "storage_offset": 0, "storage": len(storages)})
        storages.append({"dtype": dtype, "device": "cpu", "numel": N})
        meta.append((torch.Tensor, torch.Size([N]), (1,), getattr(torch, dtype), CPU))
    inputs.append({"index": len(inputs), "name": "size", "role": "saved", "source": "forward", "forward_output": 2,
                   "type": "int"})
    meta.append((int,))
    inputs.append({"index": len(inputs), "name": "idx_last", "role": "saved", "source": "forward", "forward_output": 0,
                   "type": "tensor", "shape": [N], "stride": [1], "dtype": "int32", "device": "cpu",
                   "storage_offset": 0, "storage": len(storages)})
    storages.append({"dtype": "int32", "device": "cpu", "numel": N})
    meta.append((torch.Tensor, torch.Size([N]), (1,), torch.int32, CPU))
    inputs.append({"index": len(inputs), "name": "tangent", "role": "tangent", "source": "ones", "type": "tensor",
                   "shape": [N], "stride": [1], "dtype": "int64", "device": "cpu", "storage_offset": 0,
                   "storage": len(storages)})
    storages.append({"dtype": "int64", "device": "cpu", "numel": N})
    meta.append((torch.Tensor, torch.Size([N]), (1,), torch.int64, CPU))
    folder = tmp_path / "m_backward_0"
    folder.mkdir()
    (folder / "inputs.json").write_text(json.dumps({"format_version": 3, "kind": "backward", "values": "none",
                                                    "storages": storages, "inputs": inputs, "outputs": []}))
    (folder / "m_backward_0.input").write_bytes(input_meta.dumps(meta))
    forward = records.parse(InputsRecord, {"format_version": 3, "kind": "forward", "storages": [], "inputs": [],
                                           "outputs": [{"index": 0, "role": "saved", "range": [10, 14]},
                                                       {"index": 1, "role": "saved"},
                                                       {"index": 2, "role": "saved", "value": 6},
                                                       {"index": 3, "role": "saved"},
                                                       {"index": 4, "role": "saved", "range": [5, 5]}]}, "forward")
    return folder, forward


def test_a_backwards_saved_indices_are_drawn_in_the_range_the_forwards_output_had(tmp_path):
    folder, forward = backward_folder(tmp_path)
    values = get_inputs(folder, seed=1, forward=forward)
    idx, own, far, expanded, no_range, empty, just_past, flags, floats, size, idx_last, tangent = values
    for t in (idx, idx_last):
        assert set(t.tolist()) <= {10, 11, 12, 13} and len(set(t.tolist())) > 1
    assert idx_last.dtype == torch.int32
    assert own.tolist() == [100] * N  # its own recorded range
    for t in (far, expanded, no_range, empty, just_past, tangent):  # nothing the forward recorded: [0, 2)
        assert set(t.tolist()) <= {0, 1}, t
    assert flags.dtype == torch.bool and floats.dtype == torch.float32
    assert not torch.equal(floats, floats.round())  # N(0, 1), not indices
    assert size == 6 and type(size) is int
    # drawn from the seed's generator: the same seed, the same indices; another seed, others
    again = get_inputs(folder, seed=1, forward=forward)
    assert torch.equal(again[0], idx) and torch.equal(again[10], idx_last)
    assert not torch.equal(get_inputs(folder, seed=2, forward=forward)[0], idx)


def test_without_the_forwards_record_a_backwards_saved_size_cannot_be_drawn(tmp_path):
    folder, _ = backward_folder(tmp_path)
    with pytest.raises(ArtifactError, match=r"^input 'size' \(int\) is a value the forward graph computes"):
        get_inputs(folder)


# --- first_divergence over tuples, missing nodes and samples ------------------------------------


def _max_then_relu(x):
    m = torch.ops.aten.max.dim(x, 1)
    return (operator.getitem(m, 0).relu() * 2,)


def traced(sampled: bool, x: torch.Tensor):
    """A graph with a tuple-valued node (max.dim), a call_method node (relu), and the trace of its
    run on `x` (sums over samples of each node, or over all its elements)."""
    gm = torch.fx.symbolic_trace(_max_then_relu)
    _, got = run_with_summaries(gm, [x], accuracy.sampled_summary if sampled else accuracy.summary)
    nodes = {k: records.TupleSummary(items=list(v)) if isinstance(v, tuple) else v for k, v in got.items()}
    return SimpleNamespace(module=gm, trace=records.TraceRecord(format_version=3, sampled=sampled, nodes=nodes))


X = torch.arange(64 * 128, dtype=torch.float32).reshape(64, 128).sin()  # more elements than a sample


@pytest.mark.parametrize("sampled", [False, True])
def test_a_trace_is_compared_over_the_elements_it_summed(sampled):
    ga = traced(sampled, X)
    assert first_divergence(ga, [X.clone()]) is None


def _with(ga, name, value):
    ga.trace.nodes[name] = value
    return ga


def test_a_tuple_nodes_elements_are_compared_with_the_recorded_ones_skipping_those_recorded_as_none():
    ga = traced(True, X)
    values, indices = ga.trace.nodes["max_dim"].items
    off = values.model_copy(update={"sum": values.sum + 1.0})
    assert first_divergence(_with(ga, "max_dim", records.TupleSummary(items=[off, indices])), [X]) == \
        f"max_dim (max.dim): sum of its sampled elements {values.sum:.9g}, recorded {values.sum + 1:.9g}"
    off_indices = indices.model_copy(update={"sum": indices.sum + 1.0})
    assert first_divergence(_with(ga, "max_dim", records.TupleSummary(items=[None, off_indices])), [X]) \
        .startswith("max_dim (max.dim): sum of its sampled elements ")


def test_a_node_no_longer_a_tuple_or_now_one_pairs_with_nothing():
    ga = traced(True, X)
    tensor_summary = ga.trace.nodes["relu"]
    tuple_summary = ga.trace.nodes["max_dim"]
    _with(ga, "relu", records.TupleSummary(items=[tensor_summary]))
    _with(ga, "max_dim", tensor_summary)
    assert first_divergence(ga, [X]) is None


def test_nodes_the_trace_does_not_have_are_skipped_and_later_ones_compared():
    ga = traced(True, X)
    del ga.trace.nodes["x"], ga.trace.nodes["max_dim"], ga.trace.nodes["getitem"]
    relu = ga.trace.nodes["relu"]
    _with(ga, "relu", relu.model_copy(update={"abs_sum": relu.abs_sum * 2}))
    assert first_divergence(ga, [X]).startswith("relu (relu): absolute sum of its sampled elements ")


def test_every_gradient_is_compared_past_a_primal_without_one_and_a_short_forward_is_named():
    contract = records.Partition(num_user_outputs=2, num_mutated_inputs=0, num_saved_tensors=0, num_saved_symints=0,
                                 num_tangents=1, mutated_inputs=[], grad_of=[None, "w", "v"])
    joint = records.parse(InputsRecord, {"format_version": 3, "kind": "joint", "storages": [], "inputs": [],
                                         "outputs": [{"index": 0, "role": "grad", "target": "w"},
                                                     {"index": 1, "role": "grad", "target": "v"}]}, "joint")
    g = torch.tensor([1.0, 2.0])
    problems, worst, compared = chain_problems(contract, [g], [None, g, g + 2], joint, [g, g, g])
    assert problems == ["gradient of v: differs from the joint graph's (max abs error 2)",
                        "forward output 1: missing (the partition contract names 2 forward outputs)"]
    assert (worst, compared) == (2.0, 4)


def test_replay_by_default_compares_saved_inputs_and_times_nothing(tiny):
    (r,) = replay(tiny)
    assert (r.inputs, r.status, r.bench_seconds) == ("saved", "match", None)


# --- on another device: a stand-in for one, as there is no accelerator here ----------------------------

ON_DEVICE = ["device cuda, recorded cpu"]  # what replay() says of a replay on "cuda"


class Shifted(torch.nn.Module):
    """A graph as another device runs it: the CPU's outputs, each tensor plus `shift` (the rounding
    of other kernels), or `give` in place of the tensors where it is set."""

    def __init__(self, gm, shift=0.0, give=None):
        super().__init__()
        self.gm, self.shift, self.give = gm, shift, give

    def forward(self, *inputs):
        return tuple((o + self.shift if self.give is None else self.give) if isinstance(o, torch.Tensor) else o
                     for o in run_graph(self.gm, list(inputs)))


@pytest.fixture()
def accelerator(monkeypatch):
    """Replay on "cuda" with no such device here: the inputs are moved as copies that stay on the
    CPU, and the device runs the graph `dev.graph(gm)` makes of the CPU's (by default the same one).
    `dev.moved` lists the devices inputs were moved to."""
    dev = SimpleNamespace(graph=lambda gm: gm, moved=[])

    def move_inputs(values, device):
        dev.moved.append(str(device))
        return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]

    monkeypatch.setattr(replay_run, "move_inputs", move_inputs)
    monkeypatch.setattr(replay_run, "to_device", lambda gm, device: dev.graph(gm))
    return dev


def without_evidence(ga):
    """`ga` as format version 2 records its outputs: digests and sums, no element-wise evidence."""
    for rec in ga.record.outputs:
        rec.evidence = None
    return ga


def test_on_another_device_outputs_with_evidence_are_judged_by_it_as_on_the_cpu(tiny, accelerator):
    ga, _ = inference(tiny)
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    assert (r.status, r.bit_identical, r.max_abs_error, r.errors, r.mismatches) == ("close", True, 0.0, [], [])
    assert accelerator.moved == ["cuda"]
    bound = ga.record.outputs[0].evidence.bound
    accelerator.graph = lambda gm: Shifted(gm, 4 * bound)
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    assert (r.status, r.bit_identical) == ("mismatch", False)
    assert [(e.output, e.elements, e.bound) for e in r.errors] == [("output 0 (user)", 4, bound),
                                                                    ("output 1 (user)", 4, bound)]


@pytest.mark.parametrize("share, ok", [(0.9, True), (1.1, False)])
def test_on_another_device_outputs_without_evidence_are_compared_with_the_cpus_within_float_noise(
        tiny, accelerator, share, ok):
    ga, y = inference(tiny)
    without_evidence(ga)
    floor = accuracy.floor(y, 1e-4)  # a relative floor of 1e-4: float noise of other kernels
    now = y + share * floor
    accelerator.graph = lambda gm: Shifted(gm, share * floor)
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    err, rmse = accuracy.max_abs_error(now, y), accuracy.rmse(now, y)
    assert err > 0 and (rmse <= floor) is ok
    assert [(e.output, e.max_abs_error, e.elements, e.numel, e.bound) for e in r.errors] == \
        [(f"output {i} (user)", err, 4, 4, None) for i in (0, 1)]
    assert (r.max_abs_error, r.bit_identical, r.environment) == (err, None, ON_DEVICE)
    if ok:
        assert (r.status, r.mismatches, r.ok) == ("close", [], True)
    else:
        assert (r.status, r.ok) == ("mismatch", False)
        assert r.mismatches == [f"output {i} (user): RMS error {rmse:.3g} against eager float32, over the "
                                f"float-noise floor {floor:.3g} (max abs error {err:.3g})" for i in (0, 1)]


def test_on_another_device_an_output_that_is_no_longer_a_tensor_is_a_mismatch_with_no_error_figure(
        tiny, accelerator):
    ga, y = inference(tiny)
    without_evidence(ga)
    accelerator.graph = lambda gm: Shifted(gm, give=7)
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    assert (r.status, r.errors, r.max_abs_error) == ("mismatch", [], 0.0)
    assert r.mismatches == [f"output {i} (user): 7 != eager's {y!r}" for i in (0, 1)]


def test_on_another_device_outputs_that_are_numbers_give_no_error_figure(tiny, accelerator):
    ga, _ = inference(tiny)
    without_evidence(ga).built = Gives(3, 3)
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    assert (r.errors, r.max_abs_error, r.mismatches) == ([], 0.0, [])


def test_on_another_device_a_stored_output_value_is_compared_with_it_not_with_the_cpus(tiny, accelerator):
    ga, y = inference(tiny)
    stored = Expected(digest=accuracy.digest(y), value=y, has_value=True)  # as versions 1 and 2 store values
    ga.expected_outputs = lambda: [stored, stored]
    r = replay_graph(ga, device="cuda", environment=ON_DEVICE)
    assert (r.status, r.bit_identical, r.max_abs_error) == ("close", True, 0.0)

def test_on_the_cpu_device_outputs_without_evidence_must_still_match_their_digests(tiny):
    ga, y = inference(tiny)
    off = with_first(y, float(y.view(-1)[0]) + 2 ** -20)
    without_evidence(ga).built = Gives(off, off)
    r = replay_graph(ga, device="cpu")
    assert (r.status, r.bit_identical) == ("mismatch", False)
    assert r.mismatches[0].startswith("output 0 (user): not bit-identical to the recorded output")


def test_replay_on_another_device_moves_the_graphs_there_and_says_so(tiny, accelerator):
    (r,) = replay(tiny, device="cuda")
    assert (r.status, r.environment, r.bit_identical) == ("close", ON_DEVICE, True)
    assert accelerator.moved == ["cuda"]


def test_an_output_on_another_device_is_brought_to_the_cpu_and_one_there_is_kept():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        elsewhere = torch.empty(2, device="cuda")
        assert elsewhere.device.type == "cuda" and replay_run._cpu(elsewhere).device.type == "cpu"
    here = torch.ones(2)
    assert replay_run._cpu(here) is here and replay_run._cpu(3) == 3


# --- compare_recorded goes on past each output, whatever it found ------------------------------------


def test_every_output_is_compared_past_ones_that_match_or_differ():
    ga = recorded(*[{}] * 6)
    e = Expected(digest=accuracy.digest(T))
    problems, errors, identical = compare_recorded(ga, [3, 3, T.clone(), None, T.clone(), T + 1], [
        Expected(value=3, has_value=True), Expected(value=4, has_value=True), Expected(value=T, has_value=True),
        Expected(value=T, has_value=True), e, e])
    assert problems == ["output 1 (user): 3, recorded 4; int outputs must be equal, here and elsewhere",
                        f"output 3 (user): None, recorded {T!r}",
                        "output 5 (user): not bit-identical to the recorded output"]
    assert errors == [] and identical is False


def test_in_version_2_an_unrecorded_number_is_skipped_and_the_next_output_compared():
    ga = recorded({}, {}, version=2)
    problems, _, identical = compare_recorded(ga, [3, T + 1], [Expected(has_value=True),
                                                               Expected(digest=accuracy.digest(T))])
    assert problems == ["output 1 (user): not bit-identical to the recorded output"] and identical is False


def test_elsewhere_a_zero_evidence_bound_lets_no_error_pass():
    ga = recorded({})
    now = T.clone()
    now[0, 0] = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
    err = float(now[0, 0]) - 1.0
    e = Expected(value=T, has_value=True, evidence=evidence_of(ga, T, bound=0.0))
    problems, errors, _ = compare_recorded(ga, [now], [e], True)
    assert [(x.output, x.max_abs_error, x.elements, x.numel, x.bound) for x in errors] == \
        [("output 0 (user)", err, 4, 4, 0.0)]
    assert problems == [f"output 0 (user): max abs error {err:.3g} over all 4 elements, over the bound 0"]


def test_an_error_within_the_measured_spread_names_its_output_and_counts_all_its_elements():
    ga = recorded({}, {})
    now = T.clone()
    now[1, 1] += 0.25
    e = Expected(value=T, has_value=True, spread=0.125)
    for elsewhere in (False, True):
        _, errors, _ = compare_recorded(ga, [T.clone(), now], [e, e], elsewhere)
        assert [(x.output, x.max_abs_error, x.elements, x.numel, x.bound) for x in errors] == \
            [("output 1 (user)", 0.25, 4, 4, 0.25)]


def test_where_it_was_made_the_sampled_error_is_over_the_outputs_own_count_without_a_recorded_shape():
    ga = recorded({})
    e = Expected(digest=accuracy.digest(T), evidence=evidence_of(ga, T))
    problems, errors, _ = compare_recorded(ga, [T + 0.5], [e])
    assert problems == ["output 0 (user): not bit-identical to the recorded output; max abs error 0.5 over 4 "
                        "sampled elements of 4"]
    assert [(x.elements, x.numel) for x in errors] == [(4, 4)]


def test_a_repeat_of_an_output_past_the_end_is_left_empty():
    rec = io_record([], [{"role": "user", "same_as": 1}, {"role": "user"}])
    assert expand_outputs(rec, [None]) == [None]



# --- replay_graph: what it runs, copies back and times ---------------------------------------------


class Keeps(torch.nn.Module):
    """A graph that keeps a copy of the inputs of each run and gives `outs` (by default its last
    input twice, as the tiny inference graph gives y twice)."""

    def __init__(self, outs=None):
        super().__init__()
        self.seen, self.outs = [], outs

    def forward(self, *inputs):
        self.seen.append([t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        return (inputs[-1], inputs[-1]) if self.outs is None else tuple(o.clone() for o in self.outs)


def test_random_inputs_are_drawn_with_seed_0_unless_told_another(tiny):
    art = load(tiny)
    ga = art.graphs["inference"]
    ga.built = keeps = Keeps()
    replay_graph(ga, inputs="random")
    replay_graph(ga, inputs="random", seed=0)
    replay(art, inputs="random")
    replay(art, inputs="random", seed=5)
    replay_graph(ga, inputs="random", seed=5)
    default, zero, replayed, five, five_again = keeps.seen
    assert all(torch.equal(a, b) for a, b in zip(default, zero, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(default, replayed, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(five, five_again, strict=True))
    assert not torch.equal(default[1], five[1])


def test_a_backwards_random_inputs_take_the_sizes_its_forward_recorded(tmp_path):
    folder, forward = backward_folder(tmp_path)
    rec = records.parse(InputsRecord, json.loads((folder / "inputs.json").read_text()), "backward")
    keeps = Keeps(outs=())
    ga = SimpleNamespace(name="backward", input_file=folder / f"{folder.name}.input", record=rec, module=keeps,
                         upstream=SimpleNamespace(record=forward))
    r = replay_graph(ga, inputs="random", seed=1)
    assert (r.status, r.error) == ("ran", None)
    (inputs,) = keeps.seen
    assert inputs[9] == 6 and set(inputs[0].tolist()) <= {10, 11, 12, 13}  # the forward's size and range
    ga.upstream = None
    with pytest.raises(ArtifactError, match=r"^input 'size' \(int\) is a value the forward graph computes"):
        replay_graph(ga, inputs="random")


def test_the_seconds_are_the_graphs_run_alone(tiny):
    ga = load(tiny).graphs["inference"]
    t0 = time.perf_counter()
    r = replay_graph(ga)
    assert 0 < r.seconds <= time.perf_counter() - t0


def test_mutated_inputs_are_copied_back_and_named(tiny):
    ga, y = inference(tiny)
    ga.built = keeps = Keeps((y, y + 1))
    ga.record.outputs[1] = ga.record.outputs[1].model_copy(update={"role": "mutation", "target": "arg0",
                                                                   "same_as": None})
    r = replay_graph(ga, inputs="random", bench=1)
    assert r.mutated == ["arg0"]
    assert torch.equal(keeps.seen[1][1], y + 1)  # the bench's run saw x as the first run left it


def test_bench_reruns_the_graph_itself(tiny):
    ga, y = inference(tiny)
    ga.built = keeps = Keeps((y, y))
    replay_graph(ga, bench=3)
    assert len(keeps.seen) == 4
    (r,) = replay(load(tiny), bench=2)
    assert r.bench_seconds is not None and r.bench_seconds > 0


def test_a_number_where_a_tensor_was_recorded_has_no_error_figure(tiny):
    ga, _ = inference(tiny)
    ga.built = Gives(7, 7)
    r = replay_graph(ga)
    assert (r.status, r.bit_identical, r.errors, r.max_abs_error) == ("mismatch", False, [], None)


def _sized_by_values(gm):
    """A graph of the tiny inference graph's inputs whose two outputs are [1, n] float32, n read from
    the values (how many elements of x are over 100), checked as the loader checks a graph it builds."""
    from aotpipe.artifact import precheck
    aten = torch.ops.aten
    g = torch.fx.Graph()
    _, x = g.placeholder("p_scale"), g.placeholder("x")
    n = g.call_function(aten._local_scalar_dense.default,
                        (g.call_function(aten.sum.default, (g.call_function(aten.gt.Scalar, (x, 100.0)),)),))
    z = g.call_function(aten.zeros.default, ([1, n],), {"dtype": torch.float32})
    g.output((z, z))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    precheck.check_graph(gm, [torch.ones(4), torch.full((1, 4), 200.0)], "test/graph.json")
    return gm


def test_random_inputs_may_give_other_sizes_where_the_graph_reads_them_from_values(tiny):
    ga = load(tiny).graphs["inference"]
    ga.built = _sized_by_values(ga)
    r = replay_graph(ga, inputs="random")
    assert (r.status, r.mismatches) == ("ran", [])
    out = run_graph(ga.module, get_inputs(ga.input_file))[0]
    assert list(out.shape) == [1, 0]  # N(0, 1) draws: none over 100, though 4 were recorded


# --- the chain of each subgraph, and the eager model's gradients -------------------------------------


def test_the_chain_of_an_artefact_of_forward_backward_and_joint_alone_is_checked(tmp_path):
    c = replay_chain(made_here(tmp_path, ("forward", "backward", "joint")), rebuild_source=False)
    assert (c.status, c.compared, c.problems) == ("match", 2, [])


def as_subgraphs(art, *indices):
    """`art` with its chain's graphs as those of the subgraphs `indices`, as a dynamo artefact with
    several holds them ("forward_1", ...); its inference graph left out."""
    chain = {k: art.graphs.pop(k) for k in ("forward", "backward", "joint")}
    art.graphs.clear()
    for i in indices:
        for kind, ga in chain.items():
            art.graphs[kind if i == 0 else f"{kind}_{i}"] = copy.copy(ga)
    return art


def test_each_subgraphs_chain_is_checked_and_the_eager_model_only_with_one_subgraph(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    c = replay_chain(as_subgraphs(load(tiny_all), 0, 1), trust_code=True)
    assert (c.status, c.compared, c.max_abs_error_vs_joint, c.problems) == ("match", 4, 0.0, [])
    assert (c.max_abs_error_vs_eager, c.eager_within_tolerance) == (None, None)
    c = replay_chain(as_subgraphs(load(tiny_all), 1), trust_code=True)
    assert (c.status, c.compared, c.max_abs_error_vs_eager) == ("match", 2, None)


def test_problems_in_several_subgraphs_are_each_named_by_their_subgraph(tiny_all):
    art = as_subgraphs(load(tiny_all), 0, 1)
    fw, bw = art.graphs["forward"], art.graphs["backward_1"]
    fw_out = run_graph(fw.module, fw.saved_inputs())
    grad = run_graph(bw.module, bw.saved_inputs(forward_outputs=fw_out))[0]
    fw.built = Gives(fw_out[0] + 0.25, *fw_out[1:])
    bw.built = Gives(grad + 0.5, None)
    c = replay_chain(art, rebuild_source=False)
    assert (c.status, c.compared) == ("mismatch", 4)
    assert c.max_abs_error_vs_joint == pytest.approx(0.5, abs=1e-6)
    assert c.problems == ["subgraph 0: forward output 0: differs from the joint graph's (max abs error 0.25)",
                          "subgraph 1: gradient of scale: differs from the joint graph's (max abs error 0.5)"]


def test_a_subgraph_whose_graphs_do_not_run_is_named(tiny_all):
    class Raises(torch.nn.Module):
        def forward(self, *inputs):
            raise RuntimeError("cannot run")

    art = as_subgraphs(load(tiny_all), 0, 1)
    art.graphs["joint_1"].built = Raises()
    c = replay_chain(art, rebuild_source=False)
    assert (c.status, c.problems) == ("error", ["subgraph 1: the graphs do not run: RuntimeError: cannot run"])


def test_an_artefact_with_no_graphs_has_no_chain(tiny_all):
    art = load(tiny_all)
    art.graphs.clear()
    with pytest.raises(ArtifactError, match=r"the chain needs forward, backward and joint graphs; "
                                            r"forward, backward, joint are missing$"):
        replay_chain(art)


@pytest.mark.parametrize("left, said", [
    (["joint_1"], "joint is missing (subgraph 1)"),
    (["forward_1", "joint_1"], "forward, joint are missing (subgraph 1)"),
])
def test_a_chain_only_a_later_subgraph_holds_names_what_that_subgraph_lacks(tiny_all, left, said):
    art = as_subgraphs(load(tiny_all), 1)
    for key in left:
        del art.graphs[key]
    with pytest.raises(ArtifactError, match=f"the chain needs forward, backward and joint graphs; {re.escape(said)}$"):
        replay_chain(art)


def test_with_two_subgraphs_alike_the_first_is_named(tiny_all):
    art = as_subgraphs(load(tiny_all), 0, 1)
    del art.graphs["joint"], art.graphs["joint_1"]
    with pytest.raises(ArtifactError, match=r"joint graphs; joint is missing$"):
        replay_chain(art)


def test_without_rebuilding_the_source_the_eager_model_is_not_compared_even_when_trusted(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    c = replay_chain(tiny_all, rebuild_source=False, trust_code=True)
    assert (c.status, c.max_abs_error_vs_eager, c.eager_within_tolerance) == ("match", None, None)


def test_the_eager_models_gradients_are_those_of_the_loss_the_artefact_records(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    art = load(tiny_all, trust_code=True)
    art.manifest.capture.options["loss"] = "sum"  # the graphs differentiate the weighted loss
    c = replay_chain(art, trust_code=True)
    assert (c.status, c.eager_within_tolerance) == ("mismatch", False)
    assert c.problems[0].startswith("off the eager model: gradient of scale")


def chain_with_gradients(art, grad_of, grads):
    """`art`'s chain whose backward gives `grads` for the primals `grad_of` names."""
    art.graphs["forward"].record.partition.grad_of = grad_of
    art.graphs["backward"].built = Gives(*grads)
    return art


def backward_grad(art):
    fw, bw = art.graphs["forward"], art.graphs["backward"]
    return run_graph(bw.module, bw.saved_inputs(forward_outputs=run_graph(fw.module, fw.saved_inputs())))[0]


def test_the_eager_model_is_compared_past_a_primal_without_a_gradient(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    art = load(tiny_all)
    c = replay_chain(chain_with_gradients(art, [None, "scale"], [None, backward_grad(art) + 0.5]), trust_code=True)
    assert c.eager_within_tolerance is False and c.max_abs_error_vs_eager == pytest.approx(0.5, abs=1e-6)
    assert c.problems[-1].startswith("off the eager model: gradient of scale")


def test_a_gradient_the_eager_model_does_not_have_is_not_compared_with_it(tiny_all, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    art = load(tiny_all)
    c = replay_chain(chain_with_gradients(art, ["scale", "running_mean"], [backward_grad(art), None]),
                     trust_code=True)
    assert (c.status, c.eager_within_tolerance, c.problems) == ("match", True, [])


def test_a_missing_gradient_is_off_the_eager_model_by_an_infinite_error(tiny_all, monkeypatch):
    # as the joint comparison counts a missing output: no finite error figure holds it
    monkeypatch.syspath_prepend(str(TINY.parent))
    art = load(tiny_all)
    c = replay_chain(chain_with_gradients(art, ["scale", None], [None, None]), trust_code=True)
    assert (c.status, c.eager_within_tolerance, c.max_abs_error_vs_eager) == ("mismatch", False, math.inf)
    assert c.problems[-1] == "off the eager model: gradient of scale: the graph gives None, eager gives a value"


def test_a_gradient_beyond_eager_float32s_noise_floor_passes_as_near_float64_as_eager_is(tiny_all, monkeypatch):
    """Eager float32's own gradient is 2d off float64's; the graph's is d off it the other way:
    2d from eager's (beyond the floor), yet as near float64 as eager's own, so within tolerance."""
    art = load(tiny_all)
    g = backward_grad(art)
    d = 1e-3

    class Reference:
        def __init__(self, model, args, kwargs, loss):
            pass

        def run(self, mode, fp64=False):
            grad = (g.double() + d) if fp64 else (g + 2 * d)
            return SimpleNamespace(grads={"scale": grad}) if mode == "training" else None

    monkeypatch.setattr(replay_run, "rebuild_model", lambda art, trust_code: (None, (), {}))
    monkeypatch.setattr(replay_run, "EagerReference", Reference)
    assert not accuracy.compare(g, g + 2 * d).passed  # the floor alone would refuse it
    c = replay_chain(art)
    assert (c.status, c.eager_within_tolerance, c.problems) == ("match", True, [])
    assert c.max_abs_error_vs_eager == pytest.approx(2 * d, rel=1e-3)


def test_replay_imports_module_py_only_when_trusted_and_only_if_it_is_graph_jsons_code(tiny):
    p = tiny / "tiny_inference_0" / "module.py"
    text = p.read_text()
    assert text.count("torch.ops.aten.add.Tensor(relu, 1.0)") == 1
    p.write_text(text.replace("torch.ops.aten.add.Tensor(relu, 1.0)", "torch.ops.aten.add.Tensor(relu, 1.5)"))
    assert reseal(tiny)
    (r,) = replay(tiny)
    assert r.status == "match"  # graph.json's graph: module.py is not read
    with pytest.raises(ArtifactError, match=r"--trust-code imports only a module.py that matches graph.json$"):
        replay(tiny, trust_code=True)
