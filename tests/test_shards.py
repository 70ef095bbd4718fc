"""--shard I/N: every shard computes the same balanced partition on its own."""


import pytest

from aotpipe.artifact.manifest import versions
from aotpipe.errors import AotpipeError
from aotpipe.format.records import ExecutorRecord, ModelRun, RunRecord, RunSummary
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.report import dump_run
from aotpipe.pipeline.shards import Shard, costs, estimate, parse_shard, partition, previous_times, shard_models

PIPELINE = """
version: 1
name: sharded
executor: {kind: local}
defaults: {mode: export, graphs: [inference], passes: []}
models:
""" + "".join(f"  - {{name: m{i}, source: 'aotpipe.zoo:mlp', args: {{in_features: {8 * (i % 5 + 1)}, "
              f"hidden: {16 * (i % 3 + 1)}, depth: {1 + i % 4}}}, inputs: [{{shape: [2, {8 * (i % 5 + 1)}]}}]}}\n"
              for i in range(23))


def specs():
    return parse_pipeline(PIPELINE, check_sources=False).models


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 23, 30])
def test_the_shards_cover_every_model_exactly_once(n):
    models = specs()
    shares = [shard_models(models, Shard(i, n)) for i in range(1, n + 1)]
    names = [m.name for share in shares for m in share]
    assert sorted(names) == sorted(m.name for m in models)
    assert len(names) == len(set(names))


def test_each_shard_keeps_pipeline_order():
    models = specs()
    order = {m.name: i for i, m in enumerate(models)}
    for i in range(1, 5):
        share = [order[m.name] for m in shard_models(models, Shard(i, 4))]
        assert share == sorted(share)


def _write_times(path, times):
    """A real run.json (its record) whose models took `times` seconds."""
    models = [ModelRun(name=k, status="ok", total_seconds=v) for k, v in times.items()]
    record = RunRecord(format_version=1, pipeline="sharded", versions=versions(), seconds=1.0,
                       executor=ExecutorRecord(kind="local", workers=1), ok=True,
                       summary=RunSummary(models=len(models), ok=len(models), up_to_date=0, failed=0, graphs=0,
                                          bytes=0), models=models)
    path.write_text(dump_run(record))
    assert previous_times(path) == times  # the balance can read it


def test_the_partition_balances_by_the_times_file(tmp_path):
    # One model takes as long as all the others together: with 2 shards it runs alone.
    models = specs()
    times = {m.name: 1.0 for m in models}
    times["m5"] = 22.0
    f = tmp_path / "run.json"
    _write_times(f, times)
    shares = [[m.name for m in shard_models(models, Shard(i, 2), f)] for i in (1, 2)]
    assert ["m5"] in shares
    loads = sorted(sum(times[n] for n in s) for s in shares)
    assert loads == [22.0, 22.0]


def test_the_partition_does_not_read_the_shards_own_output(tmp_path, monkeypatch):
    """Two machines whose earlier local runs timed different models still agree: the
    partition reads only the pipeline and the times file given to every shard alike."""
    models = specs()
    a = [[m.name for m in shard_models(models, Shard(i, 3))] for i in (1, 2, 3)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "artifacts" / "sharded").mkdir(parents=True)
    _write_times(tmp_path / "artifacts" / "sharded" / "run.json", {"m0": 1000.0})
    b = [[m.name for m in shard_models(models, Shard(i, 3))] for i in (1, 2, 3)]
    assert a == b


def test_models_the_times_file_lacks_are_costed_by_the_scaled_estimate():
    models = specs()
    guesses = [estimate(m) for m in models]
    times = {models[0].name: guesses[0] * 10, models[1].name: guesses[1] * 10}  # 10 s per unit
    c = costs(models, times)
    assert c[5] == pytest.approx(guesses[5] * 10)
    assert c[0] == times[models[0].name]


def test_equal_costs_break_ties_by_pipeline_order():
    assert partition(["a", "b", "c", "d"], [1.0, 1.0, 1.0, 1.0], 2) == [[0, 2], [1, 3]]
    assert partition(["a", "b", "c"], [1.0, 5.0, 1.0], 2) == [[1], [0, 2]]


@pytest.mark.parametrize("text,fragment", [
    ("3/2", "between 1 and the shard count"), ("0/4", "between 1 and the shard count"),
    ("1-4", "expected I/N"), ("a/b", "expected I/N"), ("1/0", "between 1 and the shard count"),
])
def test_a_bad_shard_is_one_line_saying_what_would_do(text, fragment):
    with pytest.raises(AotpipeError, match=fragment) as e:
        parse_shard(text)
    assert "\n" not in str(e.value) and "--shard 1/" in str(e.value)


