"""Chained steps of a train_step graph (aotpipe/replay/steps.py), on a small graph written by
hand: each step is fed the parameters, buffers and state the last one gave, by role and
target; the batch stays. Fast: nothing is captured."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.fx

from aotpipe.errors import ArtifactError
from aotpipe.format import records
from aotpipe.replay.steps import fed_inputs, next_step_inputs, replay_steps, run_steps


class _Step(torch.nn.Module):
    """w <- w - 0.5 * (x * w), m <- m + 1, running <- running * 2; loss = sum(x * w)."""

    def forward(self, w, running, m, x):
        g = x * w
        return (g.sum(), w - 0.5 * g, running * 2, m + 1, g)


def _record(kind: str = "train_step") -> records.InputsRecord:
    lay = {"shape": [3], "stride": [1], "dtype": "float32", "device": "cpu", "storage_offset": 0}
    inputs = [{"index": 0, "name": "w", "role": "param", "target": "w", "type": "tensor", **lay},
              {"index": 1, "name": "running", "role": "buffer", "target": "bn.running", "type": "tensor", **lay},
              {"index": 2, "name": "m", "role": "state", "target": "w:momentum_buffer", "type": "tensor", **lay},
              {"index": 3, "name": "x", "role": "user", "target": "x", "type": "tensor", **lay}]
    outputs = [{"index": 0, "role": "user", "target": "loss"},
               {"index": 1, "role": "param", "target": "w", **lay},
               {"index": 2, "role": "mutation", "target": "bn.running", **lay},
               {"index": 3, "role": "state", "target": "w:momentum_buffer", **lay},
               {"index": 4, "role": "grad", "target": "w", **lay}]
    return records.parse(records.InputsRecord, {"format_version": 4, "kind": kind, "storages": [],
                                                "inputs": inputs, "outputs": outputs}, "test")


def _values():
    return [torch.tensor([1.0, 2.0, 3.0]), torch.ones(3), torch.zeros(3), torch.tensor([1.0, -1.0, 0.5])]


def test_the_next_step_takes_each_new_value_by_role_and_target_and_keeps_the_batch():
    record = _record()
    inputs = _values()
    outs = list(_Step()(*inputs))
    nxt = next_step_inputs(record, inputs, outs)
    assert nxt[0] is outs[1]  # param w <- param w
    assert nxt[1] is outs[2]  # buffer bn.running <- mutation bn.running
    assert nxt[2] is outs[3]  # state <- state
    assert nxt[3] is inputs[3]  # the batch stays
    assert fed_inputs(record) == 3


def test_an_output_of_another_target_feeds_nothing():
    record = _record()
    record.outputs[1].target = "v"  # a parameter the step does not take
    inputs = _values()
    outs = list(_Step()(*inputs))
    nxt = next_step_inputs(record, inputs, outs)
    assert nxt[0] is inputs[0] and fed_inputs(record) == 2


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_chained_runs_are_the_model_applied_again_and_again(steps):
    gm = torch.fx.symbolic_trace(_Step())
    seen = []
    outs = run_steps(gm, _record(), _values(), steps, each=lambda i, o: seen.append((i, float(o[0]))))
    w, running, m, x = _values()
    for _ in range(steps):
        loss, w, running, m, _ = _Step()(w, running, m, x)
    torch.testing.assert_close(outs[1], w)
    torch.testing.assert_close(outs[2], running)
    torch.testing.assert_close(outs[3], torch.full((3,), float(steps)))
    assert [i for i, _ in seen] == list(range(steps)) and seen[-1][1] == pytest.approx(float(loss))


def test_chained_runs_refuse_another_kind_and_a_count_below_one():
    gm = torch.fx.symbolic_trace(_Step())
    with pytest.raises(ArtifactError, match="run a train_step graph, not a forward graph"):
        run_steps(gm, _record("forward"), _values(), 2)
    with pytest.raises(ArtifactError, match="--steps takes 1 or more, not 0"):
        run_steps(gm, _record(), _values(), 0)
    assert len(run_steps(gm, _record(), _values(), 1)) == 5


# ---------------------------------------------------------------------------------------
# replay_steps: what `aotpipe replay --steps N` decides, on an artefact stood in for


def _artefact(digests=None, compared=3, environment=None, saved=True, kind="train_step"):
    from types import SimpleNamespace

    from aotpipe.runtime.determinism import environment as current_environment

    ga = SimpleNamespace(kind=kind, has_saved_values=saved, saved_inputs=_values, input_file=Path("x.input"),
                         module=torch.fx.symbolic_trace(_Step()), record=_record())
    verification = {} if digests is None else {
        "steps": records.VerificationEntry(status="recorded", compared=compared, digests=digests)}
    env = current_environment("cpu") if environment is None else environment
    manifest = SimpleNamespace(verification=verification, environment=env)
    return SimpleNamespace(graphs={kind: ga}, path=Path("art"), manifest=manifest)


def _digests(steps=3):
    from aotpipe.runtime import accuracy

    w, running, m, x = _values()
    for _ in range(steps):
        out = _Step()(w, running, m, x)
        _, w, running, m, _ = out
    return [accuracy.digest(o) for o in out]


def test_the_capture_chain_replayed_matches_and_a_changed_digest_is_named():
    ok = replay_steps(_artefact(_digests()), 3)
    assert (ok.status, ok.steps, ok.compared, ok.differing, ok.ok) == ("match", 3, 5, [], True)
    assert len(ok.losses) == 3 and ok.why is None
    bad = _digests()
    bad[3] = "0" * 64
    out = replay_steps(_artefact(bad), 3)
    assert (out.status, out.steps, out.differing, out.ok) == ("mismatch", 3, ["state w:momentum_buffer"], False)
    assert out.to_json() == {"status": "mismatch", "steps": 3, "losses": out.losses, "compared": 5,
                             "differing": ["state w:momentum_buffer"], "why": None}


def test_a_recorded_output_without_a_digest_is_not_compared():
    digests = _digests()
    digests[0] = None
    assert replay_steps(_artefact(digests), 3).compared == 4


@pytest.mark.parametrize("case,why", [
    ("other count", "the capture chained 3 steps, not 2"),
    ("none recorded", "the capture recorded no chained steps"),
    ("random", "random inputs: nothing recorded to compare with"),
])
def test_nothing_to_compare_with_runs_the_steps_and_says_why(case, why, monkeypatch):
    import aotpipe.replay.steps as steps_module

    drawn = []

    def random_inputs(path, seed):
        drawn.append((path, seed))
        return [v * 2 for v in _values()]

    monkeypatch.setattr(steps_module, "get_inputs", random_inputs)
    art = _artefact(None if case == "none recorded" else _digests(2 if case == "other count" else 3))
    n = 2 if case == "other count" else 3
    out = replay_steps(art, n, inputs="random" if case == "random" else "saved")
    assert (out.status, out.steps, out.why, out.ok) == ("ran", n, why, True)
    assert len(out.losses) == n
    assert drawn == ([(Path("x.input"), 0)] if case == "random" else [])
    saved = replay_steps(_artefact(None), n)  # the saved inputs' losses, which the random ones (doubled) are not
    assert (out.losses == saved.losses) == (case != "random")


def test_random_inputs_are_drawn_with_the_seed_given_and_without_saved_values(monkeypatch):
    import aotpipe.replay.steps as steps_module

    drawn = []
    monkeypatch.setattr(steps_module, "get_inputs", lambda path, seed: drawn.append(seed) or _values())
    out = replay_steps(_artefact(_digests(), saved=False), 3, seed=5)
    assert drawn == [5] and out.why == "random inputs: nothing recorded to compare with"


def test_a_recorded_chain_of_another_length_than_the_outputs_is_not_compared():
    out = replay_steps(_artefact(_digests()[:-1]), 3)
    assert (out.status, out.steps, len(out.losses), out.ok) == ("ran", 3, 3, True) and out.why == "the capture recorded 4 digests for 5 outputs: " \
        "nothing to pair them with"


def test_the_steps_run_at_the_recorded_thread_count_unless_told(monkeypatch):
    import aotpipe.replay.steps as steps_module

    asked = []
    real = steps_module.intra_op_threads
    monkeypatch.setattr(steps_module, "intra_op_threads", lambda n: asked.append(n) or real(n))
    art = _artefact(_digests())
    replay_steps(art, 3)
    replay_steps(art, 3, threads=2)
    assert asked == [art.manifest.environment.threads, 2]


class _VectorLoss(torch.nn.Module):
    def forward(self, w, running, m, x):
        return (x * w, w, running, m, x)


def test_a_loss_that_is_not_one_number_is_not_finite_and_not_ok():
    art = _artefact(None)
    art.graphs["train_step"].module = torch.fx.symbolic_trace(_VectorLoss())
    out = replay_steps(art, 2)
    assert len(out.losses) == 2 and all(math.isnan(x) for x in out.losses) and not out.ok


def test_on_another_machine_differing_bits_are_not_a_mismatch():
    from aotpipe.runtime.determinism import environment as current_environment

    here = current_environment("cpu")
    elsewhere = here.model_copy(update={"threads": here.threads + 7, "torch": "0.0.1"})
    bad = _digests()
    bad[1] = "0" * 64
    out = replay_steps(_artefact(bad, environment=elsewhere), 3, threads=1)
    assert (out.status, out.steps, out.compared, out.ok) == ("ran", 3, 5, True) and out.differing == ["param w"]
    inside = out.why.removeprefix("bits may differ here (").split("):")[0]
    assert out.why.startswith("bits may differ here (") and "thread" in inside and "; " in inside and "XX" not in inside
    assert out.why.endswith("): the capture's are for its own machine")


def test_an_artefact_without_a_train_step_and_a_loss_that_is_not_finite():
    art = _artefact(kind="forward")
    art.graphs["backward"] = art.graphs["forward"]
    with pytest.raises(ArtifactError, match=r"has none \(it has forward, backward\); capture one with graphs: "
                                            r"\[\.\.\., train_step\]"):
        replay_steps(art, 3)
    from aotpipe.replay.steps import StepsReplay

    assert not StepsReplay("match", 2, [1.0, float("nan")]).ok
    assert StepsReplay("ran", 2, [1.0, 2.0]).ok and not StepsReplay("mismatch", 1, [1.0]).ok


def test_outputs_or_inputs_that_do_not_match_the_record_are_refused():
    record = _record()
    outs = list(_Step()(*_values()))
    with pytest.raises(ValueError):
        next_step_inputs(record, _values(), outs[:-1])
    with pytest.raises(ValueError):
        next_step_inputs(record, _values()[:-1], outs)


class _ScaledStep(torch.nn.Module):
    """w <- w - lr * x; loss = sum(w * x)."""

    def forward(self, w, x, lr):
        return ((w * x).sum(), w - lr * x)


def _lr_record() -> records.InputsRecord:
    lay = {"shape": [3], "stride": [1], "dtype": "float32", "device": "cpu", "storage_offset": 0}
    scalar = {"shape": [], "stride": [], "dtype": "float64", "device": "cpu", "storage_offset": 0}
    inputs = [{"index": 0, "name": "w", "role": "param", "target": "w", "type": "tensor", **lay},
              {"index": 1, "name": "x", "role": "user", "target": "x", "type": "tensor", **lay},
              {"index": 2, "name": "lr", "role": "lr", "target": "lr", "type": "tensor", **scalar}]
    outputs = [{"index": 0, "role": "user", "target": "loss"}, {"index": 1, "role": "param", "target": "w", **lay}]
    return records.parse(records.InputsRecord, {"format_version": 4, "kind": "train_step", "storages": [],
                                                "inputs": inputs, "outputs": outputs}, "test")


def test_each_chained_step_is_fed_its_rate_and_without_rates_keeps_the_inputs():
    from aotpipe.replay.steps import takes_lr, with_lr

    record = _lr_record()
    assert takes_lr(record) and not takes_lr(_record())
    w, x, lr = torch.zeros(3), torch.ones(3), torch.tensor(1.0, dtype=torch.float64)
    fed = with_lr(record, [w, x, lr], 0.25)
    assert fed[0] is w and fed[1] is x and fed[2].dtype == torch.float64 and float(fed[2]) == 0.25
    seen: list[float] = []
    out = run_steps(_ScaledStep(), record, [w, x, lr], 3, each=lambda i, o: seen.append(float(o[0])),
                    rates=[0.5, 0.25, 0.125])
    assert torch.equal(out[1], torch.full((3,), -0.875))  # 0.5 + 0.25 + 0.125 taken off
    assert seen == [0.0, -1.5, -2.25]
    kept = run_steps(_ScaledStep(), record, [w, x, lr], 3)  # the input's own rate every step
    assert torch.equal(kept[1], torch.full((3,), -3.0))
    with pytest.raises(ArtifactError, match="3 steps need 3 learning rates, given 2"):
        run_steps(_ScaledStep(), record, [w, x, lr], 3, rates=[0.5, 0.25])
    with pytest.raises(ValueError):  # inputs that do not match the record are not paired up silently
        with_lr(record, [w, x], 0.25)


def _art_with(optimizer: dict | None):
    from types import SimpleNamespace

    extra = {} if optimizer is None else {"optimizer": optimizer}
    return SimpleNamespace(path=Path("a"), manifest=SimpleNamespace(model=SimpleNamespace(model_extra=extra)))


def test_the_rates_of_chained_steps_are_the_schedules_after_the_warm_up():
    from aotpipe.replay.steps import schedule_rates

    stepped = {"name": "sgd", "args": {"lr": 0.1}, "clip_grad_norm": None, "warmup_steps": 2,
               "scheduler": {"name": "step", "args": {"step_size": 1, "gamma": 0.5}}}
    assert schedule_rates(_art_with(stepped), _lr_record(), 3) == pytest.approx([0.025, 0.0125, 0.00625])
    assert schedule_rates(_art_with(stepped), _record(), 3) is None  # a step without a rate input
    unscheduled = {**stepped, "scheduler": None}
    for art in (_art_with(unscheduled), _art_with(None)):
        assert schedule_rates(art, _lr_record(), 1) is None  # one step: its saved rate
        with pytest.raises(ArtifactError) as e:
            schedule_rates(art, _lr_record(), 2)
        assert str(e.value) == ("a: the train_step takes its learning rate per step (role lr), and the manifest "
                                "records no scheduler to compute the next steps' from; run one step (--steps 1), "
                                "or capture it again with optimizer: {..., scheduler: ...}")


def test_replay_feeds_a_scheduled_step_the_schedules_rates():
    from types import SimpleNamespace

    stepped = {"name": "sgd", "args": {"lr": 1.0}, "clip_grad_norm": None, "warmup_steps": 1,
               "scheduler": {"name": "step", "args": {"step_size": 1, "gamma": 0.5}}}
    w, x = torch.zeros(3), torch.ones(3)
    ga = SimpleNamespace(kind="train_step", has_saved_values=True, input_file=Path("x.input"),
                         saved_inputs=lambda: [w, x, torch.tensor(0.5, dtype=torch.float64)],
                         module=torch.fx.symbolic_trace(_ScaledStep()), record=_lr_record())
    from aotpipe.runtime.determinism import environment as current_environment

    manifest = SimpleNamespace(verification={}, environment=current_environment("cpu"),
                               model=SimpleNamespace(model_extra={"optimizer": stepped}))
    out = replay_steps(SimpleNamespace(graphs={"train_step": ga}, path=Path("a"), manifest=manifest), 3)
    # after the warm-up step the rates are 0.5, 0.25, 0.125: w goes 0 -> -0.5 -> -0.75, losses 0, -1.5, -2.25
    assert out.losses == [0.0, -1.5, -2.25] and out.why == "the capture recorded no chained steps"
