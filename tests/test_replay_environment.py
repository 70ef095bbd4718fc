"""Replay where an artefact was made (bit for bit, at its recorded thread count) and elsewhere
(judged by its evidence: "close" within the element-wise bound, "mismatch" beyond it)."""

import json
import math
import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from aotpipe.artifact.blobs import encode
from aotpipe.artifact.load import load
from aotpipe.artifact.manifest import file_sha256, seal
from aotpipe.cli import main
from aotpipe.pipeline.executors.worker import intra_op_threads
from aotpipe.replay import replay
from aotpipe.runtime import evidence
from aotpipe.runtime.determinism import cpu_from_cpuinfo, cpu_model, cpu_parts
from aotpipe.runtime.execution import run_graph
from aotpipe.trust.verify import verify_artifact
from tests.helpers.replays import assert_match_or_close_for_want_of_a_recorded_cpu


@pytest.fixture()
def small_cnn(quickstart_run, tmp_path):
    """A private copy of the quickstart's small_cnn (a model whose convolution weight
    gradients differ in their last bits from one thread count to another)."""
    root, _ = quickstart_run
    dst = tmp_path / "small_cnn"
    shutil.copytree(root / "small_cnn", dst)
    return dst


def recorded(folder):
    return json.loads((folder / "manifest.json").read_text())["environment"]


def reseal(folder):
    """Every file's sha256 into the manifest again, and its checksum: a consistent artefact."""
    m = json.loads((folder / "manifest.json").read_text())
    m["files"] = {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*"))
                  if p.is_file() and p.name not in ("manifest.json", "signature.json")}
    (folder / "manifest.json").write_bytes(seal(m))


