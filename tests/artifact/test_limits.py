"""Limits: every hostile size, depth, node count or file type is one line (exit 2), checked
before anything is read or allocated."""

import json
import os
import pickle
import re
import shutil
import threading
import time

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.cli import main
from aotpipe.errors import AotpipeError, ArtifactError, LimitError
from aotpipe.format import limits
from aotpipe.format.limits import Breach
from aotpipe.replay import get_inputs, replay
from aotpipe.trust.verify import verify_artifact


@pytest.fixture()
def no_allocation(monkeypatch):
    """Fails the test if get_inputs gets as far as drawing a storage (wherever replay's
    modules bound random_storage)."""
    import sys

    import aotpipe.replay  # noqa: F401

    def refuse(*a, **k):
        raise AssertionError("allocated before checking the limit")

    for name, module in list(sys.modules.items()):
        if name.startswith("aotpipe.") and hasattr(module, "random_storage"):
            monkeypatch.setattr(module, "random_storage", refuse)


def cli(*args, timeout=60):
    """Run the CLI in-process on a daemon thread: a hang fails the test instead of stalling it."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", CliRunner().invoke(main, list(map(str, args)))),
                         daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"aotpipe {' '.join(map(str, args))} hung"
    return out["r"]


def one_line_exit_2(r, *needles):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    for n in needles:
        assert n in r.output, (n, r.output)


# --- bytes per tensor and per replay ---------------------------------------------------------


@pytest.mark.parametrize("n", [600_000_000, 10**12])
def test_get_inputs_refuses_a_bare_input_file_asking_for_too_much(tmp_path, no_allocation, n):
    p = tmp_path / "g.input"
    p.write_bytes(pickle.dumps([(torch.Tensor, torch.Size([n]), (1,), torch.float32, torch.device("cpu"))]))
    assert len(p.read_bytes()) < 200
    with pytest.raises(LimitError) as e:
        get_inputs(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and f"float32[{n}]" in msg and "over the limit of 2.15 GB" in msg
    assert "AOTPIPE_MAX_BYTES" in msg and "\n" not in msg


def test_inputs_json_declaring_a_huge_storage_is_refused_before_allocating(mlp_copy, no_allocation):
    path = mlp_copy / "mlp_forward_0" / "inputs.json"
    rec = json.loads(path.read_text())
    rec["storages"][0]["numel"] = 750_000_000  # 3 GB of float32 from a 3 KB file
    path.write_text(json.dumps(rec))
    with pytest.raises(LimitError, match=r"inputs.json: its inputs: storage 0: float32\[750000000\] needs 3 GB"):
        replay(mlp_copy, graphs=["forward"], inputs="random")
    with pytest.raises(LimitError):
        replay(mlp_copy, graphs=["forward"])  # saved inputs: checked before reading the blobs
    one_line_exit_2(cli("replay", mlp_copy, "--graph", "forward", "--inputs", "random"), "over the limit")


def test_max_bytes_option_and_environment_set_the_limit(mlp_copy, monkeypatch):
    one_line_exit_2(cli("replay", mlp_copy, "--inputs", "random", "--max-bytes", "1k"), "over the limit of 1.02 kB")
    one_line_exit_2(cli("replay", mlp_copy, "--max-bytes", "lots"), "--max-bytes: 'lots' is not a byte count")
    monkeypatch.setenv("AOTPIPE_MAX_BYTES", "1KiB")
    assert limits.current().max_bytes == 1024
    one_line_exit_2(cli("replay", mlp_copy, "--inputs", "random"), "AOTPIPE_MAX_BYTES")
    assert cli("replay", mlp_copy, "--inputs", "random", "--max-bytes", "1G").exit_code == 0
    monkeypatch.setenv("AOTPIPE_MAX_BYTES", "-3")
    with pytest.raises(AotpipeError, match="AOTPIPE_MAX_BYTES"):
        limits.current()


def test_malformed_records_make_one_error_not_a_runtime_error(mlp_copy):
    path = mlp_copy / "mlp_forward_0" / "inputs.json"
    rec = json.loads(path.read_text())
    rec["inputs"][0]["storage_offset"] = 10**9  # a view far outside its storage
    path.write_text(json.dumps(rec))
    with pytest.raises(ArtifactError, match="cannot make inputs"):
        get_inputs(mlp_copy / "mlp_forward_0")


def test_a_constant_laid_out_beyond_its_blob_is_refused(quickstart_run, tmp_path):
    root, _ = quickstart_run
    folder = tmp_path / "small_cnn"
    shutil.copytree(root / "small_cnn", folder)
    gj = next(folder.glob("small_cnn_inference_0.*")) / "graph.json"
    data = json.loads(gj.read_text())
    const = next(n for n in data["nodes"] if n["op"] == "get_attr" and len(n["shape"]) == 4)
    const["stride"] = [10**11, 1, 1, 1]  # empty_strided would have allocated 4e11 elements
    gj.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="not a dense layout"):
        aotpipe.load(folder)


# --- graph nodes ---------------------------------------------------------------------------


def _chain_graph(n):
    nodes = [{"name": "x", "op": "placeholder", "target": "x"}]
    nodes += [{"name": f"r{i}", "op": "call_function", "target": "aten.relu.default",
               "args": [{"node": "x" if i == 0 else f"r{i - 1}"}], "kwargs": {}} for i in range(n)]
    nodes.append({"name": "output", "op": "output", "args": [{"node": f"r{n - 1}"}], "kwargs": {}})
    return {"format_version": 1, "nodes": nodes}


def test_graph_over_the_node_limit_is_refused_before_building(mlp_copy, monkeypatch):
    (mlp_copy / "mlp_inference_0" / "graph.json").write_text(json.dumps(_chain_graph(150)))
    monkeypatch.setenv("AOTPIPE_MAX_NODES", "100")
    with pytest.raises(LimitError, match=r"graph.json: 15\d nodes, over the limit of 100 \(raise it with AOTPIPE_MAX_NODES"):
        aotpipe.load(mlp_copy)
    one_line_exit_2(cli("show", mlp_copy), "AOTPIPE_MAX_NODES")
    one_line_exit_2(cli("replay", mlp_copy), "AOTPIPE_MAX_NODES")


def test_a_million_node_graph_is_refused_before_parsing(mlp_copy):
    node = b'{"name": "x", "op": "placeholder", "target": "x"},'
    (mlp_copy / "mlp_inference_0" / "graph.json").write_bytes(
        b'{"format_version": 1, "nodes": [' + node * 1_000_000 + b'{"name": "o", "op": "output", "args": []}]}')
    t0 = time.perf_counter()
    one_line_exit_2(cli("show", mlp_copy), "1,000,001 nodes, over the limit of 200,000")
    assert time.perf_counter() - t0 < 10


# --- JSON size and depth ----------------------------------------------------------------------


def _deep_manifest(folder, depth):
    m = (folder / "manifest.json").read_text()
    deep = re.sub(r'("format_version": \d+)', lambda g: g.group(1) + ', "x": ' + "[" * depth + "]" * depth, m, count=1)
    assert deep != m
    (folder / "manifest.json").write_text(deep)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_manifest_is_one_line_everywhere(mlp_copy, depth):
    _deep_manifest(mlp_copy, depth)
    with pytest.raises(LimitError, match="JSON nested more than 64 levels deep"):
        aotpipe.load(mlp_copy)
    problems = verify_artifact(mlp_copy)
    assert len(problems) == 1 and isinstance(problems[0], Breach)
    r = cli("verify", mlp_copy)
    assert r.exit_code == 2 and "nested more than 64 levels" in r.output and "Traceback" not in r.output
    for cmd in (["show", mlp_copy], ["replay", mlp_copy]):
        one_line_exit_2(cli(*cmd), "manifest.json: JSON nested more than 64 levels deep")
    r = cli("ls", mlp_copy.parent)
    assert r.exit_code == 2 and "mlp  refused" in r.output and "nested more than 64" in r.output


def test_a_9_gb_sparse_manifest_is_refused_by_its_size(mlp_copy):
    with open(mlp_copy / "manifest.json", "r+b") as f:
        f.truncate(9 * 10**9)
    for cmd in (["show", mlp_copy], ["replay", mlp_copy]):
        one_line_exit_2(cli(*cmd), "manifest.json: 9 GB on disk, over the limit of 268 MB")
    r = cli("verify", mlp_copy)
    assert r.exit_code == 2 and "9 GB on disk" in r.output
    r = cli("ls", mlp_copy.parent)
    assert r.exit_code == 2 and "refused" in r.output


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo"])
def test_manifest_that_is_not_a_regular_file_neither_hangs_nor_eats_memory(mlp_copy, kind):
    m = mlp_copy / "manifest.json"
    m.unlink()
    if kind == "fifo":
        os.mkfifo(m)
    else:
        os.symlink("/dev/zero", m)
    for cmd in (["show", mlp_copy], ["replay", mlp_copy]):
        one_line_exit_2(cli(*cmd), "manifest.json: not a regular file")
    r = cli("verify", mlp_copy)
    assert r.exit_code == 1 and "not a regular file" in r.output
    r = cli("ls", mlp_copy.parent)
    assert r.exit_code == 2 and "refused" in r.output and "not a regular file" in r.output


def test_json_limit_helpers():
    assert limits.parse_bytes("8G", "x") == 8 << 30 and limits.parse_bytes("1e9", "x") == 10**9
    assert limits.parse_bytes("512 MiB", "x") == 512 << 20 and limits.parse_bytes("100", "x") == 100
    with limits.override(max_json_depth=3):
        limits.parse_json(b'{"a": [[1]]}', "f")
        with pytest.raises(LimitError):
            limits.parse_json(b'{"a": [[[1]]]}', "f")
    with pytest.raises(ArtifactError, match="not UTF-8"):
        limits.parse_json(b'{"a": "\xff"}', "f")


def _depth(v):
    return 1 + max((_depth(c) for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))),
                   default=0)


def test_json_depth_is_counted_from_the_text_as_the_parsed_value_nests():
    import json
    import random

    rng = random.Random(0)
    tricky = ['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '[{"', 'é]', '\u005b', '\n']

    def value(d):
        r = rng.random()
        if d > 9 or r < 0.3:
            return rng.choice([1, -2.5, None, True, "".join(rng.choices(tricky, k=rng.randint(0, 6)))])
        if r < 0.65:
            return [value(d + 1) for _ in range(rng.randint(0, 3))]
        return {"".join(rng.choices(tricky, k=rng.randint(0, 4))) + str(i): value(d + 1) for i in range(rng.randint(0, 3))}

    seen = set()
    for _ in range(400):
        v = [value(0)] if rng.random() < 0.5 else {"k": value(0)}
        text = json.dumps(v, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        depth = _depth(json.loads(text))
        seen.add(depth)
        assert not limits.json_deeper_than(text, depth) and limits.json_deeper_than(text, depth - 1), text
    assert len(seen) >= 8  # shallow and deep values both drawn


# --- pipeline YAML ---------------------------------------------------------------------------

BOMB = "version: 1\nname: b\n" + "".join(
    f"{k}: &{k} [{', '.join([prev] * 9)}]\n" for k, prev in zip("abcdefghi", ['"lol"'] + [f"*{c}" for c in "abcdefgh"]))


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)
    assert len(BOMB) < 450  # 9^9 values once expanded
    t0 = time.perf_counter()
    r = cli("validate", p)
    assert time.perf_counter() - t0 < 2
    one_line_exit_2(r, f"{p}: its aliases expand to more than 100,000 values", "AOTPIPE_MAX_YAML_VALUES")


def test_non_utf8_yaml_names_the_file_and_line(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("version: 1\nname: caf\u00e9\n".encode("latin-1"))
    one_line_exit_2(cli("validate", p), f"{p}:2: not UTF-8 text: byte 0xe9 at column 10")


def test_yaml_from_a_device_is_bounded(tmp_path):
    one_line_exit_2(cli("validate", "/dev/zero"), "/dev/zero: more than 16.8 MB", "AOTPIPE_MAX_YAML_BYTES")


@pytest.mark.parametrize("target,args,kwargs", [
    ("aten.full.default", [[750_000_000], 1.0], {"dtype": {"dtype": "float32"}}),
    ("aten.empty_strided.default", [[2, 2], [10**12, 1]], {}),
    ("aten.slice_backward.default", [{"node": "x"}, [10**6, 10**6], 0, 0, 1, 1], {}),
])
def test_a_factory_op_of_a_huge_literal_size_is_refused_at_load(mlp_copy, target, args, kwargs):
    path = mlp_copy / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    x = next(n["name"] for n in data["nodes"] if n["op"] == "placeholder")
    args = json.loads(json.dumps(args).replace('"x"', json.dumps(x)))
    data["nodes"].insert(len(data["nodes"]) - 1, {"name": "big", "op": "call_function", "target": target,
                                                  "args": args, "kwargs": kwargs})
    path.write_text(json.dumps(data))
    with pytest.raises(LimitError, match="node 'big': .* needs .* over the limit of 2.15 GB"):
        aotpipe.load(mlp_copy)
