"""`aotpipe bench --sizes`: a shape-polymorphic artefact benched at sizes of its dimensions,
through the real CLI, on an mlp captured with a dynamic batch (1..16, example 4).

The recompile column is held both ways: dynamo with the graph's sizes symbolic does not
recompile at a new size in range, and a planted backend that reads every size as a number
(tests/bench/backends.py:specialises_sizes) makes it recompile at each new one, and not at
one it has seen."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
from click.testing import CliRunner

from aotpipe.artifact.load import load
from aotpipe.cli import main
from aotpipe.corpus.bench.sizes import inputs_at, is_symbolic, parse_sizes
from aotpipe.errors import AotpipeError
from tests.bench.test_bench import PLANTED, bench, bench_json

MAX = 16


def _run(tmp_path_factory, name: str, text: str):
    folder = tmp_path_factory.mktemp(name)
    (folder / "p.yaml").write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["run", str(folder / "p.yaml"), "--output", str(folder / "out"), "--no-progress",
                                  "--no-sign"])
    assert r.exit_code == 0, r.output
    return folder / "out"


@pytest.fixture(scope="module")
def dynamic_mlp(tmp_path_factory):
    out = _run(tmp_path_factory, "dyn", f"""\
        version: 1
        name: dyn
        executor: {{kind: local}}
        defaults: {{mode: export, dims: {{batch: {{min: 1, max: {MAX}, example: 4}}}}}}
        models:
          - {{name: mlp, source: "aotpipe.zoo:mlp", inputs: [{{shape: [batch, 32]}}]}}
        """)
    return out / "dyn" / "mlp"


@pytest.fixture(scope="module")
def static_mlp(tmp_path_factory):
    out = _run(tmp_path_factory, "static", """\
        version: 1
        name: static
        executor: {kind: local}
        defaults: {mode: export, graphs: [inference]}
        models:
          - {name: mlp, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32]}]}
        """)
    return out / "static" / "mlp"


@pytest.fixture(scope="module")
def two_dims(tmp_path_factory):
    """A one-layer transformer's inference graph, its batch and sequence both dynamic."""
    out = _run(tmp_path_factory, "two", """\
        version: 1
        name: two
        executor: {kind: local}
        defaults:
          mode: export
          graphs: [inference]
          dims: {batch: {min: 1, max: 16, example: 4}, seq: {min: 2, max: 64, example: 16}}
        models:
          - name: tiny_transformer
            source: aotpipe.zoo:tiny_transformer
            args: {vocab: 100, dim: 16, heads: 2, layers: 1, max_len: 64}
            inputs:
              - {name: input_ids, shape: [batch, seq], dtype: int64, high: 100}
              - {name: attention_mask, shape: [batch, seq], dtype: int64, low: 1, high: 2}
        """)
    return out / "two" / "tiny_transformer"


@pytest.fixture(scope="module")
def unchecked(dynamic_mlp):
    """A batch in range that the capture's size checks did not run at (nor the example)."""
    manifest = json.loads((dynamic_mlp / "manifest.json").read_text())
    checked = {p["sizes"]["batch"] for p in manifest["dims"]["checked"]} | {4}
    return next(b for b in range(MAX - 1, 4, -1) if b not in checked)


def rows(data):
    """{graph: [(sizes, status, compiles, recompiled), ...]} in the order of the points."""
    out: dict[str, list] = {}
    for g in sorted(data["graphs"], key=lambda g: g["point"]):
        out.setdefault(g["graph"], []).append((g["sizes"], g["status"], g["compiles"], g["recompiled"]))
    return out


def test_inputs_at_a_size_take_their_layouts_and_size_inputs_from_the_symbols(dynamic_mlp):
    art = load(dynamic_mlp)
    symbol = json.loads((dynamic_mlp / "manifest.json").read_text())["dims"]["dims"]["batch"]["symbol"]
    inference = art.graphs["inference"]
    [x] = [v for v, r in zip(inputs_at(inference, {symbol: 7}, 0), inference.record.inputs, strict=True)
           if r.role == "user"]
    assert tuple(x.shape) == (7, 32)
    bw = art.graphs["backward"]
    values = inputs_at(bw, {symbol: 7}, 0)
    by_name = {r.name: v for r, v in zip(bw.record.inputs, values, strict=True)}
    assert tuple(by_name["relu"].shape) == (7, 64)  # a saved activation, its batch in the symbol
    assert by_name["sym_size_int"] == 7  # the size input, from its sym_value
    assert by_name["alias"].untyped_storage().data_ptr() == by_name["relu"].untyped_storage().data_ptr()
    # a static graph's inputs are sized in no symbol
    assert all(is_symbolic(g.record) for g in art.graphs.values())


