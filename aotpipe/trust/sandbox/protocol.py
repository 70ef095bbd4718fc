"""The sandbox's two messages, typed: what the caller asks of a worker (request.json) and
what the worker answers (result.json), and the files they travel in. Both sides build and
read them through these classes. Plain dataclasses, so that the worker starts on the
standard library alone (its first progress mark and its rlimits come before anything
heavier); the caller validates the answer with pydantic (launch.py), since a hostile graph
may have taken the worker over, and an answer that does not fit is no answer at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

PROTOCOL = 1
REQUEST = "request.json"
RESULT = "result.json"
PROGRESS = "progress"

# Read by pydantic where the caller validates an answer: no key the protocol does not name.
_FORBID_EXTRA = {"extra": "forbid"}


@dataclass
class SandboxRequest:
    """request.json: the task to run (a name of worker.TASKS), its arguments, and the limits."""

    __pydantic_config__ = _FORBID_EXTRA

    protocol: Literal[1]
    task: str
    args: Any  # the task's own JSON arguments
    limits: dict[str, Union[int, float, None]]  # launch.SandboxLimits' fields: rlimits set before torch loads
    byte_limits: dict[str, Any] = field(default_factory=dict)  # format.limits.Limits' fields in force


@dataclass
class SandboxResult:
    """result.json: how the task ended ("ok" with its value, a user error's lines, "memory",
    or another error's line), where it was when it did, and what the canary tensors saw."""

    __pydantic_config__ = _FORBID_EXTRA

    protocol: Literal[1]  # required: a file without it is no message of this protocol
    status: Literal["ok", "user_error", "memory", "error"]
    value: Any = None  # "ok": the task's JSON result
    lines: list[str] = field(default_factory=list)  # "user_error": the error's lines
    exit_code: Optional[int] = None  # "user_error"
    line: Optional[str] = None  # "error": the exception in one line
    during: Optional[str] = None  # the progress mark when the task ended
    canaries: Optional[str] = None  # "intact", or what was overwritten