def test_manifest_records_the_environment_the_outputs_were_recorded_in(quickstart_run):
    root, _ = quickstart_run
    env = recorded(root / "small_cnn")
    # the quickstart's process executor: 2 workers share torch's default thread count
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    assert env["threads"] == max(1, default // 2)
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["deterministic_algorithms"] is True and env["mkldnn"] == torch.backends.mkldnn.is_available()


def test_worker_threads_are_a_share_of_torchs_default():
    assert intra_op_threads("/2", 4) == 2
    assert intra_op_threads("/2", 1) == 1
    assert intra_op_threads("/1", 8) == 8
    assert intra_op_threads("3", 8) == 3
    assert intra_op_threads("0", 8) == 8


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_replay_runs_at_the_recorded_thread_count_whatever_the_callers(quickstart_run, threads):
    root, _ = quickstart_run
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = replay(root / "small_cnn")
        assert torch.get_num_threads() == threads, "the caller's thread count is restored"
    finally:
        torch.set_num_threads(was)
    assert [(r.kind, r.status, r.environment) for r in results] == [(r.kind, "match", []) for r in results]


def test_cli_replay_matches_under_any_omp_num_threads(quickstart_run):
    root, _ = quickstart_run
    for n in ("1", "4"):
        out = subprocess.run([sys.executable, "-m", "aotpipe.cli", "replay", str(root / "small_cnn")],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": n})
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.strip().splitlines()
        assert len(lines) == 5 and all(line.split()[1] == "match" for line in lines), out.stdout


def test_another_thread_count_is_close_with_elementwise_errors(small_cnn):
    rec = recorded(small_cnn)["threads"]
    other = rec + 1
    results = {r.kind: r for r in replay(small_cnn, threads=other)}
    assert {r.status for r in results.values()} == {"close"}
    assert all(r.environment == [f"{other} threads, recorded {rec}"] for r in results.values())
    bw = results["backward"]
    assert bw.verdict == f"close ({other} threads, recorded {rec})"
    assert bw.bit_identical is False and bw.errors, "a convolution's weight gradient differs in its last bits"
    # Every figure is element-wise, over the sampled elements, and true: recompute it.
    art = load(small_cnn)
    ga = art.graphs["backward"]
    expected = ga.expected_outputs()
    with torch.no_grad():
        was = torch.get_num_threads()
        torch.set_num_threads(other)
        try:
            outs = run_graph(ga.module, ga.saved_inputs())
        finally:
            torch.set_num_threads(was)
    by_label = {e.output: e for e in bw.errors}
    for i, (o, e, r) in enumerate(zip(outs, expected, ga.record.outputs)):
        label = f"output {i} ({r.role}{' ' + r.target if r.target else ''})"
        ev = e.evidence
        if ev is None:  # a gradient the graph does not compute (None)
            assert o is None
            continue
        stored = ga.blobs.get(ev.blob)
        true_err = float((evidence.sample(o).double() - stored.double()).abs().max())
        if label in by_label:
            got = by_label[label]
            assert got.max_abs_error == pytest.approx(true_err, rel=0, abs=0)
            assert got.elements == ev.count and 0 < got.max_abs_error <= got.bound == ev.bound
            assert got.max_abs_error < 1e-4 * max(1.0, ev.max_abs)
        else:
            assert true_err == 0
    assert bw.max_abs_error == max(e.max_abs_error for e in bw.errors)


def test_cli_says_close_with_the_reason_and_the_elementwise_error(small_cnn):
    rec = recorded(small_cnn)["threads"]
    r = CliRunner().invoke(main, ["replay", str(small_cnn), "--graph", "backward", "--threads", str(rec + 1)])
    assert r.exit_code == 0, r.output
    assert f"close ({rec + 1} threads, recorded {rec})" in r.output
    assert "max abs error" in r.output and "sampled elements of" in r.output and "bound" in r.output


def other_capability():
    return "AVX2" if torch.backends.cpu.get_cpu_capability() != "AVX2" else "AVX512"


def test_another_cpu_capability_is_close(small_cnn):
    m = json.loads((small_cnn / "manifest.json").read_text())
    m["environment"]["cpu_capability"] = other_capability()
    (small_cnn / "manifest.json").write_bytes(seal(m))
    assert verify_artifact(small_cnn) == []  # a consistent artefact, made elsewhere
    results = replay(small_cnn)
    now = torch.backends.cpu.get_cpu_capability().lower()
    why = f"other CPU: {now}, recorded {other_capability().lower()}"
    assert [(r.status, r.environment) for r in results] == [("close", [why])] * len(results)
    r = CliRunner().invoke(main, ["replay", str(small_cnn), "--graph", "inference"])
    assert r.exit_code == 0 and f"close ({why})" in r.output, r.output


def change_weight(folder, target, delta):
    """Add `delta` to every element of parameter `target`'s stored blob; references and hashes follow."""
    rec = json.loads((folder / "small_cnn_inference_0" / "inputs.json").read_text())
    (inp,) = [i for i in rec["inputs"] if i["target"] == target]
    old = rec["storages"][inp["storage"]]["blob"]
    blobs = folder / "blobs"
    from safetensors.torch import load_file

    t = load_file(str(blobs / f"{old}.safetensors"))["tensor"]
    new, data = encode(t + delta)
    (blobs / f"{new}.safetensors").write_bytes(data)
    for p in folder.rglob("*.json"):
        if p.name != "manifest.json":
            p.write_text(p.read_text().replace(old, new))
    (blobs / f"{old}.safetensors").unlink()
    reseal(folder)


@pytest.mark.parametrize("elsewhere", [False, True])
def test_weight_changed_by_1e3_is_a_mismatch_naming_the_first_diverging_node(small_cnn, elsewhere):
    change_weight(small_cnn, "conv2.weight", 1e-3)
    threads = recorded(small_cnn)["threads"] + (1 if elsewhere else 0)
    results = {r.kind: r for r in replay(small_cnn, graphs=["inference", "forward", "backward"], threads=threads)}
    for kind, r in results.items():
        assert r.status == "mismatch", (kind, r.status)
        # the first node that departs from the recorded trace: the weight itself, a graph input
        # (for the backward: a saved activation its forward computes from the weight)
        rec = json.loads((small_cnn / f"small_cnn_{kind}_0" / "inputs.json").read_text())
        names = [i["name"] for i in rec["inputs"] if i["target"] == "conv2.weight" or i["role"] == "saved"]
        assert r.first_divergence.split(" (graph input): sum of its sampled elements")[0] in names, \
            r.first_divergence
    inf = results["inference"]
    # the logits (80 elements, all sampled): the figure is the element-wise error
    (err,) = [e for e in inf.errors if e.output.startswith("output 0")]
    assert err.elements == err.numel == 80 and 1e-5 < err.max_abs_error < 1
    if elsewhere:
        assert err.max_abs_error > err.bound and "over the bound" in inf.mismatches[0]
    else:
        assert "not bit-identical" in inf.mismatches[0] and "max abs error" in inf.mismatches[0]


@pytest.mark.parametrize("elsewhere", [False, True])
def test_op_swapped_in_graph_json_is_a_mismatch_naming_that_node(small_cnn, elsewhere):
    gj = small_cnn / "small_cnn_inference_0" / "graph.json"
    g = json.loads(gj.read_text())
    node = next(n for n in g["nodes"] if n.get("target") == "aten.relu.default")
    node["target"] = "aten.gelu.default"
    gj.write_text(json.dumps(g))
    reseal(small_cnn)
    threads = recorded(small_cnn)["threads"] + (1 if elsewhere else 0)
    (r,) = replay(small_cnn, graphs=["inference"], threads=threads)
    assert r.status == "mismatch"
    assert r.first_divergence.startswith(f"{node['name']} (gelu"), r.first_divergence
    out = CliRunner().invoke(main, ["replay", str(small_cnn), "--graph", "inference", "--threads", str(threads)])
    assert out.exit_code == 1 and f"first diverging node: {node['name']} (gelu" in out.output, out.output
    assert "max abs error" in out.output


def test_v1_and_v2_artefacts_replay_the_same_at_any_thread_count(tmp_path):
    """Made at 1 thread, replayed at 1 whatever the caller's count: the same statuses and
    errors each time (bit for bit where they were made; from another CPU, which they do not
    record, close within float noise: tests/helpers/replays.py)."""
    data = os.path.join(os.path.dirname(__file__), "data")
    for version in ("format_v1", "format_v2"):
        for model in ("mlp", "running_norm"):
            seen = []
            for caller in (1, 2, 4):
                was = torch.get_num_threads()
                torch.set_num_threads(caller)
                try:
                    art = load(os.path.join(data, version, model))
                    results = replay(art, threads=1)
                finally:
                    torch.set_num_threads(was)
                assert_match_or_close_for_want_of_a_recorded_cpu(results, art.manifest.environment)
                seen.append([(r.kind, r.status, r.max_abs_error) for r in results])
            assert seen[0] == seen[1] == seen[2], (version, model, seen)


def test_the_manifest_records_the_cpu_model_and_features(quickstart_run):
    root, _ = quickstart_run
    assert recorded(root / "small_cnn")["cpu"] == cpu_model()


def test_the_cpu_model_is_read_from_cpuinfo():
    x86 = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) "
           "Xeon(R) Platinum 8480+\nstepping\t: 8\nflags\t\t: fpu sse avx2 fma avx512f avx512_fp16 amx_tile ht\n\n"
           "processor\t: 1\nvendor_id\t: Other\n")
    cpu = cpu_from_cpuinfo(x86)
    assert cpu == "GenuineIntel 6/143/8 | amx_tile avx2 avx512_fp16 avx512f fma fpu ht sse"
    assert cpu_parts(cpu) == ("GenuineIntel 6/143/8", {"amx_tile", "avx2", "avx512_fp16", "avx512f", "fma"})
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16 crc32\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"
    assert cpu_from_cpuinfo(arm) == "arm 0x41/0xd40/? | asimd bf16 crc32 fp sve"
    fallback = cpu_from_cpuinfo("nothing: here")
    assert fallback == (" ".join(x for x in (platform.machine(), platform.processor()) if x) or "unknown")
    assert cpu_parts(fallback) == (fallback, frozenset())


