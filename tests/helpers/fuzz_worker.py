"""A long-lived process that runs `aotpipe` commands for the artefact fuzzer, one per line.

The fuzzer (tests/artifact/test_fuzz_artifacts.py) starts it once and sends it one JSON
line per case: ``{"args": [...]}``, with ``"env": {...}`` for environment variables set (or,
given as null, unset) for that case only (a lowered limit, the sandbox switched back on). It
answers with one JSON line: the exit code, what the command printed, the traceback of any
exception that escaped the command, the process's peak RSS so far, and whether torch's
global state was left as it was. A case that kills the process (a segfault, an abort) or
hangs is seen by the fuzzer as the process ending or not answering: it runs the next case
in a fresh worker. Importing torch once per worker
instead of once per case is what lets thousands of cases run within CI's time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import time
import traceback


def _state() -> tuple:
    import torch

    return (torch.is_grad_enabled(), torch.initial_seed(), torch.get_default_dtype(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(), torch.is_inference_mode_enabled())


def main() -> None:
    import click
    import torch  # noqa: F401 (imported once, before the first case)

    from aotpipe.cli import main as cli

    before = _state()
    out = sys.stdout
    for line in sys.stdin:
        case = json.loads(line)
        saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
        for k, v in case.get("env", {}).items():  # None: unset for this case
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stdout, stderr = io.StringIO(), io.StringIO()
        rc, exc = 0, None
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                rc = cli.main(args=case["args"], prog_name="aotpipe", standalone_mode=False) or 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except click.exceptions.Exit as e:
                rc = e.exit_code
            except click.ClickException as e:  # a usage error: click prints it in one line
                e.show(file=stderr)
                rc = e.exit_code
            except BaseException:  # noqa: BLE001 (what the fuzzer looks for)
                exc = traceback.format_exc()
                rc = None
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        after = _state()
        out.write(json.dumps({
            "rc": rc,
            "stdout": stdout.getvalue()[:8000],
            "stderr": stderr.getvalue()[:8000],
            "exception": exc,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "state_changed": None if after == before else f"{before} -> {after}",
            "seconds": time.perf_counter() - t0,
        }) + "\n")
        out.flush()


if __name__ == "__main__":
    main()


class Worker:
    """The test side: starts this module as a process and sends it cases, one at a time,
    restarting it when a case ends it (a crash) or it stops answering (a hang)."""

    def __init__(self, env: dict | None = None, timeout_s: float = 60, restart_every: int = 1000) -> None:
        self.env = env or {}
        self.timeout_s = timeout_s
        self.restart_every = restart_every
        self.proc = None
        self.cases = 0
        self.base_rss = self.last_rss = None

    def start(self) -> None:
        import subprocess
        from pathlib import Path

        repo = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", **self.env)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fuzz_worker"], cwd=repo, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.cases, self.base_rss, self.last_rss = 0, None, None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, args: list, env: dict | None = None) -> dict:
        """One command's result: rc, stdout, stderr, exception, maxrss_mb, seconds,
        state_changed, and rss_growth_mb (the peak's growth since the worker's first case);
        or {"died": why}."""
        import select

        if self.proc is None or self.cases >= self.restart_every:
            self.stop()
            self.start()
        self.cases += 1
        self.proc.stdin.write(json.dumps({"args": [str(a) for a in args], "env": env or {}}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
        if not ready:
            self.stop()
            return {"died": f"no answer within {self.timeout_s} s (a hang)"}
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            self.proc = None
            return {"died": f"the worker ended with {rc} (a crash){': ' + err if err else ''}"}
        r = json.loads(line)
        if self.base_rss is None:
            self.base_rss = self.last_rss = r["maxrss_mb"]
        r["rss_growth_mb"] = r["maxrss_mb"] - self.base_rss
        r["case_growth_mb"] = r["maxrss_mb"] - self.last_rss  # what this case added to the peak
        self.last_rss = r["maxrss_mb"]
        return r
