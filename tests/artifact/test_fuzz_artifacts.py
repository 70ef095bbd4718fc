"""Fuzzing artefacts: every mutation of a real artefact ends in a result or one-line errors,
and every mutation that changes what the artefact means is detected.

Each case copies one of three small real artefacts (an MLP, a batch-norm model with a
mutated buffer, a CNN: every graph kind and an optimised graph each), all signed with an
Ed25519 key, mutates the copy the way a careless user or an attacker could, and runs one
`aotpipe` command on it in a worker process (tests/helpers/fuzz_worker.py).

The mutations come from one table, MUTATIONS: a class each (graph.json, inputs.json,
trace.json, manifest.json, the .input pickles, hostile payloads in a pickle or a graph, the
blobs, the files themselves), with the commands that reach what it changes and what it
expects. A forger then may reseal the copy (file digests and the manifest's checksum made
to fit, tests/helpers/forge.py), so that the content checks, not the sha256 filter, are
what stand between a payload and its execution.

The oracle (`judge`) fails a case that
- crashes or hangs the worker, lets an exception or a traceback out, prints anything but
  one-line errors, changes torch's global state, or grows the worker's peak RSS past the
  byte limit;
- runs a payload (the marker file a payload would create exists afterwards);
- changes the artefact's meaning (its files, compared as parsed JSON, bytes or file types,
  with digests and checksums left out) and is accepted with exit 0 while `verify --key`
  with the public key reports nothing: a tamper accepted and not reported;
- of a class that expects "refused", is accepted with exit 0 at all.
It counts, per class: refused (exit 1 or 2), accepted and reported (exit 0, and the
detector reported the change), accepted with the meaning unchanged, and failures; the
table is printed at the end.

Five classes aim at what untrusted artefacts must never do. "hostile op args" gives an op
that indexes memory with values (pool, embedding and norm backward, views and strides,
segment_reduce unsafe, denied ops) inconsistent arguments and replays it in the sandbox,
as users do (AOTPIPE_NO_SANDBOX unset): refused before any kernel (exit 2), or the
sandbox's one line for a crash (exit 1), never corrupted canary tensors. "literal sizes"
and "referenced outputs" ask for gigabytes under the worker's byte limit, replayed in the
worker's own process: refused with exit 2 before the allocation (the case adds under
BUDGET_MB to the peak RSS). "public key files" writes the verifier's Ed25519 public key in
every public encoding and signs a changed artefact with HMAC keyed by those bytes: `verify
--key` (hmac:, ed25519: or plain) must never say ok. "escape sequences" puts control
characters and Cyrillic look-alikes in folder, model and graph names: nothing printed holds
a raw control character, and a damaged twin never prints as ok or verified.

To teach the fuzzer a new class, add a Mutation to MUTATIONS: a function that mutates the
copy and returns what it did, the commands to run, the expected outcome, and the class's
own oracle if it has one.

AOTPIPE_FUZZ_EXAMPLES sets the number of cases of the slow run (default 1500; CI runs the
default); the main suite runs FAST_CASES cases of each class.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotpipe.artifact import input_meta
from tests.helpers.forge import reseal
from tests.helpers.fuzz_worker import Worker

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("AOTPIPE_FUZZ_EXAMPLES", "1500"))
FAST_CASES = int(os.environ.get("AOTPIPE_FUZZ_FAST", "1"))  # per mutation class and forgery, in the main suite
LOG = os.environ.get("AOTPIPE_FUZZ_LOG")  # a file to append one line per case to
LIMIT_MB = 64  # the worker's byte limit (AOTPIPE_MAX_BYTES); nodes and record sizes are lowered too
SLACK_MB = 192  # what a worker's peak RSS may grow by besides, over a worker's life (caches)
CASE_TIMEOUT_S = 60
RESTART_EVERY = 1000
MARKER = "PAYLOAD-RAN"  # what every payload would create, in the case's folder

PIPELINE = """\
version: 1
name: fz
defaults:
  graphs: [inference, forward, backward, joint]
  passes: [freeze, fold_conv_bn, channels_last, reinplace]
models:
  - name: mlp
    source: aotpipe.zoo:mlp
    args: {in_features: 4, hidden: 8, depth: 1}
    inputs: [{shape: [2, 4], dtype: float32}]
  - name: running_norm
    source: aotpipe.zoo:running_norm
    args: {features: 4}
    inputs: [{shape: [2, 4]}]
  - name: small_cnn
    source: aotpipe.zoo:small_cnn
    args: {channels: 4}
    inputs: [{shape: [1, 3, 8, 8], dtype: float32}]