def test_only_the_model_and_kernel_features_are_compared(small_cnn):
    """The recorded flags are all of them: flags that decide no kernel (a hypervisor's, a
    mitigation's) and their order change nothing; a kernel feature does."""
    m = json.loads((small_cnn / "manifest.json").read_text())
    ident, _, flags = m["environment"]["cpu"].partition(" | ")
    for recorded_flags, status in ((" ".join(reversed(flags.split())), "match"),
                                   (flags + " hypervisor_x md_clear_x", "match"),  # flags no kernel is chosen by
                                   (flags + " amx_fp16", "close")):
        m["environment"]["cpu"] = f"{ident} | {recorded_flags}"
        (small_cnn / "manifest.json").write_bytes(seal(m))
        (r,) = replay(small_cnn, graphs=["inference"])
        assert r.status == status, (recorded_flags[-30:], r.status, r.environment)


@pytest.mark.parametrize("other", ["model", "features", "unrecorded"])
def test_another_cpu_model_or_features_is_close_and_the_same_one_must_match(small_cnn, other):
    """Two CPUs of the same instruction set (cpu_capability AVX512 both) can give other GEMM
    bits: an artefact recorded on another CPU model, or one with other features, or one that
    does not say (an early version 3 artefact), is judged by evidence, the reason said. The
    planted fault: its recorded bits changed (a digest), it is close by evidence there, and a
    mismatch where the recorded CPU is this one."""
    m = json.loads((small_cnn / "manifest.json").read_text())
    here = m["environment"]["cpu"]
    ident = here.partition(" | ")[0]
    if other == "model":
        m["environment"]["cpu"] = "TestVendor 0/0/0 | " + here.partition(" | ")[2]  # no real CPU's
        why = f"other CPU model: {ident}, recorded TestVendor 0/0/0"
    elif other == "features":
        has = "amx_tile" in here.split()
        m["environment"]["cpu"] = here.replace(" amx_tile", "") if has else here + " amx_tile"
        why = "other CPU features than recorded: " + ("+amx_tile" if has else "-amx_tile")
    else:
        del m["environment"]["cpu"]
        why = "its CPU is not recorded: written before aotpipe recorded it"
    (small_cnn / "manifest.json").write_bytes(seal(m))
    assert verify_artifact(small_cnn) == []
    (r,) = replay(small_cnn, graphs=["inference"])
    if other == "unrecorded":  # bits that match are a match: nothing to excuse
        assert (r.status, r.environment) == ("match", []), (r.status, r.environment)
    else:
        assert (r.status, r.environment) == ("close", [why]), (r.status, r.environment)
    # another machine's bits: the recorded digest of the logits changed
    rec_path = small_cnn / "small_cnn_inference_0" / "inputs.json"
    rec = json.loads(rec_path.read_text())
    rec["outputs"][0]["digest"] = "0" * 64
    rec_path.write_text(json.dumps(rec))
    reseal(small_cnn)
    (r,) = replay(small_cnn, graphs=["inference"])
    assert (r.status, r.environment, r.bit_identical) == ("close", [why], False), (r.status, r.mismatches)
    m = json.loads((small_cnn / "manifest.json").read_text())
    m["environment"]["cpu"] = here
    (small_cnn / "manifest.json").write_bytes(seal(m))
    (r,) = replay(small_cnn, graphs=["inference"])
    assert r.status == "mismatch" and r.environment == [] and "not bit-identical" in r.mismatches[0], r.mismatches


