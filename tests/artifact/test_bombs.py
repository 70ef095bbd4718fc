"""Bombs: a few bytes of an artefact that ask for gigabytes, refused before the allocation.

Each case plants one bomb in a copy of the quickstart's mlp artefact and runs the real CLI on
it in a worker process (tests/helpers/fuzz_worker.py), which reports the exit code, what was
printed and the process's peak RSS. Every bomb must end in exit 2 with the one error line
that names its limit, and must add less than BUDGET_MB to the worker's peak (the worker has
already loaded and replayed a clean artefact, so its peak covers aotpipe's own needs).
Without the limit each of these costs from hundreds of megabytes to tens of gigabytes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import time

import pytest
import torch

from aotpipe.artifact.manifest import seal
from tests.helpers.fuzz_worker import Worker

BUDGET_MB = 120  # what a refused bomb may add to the worker's peak RSS
FIGURES: dict[str, tuple[float, float]] = {}  # bomb: (peak growth MB, seconds), printed at the end


@pytest.fixture(scope="module")
def worker(quickstart_run):
    root, _ = quickstart_run
    w = Worker()
    # A clean replay and show first: the peak then holds torch, aotpipe and a built graph.
    for args in (["replay", root / "mlp"], ["show", root / "mlp"]):
        r = w.run(args)
        assert r.get("rc") == 0, r
    yield w
    w.stop()
    if FIGURES:
        print("\nbomb refusals (peak RSS growth, seconds):")
        for name, (mb, s) in FIGURES.items():
            print(f"  {name:<40} {mb:6.1f} MB {s:6.2f} s")


def refused(worker, name, args, message, env=None, stream="stderr"):
    """Run a command on a bomb: exit 2, `message` in one 'error: ' line, nothing else raised,
    within the memory budget."""
    t0 = time.perf_counter()
    r = worker.run(args, env=env)
    seconds = time.perf_counter() - t0
    assert "died" not in r, r["died"]
    assert r["exception"] is None, r["exception"]
    out = r["stdout"] + r["stderr"]
    assert r["rc"] == 2, out
    assert "Traceback" not in out, out
    lines = [ln for ln in r[stream].splitlines() if message in ln]
    assert len(lines) == 1 and re.search(r"(^error: |: )", lines[0]), out
    if stream == "stderr":
        assert all(ln.startswith("error: ") for ln in r["stderr"].splitlines() if ln.strip()), r["stderr"]
    assert r["case_growth_mb"] < BUDGET_MB, f"{name}: the peak grew by {r['case_growth_mb']:.0f} MB"
    FIGURES[name] = (max(r["case_growth_mb"], 0.0), seconds)
    return r


# --- .input pickles ----------------------------------------------------------------------------


def test_a_9_byte_memo_pickle_is_refused_before_the_memo_grows(worker, mlp_copy):
    # LONG_BINPUT 2**28: the unpickler would grow its memo to 2**29 slots (4.3 GB) first.
    bomb = b"\x80\x04]r\x00\x00\x00\x10."
    assert len(bomb) == 9
    (mlp_copy / "mlp_inference_0" / "mlp_inference_0.input").write_bytes(bomb)
    refused(worker, "9-byte .input (memo index 2**28)",
            ["replay", mlp_copy, "--graph", "inference", "--inputs", "random"],
            "mlp_inference_0.input: pickle memo index 268435456 at byte 3 is out of order (the memo holds 0 entries)")


def test_a_pickle_of_many_small_objects_is_refused_by_its_opcode_count(worker, mlp_copy):
    # EMPTY_LIST is one byte and 64 bytes in memory: 2.2 MB here; 16 GB at the record size limit.
    bomb = b"\x80\x04](" + b"]" * 1_100_000 + b"e."
    (mlp_copy / "mlp_inference_0" / "mlp_inference_0.input").write_bytes(bomb)
    refused(worker, ".input of 1.1 million empty lists",
            ["replay", mlp_copy, "--graph", "inference", "--inputs", "random"],
            "mlp_inference_0.input: more than 1,000,000 pickle opcodes, over the limit of 1,000,000 "
            "(raise it with AOTPIPE_MAX_PICKLE_OPS)")


# --- JSON --------------------------------------------------------------------------------------


def _splice_manifest(folder, key, text):
    m = (folder / "manifest.json").read_text()
    spliced = m.replace('"format_version":', f'"{key}": {text}, "format_version":', 1)
    assert spliced != m
    (folder / "manifest.json").write_text(spliced)


@pytest.mark.parametrize("command", ["ls", "verify", "show"])
def test_a_30_mb_manifest_of_ten_million_values_is_refused_before_parsing(worker, mlp_copy, command):
    _splice_manifest(mlp_copy, "pass_failures", "[" + "{}," * 10_000_000 + "{}]")
    assert (mlp_copy / "manifest.json").stat().st_size > 30_000_000
    message = "manifest.json: more than 2,000,000 JSON values, over the limit of 2,000,000 " \
              "(raise it with AOTPIPE_MAX_JSON_VALUES)"
    target = mlp_copy.parent if command == "ls" else mlp_copy
    refused(worker, f"30 MB manifest: {command}", [command, target], message,
            stream="stdout" if command == "verify" else "stderr")


def test_json_values_are_counted_outside_strings(worker, mlp_copy):
    # A long string full of commas and brackets is one value: the manifest is read, and then
    # refused for the field, not for its size.
    _splice_manifest(mlp_copy, "stray", json.dumps("[{," * 3_000_000))
    r = worker.run(["show", mlp_copy])
    assert r["rc"] == 2 and "JSON values" not in r["stderr"] and "stray" in r["stderr"], r["stderr"]


def test_an_inputs_record_of_too_many_records_is_refused_before_validation(worker, mlp_copy):
    path = mlp_copy / "mlp_inference_0" / "inputs.json"
    rec = json.loads(path.read_text())
    storage = rec["storages"][0]
    text = json.dumps(rec).replace('"storages": [', '"storages": [' + (json.dumps(storage) + ",") * 500_000, 1)
    path.write_text(text)
    refused(worker, "inputs.json of 500,000 storage records", ["show", mlp_copy],
            "inputs.json: more than 2,000,000 JSON values, over the limit of 2,000,000 (raise it with AOTPIPE_MAX_JSON_VALUES)")


def test_validation_stops_at_the_first_bad_record_of_a_long_collection(worker, mlp_copy):
    # 100,000 verification entries with their fields missing: pydantic built an error for each
    # missing field of each (400 MB here; gigabytes and a minute for a million) before the
    # first was reported.
    m = json.loads((mlp_copy / "manifest.json").read_text())
    m["verification"] = {f"g{i}": {} for i in range(100_000)}
    (mlp_copy / "manifest.json").write_bytes(seal(m))
    refused(worker, "manifest of 100,000 bad entries", ["show", mlp_copy],
            "manifest.json: field verification.g0.")


# --- graphs per artefact -----------------------------------------------------------------------


def test_a_manifest_of_too_many_graphs_is_refused_before_any_is_validated(worker, mlp_copy):
    m = json.loads((mlp_copy / "manifest.json").read_text())
    entry = m["graphs"]["inference"]
    for i in range(600):
        m["graphs"][f"inference_{i + 1}"] = entry  # the same folder, built 600 times
    (mlp_copy / "manifest.json").write_bytes(seal(m))
    for command in ("show", "replay"):
        refused(worker, f"manifest of 605 graphs: {command}", [command, mlp_copy],
                "manifest.json: 605 graphs, over the limit of 512 (raise it with AOTPIPE_MAX_GRAPHS)")


def _relu_chain(n):
    nodes = [{"name": "x", "op": "placeholder", "target": "x"}]
    nodes += [{"name": f"r{i}", "op": "call_function", "target": "aten.relu.default",
               "args": [{"node": "x" if i == 0 else f"r{i - 1}"}], "kwargs": {}} for i in range(n)]
    nodes.append({"name": "output", "op": "output", "args": [{"node": f"r{n - 1}"}], "kwargs": {}})
    return {"format_version": 1, "nodes": nodes}


def test_graphs_within_the_node_limit_each_are_refused_together(worker, mlp_copy):
    # Each graph under max_nodes, the artefact over max_artifact_nodes: refused when the graph
    # that crosses it is read, before it is validated or built.
    for kind in ("inference", "forward"):
        (mlp_copy / f"mlp_{kind}_0" / "graph.json").write_text(json.dumps(_relu_chain(700)))
    refused(worker, "two 700-node graphs (limit 1,000 in all)", ["show", mlp_copy],
            "mlp_forward_0/graph.json: 702 nodes after 702 in the artefact's other graphs, over the limit of 1,000 "
            "(raise it with AOTPIPE_MAX_ARTIFACT_NODES)",
            env={"AOTPIPE_MAX_ARTIFACT_NODES": "1000"})


# --- tree walks --------------------------------------------------------------------------------


def _nest(folder, depth):
    """`depth` folders, each inside the last (past PATH_MAX: made through folder descriptors)."""
    fds = [os.open(folder, os.O_RDONLY)]
    for _ in range(depth):
        os.mkdir("n", dir_fd=fds[-1])
        fds.append(os.open("n", os.O_RDONLY, dir_fd=fds[-1]))
    for fd in fds:
        os.close(fd)


def _unnest(folder, depth):
    fds = [os.open(folder, os.O_RDONLY)]
    for _ in range(depth - 1):
        fds.append(os.open("n", os.O_RDONLY, dir_fd=fds[-1]))
    while fds:
        fd = fds.pop()
        os.rmdir("n", dir_fd=fd)
        os.close(fd)


def test_a_tree_nested_1900_deep_is_refused_by_ls_and_verify(worker, mlp_copy):
    d = mlp_copy.parent
    _nest(d, 1900)
    try:
        for command in ("ls", "verify"):
            refused(worker, f"folders nested 1900 deep: {command}", [command, d],
                    "folders nested more than 32 deep under", stream="stderr")
    finally:
        _unnest(d, 1900)


def test_a_tree_of_too_many_files_is_refused_by_ls_and_verify(worker, mlp_copy):
    wide = mlp_copy.parent / "wide"
    wide.mkdir()
    for i in range(1500):
        (wide / f"f{i}").touch()
    for command in ("ls", "verify"):
        refused(worker, f"1,500 files (limit 1,000): {command}", [command, mlp_copy.parent],
                "more than 1,000 files and folders, over the limit of 1,000 (raise it with AOTPIPE_MAX_WALK_ENTRIES)",
                env={"AOTPIPE_MAX_WALK_ENTRIES": "1000"})


def test_ls_sums_sizes_from_one_walk(quickstart_run, tmp_path):
    from aotpipe.corpus.inspect import list_artifacts

    root, _ = quickstart_run
    shutil.copytree(root / "mlp", tmp_path / "a" / "mlp")
    shutil.copytree(root / "mlp", tmp_path / "a" / "mlp" / "nested" / "mlp")  # an artefact inside another
    (tmp_path / "a" / ".tmp-x-1").mkdir()
    shutil.copytree(root / "mlp", tmp_path / "a" / ".tmp-x-1" / "mlp")  # a run in progress: not listed
    rows = {r.path: r for r in list_artifacts(tmp_path / "a")}
    assert sorted(rows) == ["mlp", "mlp/nested/mlp"]
    one = sum(p.stat().st_size for p in (root / "mlp").rglob("*") if p.is_file())
    from aotpipe.pipeline.report import human_size

    assert rows["mlp/nested/mlp"].size == human_size(one) and rows["mlp"].size == human_size(2 * one)


# --- rebuilding the model a manifest names -----------------------------------------------------


def _model_args(folder, **args):
    m = json.loads((folder / "manifest.json").read_text())
    m["model"]["args"].update(args)
    (folder / "manifest.json").write_bytes(seal(m))


def test_a_huge_zoo_argument_is_refused_before_the_builder_runs(worker, mlp_copy):
    _model_args(mlp_copy, depth=10**10)  # mlp's builder makes a list of `depth` sizes first: 80 GB
    refused(worker, "zoo mlp depth=10**10", ["replay", mlp_copy, "--chain"],
            "manifest.json: model args.depth = 10000000000, over the limit of 1,000,000 "
            "(raise it with AOTPIPE_MAX_REBUILD_INT)")


def test_a_zoo_model_of_too_many_modules_stops_at_the_limit(worker, mlp_copy):
    _model_args(mlp_copy, depth=900_000, hidden=1)  # tiny weights, 900,000 layers: minutes and gigabytes
    refused(worker, "zoo mlp of 900,000 layers", ["replay", mlp_copy, "--chain"],
            "manifest.json: a model of more than 10,000 modules, parameters and buffers, over the limit of "
            "10,000 (raise it with AOTPIPE_MAX_MODULES)")


def test_running_out_of_memory_while_parsing_json_is_one_line(monkeypatch):
    # Under a memory cap below what the limits allow (ulimit -v, a container), the parser's
    # MemoryError is a limit breach, not a traceback.
    from aotpipe.errors import LimitError
    from aotpipe.format import limits

    def oom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(limits.json, "loads", oom)
    with pytest.raises(LimitError, match=r"^m\.json: out of memory parsing 2 bytes of JSON; lower the limits "
                                         r"\(AOTPIPE_MAX_JSON_VALUES, AOTPIPE_MAX_RECORD_BYTES\) or raise the memory cap$"):
        limits.parse_json(b"{}", "m.json")


def test_json_values_are_counted_exactly_outside_strings():
    from aotpipe.format.limits import count_json_values

    for text in ['[]', '[1, 2]', '{"a": [ ], "b": {}}', '["a,b\\"[{,", 1, {"x": [2, 3]}]', '[{}, {}, {}]']:
        def values(v):
            return 1 + sum(values(x) for x in (v.values() if isinstance(v, dict) else v)) \
                if isinstance(v, (dict, list)) else 1
        assert count_json_values(text.encode()) == values(json.loads(text)), text
    assert count_json_values(b"[" + b"0," * 100 + b"0]", stop=10) == 11  # stops once past the limit
