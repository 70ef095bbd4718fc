"""Where an artefact's graphs run: in this process, or in the sandbox. One decision for every
command that runs graphs (replay, bench, diff, export-pt2).

Graphs run in this process only when the user says so (``--no-sandbox``) or when EVERY
artefact the command runs is trusted: signed by ``--key`` (or, without one, by a key the
user trusts: their own or one they added, see :mod:`aotpipe.trust.keyring`) and
unchanged since. One untrusted artefact (the unsigned side of a diff, one unsigned model of
a bench) sends them all to the sandbox, or is refused where a command has no sandboxed form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from aotpipe.format.folders import model_folder


@dataclass(frozen=True)
class SandboxDecision:
    """Whether the graphs run in this process, and each untrusted artefact with why (its
    first problem); `untrusted` is empty when ``--no-sandbox`` decided (nothing was checked)."""

    in_process: bool
    untrusted: tuple[tuple[Path, str], ...] = ()

    @property
    def why(self) -> Optional[str]:
        """The first untrusted artefact's problem, or None."""
        return self.untrusted[0][1] if self.untrusted else None


def decide_sandbox(paths: Sequence[str | Path], *, key: Optional[str], no_sandbox: bool) -> SandboxDecision:
    """Run the graphs of the artefacts at `paths` in this process, or in the sandbox: in this
    process if `no_sandbox`, or if every one of them is trusted (:func:`trust_problems` has
    nothing to say); else in the sandbox. A bad `key` file is the user's error, raised (unless
    `no_sandbox`, where no key is read)."""
    if no_sandbox:
        return SandboxDecision(True)
    untrusted = []
    for path in paths:
        problems = trust_problems(path, key)
        if problems:
            untrusted.append((Path(path), problems[0]))
    return SandboxDecision(not untrusted, tuple(untrusted))


def trust_problems(path: str | Path, key: Optional[str] = None) -> list[str]:
    """Why the artefact at `path` is not one to run in this process; [] if it is signed by
    `key` (or, without one, by a key the user trusts: their own or one they added, see
    :mod:`aotpipe.trust.keyring`) and every file is still the one its signed manifest lists.

    Reads and hashes only: no graph is built. A bad key file is the user's error, raised."""
    from aotpipe.trust.keyring import provenance_problems  # cryptography: only when used
    from aotpipe.trust.signing import check_signature  # cryptography: only when used
    from aotpipe.trust.verify import verify_artifact  # cryptography: only when used

    folder = model_folder(path)
    if key is None:
        return provenance_problems(folder)
    problems = check_signature(folder, key)
    if problems:
        return problems
    return verify_artifact(folder, load_graphs=False)