def test_kernels_of_another_instruction_set_are_close(quickstart_run):
    """ATEN_CPU_CAPABILITY makes torch dispatch to another instruction set's kernels: the bits
    of some outputs change for real, and replay judges them by evidence."""
    root, _ = quickstart_run
    rec = recorded(root / "small_cnn")["cpu_capability"]
    if rec == "DEFAULT":
        pytest.skip("recorded with torch's DEFAULT kernels already: no other instruction set to force")
    out = subprocess.run([sys.executable, "-m", "aotpipe.cli", "replay", str(root / "small_cnn"), "--json"],
                         capture_output=True, text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    graphs = {g["kind"]: g for g in json.loads(out.stdout)["graphs"]}
    assert {g["status"] for g in graphs.values()} == {"close"}
    assert all(g["environment"][0] == f"other CPU: default, recorded {rec.lower()}" for g in graphs.values())
    bw = graphs["backward"]
    assert not bw["bit_identical"] and all(0 < e["max_abs_error"] <= e["bound"] for e in bw["errors"])


def test_bounds_come_from_eagers_measured_float64_error_joint_included(tmp_path, monkeypatch):
    """Where a check measured eager float32's error against float64, that output's evidence
    bound is derived from it, and the joint's outputs get their forward's and backward's."""
    import textwrap

    from aotpipe.checks import written as checks
    from aotpipe.runtime import accuracy

    real = accuracy.compare
    measured = {}

    def compare(actual, expected, reference=None, *, what="value", rel_floor=None, samples=()):
        c = real(actual, expected, reference, what=what, rel_floor=rel_floor, samples=samples)
        if isinstance(expected, torch.Tensor) and expected.is_floating_point():
            c.eager_error = measured.setdefault(what, 1e-3 * (len(measured) + 1))  # as if the fp64 rule ran
        return c

    monkeypatch.setattr(checks.accuracy, "compare", compare)
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent("""
        version: 1
        name: small
        models:
          - {name: a, source: aotpipe.zoo:mlp, args: {in_features: 8, hidden: 8}, inputs: [{shape: [2, 8]}]}
    """))
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--no-progress", "--executor", "local"])
    assert r.exit_code == 0, r.output
    art = load(tmp_path / "out" / "small" / "a")
    grads = {}
    for kind in ("backward", "joint"):
        for rec in art.graphs[kind].record.outputs:
            if rec.role == "grad" and rec.evidence is not None:
                ev = rec.evidence
                assert ev.bound_from == "fp64" and ev.eager_error == measured[f"gradient of {rec.target}"], kind
                m = accuracy.multiplier(torch.float32, math.prod(rec.shape))
                assert ev.bound > evidence.TAIL * 2 * m * ev.eager_error
                grads.setdefault(rec.target, []).append(ev.bound)
    assert grads and all(len(b) == 2 and b[0] == b[1] for b in grads.values())  # joint == backward
    (loss,) = [o for o in art.graphs["joint"].record.outputs if o.role == "user"]
    assert loss.evidence.eager_error == measured["loss"]