def test_eager_at_three_sizes_one_never_checked_at_capture_passes_every_graph(dynamic_mlp, unchecked):
    r, data = bench_json(str(dynamic_mlp), "--backend", "eager", "--sizes", f"batch=2,{unchecked},{MAX}")
    assert r.exit_code == 0, r.output
    got = rows(data)
    assert set(got) == {"inference", "forward", "backward", "joint"}
    for graph, points in got.items():
        # eager compiles nothing: no compile count, no recompile
        assert points == [({"batch": b}, "pass", None, None) for b in (2, unchecked, MAX)], graph
    assert data["sizes"] == [{"batch": 2}, {"batch": unchecked}, {"batch": MAX}]
    assert all(g["inputs"] == "random" and g["speedup"] for g in data["graphs"])
    assert data["scores"]["all"]["graphs"] == 12  # a graph once per point


def test_aot_eager_compiles_the_backward_once_its_size_input_symbolic_too(dynamic_mlp, unchecked):
    # The backward takes the batch as an int input too: dynamo specialises an int on first sight
    # unless told it is dynamic, and would recompile at the second point.
    r, data = bench_json(str(dynamic_mlp), "--backend", "aot_eager", "--graphs", "backward",
                         "--sizes", f"batch=3,{unchecked},{MAX}")
    assert r.exit_code == 0, r.output
    assert rows(data)["backward"] == [({"batch": 3}, "pass", 1, None), ({"batch": unchecked}, "pass", 0, False),
                                      ({"batch": MAX}, "pass", 0, False)]


def test_inductor_at_three_sizes_passes_and_does_not_recompile_in_range(dynamic_mlp, unchecked):
    r = bench(str(dynamic_mlp), "--backend", "inductor", "--graphs", "inference",
              "--sizes", f"batch=2,{unchecked},{MAX}")
    assert r.exit_code == 0, r.output
    lines = {line.split()[2]: line for line in r.output.splitlines() if line.startswith("mlp inference batch=")}
    assert list(lines) == ["batch=2", f"batch={unchecked}", f"batch={MAX}"], r.output
    assert all(line.split()[3] == "pass" for line in lines.values()), r.output
    assert "compile " in lines["batch=2"] and "recompile" not in lines["batch=2"]
    assert "no recompile" in lines[f"batch={unchecked}"] and "no recompile" in lines[f"batch={MAX}"], r.output


def test_a_backend_that_compiles_static_shapes_is_reported_recompiling_at_each_new_size(dynamic_mlp, tmp_path):
    table = tmp_path / "sizes.csv"
    r, data = bench_json(str(dynamic_mlp), "--backend", f"{PLANTED}:specialises_sizes", "--graphs", "inference",
                         "--sizes", "batch=2,7,16,7", "--csv", str(table))
    assert r.exit_code == 0, r.output
    assert rows(data)["inference"] == [({"batch": 2}, "pass", 1, None), ({"batch": 7}, "pass", 1, True),
                                       ({"batch": 16}, "pass", 1, True), ({"batch": 7}, "pass", 0, False)]
    written = list(csv.DictReader(table.read_text().splitlines()))
    assert [(w["sizes"], w["compiles"], w["recompiled"]) for w in written] == [
        ("batch=2", "1", ""), ("batch=7", "1", "yes"), ("batch=16", "1", "yes"), ("batch=7", "0", "no")]


def test_two_dimensions_equal_at_the_first_point_by_chance_do_not_recompile_where_they_differ(two_dims):
    # batch 8 and seq 8: dynamo's duck shaping would give both one symbol, guard that they are
    # equal, and recompile at batch 7 seq 33. The lists are zipped into two points.
    r, data = bench_json(str(two_dims), "--backend", "aot_eager", "--sizes", "batch=8,7", "--sizes", "seq=8,33")
    assert r.exit_code == 0, r.output
    assert rows(data)["inference"] == [({"batch": 8, "seq": 8}, "pass", 1, None),
                                       ({"batch": 7, "seq": 33}, "pass", 0, False)]


