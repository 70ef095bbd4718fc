"""Shared by the benchmarks: `--markdown [FILE]` writes a script's table to docs/benchmarks/<name>.md.

The page says which command made it, when, and on what (torch, threads, load average, commit),
so every figure the documentation quotes can be traced to the run that measured it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks"
_argv: Optional[list[str]] = None  # the command line as given, before take_markdown_option edited it


def default_page(name: str) -> Path:
    """docs/benchmarks/<name>.md: where a benchmark's table lives."""
    return DOCS / f"{name}.md"


def add_markdown_option(parser: argparse.ArgumentParser, name: str) -> None:
    """--markdown [FILE]: also write the table to FILE (default docs/benchmarks/<name>.md)."""
    parser.add_argument("--markdown", nargs="?", type=Path, const=default_page(name), default=None,
                        metavar="FILE", help=f"also write the table to FILE (default: docs/benchmarks/{name}.md)")


def take_markdown_option(name: str) -> Optional[Path]:
    """For scripts that read sys.argv themselves: remove `--markdown [FILE.md]` from it; the page to write."""
    global _argv
    argv = sys.argv
    _argv = list(argv[1:])
    if "--markdown" not in argv:
        return None
    i = argv.index("--markdown")
    del argv[i]
    if i < len(argv) and argv[i].endswith(".md"):
        return Path(argv.pop(i))
    return default_page(name)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def header(name: str, command: list[str]) -> str:
    """The first lines of a benchmark page: the command that wrote it, and what it ran on."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shown = " ".join(["python", f"benchmarks/{name}.py", *command])
    return (f"<!-- Written by `{shown}`. A measurement, not generated from the code: rerun the command "
            f"to refresh it. -->\n\n# {name}\n\nMeasured {when} at commit {_commit()}: torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op threads, {os.cpu_count()} CPUs, load average {load:.1f} when "
            f"the page was written. Read the ratios of tools measured side by side in the same run; absolute "
            f"times on a shared machine drift from run to run.\n\n")


def write_page(path: Path, name: str, body: str, command: Optional[list[str]] = None) -> None:
    """Write a benchmark page: the header, then BODY (the script's Markdown)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = command if command is not None else (_argv if _argv is not None else sys.argv[1:])
    path.write_text(header(name, args) + body.rstrip() + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


@contextlib.contextmanager
def tee_page(path: Optional[Path], name: str, command: Optional[list[str]] = None,
             preformatted: bool = False) -> Iterator[None]:
    """Print as usual; with a PATH, also write what was printed as the page's body (in a code
    block if PREFORMATTED: aligned plain text rather than Markdown tables)."""
    if path is None:
        yield
        return
    captured = io.StringIO()
    real = sys.stdout

    class _Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            real.write(s)
            return captured.write(s)

        def flush(self) -> None:
            real.flush()

    sys.stdout = _Tee()
    try:
        yield
    finally:
        sys.stdout = real
    body = captured.getvalue()
    write_page(path, name, f"```\n{body.rstrip()}\n```\n" if preformatted else body, command)