def test_an_unreadable_times_file_is_a_user_error(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    with pytest.raises(AotpipeError, match=r"--shard-times .*run\.json: cannot read it as a run\.json"):
        shard_models(specs(), Shard(1, 2), bad)
    with pytest.raises(AotpipeError, match=r"absent\.json: cannot read it as a run\.json \(.*absent\.json: missing\)"):
        shard_models(specs(), Shard(1, 2), tmp_path / "absent.json")


def test_the_cli_refuses_a_bad_shard_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from aotpipe.cli import main

    p = tmp_path / "p.yaml"
    p.write_text(PIPELINE)
    r = CliRunner().invoke(main, ["run", str(p), "--shard", "5/4", "-o", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert r.output.strip() == "error: --shard '5/4': the shard index must be between 1 and the shard count " \
                               "(got 5 of 4); e.g. --shard 1/4"
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
    r = CliRunner().invoke(main, ["run", str(p), "--shard-times", str(p), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "give --shard I/N with it" in r.output


# ---------------------------------------------------------------------------------------
# boundaries: the shard index at 1 and N (and N+1 refused), the estimate's keys, the times file


@pytest.mark.parametrize("text,shard", [("1/1", Shard(1, 1)), ("4/4", Shard(4, 4)), ("1/4", Shard(1, 4)),
                                        (" 2 / 3 ", Shard(2, 3)), ("10/12", Shard(10, 12))])
def test_a_shard_index_from_1_to_the_count_is_taken(text, shard):
    assert parse_shard(text) == shard and str(shard) == f"{shard.index}/{shard.count}"


@pytest.mark.parametrize("text,message", [
    ("0/1", "(got 0 of 1); e.g. --shard 1/1"), ("2/1", "(got 2 of 1); e.g. --shard 1/1"),
    ("5/4", "(got 5 of 4); e.g. --shard 1/4"), ("0/0", "(got 0 of 0); e.g. --shard 1/1"),
    ("1/0", "(got 1 of 0); e.g. --shard 1/1")])
def test_a_shard_index_just_outside_is_refused_with_an_example_that_fits(text, message):
    with pytest.raises(AotpipeError) as e:
        parse_shard(text)
    assert str(e.value) == f"--shard {text!r}: the shard index must be between 1 and the shard count {message}"


@pytest.mark.parametrize("text", ["", "1/4x", "1//4", "-1/4", "1/-4", "1.5/4"])
def test_anything_but_i_slash_n_is_refused_naming_the_form(text):
    with pytest.raises(AotpipeError) as e:
        parse_shard(text)
    assert str(e.value) == f"--shard {text!r}: expected I/N, e.g. --shard 1/4 (shard 1 of 4)"


@pytest.mark.parametrize("n", [1, 3, 23])
def test_the_first_and_the_last_shard_are_the_partitions_first_and_last(n):
    models = specs()
    parts = partition([m.name for m in models], costs(models, {}), n)
    assert [m.name for m in shard_models(models, Shard(1, n))] == [models[i].name for i in parts[0]]
    assert [m.name for m in shard_models(models, Shard(n, n))] == [models[i].name for i in parts[n - 1]]
    assert shard_models(models, Shard(1, 1)) == models


def test_more_shards_than_models_leaves_the_last_ones_empty():
    assert partition(["a", "b"], [1.0, 2.0], 4) == [[1], [0], [], []]


def spec_with(args=None, config=None, graphs=None, shapes=((2, 8),)):
    base = specs()[0]
    inputs = [base.inputs[0].model_copy(update={"shape": list(s)}) for s in shapes]
    return base.model_copy(update={"args": args or {}, "config": config, "graphs": graphs or ["inference"],
                                   "inputs": inputs})


def test_the_estimate_reads_depth_and_width_from_args_or_config():
    import math

    plain = spec_with()
    assert estimate(plain) == pytest.approx(2 * math.sqrt(64) * math.log2(2 + 16))
    assert estimate(spec_with({"num_layers": 6})) == pytest.approx(3 * estimate(plain))
    assert estimate(spec_with(config={"n_layer": 6})) == pytest.approx(3 * estimate(plain))
    assert estimate(spec_with({"hidden_size": 256})) == pytest.approx(2 * estimate(plain))
    assert estimate(spec_with({"encoder_layers": 2, "decoder_layers": 4})) == pytest.approx(3 * estimate(plain))
    assert estimate(spec_with({"decoder_layers": 4})) == pytest.approx(2 * estimate(plain))
    # the first depth key present wins; args over config
    assert estimate(spec_with({"num_hidden_layers": 4, "depth": 8})) == pytest.approx(2 * estimate(plain))
    assert estimate(spec_with({"depth": 4}, config={"depth": 8})) == pytest.approx(2 * estimate(plain))
    assert estimate(spec_with(graphs=["inference", "forward", "backward"])) == pytest.approx(3 * estimate(plain))
    assert estimate(spec_with(shapes=((2, 8), (4,)))) == pytest.approx(
        2 * math.sqrt(64) * math.log2(2 + 20))
    assert estimate(spec_with(shapes=((),))) == pytest.approx(2 * math.sqrt(64) * math.log2(3))


@pytest.mark.parametrize("value", [0, -3, True, "12", None, 0.0])
def test_a_depth_or_width_that_is_not_a_positive_number_is_not_read(value):
    plain = estimate(spec_with())
    assert estimate(spec_with({"num_layers": value})) == pytest.approx(plain)
    assert estimate(spec_with({"hidden_size": value})) == pytest.approx(plain)


def test_a_positive_fractional_depth_is_read():
    assert estimate(spec_with({"num_layers": 0.5})) == pytest.approx(estimate(spec_with()) / 4)


def test_the_scale_is_the_median_ratio_of_time_to_estimate():
    models = specs()[:5]
    g = [estimate(m) for m in models]
    times = {models[0].name: g[0] * 1, models[1].name: g[1] * 2, models[2].name: g[2] * 9}
    assert costs(models, times)[3:] == [pytest.approx(g[3] * 2), pytest.approx(g[4] * 2)]
    times[models[3].name] = g[3] * 4  # an even count: the upper middle
    assert costs(models, times)[4] == pytest.approx(g[4] * 4)
    assert costs(models, {})[4] == pytest.approx(g[4])  # no times: 1 s per unit


def test_the_times_file_counts_only_models_that_ran_with_a_time(tmp_path):
    models = [ModelRun(name="ran", status="ok", total_seconds=3.0),
              ModelRun(name="failed", status="failed", total_seconds=1.5),
              ModelRun(name="kept", status="ok", total_seconds=0.2, skipped=True),
              ModelRun(name="untimed", status="ok", total_seconds=0.0)]
    record = RunRecord(format_version=2, pipeline="sharded", versions=versions(), seconds=1.0,
                       executor=ExecutorRecord(kind="local", workers=1), ok=True,
                       summary=RunSummary(models=4, ok=3, up_to_date=1, failed=1, graphs=0, bytes=0), models=models)
    path = tmp_path / "run.json"
    path.write_text(dump_run(record))
    assert previous_times(path) == {"ran": 3.0, "failed": 1.5}
    assert previous_times(tmp_path / "absent.json") == {}
    path.write_text("{")
    assert previous_times(path) == {}


def test_a_times_file_changes_the_partition_it_balances(tmp_path):
    models = specs()[:4]
    without = [[m.name for m in shard_models(models, Shard(i, 2))] for i in (1, 2)]
    f = tmp_path / "run.json"
    _write_times(f, {models[0].name: 100.0, models[1].name: 1.0, models[2].name: 1.0, models[3].name: 1.0})
    with_times = [[m.name for m in shard_models(models, Shard(i, 2), f)] for i in (1, 2)]
    assert with_times == [[models[0].name], [m.name for m in models[1:]]] and with_times != without


def test_a_model_whose_estimate_is_below_one_still_scales_the_others():
    models = [spec_with({"num_layers": 0.001}), spec_with(), spec_with({"num_layers": 4})]
    models = [m.model_copy(update={"name": n}) for m, n in zip(models, ("tiny", "plain", "deep"))]
    g = [estimate(m) for m in models]
    assert g[0] < 1 < g[1]
    c = costs(models, {"tiny": g[0] * 3, "plain": g[1] * 3})
    assert c[2] == pytest.approx(g[2] * 3)
    c = costs(models, {"tiny": g[0] * 5})
    assert c[1:] == [pytest.approx(g[1] * 5), pytest.approx(g[2] * 5)]


def test_a_times_file_that_cannot_be_read_is_named_with_what_to_do(tmp_path):
    with pytest.raises(AotpipeError) as e:
        shard_models(specs(), Shard(1, 2), tmp_path / "absent.json")
    assert str(e.value) == (f"--shard-times {tmp_path / 'absent.json'}: cannot read it as a run.json "
                            f"({tmp_path / 'absent.json'}: missing); give the run.json of an earlier run, or leave "
                            "the option out")


def test_a_times_file_the_disk_cannot_read_says_the_systems_reason(tmp_path, monkeypatch):
    import aotpipe.pipeline.shards as shards

    def unreadable(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(shards, "read_run_json", unreadable)
    with pytest.raises(AotpipeError, match=r"cannot read it as a run\.json \(Input/output error\); give the run"):
        shard_models(specs(), Shard(1, 2), tmp_path / "run.json")
    monkeypatch.setattr(shards, "read_run_json", lambda path: (_ for _ in ()).throw(OSError("no reason\nmore")))
    with pytest.raises(AotpipeError, match=r"cannot read it as a run\.json \(no reason\); give the run"):
        shard_models(specs(), Shard(1, 2), tmp_path / "run.json")
