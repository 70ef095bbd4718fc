"""User errors: problems with what the user gave us, as opposed to bugs in aotpipe.

The CLI prints an :class:`AotpipeError` as one line per problem and exits 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass


MAX_LINE = 1000  # characters of one printed error line


def printable(text: str, *, names: bool = False) -> str:
    """`text` safe to print on a terminal: control and format characters (escape sequences,
    NUL, carriage returns, bidirectional overrides, zero-width marks), line separators and
    lone surrogates (undecodable file-name bytes) escaped as Python writes them (\\x1b,
    \\u202e, \\udcff). With `names` (file, folder and model names, artefact-supplied text),
    every non-ASCII character is escaped too, so that a name that looks like another (a
    Cyrillic letter for a Latin one) never prints like it."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        out.append(ascii(ch)[1:-1] if (names and ord(ch) > 127) or cat[0] == "C" or cat in ("Zl", "Zp") else ch)
    return "".join(out)


def exception_line(e: BaseException, limit: int = 300) -> str:
    """An exception in one short line: its class and the first line of its message (torch's
    messages run to many lines, with tensors and schemas in them)."""
    text = str(e).strip()
    first = text.splitlines()[0].strip() if text else ""
    if len(first) > limit:
        first = first[:limit] + "..."
    return f"{e.__class__.__name__}: {first}" if first else e.__class__.__name__


class AotpipeError(Exception):
    """Base class of every error caused by the user's input."""

    exit_code = 2

    def lines(self) -> list[str]:
        """The messages to print, one per problem: each on one line, of bounded length,
        whatever it quotes."""
        line = printable(" ".join(str(self).split()))
        return [line if len(line) <= MAX_LINE else line[:MAX_LINE] + " ..."]


@dataclass(frozen=True)
class Problem:
    """One problem in a config file: where it is, which field, and what would fix it."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        place = f"{self.file}:{self.line}" if self.line is not None else self.file
        field = f" {self.field}:" if self.field else ""
        return f"{place}:{field} {self.message}"


class ConfigError(AotpipeError):
    """A pipeline file is wrong; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def lines(self) -> list[str]:
        return [printable(" ".join(str(p).split())) for p in self.problems]


class SourceError(AotpipeError):
    """A model source could not be imported or built."""


class CaptureError(AotpipeError):
    """A model could not be traced into graphs."""


class ArtifactError(AotpipeError):
    """An artefact on disk is missing, malformed, of an unknown version, or unsafe."""


class LimitError(ArtifactError):
    """A file or what it asks for is over one of aotpipe's limits (size, depth, nodes, bytes);
    raised before the read or allocation it guards."""


class SandboxUnavailable(AotpipeError):
    """The sandbox an untrusted graph must run in cannot start here (bubblewrap missing, or
    the kernel refuses its namespaces)."""


class SandboxError(AotpipeError):
    """A graph crashed, corrupted memory in, or overran the sandboxed worker that ran it: a
    result about the artefact (exit 1), reported in one line; the caller is unharmed.

    `kind` says which, for programs (the artefact fuzzer's oracle): "crashed" (a signal),
    "corrupted" (a canary tensor changed), "memory", "cpu_time", "wall_time", "malformed"
    (the worker's result), "failed" (the worker itself)."""

    exit_code = 1

    def __init__(self, message: str, kind: str = "failed"):
        super().__init__(message)
        self.kind = kind
