"""Bad input never gives a traceback: generated and mutated pipelines through validate and run.

Each pipeline either succeeds, or exits 2 with one line per problem naming the file (and
the line, when the problem is in the file's content); `run` may also exit 1 when a model
fails while tracing, with the failure recorded in run.json.
"""

import json
import re
import tempfile
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotpipe.cli import main

SETTINGS = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE = textwrap.dedent("""\
    version: 1
    name: fz
    seed: 3
    defaults: {graphs: [inference], save_inputs: false, verify: false}
    models:
      - name: m1
        source: tests.fuzzmodels:any_shape
        args: {scale: 1.5}
        inputs:
          - {shape: [2, 3], dtype: float32}
          - {name: ids, shape: [4], dtype: int64, high: 9}
""")

junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=6),
                 st.lists(st.integers(-2, 4), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def maybe(good, bad=junk, one_in=25):
    """Mostly `good`, now and then `bad`: so that enough whole pipelines stay valid."""
    return st.integers(0, one_in - 1).flatmap(lambda i: bad if i == one_in - 1 else good)


def mostly(good: list, bad: list, one_in=12):
    return st.integers(0, one_in - 1).flatmap(lambda i: st.sampled_from(bad if i == one_in - 1 else good))


shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3)
dtypes = mostly(["float32", "float16", "int64", "int8", "bool", "bfloat16", "uint8"], ["flaot", "complex64", "f32"])
inputs = st.fixed_dictionaries(
    {"shape": maybe(shapes)},
    optional={"dtype": maybe(dtypes), "name": maybe(st.sampled_from(["a", "b", "ids"])),
              "low": maybe(st.integers(-2, 2)), "high": maybe(st.integers(3, 5))},
)
sources = mostly(["tests.fuzzmodels:any_shape"],
                 ["tests.fuzzmodels:nope", "nomodule_zz:x", "hf:NopeModel", "no-colon", "aotpipe.zoo:mlp", ":x"])
graphs = st.lists(mostly(["inference"] * 6 + ["forward", "backward", "joint"], ["jointt", "loss"]), max_size=2)
models = st.fixed_dictionaries(
    {"name": mostly(["m1", "m2"], ["m 3", "../x", "ü", ""]), "source": maybe(sources),
     "inputs": maybe(st.lists(inputs, max_size=2))},
    optional={"args": maybe(st.fixed_dictionaries({}, optional={"scale": st.floats(0.5, 2)})),
              "graphs": maybe(graphs), "save_inputs": maybe(st.booleans()), "verify": maybe(st.booleans()),
              "passes": maybe(st.just([]), st.lists(st.sampled_from(["freeze", "x"]), min_size=1, max_size=1)),
              "mode": maybe(st.just("export"))},
)
pipelines = st.fixed_dictionaries(
    {"version": maybe(st.just(1)), "name": mostly(["fz"], ["a/b", "", "ü"]),
     "models": maybe(st.lists(models, min_size=1, max_size=2))},
    optional={"seed": maybe(st.integers(0, 9)), "output": maybe(st.just("out")),
              "executor": maybe(st.fixed_dictionaries({}, optional={"kind": maybe(st.sampled_from(["local", "process"])),
                                                                   "workers": maybe(st.integers(0, 3))})),
              "defaults": maybe(st.fixed_dictionaries(
                  {"graphs": maybe(graphs)}, optional={"save_inputs": st.booleans(), "verify": st.just(False)})),
              },
)


@st.composite
def with_stray_keys(draw, base):
    """Now and then an unknown key, or a config: on a non-hf model, somewhere in the pipeline."""
    d = draw(base)
    if draw(st.integers(0, 9)) == 9:  # hypothesis favours small numbers: 9 is the rare case
        models = d.get("models") if isinstance(d.get("models"), list) else []
        targets = [d] + [m for m in models if isinstance(m, dict)]
        target = draw(st.sampled_from(targets))
        target[draw(st.sampled_from(["colour", "config", "modle", "inputs_"]))] = draw(junk)
    return d


@st.composite
def mutated_texts(draw):
    text = BASE
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "dupline", "swapchar"]))
        if op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif op == "insert":
            text = text[:i] + draw(st.text(alphabet=":-[]{}#&*!|>'\"\n\t %@`,?0aZ~", min_size=1, max_size=4)) + text[i:]
        elif op == "dupline":
            lines = text.splitlines(keepends=True)
            j = draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[j])
            text = "".join(lines)
        elif i + 1 < len(text):
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
    return text


generated = with_stray_keys(pipelines).map(lambda d: yaml.safe_dump(d, sort_keys=False))
texts = st.one_of(generated, generated, mutated_texts())

LINE = re.compile(r"^error: (?P<file>.+?\.yaml)(?::(?P<line>\d+))?: .+")


def _check_errors(output: str, path: Path) -> None:
    assert "Traceback" not in output
    lines = [ln for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert errors, output
    for ln in errors:
        m = LINE.match(ln)
        assert m and m.group("file") == str(path), ln


counts = {"validate": 0, "run": 0}


@SETTINGS
@given(texts)
def test_validate_never_tracebacks(text):
    counts["validate"] += 1
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.yaml"
        p.write_text(text)
        r = CliRunner().invoke(main, ["validate", str(p)])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        assert r.exit_code in (0, 2), r.output
        if r.exit_code == 2:
            _check_errors(r.output, p)
        else:
            assert r.output.startswith("ok: ")


# `run` costs a capture per pipeline: the main suite runs 100 of them, the slow suite 500.
@settings(SETTINGS, max_examples=100)
@given(texts)
def test_run_never_tracebacks(text):
    counts["run"] += 1
    _run_never_tracebacks(text)


@pytest.mark.slow
@SETTINGS
@given(texts)
def test_run_never_tracebacks_over_500_pipelines(text):
    _run_never_tracebacks(text)


def _run_never_tracebacks(text):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.yaml"
        p.write_text(text)
        out = Path(d) / "out"
        # In this process: each run would pay a worker's torch import otherwise; what is
        # fuzzed is the YAML and the job, not the executor (tests/executors covers it).
        r = CliRunner().invoke(main, ["run", str(p), "-o", str(out), "--no-progress", "--executor", "local"])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        assert r.exit_code in (0, 1, 2), r.output
        if r.exit_code == 2:
            _check_errors(r.output, p)
            assert not out.exists() or not any(out.rglob("manifest.json"))
        else:
            (run_json,) = out.glob("*/run.json")
            run = json.loads(run_json.read_text())
            assert run["ok"] == (r.exit_code == 0)
            for m in run["models"]:
                assert m["status"] == "ok" or m["error"], m
                # The fuzz model runs on any shape and dtype: a failure that is not a
                # one-line aotpipe error is an internal exception, not the model's.
                assert m["exception"] is None, (m["stage"], m["error"], m["exception"])


def test_at_least_500_pipelines_were_validated_and_100_run():
    # Runs after the properties (pytest keeps file order).
    assert counts["validate"] >= 500 and counts["run"] >= 100, counts
