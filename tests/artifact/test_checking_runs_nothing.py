"""Checking an artefact never runs a graph: `verify`, `verify --key`, `show`, `ls`, `sign`,
`ops`, `report` and `aotpipe.load(...).build_all()` read and hash only.

A pass graph whose constants are marked `recompute` is rebuilt, on replay, by running the
pass chain on its base graph. The spies below record that (the loader's call of
recompute_constants) and any convolution kernel (the base graph is a CNN; loading runs
none): each checking path must leave both untouched, and the positive control (replaying
the graph) shows the spies do see a run.
"""

import json
import shutil
import textwrap

import pytest
import torch
from click.testing import CliRunner
from torch.utils._python_dispatch import TorchDispatchMode

import aotpipe
from aotpipe.artifact import recompute
from aotpipe.cli import main

CHAIN = "inference.freeze+fold_conv_bn+channels_last"


@pytest.fixture(scope="module")
def recomputed(tmp_path_factory):
    """A small CNN artefact whose pass graph's folded constants are recomputed at load."""
    from aotpipe.artifact import writer

    tmp = tmp_path_factory.mktemp("recompute")
    (tmp / "p.yaml").write_text(textwrap.dedent("""
        version: 1
        name: c
        defaults: {graphs: [inference], passes: [freeze, fold_conv_bn, channels_last], save_values: minimal}
        models: [{name: cnn, source: aotpipe.zoo:small_cnn, args: {channels: 4}, inputs: [{shape: [2, 3, 8, 8]}]}]
    """))
    with pytest.MonkeyPatch.context() as mp:  # a tiny model: recompute whatever its size
        mp.setattr(writer, "RECOMPUTE_MIN_BYTES", 0)
        mp.setattr(writer, "RECOMPUTE_MIN_SHARE", 0.0)
        r = CliRunner().invoke(main, ["run", str(tmp / "p.yaml"), "-o", str(tmp / "out"), "--no-progress",
                                      "--executor", "local"])
    assert r.exit_code == 0, r.output
    folder = tmp / "out" / "c" / "cnn"
    gj = json.loads(next(folder.glob("cnn_inference_0.*")).joinpath("graph.json").read_text())
    assert any(n.get("recompute") for n in gj["nodes"])  # the case under test
    return folder


@pytest.fixture()
def copy(recomputed, tmp_path):
    dst = tmp_path / "lib" / "cnn"
    shutil.copytree(recomputed, dst)
    return dst


class _Kernels(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.convolutions = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.convolutions += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture()
def spy(monkeypatch):
    """Records every recompute of constants and every convolution run while active."""
    calls = []
    real = recompute.recompute_constants

    def recording(*args, **kwargs):
        calls.append("recompute_constants")
        return real(*args, **kwargs)

    monkeypatch.setattr(recompute, "recompute_constants", recording)
    kernels = _Kernels()
    with kernels:
        yield calls, kernels


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.fixture()
def hmac_key(tmp_path):
    key = tmp_path / "secret.key"
    key.write_bytes(bytes(range(64)))
    return key


def test_the_spies_see_a_replay_recompute_and_run_the_graph(copy, spy):
    calls, kernels = spy
    art = aotpipe.load(copy)
    assert calls == [] and kernels.convolutions == 0  # loading alone runs nothing
    from aotpipe.replay import replay

    (res,) = replay(art, graphs=[CHAIN])
    assert res.status == "match"
    assert calls == ["recompute_constants"] and kernels.convolutions > 0


@pytest.mark.parametrize("command", ["verify", "verify --key", "show", "ls", "sign", "ops", "report", "build_all"])
def test_checking_commands_never_run_a_graph(copy, spy, hmac_key, command):
    calls, kernels = spy
    if command == "verify":
        r = cli("verify", copy.parent)
        assert r.exit_code == 0 and "1/1 artefacts ok" in r.output, r.output
    elif command == "verify --key":
        from aotpipe.trust.verify import sign_artifact

        sign_artifact(copy, f"hmac:{hmac_key}")
        r = cli("verify", copy.parent, "--key", f"hmac:{hmac_key}")
        assert r.exit_code == 0 and "1/1 artefacts ok" in r.output, r.output
    elif command == "show":
        r = cli("show", copy)
        assert r.exit_code == 0 and "cnn_inference_0.freeze+fold_conv_bn+channels_last: " in r.output, r.output
    elif command == "ls":
        r = cli("ls", copy.parent)
        assert r.exit_code == 0 and "verified" in r.output, r.output
    elif command == "sign":
        r = cli("sign", copy.parent, "--key", f"hmac:{hmac_key}")
        assert r.exit_code == 0 and "signed  " in r.output, r.output
    elif command == "ops":
        r = cli("ops", copy.parent)
        assert r.exit_code == 0 and "aten.convolution.default " in r.output, r.output
    elif command == "report":
        r = cli("report", copy.parent)
        assert r.exit_code == 0 and "aten.convolution.default" in (copy.parent / "report.html").read_text(), r.output
    else:
        art = aotpipe.load(copy).build_all()
        gm = art.graphs[CHAIN].structure
        gj = json.loads((art.graphs[CHAIN].folder / "graph.json").read_text())
        recomputed = {n["target"] for n in gj["nodes"] if n.get("recompute")}
        devices = {n.target: getattr(gm, n.target).device.type for n in gm.graph.nodes if n.op == "get_attr"}
        assert recomputed and all(devices[t] == "meta" for t in recomputed)  # left for a replay
        assert any(d == "cpu" for t, d in devices.items() if t not in recomputed)  # stored ones are read
    assert calls == [] and kernels.convolutions == 0, (calls, kernels.convolutions)


def test_verify_still_catches_a_pass_graph_whose_module_py_differs(copy):
    g = next(copy.glob("cnn_inference_0.*"))
    text = (g / "module.py").read_text()
    (g / "module.py").write_text(text.replace("torch.ops.aten.relu.default", "torch.ops.aten.neg.default", 1))
    from tests.artifact.test_signing import _reseal

    _reseal(copy)
    r = cli("verify", copy.parent)
    assert r.exit_code == 1 and "module.py does not match graph.json" in r.output and "aten.neg" in r.output


@pytest.mark.parametrize("case", ["unsigned", "forged signature"])
def test_verify_with_a_key_stops_at_a_bad_signature_before_reading_any_graph(copy, hmac_key, monkeypatch, case):
    if case == "unsigned":  # as a copy from elsewhere comes (run signed it with the suite's own key)
        (copy / "signature.json").unlink(missing_ok=True)
    if case == "forged signature":
        from aotpipe.trust.verify import sign_artifact

        other = hmac_key.parent / "other.key"
        other.write_bytes(bytes(range(100, 164)))
        sign_artifact(copy, f"hmac:{other}")
    read = []
    from aotpipe.artifact import graph_json, load
    from aotpipe.trust import verify

    def spy(name, real):
        def recording(*args, **kwargs):
            read.append(name)
            return real(*args, **kwargs)
        return recording

    for mod, name in [(graph_json, "read_graph_json"), (load, "read_graph_json"), (load, "load"),
                      (verify, "verify_artifact"), (verify, "read_manifest")]:
        monkeypatch.setattr(mod, name, spy(name, getattr(mod, name)))
    r = cli("verify", copy.parent, "--key", f"hmac:{hmac_key}")
    assert r.exit_code == 1, r.output
    want = "signature.json: missing (the artefact is not signed" if case == "unsigned" else "signed with another key"
    assert want in r.output
    assert read == [], read  # neither the manifest nor any graph was parsed