def test_a_dimension_left_out_stays_at_its_example_and_one_another_artefact_lacks_is_noted(two_dims, dynamic_mlp):
    r, data = bench_json(str(two_dims), str(dynamic_mlp), "--backend", "eager", "--graphs", "inference",
                         "--sizes", "seq=3,40")
    assert r.exit_code == 0, r.output
    assert [g["sizes"] for g in data["graphs"] if g["artifact"] == "tiny_transformer"] == [
        {"batch": 4, "seq": 3}, {"batch": 4, "seq": 40}]
    # mlp has no seq: benched once, at its example batch
    assert [g["sizes"] for g in data["graphs"] if g["artifact"] == "mlp"] == [{"batch": 4}]
    assert "--sizes: mlp has no dimension seq: benched at the sizes of the others" in data["notes"]


def test_a_backend_that_fails_to_compile_fails_the_first_point_and_the_others_are_not_run(dynamic_mlp):
    r, data = bench_json(str(dynamic_mlp), "--backend", f"{PLANTED}:fails_to_compile", "--graphs", "inference",
                         "--sizes", "batch=2,7")
    assert r.exit_code == 1, r.output
    first, second = sorted(data["graphs"], key=lambda g: g["point"])
    assert first["status"] == "compile_error" and "no lowering for this graph" in first["reason"]
    assert second["status"] == "compile_error" and second["reason"].startswith(
        "not run: the compile failed at the first point (")


def test_the_max_of_the_range_is_benched_and_one_past_it_refused_naming_the_range(dynamic_mlp):
    r = bench(str(dynamic_mlp), "--backend", "eager", "--graphs", "inference", "--sizes", f"batch={MAX + 1}")
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: --sizes batch={MAX + 1}: outside mlp's recorded range for batch, 1..{MAX}; "
                                "bench sizes in that range (the graphs hold only there)")
    below = bench(str(dynamic_mlp), "--backend", "eager", "--graphs", "inference", "--sizes", "batch=0")
    assert below.exit_code == 2 and f"outside mlp's recorded range for batch, 1..{MAX}" in below.output
    ok, data = bench_json(str(dynamic_mlp), "--backend", "eager", "--graphs", "inference", "--sizes", f"batch={MAX}")
    assert ok.exit_code == 0, ok.output
    assert rows(data)["inference"] == [({"batch": MAX}, "pass", None, None)]


def test_a_static_artefact_is_refused_in_one_line(static_mlp):
    r = bench(str(static_mlp), "--backend", "eager", "--sizes", "batch=2,3")
    assert r.exit_code == 2
    assert r.output.strip() == ("error: mlp: --sizes needs a shape-polymorphic artefact, and this one has no dynamic "
                                "dimension (captured at static sizes); bench it without --sizes, or capture it again "
                                "with dims: in the pipeline")
    assert not is_symbolic(load(static_mlp).graphs["inference"].record)


def test_a_dimension_the_artefact_does_not_have_is_refused_listing_its_own(dynamic_mlp):
    r = bench(str(dynamic_mlp), "--backend", "eager", "--sizes", "seq=8")
    assert r.exit_code == 2
    assert r.output.strip() == "error: --sizes seq: mlp has no dimension 'seq'; its dimensions are batch"


def test_sizes_with_a_baseline_is_refused_before_anything_runs(dynamic_mlp, tmp_path):
    r = bench(str(dynamic_mlp), "--backend", "eager", "--sizes", "batch=2", "--write-baseline", str(tmp_path / "b.csv"))
    assert r.exit_code == 2 and r.output.startswith("error: --write-baseline does not go with --sizes"), r.output
    assert not (tmp_path / "b.csv").exists()


def test_several_dimensions_are_zipped_into_points():
    assert parse_sizes(["batch=1,7", "seq=8,33"]) == [{"batch": 1, "seq": 8}, {"batch": 7, "seq": 33}]
    assert parse_sizes([]) == []


@pytest.mark.parametrize("given, message", [
    (["batch=1,7,64", "seq=8,33"], "--sizes: the dimensions' lists are zipped into points, so they must be of one "
                                   "length (given: batch 3, seq 2); give each dimension one size per point"),
    (["batch"], "--sizes 'batch': write NAME=SIZE,SIZE,... (a dimension of the artefact's dims, e.g. "
                "--sizes batch=1,7,16)"),
    (["batch=1,x"], "--sizes 'batch=1,x': '1,x' is not a comma-separated list of whole numbers"),
    (["batch=1", "batch=2"], "--sizes batch: given twice; give each dimension once, its sizes comma-separated"),
    (["batch=-1"], "--sizes 'batch=-1': a size is a whole number of 0 or more"),
])
def test_a_malformed_sizes_option_is_refused_in_one_line(given, message):
    with pytest.raises(AotpipeError) as e:
        parse_sizes(given)
    assert str(e.value) == message
