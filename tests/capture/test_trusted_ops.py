"""A library's custom op with no ATen decomposition: kept only when the pipeline trusts its
namespace (trusted_ops, recorded in the manifest), run at load only when the user grants the
same trust (--trust-ops), which imports the library; never silently.

The library is tests/data/aptestops (op aptestops::scaled_tanh, with fake and autograd
registrations). Loads run in fresh processes, where nothing has registered the op yet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import ConfigError
from aotpipe.pipeline.config import parse_pipeline

LIBRARY = Path(__file__).resolve().parent.parent / "data" / "aptestops"

PIPELINE = """
version: 1
name: lib
{trusted}
models:
  - name: tiny
    source: aptestops:tiny
    inputs: [{{name: x, shape: [2, 8]}}]
"""


def _pipeline(tmp_path: Path, trusted: str = "") -> Path:
    """A pipeline beside a copy of the library (the pipeline's folder is on the model's path)."""
    if not (tmp_path / "aptestops").exists():
        shutil.copytree(LIBRARY, tmp_path / "aptestops", ignore=shutil.ignore_patterns("__pycache__"))
    p = tmp_path / "p.yaml"
    p.write_text(textwrap.dedent(PIPELINE.format(trusted=trusted)))
    return p


def _run(tmp_path: Path, trusted: str) -> dict:
    p = _pipeline(tmp_path, trusted)
    r = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "out"), "--no-progress", "--json"])
    (m,) = json.loads(r.stdout)["models"]
    return m


def _cli(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a fresh process (no library imported), the library on its path if given."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "aotpipe.cli", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def trusted_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trusted")
    m = _run(tmp, "trusted_ops: [aptestops]")
    return tmp, tmp / "out" / "lib" / "tiny", m


def test_an_untrusted_library_op_fails_the_capture_saying_how_to_trust_it(tmp_path):
    m = _run(tmp_path, "")
    assert m["status"] == "failed" and m["stage"] == "capture", m
    assert "aptestops::scaled_tanh" in m["error"] and "trusted_ops: [aptestops]" in m["error"], m["error"]
    assert not (tmp_path / "out" / "lib" / "tiny").exists()


def test_a_trusted_library_op_is_kept_recorded_and_checked(trusted_run):
    _, art, m = trusted_run
    assert m["status"] == "ok", m
    assert sorted(g["kind"] for g in m["graphs"]) == ["backward", "forward", "inference", "joint"]
    assert m["checks"]["failed"] == 0 and m["checks"]["run"] > 0, m["checks"]
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["capture"]["trusted_ops"] == {"aptestops": {"module": "aptestops",
                                                                "ops": ["aptestops::scaled_tanh"]}}
    assert manifest["model"]["trusted_ops"] == ["aptestops"]
    ops = {n["target"] for gj in art.rglob("graph.json") for n in json.loads(gj.read_text())["nodes"]
           if n["op"] == "call_function"}
    assert "aptestops.scaled_tanh.default" in ops


def test_loading_needs_the_users_trust_and_then_imports_the_library(trusted_run):
    tmp, art, _ = trusted_run
    refused = _cli("replay", str(art), pythonpath=tmp)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert "--trust-ops aptestops" in refused.stderr, refused.stderr
    ok = _cli("replay", str(art), "--trust-ops", "aptestops", "--json", pythonpath=tmp)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["ok"] and len(out["graphs"]) == 4, out
    verified = _cli("verify", str(art), "--trust-ops", "aptestops", pythonpath=tmp)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    not_verified = _cli("verify", str(art), pythonpath=tmp)
    assert not_verified.returncode == 1 and "--trust-ops aptestops" in not_verified.stdout
    shown = _cli("show", str(art), "--trust-ops", "aptestops", pythonpath=tmp)
    assert shown.returncode == 0 and "aptestops.scaled_tanh.default" in shown.stdout, shown.stderr


def test_trust_without_the_library_installed_says_so(trusted_run):
    _, art, _ = trusted_run
    r = _cli("replay", str(art), "--trust-ops", "aptestops")  # not on the path
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "importing aptestops" in r.stderr and "install the library" in r.stderr, r.stderr


def _forge(art: Path, dest: Path, edit) -> Path:
    """A copy of the artefact whose manifest `edit` changed, resealed (as a forger would)."""
    shutil.copytree(art, dest)
    m = json.loads((dest / "manifest.json").read_text())
    edit(m)
    (dest / "manifest.json").write_bytes(seal(m))
    return dest


def test_an_artefact_cannot_make_the_loader_import_a_module_outside_the_trusted_package(trusted_run, tmp_path):
    tmp, art, _ = trusted_run
    marker = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")

    def point_elsewhere(m):
        m["capture"]["trusted_ops"]["aptestops"]["module"] = "evilmod"

    forged = _forge(art, tmp_path / "forged", point_elsewhere)
    r = _cli("replay", str(forged), "--trust-ops", "aptestops", pythonpath=tmp_path)
    assert r.returncode != 0 and not marker.exists(), r.stderr
    assert "--trust-ops aptestops=evilmod" in r.stderr, r.stderr  # the user may, by naming it


def test_a_graph_calling_a_namespace_its_manifest_does_not_record_is_refused_even_when_trusted(trusted_run, tmp_path):
    tmp, art, _ = trusted_run

    def drop(m):
        del m["capture"]["trusted_ops"]

    forged = _forge(art, tmp_path / "forged", drop)
    r = _cli("replay", str(forged), "--trust-ops", "aptestops", pythonpath=tmp)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "aptestops.scaled_tanh.default" in r.stderr, r.stderr


@pytest.mark.parametrize("bad", ["aten", "prims", "my-lib", "__builtins__"])
def test_trusting_a_namespace_the_allow_list_checks_or_a_non_name_is_a_config_error(bad):
    with pytest.raises(ConfigError) as e:
        parse_pipeline(textwrap.dedent(PIPELINE.format(trusted=f"trusted_ops: [{bad!r}]")), check_sources=False)
    assert "trusted_ops" in str(e.value)


def test_trust_is_part_of_the_fingerprint_and_absent_when_empty():
    plain = parse_pipeline(textwrap.dedent(PIPELINE.format(trusted="")), check_sources=False).models[0]
    trusting = parse_pipeline(textwrap.dedent(PIPELINE.format(trusted="trusted_ops: [aptestops]")),
                              check_sources=False).models[0]
    assert "trusted_ops" not in plain.to_json()  # artefacts made before the field stay up to date
    assert trusting.to_json()["trusted_ops"] == ["aptestops"]


@pytest.mark.parametrize("bad", ["aten", "x=../evil", "a b"])
def test_a_malformed_trust_ops_is_a_one_line_error(bad, trusted_run):
    _, art, _ = trusted_run
    r = CliRunner().invoke(main, ["verify", str(art), "--trust-ops", bad])
    assert r.exit_code == 2 and "error: --trust-ops" in r.output and "Traceback" not in r.output, r.output
