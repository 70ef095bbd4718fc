"""Fuzzing artefacts: mutated records of real artefacts never crash, hang, trace back or over-allocate.

Each case copies one of three small real artefacts (an MLP, a batch-norm model with a
mutated buffer, a CNN: every graph kind and an optimised graph each), mutates it the way a
careless user or an attacker could (graph.json nodes and arguments, inputs.json,
trace.json, manifest.json, the .input pickles, the blobs, the files themselves), and runs
one `aotpipe` command on it (replay, with random inputs, --chain, verify, show, ls) in a
worker process (tests/helpers/fuzz_worker.py). A segfault or abort ends the worker, a hang
stops it answering: both fail the case. Every case must end in a correct run or in
one-line errors (exit 1 or 2, no traceback), under the byte limit, with torch's global
state (grad mode, seed, default dtype, threads, deterministic flag) as it was.

AOTPIPE_FUZZ_EXAMPLES sets the number of cases (default 5000; CI runs the default).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotpipe.artifact import input_meta
from aotpipe.artifact.blobs import encode
from aotpipe.artifact.manifest import file_sha256, seal

pytestmark = pytest.mark.slow  # about 2.5 minutes on 2 cores; CI runs it

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("AOTPIPE_FUZZ_EXAMPLES", "5000"))
LOG = os.environ.get("AOTPIPE_FUZZ_LOG")  # a file to append one line per case to
LIMIT_MB = 64  # the worker's byte limit (AOTPIPE_MAX_BYTES); nodes and record sizes are lowered too
SLACK_MB = 192  # what a worker's peak RSS may grow by besides, over a worker's life (caches)
CASE_TIMEOUT_S = 60
RESTART_EVERY = 1000

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
MODELS = ("mlp", "mlp", "running_norm", "running_norm", "small_cnn")


class Worker:
    """The fuzz worker process: one case at a time, restarted when a case ends it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.cases = 0
        self.base_rss: float | None = None

    def start(self) -> None:
        env = dict(os.environ, AOTPIPE_MAX_BYTES=f"{LIMIT_MB}M", AOTPIPE_MAX_NODES="2000",
                   AOTPIPE_MAX_RECORD_BYTES="4M", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fuzz_worker"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.cases, self.base_rss = 0, None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, args: list[str]) -> dict:
        if self.proc is None or self.cases >= RESTART_EVERY:
            self.stop()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.cases += 1
        self.proc.stdin.write(json.dumps({"args": args}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT_S)
        if not ready:
            self.stop()
            return {"died": f"no answer within {CASE_TIMEOUT_S} s (a hang)"}
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            self.proc = None
            return {"died": f"the worker ended with {rc} (a crash){': ' + err if err else ''}"}
        r = json.loads(line)
        if self.base_rss is None:
            self.base_rss = r["maxrss_mb"]
        r["rss_growth_mb"] = r["maxrss_mb"] - self.base_rss
        return r


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    from click.testing import CliRunner

    from aotpipe.cli import main

    d = tmp_path_factory.mktemp("fuzzbase")
    (d / "p.yaml").write_text(PIPELINE)
    r = CliRunner().invoke(main, ["run", str(d / "p.yaml"), "-o", str(d / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    return d / "out" / "fz"


@pytest.fixture(scope="module")
def worker():
    w = Worker()
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


def _reseal(model: Path, files_too: bool) -> None:
    """What a forger does after an edit: file digests and the manifest's checksum made to fit."""
    mpath = model / "manifest.json"
    try:
        if not mpath.is_file() or mpath.stat().st_size > (16 << 20):
            return  # a FIFO, a link to a device, a huge file: a forger would not reseal it either
        m = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError, OSError, RecursionError):
        return  # nothing a forger could seal either
    if not isinstance(m, dict):
        return
    if files_too and isinstance(m.get("files"), dict):
        for rel in list(m["files"]):
            p = model / rel
            if isinstance(rel, str) and p.is_file() and not p.is_symlink() and p.stat().st_size < (16 << 20):
                m["files"][rel] = file_sha256(p)
    try:
        _write(mpath, seal(m))
    except (ValueError, TypeError, RecursionError):
        pass


@st.composite
def mutation(draw, model: Path):
    """Mutate the artefact copy at `model` in place; returns a description of what was done."""
    graphs = _graph_folders(model)
    g = graphs[draw(st.integers(0, len(graphs) - 1))]
    kind = draw(st.sampled_from(["graph"] * 5 + ["inputs"] * 4 + ["trace", "manifest", "manifest",
                                                                     "pickle", "pickle", "blob", "blob", "file"]))
    if kind in ("graph", "inputs", "trace", "manifest"):
        path = model / "manifest.json" if kind == "manifest" else g / {"graph": "graph.json", "inputs": "inputs.json",
                                                                          "trace": "trace.json"}[kind]
        data = json.loads(path.read_text())
        if kind == "graph" and draw(st.booleans()):
            # Aim at the nodes: most of what a graph says is there.
            nodes = data["nodes"]
            i = draw(st.integers(0, len(nodes) - 1))
            nodes[i] = draw(json_edit(nodes[i]))
        else:
            data = draw(json_edit(data))
        text = json.dumps(data, allow_nan=True)
        _write(path, text.replace(json.dumps(DEEP), "[" * 100_000 + "0" + "]" * 100_000))
        what = f"{path.relative_to(model)} edited"
    elif kind == "pickle":
        path = g / f"{g.name}.input"
        raw = path.read_bytes()
        how = draw(st.sampled_from(["meta", "meta", "flip", "truncate", "opcode"]))
        if how == "meta":
            meta = input_meta.read(path)
            flat = [e for grp in meta for e in grp] if meta and isinstance(meta[0], list) else meta
            if flat:
                j = draw(st.integers(0, len(flat) - 1))
                e = list(flat[j])
                if len(e) == 5:
                    field = draw(st.integers(1, 2))
                    e[field] = draw(st.sampled_from([[6 * 10**8], [10**12], [2**62, 2**62], [-1], [0], [3] * 70]))
                flat[j] = tuple(e)
            try:
                raw = input_meta.dumps(flat)
            except Exception:
                pass
        elif how == "flip" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
        elif how == "truncate":
            raw = raw[: draw(st.integers(0, len(raw)))]
        else:
            bad = draw(st.sampled_from([b"cos\nsystem\n(S'true'\ntR.", b"ctorch\nTensor\n)Rq\x00}b.",
                                        b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01e.",
                                        b"cbuiltins\neval\n(S'1'\ntR."]))
            i = draw(st.integers(0, len(raw)))
            raw = raw[:i] + bad + raw[i:] if draw(st.booleans()) else bad
        _write(path, raw)
        what = f"{path.relative_to(model)} {how}"
    elif kind == "blob":
        blobs = sorted((model / "blobs").iterdir())
        b = blobs[draw(st.integers(0, len(blobs) - 1))]
        raw = b.read_bytes()
        how = draw(st.sampled_from(["flip", "truncate", "forge"]))
        if how == "flip":
            i = draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + bytes([raw[i] ^ 0x40]) + raw[i + 1:]
            _write(b, raw)
        elif how == "truncate":
            _write(b, raw[: draw(st.integers(0, len(raw)))])
        else:
            # A well-formed blob under its own hash, with a header of the attacker's choosing,
            # and a reference moved to it.
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
        what = f"blob {how}"
    else:
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
        what = f"{victim.relative_to(model)} -> {how}"
    forge = draw(st.sampled_from(["none", "seal", "files"]))
    if forge != "none":
        _reseal(model, files_too=forge == "files")
    return f"{what}; forged: {forge}"


COMMANDS = (
    [["replay"]] * 8 + [["replay", "--inputs", "random"]] * 2 + [["replay", "--chain"]] * 2
    + [["replay", "--graph", "inference"]] + [["verify"]] * 2 + [["show"]] * 2 + [["ls"]]
)
counts = {"cases": 0, "ok": 0}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_artefacts_end_in_a_result_or_one_line_errors(bases, worker, data):
    counts["cases"] += 1
    with tempfile.TemporaryDirectory() as d:
        name = data.draw(st.sampled_from(MODELS), label="model")  # the CNN's graphs are the slowest
        model = Path(d) / name
        shutil.copytree(bases / name, model, symlinks=True, copy_function=os.link)
        what = data.draw(mutation(model), label="mutation")
        command = data.draw(st.sampled_from(COMMANDS), label="command")
        args = command + [str(model if command[0] != "ls" else Path(d))]
        t0 = time.perf_counter()
        r = worker.run(args)
        case = f"{name}: {what}: aotpipe {' '.join(command)}"
        if LOG:
            with open(LOG, "a") as f:
                f.write(f"{time.perf_counter() - t0:7.3f}s rc={r.get('rc')} {case}\n")
        assert "died" not in r, f"{case}: {r.get('died')}"
        assert r["exception"] is None, f"{case}: an exception escaped:\n{r['exception']}"
        assert r["rc"] in (0, 1, 2), f"{case}: exit {r['rc']}\n{r['stderr']}"
        assert "Traceback" not in r["stdout"] + r["stderr"], f"{case}:\n{r['stdout']}\n{r['stderr']}"
        errors = [ln for ln in r["stderr"].splitlines() if ln.strip()]
        assert all(ln.startswith(("error: ", "no artefacts under", "Error: ", "Usage: ", "Try ")) for ln in errors), \
            f"{case}: stderr is not one-line errors:\n{r['stderr']}"
        assert r["rc"] != 2 or errors or "FAILED" in r["stdout"], f"{case}: exit 2 without saying why"
        assert r["state_changed"] is None, f"{case}: torch's global state changed: {r['state_changed']}"
        assert r["rss_growth_mb"] < LIMIT_MB + SLACK_MB, \
            f"{case}: peak RSS grew by {r['rss_growth_mb']:.0f} MB (limit {LIMIT_MB} MB)"
        counts["ok"] += r["rc"] == 0


def test_the_fuzzer_ran_its_cases_and_some_still_ran():
    # Runs after the property (pytest keeps file order): the count is real, and mutations
    # that leave an artefact usable (a trace edit, a forged seal) still replay.
    assert counts["cases"] >= EXAMPLES, counts
    assert 0 < counts["ok"] < counts["cases"], counts
