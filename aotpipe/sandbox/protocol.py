"""The sandbox's two messages, typed: what the caller asks of a worker (request.json) and
what the worker answers (result.json). Both sides build and read them through these
classes; the answer is untrusted (a hostile graph may have taken the worker over), so it
is validated, and one that does not fit is no answer at all."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

PROTOCOL = 1


class SandboxRequest(BaseModel):
    """request.json: the task to run (a name of worker.TASKS), its arguments, and the limits."""

    model_config = ConfigDict(extra="forbid")

    protocol: Literal[1]  # required: a file without it is no message of this protocol
    task: str
    args: Any  # the task's own JSON arguments
    limits: dict[str, Union[int, float]]  # launch.SandboxLimits' fields: rlimits set before torch loads
    byte_limits: dict[str, Any] = {}  # format.limits.Limits' fields in force in the caller


class SandboxResult(BaseModel):
    """result.json: how the task ended ("ok" with its value, a user error's lines, "memory",
    or another error's line), where it was when it did, and what the canary tensors saw."""

    model_config = ConfigDict(extra="forbid")

    protocol: Literal[1]  # required: a file without it is no message of this protocol
    status: Literal["ok", "user_error", "memory", "error"]
    value: Any = None  # "ok": the task's JSON result
    lines: list[str] = []  # "user_error": the error's lines
    exit_code: Optional[int] = None  # "user_error"
    line: Optional[str] = None  # "error": the exception in one line
    during: Optional[str] = None  # the progress mark when the task ended
    canaries: Optional[str] = None  # "intact", or what was overwritten