"""
MODELS = ("mlp", "mlp", "running_norm", "running_norm", "small_cnn")  # the CNN's graphs are the slowest


@dataclass
class Bases:
    root: Path  # the model folders, signed
    public_key: Path
    models: tuple[str, ...]  # to draw from (a name twice: drawn twice as often)


def _signed(d: Path, root: Path, models: tuple[str, ...]) -> Bases:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from aotpipe.trust.verify import sign_artifact

    private = ed25519.Ed25519PrivateKey.generate()
    (d / "key.pem").write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    (d / "key.pub").write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    for name in set(models):
        sign_artifact(root / name, d / "key.pem")
    return Bases(root, d / "key.pub", models)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Three small models captured for the fuzzer (every graph kind, an optimised graph each)."""
    from click.testing import CliRunner

    from aotpipe.cli import main

    d = tmp_path_factory.mktemp("fuzzbase")
    (d / "p.yaml").write_text(PIPELINE)
    r = CliRunner().invoke(main, ["run", str(d / "p.yaml"), "-o", str(d / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    return _signed(d, d / "out" / "fz", MODELS)


@pytest.fixture(scope="module")
def quick_bases(quickstart_run, tmp_path_factory):
    """For the main suite's few cases: copies of the quickstart's MLP and batch-norm model
    (captured once per session for other tests anyway)."""
    root, _ = quickstart_run
    d = tmp_path_factory.mktemp("fuzzquick")
    for name in ("mlp", "running_norm"):
        shutil.copytree(root / name, d / "models" / name)
    return _signed(d, d / "models", ("mlp", "running_norm"))


@pytest.fixture(scope="module")
def worker():
    w = Worker(env={"AOTPIPE_MAX_BYTES": f"{LIMIT_MB}M", "AOTPIPE_MAX_NODES": "2000",
                    "AOTPIPE_MAX_RECORD_BYTES": "4M"}, timeout_s=CASE_TIMEOUT_S, restart_every=RESTART_EVERY)
    yield w
    w.stop()


# ---------------------------------------------------------------------------------------
# What a mutation puts in a record

OPS = [
    "aten.relu.default", "aten.neg.default", "aten.addmm.default", "aten.view.default", "aten.as_strided.default",
    "aten.empty.memory_format", "aten.full.default", "aten.index.Tensor", "aten.index_put.default",
    "aten.gather.default", "aten.scatter.src", "aten.embedding.default", "aten.slice.Tensor",
    "aten.expand.default", "aten.cat.default", "aten.copy_.default", "aten._unsafe_view.default",
    "aten.native_batch_norm.default", "aten.convolution.default", "aten.bernoulli.p", "aten.randn.default",
    "aten.resize_.default", "prims.resize.default", "aten._copy_from_and_resize.default",
    "aten._sparse_coo_tensor_with_dims_and_tensors.default", "aten.to_dense.default", "aten.set_.source_Storage",
    "aten.manual_seed.default", "aten.set_grad_enabled.default", "aten._nested_tensor_from_tensor_list.default",
    "aten.from_file.default", "aten.save.default", "aten._local_scalar_dense.default", "aten.masked_scatter.default",
    "operator.getitem", "builtins.eval", "os.system", "torch.load", "aten.relu", "aten..default", "",
]
NAMES = ["import", "None", "self", "__class__", "__init__", "forward", "x.y", "a b", "1a", "relu", "addmm",
         "output", "getattr", "graph", "code", "training", "_const_0", "ü", "x" * 300]
BIG = [2**31, 2**32 + 1, 2**40, 2**62, 2**63, 2**64, 10**12, 10**18, -1, -(2**31), 7.5e8, 1e308]


def _deep(n: int):
    v: object = 0
    for _ in range(n):
        v = [v]
    return v


DEEP = "<nested 100000 deep>"  # spliced into the JSON text (Python's encoder cannot nest so deep)

hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.sampled_from(BIG),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(OPS), st.sampled_from(NAMES),
    st.sampled_from(["float32", "float64", "int64", "bool", "qint8", "bits8", "complex128", "float8_e4m3fn",
                     "cpu", "meta", "cuda:0", "cuda:99", "load", "tensor", "int", "forward", "ones", "blob",
                     "full", "none", "../../x", "/dev/zero", "a" * 64, "0" * 64]),
    st.sampled_from([{"node": "relu"}, {"node": "nope"}, {"tuple": [1, 2]}, {"dtype": "float64"},
                     {"dtype": "qint8"}, {"device": "meta"}, {"device": "cuda:7"}, {"layout": "sparse_coo"},
                     {"memory_format": "channels_last"}, {"slice": [0, 2**62, 1]}, {"float": "nan"},
                     {"complex": [1, 2]}, {"tuple": {"node": "x"}}, {}, {"a": 1, "b": 2}]),
    st.lists(st.sampled_from([0, 1, 2, 8, -1, 2**31, 10**9]), max_size=6),
    st.sampled_from([_deep(60), DEEP]),
    st.text(max_size=12),
)


def _paths(data, prefix=()):
    """Every (path, value) of a JSON document, for choosing what to mutate."""
    out = [(prefix, data)]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, prefix + (i,))
    return out


def _set(data, path, value):
    if not path:
        return value
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return data


def _delete(data, path):
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    del parent[path[-1]]
    return data


@st.composite
def json_edit(draw, data):
    """One edit of a JSON document: a value replaced (by a hostile one, or by another value
    of the same document), a key or element removed or repeated, a stray key added."""
    paths = _paths(data)
    path, value = paths[draw(st.integers(0, len(paths) - 1))]
    action = draw(st.sampled_from(["replace", "replace", "replace", "swap", "delete", "repeat", "stray"]))
    if action == "replace" or (not path and action != "stray"):
        return _set(data, path, draw(hostile))
    if action == "swap":
        other = paths[draw(st.integers(0, len(paths) - 1))][1]
        return _set(data, path, json.loads(json.dumps(other)))
    if action == "delete":
        return _delete(data, path)
    if action == "repeat":
        if isinstance(value, list):
            # Past the worker's node and record-size limits, not past the fuzzer's memory.
            times = draw(st.sampled_from([2, 50, 2500]))
            return _set(data, path, (value * times)[:6000])
        return _set(data, path, [value, value])
    target = value if isinstance(value, dict) else data if isinstance(data, dict) else None
    if target is not None:
        target[draw(st.sampled_from(["extra", "__proto__", "blob", "recompute", "value", "base"]))] = draw(hostile)
    return data


def _write(path: Path, data: bytes | str) -> None:
    """Write a file of the case's copy; the copy is hard links to the base artefact, so the
    link is broken first (the base stays as it was for the next case)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _graph_folders(model: Path) -> list[Path]:
    return sorted(p for p in model.iterdir() if p.is_dir() and p.name != "blobs")


# ---------------------------------------------------------------------------------------
# The mutation classes


def _edit_json(draw, model: Path, marker: Path, which: str) -> str:
    g = draw(st.sampled_from(_graph_folders(model)))
    path = model / "manifest.json" if which == "manifest" else g / f"{which}.json"
    data = json.loads(path.read_text())
    if which == "graph" and draw(st.booleans()):
        # Aim at the nodes: most of what a graph says is there.
        nodes = data["nodes"]
        i = draw(st.integers(0, len(nodes) - 1))
        nodes[i] = draw(json_edit(nodes[i]))
    else:
        data = draw(json_edit(data))
    text = json.dumps(data, allow_nan=True)
    _write(path, text.replace(json.dumps(DEEP), "[" * 100_000 + "0" + "]" * 100_000))
    return f"{path.relative_to(model)} edited"


def _input_file(draw, model: Path) -> Path:
    g = draw(st.sampled_from(_graph_folders(model)))
    return g / f"{g.name}.input"


def _pickle_meta(draw, model: Path, marker: Path) -> str:
    """A well-formed .input whose sizes or strides are hostile (a shape of 10**12...)."""
    path = _input_file(draw, model)
    meta = input_meta.read(path)
    flat = [e for grp in meta for e in grp] if meta and isinstance(meta[0], list) else meta
    if flat:
        j = draw(st.integers(0, len(flat) - 1))
        e = list(flat[j])
        if len(e) == 5:
            e[draw(st.integers(1, 2))] = draw(st.sampled_from([[6 * 10**8], [10**12], [2**62, 2**62], [-1], [0], [3] * 70]))
        flat[j] = tuple(e)
    try:
        raw = input_meta.dumps(flat)
    except Exception:
        raw = path.read_bytes()
    _write(path, raw)
    return f"{path.relative_to(model)} meta"


def _pickle_bytes(draw, model: Path, marker: Path) -> str:
    path = _input_file(draw, model)
    raw = path.read_bytes()
    how = draw(st.sampled_from(["flip", "truncate", "memo", "many"]))
    if how == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "memo":  # a memo index that would grow the unpickler's memo to gigabytes
        raw = b"\x80\x04]r" + draw(st.sampled_from([2**28, 2**31, 2**32 - 1])).to_bytes(4, "little") + b"."
    else:  # objects by the million, one byte each
        raw = b"\x80\x04](" + b"]" * draw(st.sampled_from([10, 1_100_000])) + b"e."
    _write(path, raw)
    return f"{path.relative_to(model)} {how}"


class _Call:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _pickle_payload(draw, model: Path, marker: Path) -> str:
    """A .input that calls something that creates the marker, written with opcodes the format
    allows (so the opcode check passes it and the restricted unpickler must refuse it)."""
    import subprocess

    path = _input_file(draw, model)
    m = str(marker)
    payload = draw(st.sampled_from([_Call(os.system, f"touch {m}"), _Call(exec, f"open({m!r}, 'w').close()"),
                                    _Call(subprocess.call, ["touch", m]), _Call(open, m, "w"),
                                    _Call(eval, f"open({m!r}, 'w').close()")]))
    meta = input_meta.read(path)
    flat = [e for grp in meta for e in grp] if meta and isinstance(meta[0], list) else meta
    where = draw(st.sampled_from(["alone", "entry", "field"]))
    if where == "alone" or not flat:
        obj = payload
    elif where == "entry":
        obj = flat[:1] + [payload] + flat[1:]
    else:
        e = list(flat[0])
        e[-1] = payload
        obj = [tuple(e)] + flat[1:]
    _write(path, pickle_dumps(obj, draw(st.sampled_from([2, 4, 5]))))
    return f"{path.relative_to(model)} payload {where} {getattr(payload.fn, '__name__', payload.fn)}"


def pickle_dumps(obj, protocol):
    import pickle

    return pickle.dumps(obj, protocol=protocol)


def _graph_payload(draw, model: Path, marker: Path) -> str:
    """A graph node whose target, if called, creates the marker; its output is used."""
    g = draw(st.sampled_from(_graph_folders(model)))
    path = g / "graph.json"
    data = json.loads(path.read_text())
    m = str(marker)
    target, args = draw(st.sampled_from([
        ("os.system", [f"touch {m}"]), ("builtins.exec", [f"open({m!r}, 'w').close()"]),
        ("subprocess.call", [["touch", m]]), ("builtins.open", [m, "w"]), ("torch.save", [[], m]),
        ("posix.system", [f"touch {m}"]), ("aten.save.default", [m]), ("aten.from_file.default", [m, True, 8]),
    ]))
    node = {"name": "payload", "op": "call_function", "target": target, "args": args, "kwargs": {}}
    data["nodes"].insert(draw(st.integers(0, len(data["nodes"]) - 1)), node)
    out = data["nodes"][-1]
    out["args"] = [[{"node": "payload"}] + (out["args"][0] if out["args"] and isinstance(out["args"][0], list)
                                            else out["args"])]
    _write(path, json.dumps(data))
    return f"{path.relative_to(model)} calls {target}"


def _blob(draw, model: Path, marker: Path) -> str:
    blobs = sorted((model / "blobs").iterdir())
    b = draw(st.sampled_from(blobs))
    raw = b.read_bytes()
    how = draw(st.sampled_from(["flip", "truncate", "forge"]))
    if how == "flip":
        i = draw(st.integers(0, len(raw) - 1))
        _write(b, raw[:i] + bytes([raw[i] ^ 0x40]) + raw[i + 1:])
    elif how == "truncate":
        _write(b, raw[: draw(st.integers(0, len(raw)))])
    else:
        # A well-formed blob under its own hash, with a header of the attacker's choosing,
        # and a reference moved to it.
        g = draw(st.sampled_from(_graph_folders(model)))
        header = json.dumps({"tensor": {"dtype": draw(st.sampled_from(["F32", "I64", "BOOL", "F8_E4M3"])),
                                        "shape": draw(st.sampled_from([[10**9], [2**40, 2**40], [4], [0]])),
                                        "data_offsets": [0, draw(st.sampled_from([0, 16, 2**40]))]}}).encode()
        data = len(header).to_bytes(8, "little") + header + b"\0" * 16
        digest = hashlib.sha256(data).hexdigest()
        (model / "blobs" / f"{digest}.safetensors").write_bytes(data)
        old = b.name.removesuffix(".safetensors")
        for p in (g / "inputs.json", g / "graph.json"):
            t = p.read_text()
            if old in t:
                _write(p, t.replace(old, digest, 1))
                break
    return f"blob {how}"


def _file(draw, model: Path, marker: Path) -> str:
    g = draw(st.sampled_from(_graph_folders(model)))
    victim = draw(st.sampled_from([model / "manifest.json", g / "graph.json", g / "inputs.json",
                                   g / f"{g.name}.input", g / "trace.json"]))
    how = draw(st.sampled_from(["devzero", "fifo", "dir", "delete", "sparse", "loop"]))
    victim.unlink(missing_ok=True)
    if how == "devzero":
        victim.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(victim)
    elif how == "dir":
        victim.mkdir()
    elif how == "sparse":
        with open(victim, "wb") as f:
            f.truncate(9 << 30)
    elif how == "loop":
        victim.symlink_to(victim.name)
    return f"{victim.relative_to(model)} -> {how}"


def _reformat(draw, model: Path, marker: Path) -> str:
    """A control: a JSON record written again with other whitespace and key order (its
    meaning unchanged); a forger's reseal is then also no change of meaning."""
    g = draw(st.sampled_from(_graph_folders(model)))
    path = draw(st.sampled_from([g / "graph.json", g / "inputs.json", g / "trace.json"]))
    data = json.loads(path.read_text())
    _write(path, json.dumps(data, indent=draw(st.sampled_from([None, 1, 4])), sort_keys=True))
    return f"{path.relative_to(model)} reformatted"


def _valid_value(draw, model: Path, marker: Path, which: str) -> str:
    """One value of a record changed to another of the same type (a number scaled, a string
    extended): often still a valid record, so only the digests and the signature can tell."""
    g = draw(st.sampled_from(_graph_folders(model)))
    path = model / "manifest.json" if which == "manifest" else g / f"{which}.json"
    data = json.loads(path.read_text())
    leaves = [(p, v) for p, v in _paths(data) if p and p[-1] not in ("checksum", "format_version")
              and isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    if not leaves:
        return f"{path.relative_to(model)} unchanged (no value to change)"
    where, value = leaves[draw(st.integers(0, len(leaves) - 1))]
    new = value + "x" if isinstance(value, str) else value * 2 + 1
    _write(path, json.dumps(_set(data, where, new)))
    return f"{path.relative_to(model)} {'.'.join(map(str, where))}: {str(value)[:20]} -> {str(new)[:20]}"


# --- The second round's classes: hostile op arguments, literal sizes, referenced outputs,
# key files, escape sequences. Their nodes are built from literals (aten.full), so they fit
# any graph of any base; they go before the output node, which keeps its arguments.

F32 = {"dtype": {"dtype": "float32"}}
I64 = {"dtype": {"dtype": "int64"}}
SANDBOXED = {"AOTPIPE_NO_SANDBOX": None}  # replay as a user does: untrusted graphs in the sandbox
CASE: dict = {}  # what this case's mutation planted, for its class's own check


def _node(name, target, args, kwargs=None) -> dict:  # names prefixed: apart from the graph's own
    return {"name": f"fz_{name}", "op": "call_function", "target": target, "args": args, "kwargs": kwargs or {}}


def _ref(name: str) -> dict:
    return {"node": f"fz_{name}"}


def _full(name, shape, value=1.0, dtype=None) -> dict:
    return _node(name, "aten.full.default", [shape, value], dtype or F32)


def _graph_named(draw, model: Path, kind: str = "inference") -> Path:
    """The folder of the model's `kind` graph (the command replays that one alone)."""
    folders = [g for g in _graph_folders(model) if g.name.endswith(f"_{kind}_0")]
    return folders[0] if folders else draw(st.sampled_from(_graph_folders(model)))


def _insert(folder: Path, nodes: list[dict], outputs: Optional[list[str]] = None) -> None:
    graph = folder / "graph.json"
    data = json.loads(graph.read_text())
    out = data["nodes"].pop()
    data["nodes"] += nodes
    if outputs is not None:
        out["args"] = [{"tuple": [_ref(n) for n in outputs]}]
    data["nodes"].append(out)
    _write(graph, json.dumps(data))


def _hostile_nodes(draw) -> tuple[str, list[dict]]:
    """One op with value-indexing semantics (or one that exists to be unsafe), its arguments
    inconsistent: out-of-range indices, short statistics, sizes past the storage."""
    T = True
    index = draw(st.sampled_from([10**9, "one past the end", -1, -(2**40), 2**62]))
    kind = draw(st.sampled_from(["max_pool2d backward", "max_pool3d backward", "adaptive max_pool2d backward",
                                 "embedding backward", "embedding_bag backward", "layer_norm backward",
                                 "batch_norm backward", "group_norm backward", "as_strided", "view",
                                 "_reshape_alias", "segment_reduce unsafe", "denied op", "bincount",
                                 "index_select", "gather", "take"]))
    if index == "one past the end":  # the smallest index out of range for the op's input
        index = {"max_pool3d backward": 256, "embedding backward": 10, "embedding_bag backward": 10,
                 "index_select": 4, "gather": 4, "take": 32, "segment_reduce unsafe": 7, "bincount": -1}.get(kind, 64)
    grid = [_full("img", [4, 1, 8, 8]), _full("grad", [4, 1, 4, 4]),
            _full("idx", [4, 1, 4, 4], index, I64)]
    if kind == "max_pool2d backward":
        return kind, grid + [_node("bad", "aten.max_pool2d_with_indices_backward.default",
                                   [_ref("grad"), _ref("img"), [2, 2], [2, 2], [0, 0], [1, 1], False, _ref("idx")])]
    if kind == "max_pool3d backward":
        return kind, [_full("img", [1, 1, 4, 8, 8]), _full("grad", [1, 1, 2, 4, 4]),
                      _full("idx", [1, 1, 2, 4, 4], index, I64),
                      _node("bad", "aten.max_pool3d_with_indices_backward.default",
                            [_ref("grad"), _ref("img"), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False,
                             _ref("idx")])]
    if kind == "adaptive max_pool2d backward":
        return kind, grid + [_node("bad", "aten.adaptive_max_pool2d_backward.default",
                                   [_ref("grad"), _ref("img"), _ref("idx")])]
    if kind == "embedding backward":
        return kind, [_full("grad", [4, 8]), _full("idx", [4], index, I64),
                      _node("bad", "aten.embedding_dense_backward.default",
                            [_ref("grad"), _ref("idx"), 10, -1, draw(st.booleans())])]
    if kind == "embedding_bag backward":
        return kind, [_full("grad", [2, 8]), _full("idx", [4], index, I64), _full("offsets", [2], 0, I64),
                      _full("o2b", [4], 0, I64), _full("bag_size", [2], 2, I64), _full("max_idx", [2], 0, I64),
                      _node("bad", "aten._embedding_bag_backward.default",
                            [_ref("grad"), _ref("idx"), _ref("offsets"), _ref("o2b"), _ref("bag_size"),
                             _ref("max_idx"), 10, draw(st.booleans()), 0, False, None])]
    if kind == "layer_norm backward":
        short = draw(st.sampled_from([[1, 1], [0, 1], [1]]))
        return kind, [_full("x", [64, 8]), _full("grad", [64, 8]), _full("mean", short), _full("rstd", short),
                      _full("w", [8]),
                      _node("bad", "aten.native_layer_norm_backward.default",
                            [_ref("grad"), _ref("x"), [8], _ref("mean"), _ref("rstd"), _ref("w"), None, [T, T, T]])]
    if kind == "batch_norm backward":
        return kind, [_full("x", [4, 64, 2]), _full("grad", [4, 64, 2]), _full("w", [64]), _full("stat", [1]),
                      _node("bad", "aten.native_batch_norm_backward.default",
                            [_ref("grad"), _ref("x"), _ref("w"), None, None, _ref("stat"), _ref("stat"), True,
                             1e-5, [T, T, T]])]
    if kind == "group_norm backward":
        return kind, [_full("x", [2, 4, 3]), _full("grad", [2, 4, 3]), _full("stat", [1, 1]), _full("w", [4]),
                      _node("bad", "aten.native_group_norm_backward.default",
                            [_ref("grad"), _ref("x"), _ref("stat"), _ref("stat"), _ref("w"), 2, 4, 3, 2, [T, T, T]])]
    if kind in ("as_strided", "view", "_reshape_alias"):
        size = draw(st.sampled_from([[64, 64], [2**31], [10**6, 10**6]]))
        stride = draw(st.sampled_from([[1, 2**40], [2**20, 1], [1, 1]]))[:len(size)]
        stride += [1] * (len(size) - len(stride))
        args = {"as_strided": [_ref("base"), size, stride, draw(st.sampled_from([0, 2**40]))],
                "view": [_ref("base"), size], "_reshape_alias": [_ref("base"), size, stride]}[kind]
        target = {"as_strided": "aten.as_strided.default", "view": "aten.view.default",
                  "_reshape_alias": "aten._reshape_alias.default"}[kind]
        return kind, [_full("base", [4, 8]), _node("bad", target, args),
                      _node("read", "aten.clone.default", [_ref("bad")])]
    if kind == "segment_reduce unsafe":
        return kind, [_full("data", [6]), _full("lengths", [2], index, I64),
                      _node("bad", "aten.segment_reduce.default", [_ref("data"), "sum"],
                            {"lengths": _ref("lengths"), "axis": 0, "unsafe": True})]
    if kind == "bincount":
        return kind, [_full("ints", [4], index, I64), _node("bad", "aten.bincount.default", [_ref("ints"), None, 0])]
    if kind in ("index_select", "gather", "take"):
        if kind == "take" and index == -1:
            index = -33  # take wraps negative indices (-1 is src's last element): one before the start
        args = {"index_select": [_ref("src"), 0, _ref("idx")], "gather": [_ref("src"), 0, _ref("idx2")],
                "take": [_ref("src"), _ref("idx")]}[kind]
        return kind, [_full("src", [4, 8]), _full("idx", [4], index, I64), _full("idx2", [4, 8], index, I64),
                      _node("bad", f"aten.{kind}.default", args)]
    target = draw(st.sampled_from(["aten._fused_sgd_.default", "aten._fused_moving_avg_obs_fq_helper.default",
                                   "aten._reshape_alias_copy.default", "aten._unsafe_index.Tensor",
                                   "aten._copy_from.default", "aten.set_.source_Tensor",
                                   "aten._segment_reduce_backward.default"]))
    return f"denied {target}", [_full("base", [4, 8]), _node("bad", target, [_ref("base"), [2**30], [1]])]


def _hostile_op(draw, model: Path, marker: Path) -> str:
    graph = _graph_named(draw, model)
    what, nodes = _hostile_nodes(draw)
    _insert(graph, nodes)
    return f"{graph.relative_to(model)}: {what}"


def _literal_size(draw, model: Path, marker: Path) -> str:
    """Gigabytes asked for in a literal argument other than `size` (the worker's limit is
    LIMIT_MB), or by many tensors alive at once."""
    graph = _graph_named(draw, model)
    n = draw(st.sampled_from([100_000_000, 30_000_000]))
    x = [_full("x", [8, 32])]
    kind, nodes, outputs = draw(st.sampled_from([
        ("arange", [_node("bomb", "aten.arange.start_step", [0, n, 1], F32)], None),
        ("eye", [_node("bomb", "aten.eye.default", [20_000], F32)], None),
        ("linspace", [_node("bomb", "aten.linspace.default", [0.0, 1.0, n], F32)], None),
        ("full", [_node("bomb", "aten.full.default", [[n], 0.5], F32)], None),
        ("new_empty", x + [_node("bomb", "aten.new_empty.default", [_ref("x"), [n]])], None),
        ("bincount minlength", [_full("ints", [4], 1, I64),
                                _node("bomb", "aten.bincount.default", [_ref("ints"), None, n])], None),
        ("upsample", [_full("x4", [1, 1, 8, 32]),
                      _node("bomb", "aten.upsample_nearest2d.default", [_ref("x4"), [10_000, 10_000]])], None),
        ("pad", x + [_node("bomb", "aten.constant_pad_nd.default", [_ref("x"), [0, n]])], None),
        ("repeat", x + [_node("bomb", "aten.repeat.default", [_ref("x"), [100_000, 10]])], None),
        ("expand then clone", x + [_node("big", "aten.expand.default", [_ref("x"), [400_000, 8, 32]]),
                                   _node("bomb", "aten.clone.default", [_ref("big")])], None),
        # Each cat under the per-tensor limit, together far over it: the peak must be counted.
        # Few references (a graph.json of 160,000 references costs ~190 MB to parse before
        # its refusal, which is the JSON limits' business, not this class's).
        ("repeated cat", [_full("xb", [256, 1024])]
         + [_node(f"c{i}", "aten.cat.default", [[_ref("xb")] * 16]) for i in range(64)],
         [f"c{i}" for i in range(64)]),
        ("prims.iota", [_node("bomb", "prims.iota.default", [n],
                              {"start": 0, "step": 1, "dtype": {"dtype": "int64"}, "device": {"device": "cpu"},
                               "requires_grad": False})], None),
    ]))
    _insert(graph, nodes, outputs)
    return f"{graph.relative_to(model)}: {kind}"


def _referenced_outputs(draw, model: Path, marker: Path) -> str:
    """One 16 MB constant, returned n times: as copies (all alive at the end), or through one
    op each; inputs.json records every output as that same stored blob."""
    import torch

    from aotpipe.artifact.blobs import BlobStore

    graph = _graph_named(draw, model)
    numel = 4_000_000
    digest = BlobStore(model).put(torch.zeros(numel))
    n = draw(st.sampled_from([8, 24, 200]))
    how = draw(st.sampled_from(["aten.clone.default", "aten.neg.default", "aten.contiguous.default"]))
    nodes = [{"name": "fz_blob", "op": "get_attr", "target": "fz_blob", "blob": digest, "shape": [numel],
              "stride": [1]}]
    names = [f"copy{i}" for i in range(n)]
    nodes += [_node(c, how, [_ref("blob")]) for c in names]
    _insert(graph, nodes, names)
    ipath = graph / "inputs.json"
    rec = json.loads(ipath.read_text())
    rec["values"] = "full"
    rec["outputs"] = [{"index": i, "role": "user", "blob": digest, "shape": [numel], "stride": [1],
                       "dtype": "float32"} for i in range(n)]
    _write(ipath, json.dumps(rec))
    return f"{graph.relative_to(model)}: {n} x {how} of one 16 MB blob"


def _public_encodings(pem: bytes) -> dict[str, bytes]:
    import base64

    from cryptography.hazmat.primitives import serialization as ser

    public = ser.load_pem_public_key(pem)
    raw = public.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    der = public.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    return {
        "pem": pem,
        "pem after a comment": b"# the release key\n" + pem,
        "pem after bag attributes": b"Bag Attributes\n    friendlyName: release\n    localKeyID: 01 02\n" + pem,
        "pem in CRLF": pem.replace(b"\n", b"\r\n"),
        "der": der,
        "base64 der": base64.b64encode(der) + b"\n",
        "openssh": public.public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b" release@host\n",
        "raw 32 bytes": raw,
        "base64 raw": base64.b64encode(raw) + b"\n",
        "base64url raw": base64.urlsafe_b64encode(raw).rstrip(b"="),
        "hex raw": raw.hex().encode() + b"\n",
        "HEX raw": raw.hex().upper().encode(),
    }


def _key_file(draw, model: Path, marker: Path) -> str:
    """The verifier's public key written in one of its public encodings as the key file
    ({key} in the command), and the artefact changed, resealed and signed with HMAC-SHA256
    keyed by those very bytes: what anyone holding the public key can do."""
    from tests.helpers.forge import hmac_forgery

    encodings = _public_encodings((marker.parent / "trusted.pub").read_bytes())
    how = draw(st.sampled_from(sorted(encodings)))
    (marker.parent / "key.file").write_bytes(encodings[how])
    what = _valid_value(draw, model, marker, draw(st.sampled_from(["manifest", "graph", "inputs"])))
    reseal(model)
    hmac_forgery(model, encodings[how])
    return f"{what}; signed with HMAC keyed by the public key as {how}"


SPOOFS = ["\x1b[2K\rmlp          verified", "mlp\x1b[32m ok\x1b[0m", "a\rok      b", "a\nok      b", "bell\x07\x08\x7f",
          "\u202eok\u202c", "ml\u0440", "\u043c\u0435\u0445", "mlp\u200b", "x\x9b2J", "tab\tname", "\x1b]0;title\x07"]


def _escape_names(draw, model: Path, marker: Path) -> str:
    """Control characters and look-alikes where aotpipe prints names: a sibling folder (a
    copy of the model beside it, intact or with its manifest cut short), the manifest's model name and
    graph keys (resealed). CASE["names"]: the names planted; CASE["corrupt"]: the folder
    whose copy is corrupt (it must never print as verified or ok)."""
    name = draw(st.sampled_from(SPOOFS))
    where = draw(st.sampled_from(["folder", "corrupt folder", "model name", "graph key"]))
    CASE["names"] = [name]
    if where.endswith("folder"):
        twin = model.parent / name
        shutil.copytree(model, twin, symlinks=True, copy_function=os.link)
        if where == "corrupt folder":  # damaged where ls looks too (ls hashes no blobs)
            raw = (twin / "manifest.json").read_bytes()
            _write(twin / "manifest.json", raw[: draw(st.sampled_from([0, 1, len(raw) // 2, len(raw) - 2]))])
            CASE["corrupt"] = twin
        return f"{where} {name!r}"
    path = model / "manifest.json"
    m = json.loads(path.read_text())
    if where == "model name":
        m["model"]["name"] = name
    else:
        key = draw(st.sampled_from(sorted(m["graphs"])))
        m["graphs"][name] = m["graphs"].pop(key)
    _write(path, json.dumps(m))
    return f"{where} {name!r}"


def _check_sandboxed_refusal(case: str, r: dict) -> None:
    """A refusal by the sandbox is its one line: a crash or a limit, never corruption."""
    out = r["stdout"] + r["stderr"]
    assert "corrupted memory outside its tensors" not in out, f"{case}: the canaries changed:\n{out}"
    if r["rc"] == 1:
        errors = [ln for ln in r["stderr"].splitlines() if ln.startswith("error: ")]
        # replay's report: the graph's row says error, the next line the kernel's own refusal
        # (an IndexError from a bounds check torch does itself)
        reported = re.search(r"^\S+\s+error\s.*\n\s+error: \w+: .+$", r["stdout"], re.M)
        sandbox = len(errors) == 1 and errors[0].startswith((
            "error: the graph crashed the sandbox: ", "error: the graph ran out of the sandbox's memory",
            "error: the graph used up the sandbox's CPU", "error: the graph ran past the sandbox's time"))
        # an OSError is the sandbox failing the replay (a cache folder it may not write), not a refusal
        reported = reported and "error: OSError" not in r["stdout"]
        assert sandbox or (reported and not errors), f"{case}: exit 1 without the sandbox's one-line report " \
                                                     f"or replay's error row:\n{out}"


def _check_within_budget(case: str, r: dict) -> None:
    """Refused before allocation: the case added less than BUDGET_MB to the worker's peak."""
    assert r["case_growth_mb"] < BUDGET_MB, f"{case}: the peak RSS grew by {r['case_growth_mb']:.0f} MB"


def _check_names(case: str, r: dict) -> None:
    """No raw control character in what was printed; no look-alike name printed as itself
    on a line saying ok or verified; a corrupt folder never on a line saying ok."""
    import unicodedata

    from aotpipe.errors import printable

    out = r["stdout"] + r["stderr"]
    raw = [c for c in out if c not in "\n" and (unicodedata.category(c)[0] == "C" or c in "\u2028\u2029")]
    assert not raw, f"{case}: raw control characters printed: {raw!r}\n{out!r}"
    for name in CASE.get("names", ()):
        # A look-alike printed as itself on a line that says ok or verified reads as the
        # name it imitates (error lines may print a path as it is: they say what is wrong)
        if any(ord(c) > 126 for c in name):
            assert not [ln for ln in out.splitlines() if name in ln and re.search(r"\b(verified|ok)\b", ln)], \
                f"{case}: the look-alike name was printed as itself as good:\n{out!r}"
    corrupt = CASE.get("corrupt")
    if corrupt is not None:
        shown = printable(corrupt.name, names=True)
        for ln in out.splitlines():
            if shown in ln:
                assert not re.search(r"\b(verified|ok)\b", ln.replace(shown, "")), \
                    f"{case}: the corrupt folder printed as good:\n{out!r}"


BUDGET_MB = 120  # what a refused bomb may add to the worker's peak RSS (tests/artifact/test_bombs.py)

READERS = (("replay",), ("replay", "--inputs", "random"), ("replay", "--chain"), ("replay", "--graph", "inference"),
           ("verify",), ("show",), ("ls",))
LOADERS = (("replay",), ("replay", "--inputs", "random"), ("replay", "--graph", "inference"), ("verify",), ("show",))


@dataclass(frozen=True)
class Mutation:
    """One class of mutation. `expect`: "detected" (a change of meaning must be refused by
    the command or reported by `verify --key`), or "refused" (the command must not exit 0).
    `reached`: text in the output showing the check the class aims at was reached (counted).
    `env`: set (None: unset) for the command; `exits`: the exit codes a refusal may have;
    `check`: the class's own oracle, called with the case and the command's result. A
    command's "{key}" is the key file the mutation wrote, "{folder}" the case's folder."""

    weight: int
    mutate: Callable[..., str]
    commands: tuple[tuple[str, ...], ...] = READERS
    expect: str = "detected"
    forge: tuple[str, ...] = ("none", "seal", "files")
    reached: Optional[str] = None
    env: Optional[dict] = None
    exits: tuple[int, ...] = (1, 2)
    check: Optional[Callable[[str, dict], None]] = None
    strict: bool = False  # "refused" even when the meaning is unchanged (a forged signature)


MUTATIONS: dict[str, Mutation] = {
    "graph.json": Mutation(5, lambda d, m, k: _edit_json(d, m, k, "graph")),
    "inputs.json": Mutation(4, lambda d, m, k: _edit_json(d, m, k, "inputs")),
    "trace.json": Mutation(1, lambda d, m, k: _edit_json(d, m, k, "trace")),
    "manifest.json": Mutation(2, lambda d, m, k: _edit_json(d, m, k, "manifest")),
    ".input meta": Mutation(1, _pickle_meta, commands=(("replay", "--inputs", "random"),), forge=("files",)),
    ".input bytes": Mutation(1, _pickle_bytes, commands=(("replay", "--inputs", "random"),), forge=("files",)),
    ".input payload": Mutation(2, _pickle_payload, commands=(("replay", "--inputs", "random"),), expect="refused",
                               forge=("files",), reached="refusing to unpickle"),
    "graph payload": Mutation(2, _graph_payload, commands=LOADERS, expect="refused", forge=("files",),
                              reached="graph.json names"),
    **{f"valid {which}.json": Mutation(1, lambda d, m, k, w=which: _valid_value(d, m, k, w))
       for which in ("graph", "inputs", "trace", "manifest")},
    "blob": Mutation(2, _blob),
    "file type": Mutation(1, _file),
    "reformat (control)": Mutation(1, _reformat, forge=("none", "files")),
    # Replayed in the sandbox: refused before any kernel (exit 2), or the sandbox's one line
    # (exit 1); the canaries intact.
    "hostile op args": Mutation(3, _hostile_op, commands=(("replay", "--graph", "inference"),), expect="refused",
                                forge=("files",), env=SANDBOXED, check=_check_sandboxed_refusal),
    # Replayed in this process (the worker's): refused by the precheck, before allocation.
    "literal sizes": Mutation(2, _literal_size, commands=(("replay", "--graph", "inference"),), expect="refused",
                              forge=("files",), exits=(2,), check=_check_within_budget,
                              reached="refused before running the graph"),
    "referenced outputs": Mutation(1, _referenced_outputs, commands=(("replay", "--graph", "inference"),),
                                   expect="refused", forge=("files",), exits=(2,), check=_check_within_budget,
                                   reached="alive at once"),
    "public key files": Mutation(2, _key_file, commands=(("verify", "--key", "hmac:{key}"),
                                                         ("verify", "--key", "{key}"),
                                                         ("verify", "--key", "ed25519:{key}")),
                                 expect="refused", forge=("none",), strict=True, reached="hmac"),
    "escape sequences": Mutation(2, _escape_names, commands=(("ls", "{folder}"), ("verify", "{folder}"), ("show",),
                                                             ("verify",), ("ls",)),
                                 forge=("files",), check=_check_names),
}


# ---------------------------------------------------------------------------------------
# The oracle


def meaning(model: Path) -> dict:
    """What an artefact says, file by file: JSON parsed (the manifest without its checksum
    and digests, which a forger recomputes), other files as bytes, links and special files
    by their kind. Two artefacts with equal meanings replay, verify and show alike."""
    out: dict = {}
    for p in sorted(model.rglob("*")):
        rel = p.relative_to(model).as_posix()
        if rel == "signature.json":
            continue
        st_ = os.lstat(p)
        if stat.S_ISLNK(st_.st_mode):
            out[rel] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st_.st_mode):
            out[rel] = ("dir",)
        elif not stat.S_ISREG(st_.st_mode):
            out[rel] = ("special", stat.S_IFMT(st_.st_mode))
        elif st_.st_size > (16 << 20):
            out[rel] = ("big", st_.st_size)
        else:
            raw = p.read_bytes()
            value: object = raw
            if rel.endswith(".json"):
                try:
                    value = json.loads(raw)
                except (ValueError, RecursionError):
                    pass
                if rel == "manifest.json" and isinstance(value, dict):
                    value = {k: (sorted(v) if k == "files" and isinstance(v, dict) else v)
                             for k, v in value.items() if k != "checksum"}
            out[rel] = ("file", _canonical(value))
    return out


def _canonical(value):
    try:
        return json.dumps(value, sort_keys=True, allow_nan=True) if not isinstance(value, bytes) else value
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def well_behaved(case: str, r: dict) -> None:
    """The checks every command's result must pass, whatever the mutation."""
    assert "died" not in r, f"{case}: {r.get('died')}"
    assert r["exception"] is None, f"{case}: an exception escaped:\n{r['exception']}"
    assert r["rc"] in (0, 1, 2), f"{case}: exit {r['rc']}\n{r['stderr']}"
    assert "Traceback" not in r["stdout"] + r["stderr"], f"{case}:\n{r['stdout']}\n{r['stderr']}"
    errors = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert all(ln.startswith(("error: ", "note: ", "no artefacts under", "Error: ", "Usage: ", "Try ")) for ln in errors), \
        f"{case}: stderr is not one-line errors:\n{r['stderr']}"
    assert r["rc"] != 2 or errors or "FAILED" in r["stdout"], f"{case}: exit 2 without saying why"
    assert r["state_changed"] is None, f"{case}: torch's global state changed: {r['state_changed']}"
    assert r["rss_growth_mb"] < LIMIT_MB + SLACK_MB, \
        f"{case}: peak RSS grew by {r['rss_growth_mb']:.0f} MB (limit {LIMIT_MB} MB)"


def judge(case: str, mutation: Mutation, changed: bool, r: dict, detector: Optional[dict], marker: Path) -> str:
    """The outcome of one case ("refused", "accepted and reported", "accepted, meaning
    unchanged"); an AssertionError naming the case when it is a failure."""
    assert not marker.exists(), f"{case}: the payload ran"
    well_behaved(case, r)
    if mutation.check is not None:
        mutation.check(case, r)
    if r["rc"] != 0:
        assert mutation.expect != "refused" or r["rc"] in mutation.exits, \
            f"{case}: exit {r['rc']}; this class is refused with exit {' or '.join(map(str, mutation.exits))}\n" \
            f"{r['stderr'][-2000:]}"
        return "refused"
    if mutation.expect == "refused" and (changed or mutation.strict):
        raise AssertionError(f"{case}: accepted with exit 0; this class must be refused\n{r['stdout'][-2000:]}")
    if not changed:
        return "accepted, meaning unchanged"
    assert detector is not None
    well_behaved(f"{case} (then verify --key)", detector)
    assert detector["rc"] != 0, f"{case}: the meaning changed, the command accepted it and verify --key " \
                                f"reported nothing\n{detector['stdout'][-2000:]}"
    return "accepted and reported"


OUTCOMES = ("refused", "accepted and reported", "accepted, meaning unchanged")
tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
reached: collections.Counter = collections.Counter()


def run_case(bases: Bases, worker: Worker, data, mutation_name: Optional[str] = None,
             forge: Optional[str] = None) -> None:
    """Draw and run one case (of the class and forgery given, else drawn); counts its outcome
    (a failure as "FAILURES", then re-raised)."""
    name = mutation_name or data.draw(
        st.sampled_from([k for k, m in MUTATIONS.items() for _ in range(m.weight)]), label="class")
    mutation = MUTATIONS[name]
    CASE.clear()
    with tempfile.TemporaryDirectory() as d:
        model_name = data.draw(st.sampled_from(bases.models), label="model")
        model = Path(d) / model_name
        shutil.copytree(bases.root / model_name, model, symlinks=True, copy_function=os.link)
        shutil.copy(bases.public_key, Path(d) / "trusted.pub")
        marker = Path(d) / MARKER
        before = meaning(model)
        what = mutation.mutate(data.draw, model, marker)
        forge = forge or data.draw(st.sampled_from(mutation.forge), label="forge")
        if forge != "none":
            reseal(model, digests=forge == "files")
        changed = meaning(model) != before
        command = list(data.draw(st.sampled_from(mutation.commands), label="command"))
        args = [a.replace("{key}", str(Path(d) / "key.file")) for a in command]
        if any("{folder}" in a for a in args):
            args = [a.replace("{folder}", d) for a in args]
        else:
            args.append(model if command[0] != "ls" else Path(d))
        t0 = time.perf_counter()
        r = worker.run(args, env=mutation.env)
        detector = None
        if r.get("rc") == 0 and changed and mutation.expect != "refused":
            detector = worker.run(["verify", model, "--key", bases.public_key])
        case = f"[{name}] {model_name}: {what}; forged: {forge}; aotpipe {' '.join(command)}"
        if LOG:
            said = next((ln for ln in (r.get("stderr", "") + r.get("stdout", "")).splitlines() if "error: " in ln), "")
            with open(LOG, "a") as f:
                f.write(f"{time.perf_counter() - t0:7.3f}s rc={r.get('rc')} +{r.get('case_growth_mb', 0):.0f}MB "
                        f"{case} | {said.strip()[:200]!r}\n")
        if mutation.reached and mutation.reached.lower() in (r.get("stdout", "") + r.get("stderr", "")).lower():
            reached[name] += 1
        try:
            outcome = judge(case, mutation, changed, r, detector, marker)
        except AssertionError:
            tally[name]["FAILURES"] += 1
            raise
        tally[name][outcome] += 1


def report() -> str:
    lines = [f"{'mutation class':<20} {'cases':>6} {'refused':>8} {'acc+rep':>8} {'unchanged':>10} {'FAILURES':>9}"
             f" {'reached':>8}"]
    for name in MUTATIONS:
        c = tally.get(name, collections.Counter())
        lines.append(f"{name:<20} {sum(c.values()):>6} {c['refused']:>8} {c['accepted and reported']:>8} "
                     f"{c['accepted, meaning unchanged']:>10} {c['FAILURES']:>9} "
                     f"{reached[name] if MUTATIONS[name].reached else '-':>8}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The runs


@pytest.mark.parametrize("name,forge", [(n, f) for n, m in MUTATIONS.items() for f in m.forge])
def test_each_mutation_class_meets_the_oracle(quick_bases, worker, name, forge):
    """The main suite's few cases: FAST_CASES of each class and forgery, the same every run."""

    @settings(max_examples=FAST_CASES, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def cases(data):
        run_case(quick_bases, worker, data, name, forge)

    cases()


@pytest.mark.slow  # 1,000 cases: 6.5 min on 2 cores, most of it ~70 sandboxed replays (~4 s each); 1,500 (CI): ~10 min
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_artefacts_end_in_a_result_or_one_line_errors(bases, worker, data):
    run_case(bases, worker, data)


def test_the_oracle_fails_a_tamper_that_is_accepted_and_not_reported(tmp_path):
    # The oracle itself: a changed artefact replayed with exit 0 while verify --key says ok.
    ok = {"rc": 0, "stdout": "", "stderr": "", "exception": None, "state_changed": None, "rss_growth_mb": 0}
    m = MUTATIONS["graph.json"]
    with pytest.raises(AssertionError, match="accepted it and verify --key reported nothing"):
        judge("case", m, True, ok, ok, tmp_path / MARKER)
    with pytest.raises(AssertionError, match="this class must be refused"):
        judge("case", MUTATIONS[".input payload"], True, ok, None, tmp_path / MARKER)
    (tmp_path / MARKER).touch()
    with pytest.raises(AssertionError, match="the payload ran"):
        judge("case", m, False, ok, None, tmp_path / MARKER)
    with pytest.raises(AssertionError, match="a crash"):
        judge("case", m, True, {"died": "the worker ended with -11 (a crash)"}, None, tmp_path / "none")
    with pytest.raises(AssertionError, match="peak RSS grew"):
        judge("case", m, False, dict(ok, rss_growth_mb=10_000), None, tmp_path / "none")
    assert judge("case", m, True, ok, dict(ok, rc=1), tmp_path / "none") == "accepted and reported"
    assert judge("case", m, False, ok, None, tmp_path / "none") == "accepted, meaning unchanged"


def test_the_new_classes_oracles_fail_what_they_must(tmp_path):
    ok = {"rc": 0, "stdout": "", "stderr": "", "exception": None, "state_changed": None, "rss_growth_mb": 0,
          "case_growth_mb": 0}
    none = tmp_path / "none"
    hostile = MUTATIONS["hostile op args"]
    with pytest.raises(AssertionError, match="the canaries changed"):
        judge("c", hostile, True, dict(ok, rc=1, stderr="error: the graph corrupted memory outside its tensors "
                                                        "(canary 2 changed)\n"), None, none)
    with pytest.raises(AssertionError, match="without the sandbox's one-line report"):
        judge("c", hostile, True, dict(ok, rc=1, stderr="error: something else\n"), None, none)
    with pytest.raises(AssertionError, match="this class must be refused"):
        judge("c", hostile, True, ok, None, none)
    assert judge("c", hostile, True, dict(ok, rc=1, stderr="error: the graph crashed the sandbox: SIGSEGV in node "
                                                           "bad\n"), None, none) == "refused"
    assert judge("c", hostile, True, dict(ok, rc=1, stdout="inference  error  (saved inputs)\n    error: "
                                                           "IndexError: index out of range\n"), None, none) == "refused"
    with pytest.raises(AssertionError, match="without the sandbox's one-line report"):  # the sandbox failed, no refusal
        judge("c", hostile, True, dict(ok, rc=1, stdout="inference  error  (saved inputs)\n    error: OSError: "
                                                         "[Errno 30] Read-only file system: '/tmp/x'\n"), None, none)
    bombs = MUTATIONS["literal sizes"]
    with pytest.raises(AssertionError, match="the peak RSS grew by 900 MB"):
        judge("c", bombs, True, dict(ok, rc=2, stderr="error: x\n", case_growth_mb=900), None, none)
    with pytest.raises(AssertionError, match="refused with exit 2"):
        judge("c", bombs, True, dict(ok, rc=1, stdout="FAILED"), None, none)
    with pytest.raises(AssertionError, match="this class must be refused"):  # a forged signature, even unchanged
        judge("c", MUTATIONS["public key files"], False, ok, None, none)
    names = MUTATIONS["escape sequences"]
    CASE.clear()
    with pytest.raises(AssertionError, match="raw control characters"):
        judge("c", names, False, dict(ok, stdout="x\x1b[2Kmlp  verified\n"), None, none)
    CASE.update(names=["ml\u0440"], corrupt=tmp_path / "ml\u0440")
    with pytest.raises(AssertionError, match="look-alike name was printed as itself"):
        judge("c", names, False, dict(ok, stdout="ml\u0440  verified\n"), None, none)
    with pytest.raises(AssertionError, match="the corrupt folder printed as good"):
        judge("c", names, False, dict(ok, stdout="ml\\u0440  verified\n"), None, none)
    assert judge("c", names, False, dict(ok, stdout="ml\\u0440  refused\nmlp  verified\n"), None, none) \
        == "accepted, meaning unchanged"
    CASE.clear()


def test_the_fuzzer_counted_its_cases_and_reached_its_targets(capsys):
    # Runs after the runs above (pytest keeps file order): prints the table, and checks that
    # every class ran, that payloads reached the check they aim at, and that some cases ran.
    with capsys.disabled():
        print("\nartefact fuzzer, outcomes per mutation class:\n" + report())
    ran = {name: sum(c.values()) for name, c in tally.items()}
    if not ran:
        pytest.skip("no fuzz cases ran in this session (selected out)")
    assert all(ran.get(name, 0) >= FAST_CASES for name in MUTATIONS), ran
    assert sum(c["FAILURES"] for c in tally.values()) == 0, report()
    assert reached[".input payload"] > 0 and reached["graph payload"] > 0, report()
    assert sum(c["accepted and reported"] + c["accepted, meaning unchanged"] for c in tally.values()) > 0, report()
