"""The one table of capture modes (modes.CAPTURE_MODES): the YAML, the fingerprint, the
config's rules and every stage of a model's job read it; no place decides a mode by name."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import get_args

import pytest

from aotpipe.errors import CaptureError, ConfigError, SourceError
from aotpipe.format.vocabulary import STAGES as RESULT_STAGES
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.job import STAGES, run_model
from aotpipe.spec import Mode, modes

ONE_MODEL = textwrap.dedent("""
    version: 1
    name: t
    models:
      - {name: mlp, source: aotpipe.zoo:mlp, args: {in_features: 4, hidden: 8, depth: 1},
         inputs: [{shape: [2, 4]}], mode: export, graphs: [inference]}
""")


def planted_capture(model, args, kwargs, **kw):
    raise CaptureError(f"planted capture ran with {sorted(kw)}")


def capture_seeing_the_collector(model, args, kwargs, **kw):
    import gc

    raise CaptureError(f"the collector's thresholds: {gc.get_threshold()}")


def planted_build(spec, base_dir):
    raise SourceError(f"planted builder ran for {spec.name}")


@pytest.fixture()
def export_entry(monkeypatch):
    """Replace the table's export entry with fields of the test's choosing."""
    def replace(**fields):
        entry = dataclasses.replace(modes.CAPTURE_MODES["export"], **fields)
        monkeypatch.setitem(modes.CAPTURE_MODES, "export", entry)
        return entry
    return replace


def test_the_yaml_accepts_exactly_the_modes_of_the_table():
    assert get_args(Mode) == tuple(modes.CAPTURE_MODES) == modes.MODES


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        modes.capture_options("jit")
    assert str(e.value) == "unknown capture mode 'jit'; use one of: export, dynamo, meta, auto"


def test_a_mode_without_values_refuses_passes_whatever_its_name(export_entry):
    text = ONE_MODEL.replace("graphs: [inference]}", "graphs: [inference], passes: [freeze]}")
    parse_pipeline(text, "p.yaml", check_sources=False)  # export has values: passes are fine
    export_entry(values=False)
    with pytest.raises(ConfigError) as e:
        parse_pipeline(text, "p.yaml", check_sources=False)
    assert "models[0].passes" in str(e.value) and "mode export captures shapes only" in str(e.value)


def test_the_job_captures_with_the_function_the_table_names(tmp_path, export_entry):
    export_entry(capture=f"{__name__}:planted_capture")
    (spec,) = parse_pipeline(ONE_MODEL, "p.yaml").models
    r = run_model(spec, tmp_path)
    assert (r.status, r.stage) == ("failed", "capture")
    # export differentiates the `loss:` setting: the table says so, and the job passes it
    assert r.error.startswith("planted capture ran with ['graphs', 'input_names', 'int_ranges', 'loss', 'name']")


def test_a_job_runs_with_the_collector_paced_and_gives_the_callers_pacing_back(tmp_path, export_entry):
    import gc

    from aotpipe.pipeline import job

    export_entry(capture=f"{__name__}:capture_seeing_the_collector")
    (spec,) = parse_pipeline(ONE_MODEL, "p.yaml").models
    was = gc.get_threshold()
    gc.set_threshold(123, 4, 5)
    try:
        r = run_model(spec, tmp_path)
        assert gc.get_threshold() == (123, 4, 5)  # a failed job too
    finally:
        gc.set_threshold(*was)
    assert r.error.startswith(f"the collector's thresholds: {job.JOB_GC_THRESHOLDS};"), r.error
    assert job.JOB_GC_THRESHOLDS[0] > 700 * 10  # far from the defaults' full collections (see job.py)


def test_a_mode_without_loss_is_not_given_one(tmp_path, export_entry):
    export_entry(capture=f"{__name__}:planted_capture", takes_loss=False)
    (spec,) = parse_pipeline(ONE_MODEL, "p.yaml").models
    r = run_model(spec, tmp_path)
    assert r.error.startswith("planted capture ran with ['graphs', 'input_names', 'int_ranges', 'name']")


def test_the_job_builds_the_model_as_the_table_says(tmp_path, export_entry):
    export_entry(build=f"{__name__}:planted_build")
    (spec,) = parse_pipeline(ONE_MODEL, "p.yaml").models
    r = run_model(spec, tmp_path)
    assert (r.status, r.stage, r.error) == ("failed", "source", "planted builder ran for mlp")


@pytest.mark.slow  # a real capture and write: several seconds on 2 busy cores
def test_a_failing_check_stops_the_model_at_stage_verify(tmp_path, monkeypatch):
    from aotpipe.checks import written

    def planted_check(*args, **kwargs):
        raise RuntimeError("planted check failure")

    monkeypatch.setattr(written, "check_written", planted_check)
    (spec,) = parse_pipeline(ONE_MODEL, "p.yaml").models
    r = run_model(spec, tmp_path)
    assert (r.status, r.stage) == ("failed", "verify") and "planted check failure" in r.error
    assert not (tmp_path / "mlp").exists()  # a folder that failed its checks is not renamed into place


def test_every_stage_of_the_job_is_a_stage_a_result_can_name():
    names = [name for name, _, _ in STAGES]
    assert names == ["source", "capture", "passes", "write"]
    assert set(names) | {"verify"} <= set(RESULT_STAGES)


def test_every_command_runs_with_the_collector_paced_and_gives_the_callers_pacing_back(monkeypatch, tmp_path):
    # replay, bench, report and ops build graphs by the thousand, as a job does; each command
    # goes through the same wrapper (cli._user_errors), seen here through `validate`.
    import gc

    from click.testing import CliRunner

    from aotpipe import cli
    from aotpipe.errors import AotpipeError
    from aotpipe.pipeline import job

    seen = []

    def load(path):
        seen.append(gc.get_threshold())
        raise AotpipeError("planted: stop here")

    monkeypatch.setattr(cli, "load_pipeline", load)
    was = gc.get_threshold()
    gc.set_threshold(123, 4, 5)
    try:
        r = CliRunner().invoke(cli.main, ["validate", str(tmp_path / "p.yaml")])
        assert gc.get_threshold() == (123, 4, 5)  # given back, after an error too
    finally:
        gc.set_threshold(*was)
    assert (r.exit_code, r.output.strip()) == (2, "error: planted: stop here")
    assert seen == [job.JOB_GC_THRESHOLDS]


def _record_call(model, args, kwargs, **keywords):
    return {"model": model, "args": args, "kwargs": kwargs, **keywords}


def test_a_capture_request_reaches_the_modes_function_with_what_the_mode_takes():
    from aotpipe.spec.modes import CaptureMode, CaptureRequest

    request = CaptureRequest("M", (1,), {"k": 2}, name="m", graphs=("forward", "backward"), input_names=("x",),
                             int_ranges={"x": (0, 5)}, loss="mean")
    takes = CaptureMode("t", f"{__name__}:_record_call", dict, "takes loss")
    call = takes.capture_graphs(request)
    assert call == {"model": "M", "args": (1,), "kwargs": {"k": 2}, "name": "m", "graphs": ["forward", "backward"],
                    "input_names": ["x"], "int_ranges": {"x": (0, 5)}, "loss": "mean"}
    assert "loss" not in CaptureMode("n", f"{__name__}:_record_call", dict, "no loss", takes_loss=False
                                     ).capture_graphs(request)
    first = CaptureMode("a", f"{__name__}:_record_call", dict, "tries export first", tries_first="export")
    assert first.capture_graphs(request)["export"] is modes.CAPTURE_MODES["export"].function()
