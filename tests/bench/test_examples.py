"""The bench examples of `aotpipe bench --help`, README.md and docs/bench.md run as written: from
a clone's root (here a folder that links the clone's pipelines, tests and benchmarks), as a new
user with no key yet, after the quickstart's own `aotpipe run`, through the installed
`aotpipe` script (whose sys.path does not hold the current folder)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main

REPO = Path(__file__).resolve().parents[2]


def help_examples() -> list[str]:
    text = CliRunner().invoke(main, ["bench", "--help"]).output
    return [line.strip() for line in text.splitlines() if line.strip().startswith("aotpipe bench ")]


def doc_examples() -> list[str]:
    """`aotpipe bench artifacts/...` commands in README.md (in backticks) and docs/bench.md (code blocks)."""
    found = re.findall(r"`(aotpipe bench artifacts/[^`]*)`", (REPO / "README.md").read_text())
    for block in re.findall(r"```\n(.*?)```", (REPO / "docs" / "bench.md").read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        found += [re.sub(r"\s+#.*", "", line).strip() for line in text.splitlines()
                  if line.strip().startswith("aotpipe bench artifacts/")]
    return found


def test_there_are_examples_and_every_one_names_a_real_backend_or_a_planted_one():
    examples = help_examples() + doc_examples()
    assert len(help_examples()) >= 3 and doc_examples(), examples
    for cmd in examples:
        args = shlex.split(cmd)
        backend = args[args.index("--backend") + 1]
        assert backend in ("eager", "aot_eager", "inductor", "inductor-freezing") or \
            backend.startswith("tests.bench.backends:"), cmd


def _aotpipe() -> list[str]:
    script = Path(sys.executable).with_name("aotpipe")
    return [str(script)] if script.exists() else [sys.executable, "-c", "import sys; sys.path.pop(0); "
                                                  "from aotpipe.cli import main; main()"]


@pytest.mark.slow
def test_the_bench_examples_run_as_written(tmp_path):
    for name in ("pipelines", "tests", "benchmarks"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "AOTPIPE_CONFIG_DIR": str(tmp_path / "config"),
           "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p and Path(p).resolve() != REPO])}
    env.pop("AOTPIPE_NO_SANDBOX", None)

    def sh(cmd: str) -> subprocess.CompletedProcess:
        args = shlex.split(cmd)
        assert args[0] == "aotpipe"
        return subprocess.run(_aotpipe() + args[1:] + ["--no-progress"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=1500)

    examples = help_examples() + doc_examples()
    # Each pipeline an example reads is run first, only for the models the examples name (a rank's folder
    # `<model>.rankN` comes from the model `<model>`); a folder of the whole pipeline runs it whole.
    wanted: dict[str, set[str]] = {"quickstart": set()}
    for cmd in examples:
        for pipeline, model in re.findall(r"artifacts/([\w.-]+)(?:/([\w-]+))?", cmd):
            names = wanted.setdefault(pipeline, set())
            if model and names is not None:
                names.add(model)
            elif not model:
                wanted[pipeline] = None
    for pipeline, models in wanted.items():
        only = "".join(f" --only {m}" for m in sorted(models or ()))
        run = sh(f"aotpipe run pipelines/{pipeline}.yaml{only}")
        assert run.returncode == 0, run.stdout + run.stderr
    seen = set()
    for cmd in examples:
        if cmd in seen:
            continue
        seen.add(cmd)
        r = sh(cmd)
        out = r.stdout + r.stderr
        assert "Traceback" not in out and "not signed" not in out, (cmd, out)
        if ":gelu_as_relu" in cmd:  # a planted fault: exits 1 naming the gelu it computes as relu
            assert r.returncode == 1 and "fail_accuracy" in out and "gelu" in out, (cmd, out)
        else:
            assert r.returncode == 0, (cmd, out)
