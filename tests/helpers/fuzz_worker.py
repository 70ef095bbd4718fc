"""A long-lived process that runs `aotpipe` commands for the artefact fuzzer, one per line.

The fuzzer (tests/artifact/test_fuzz_artifacts.py) starts it once and sends it one JSON
line per case: ``{"args": [...]}``. It answers with one JSON line: the exit code, what the
command printed, the traceback of any exception that escaped the command, the process's
peak RSS so far, and whether torch's global state was left as it was. A case that kills
the process (a segfault, an abort) or hangs is seen by the fuzzer as the process ending
or not answering: it runs the next case in a fresh worker. Importing torch once per worker
instead of once per case is what lets thousands of cases run within CI's time.
"""

from __future__ import annotations

import contextlib
import io
import json
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
