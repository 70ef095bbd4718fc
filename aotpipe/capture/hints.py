"""What to try next when a capture fails: one clause appended to the failure's one line.

torch's capture errors say what went wrong in torch's terms (``GuardOnDataDependentSymNode``,
``DynamicOutputShapeException``, "captured no graph"); a user needs the line of their model
that caused it and a setting that may work. No torch import: these read messages only.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from aotpipe.spec.modes import CAPTURE_MODES

# The frame torch.export names as the model's: 'The following call raised this error:\n  File "x.py", line 3, in f\n    code'
_USER_FRAME = re.compile(r'The following call raised this error:\s*\n\s*File "([^"]+)", line (\d+), in \S+\s*\n\s*(.+)')
# dynamo's graph-break locations: 'Graph break ... at /path/x.py:12'
_DYNAMO_AT = re.compile(r"(\S+\.py):(\d+)")

_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent expression", "data dependent")
_RANDOM_BRANCH = "the model branches on a random number it draws"  # capture/export.py's RANDOM_BRANCH


def where_in_model(text: str) -> Optional[str]:
    """'file:line (`code`)' of the model code a torch capture error names, if it names one."""
    m = _USER_FRAME.search(text)
    if m:
        return f"{m.group(1)}:{m.group(2)} (`{m.group(3).strip()}`)"
    return None


def chain_text(e: BaseException) -> str:
    """The text of an exception and of those it was raised from (torch's detail is in the cause)."""
    parts, seen = [], set()
    cur: Optional[BaseException] = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(str(cur)[:20000])
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


# Model configs known to make capture fail, and the setting that fixes each: (what torch's
# error says, the hint). transformers' GPT-2, Llama and kin return their key/value cache (a
# DynamicCache, a Cache subclass) unless use_cache is off, and pytree cannot flatten it.
_CONFIG_HINTS = (
    (re.compile(r"Found <class '[\w.]*(Cache|cache_utils\.\w+)'> in output"),
     "the model returns a transformers cache object (its config's use_cache is on), which capture cannot "
     "flatten: set use_cache: false under config"),
)


def config_hint(text: str) -> Optional[str]:
    """The model-config setting that fixes the capture failure `text` says, if one is known."""
    for pattern, hint in _CONFIG_HINTS:
        if pattern.search(text):
            return hint
    return None


def config_hint_applies(text: str, model: Any) -> bool:
    """Whether :func:`config_hint`'s setting is one `model`'s config can take: its top-level
    `use_cache` is on. T5Gemma returns its cache whatever its stacks' use_cache says and its
    own config has none: the hint cannot be followed, and dynamo captures it."""
    return config_hint(text) is not None and bool(getattr(getattr(model, "config", None), "use_cache", False))


def capture_hint(mode: str, error: str, detail: str = "") -> str:
    """What to try next after a capture in `mode` failed with `error` (its one line);
    `detail` is the full text of torch's exception, where the model's own line is found."""
    where = where_in_model(detail) or where_in_model(error)
    at = f" at {where}" if where else ""
    text = error + "\n" + detail
    via_export = mode in CAPTURE_MODES and CAPTURE_MODES[mode].via_export
    if config_hint(text):
        return config_hint(text)  # type: ignore[return-value]
    if _RANDOM_BRANCH in text:
        return (f"in training the model takes a branch by a random draw{at} (a layer drop): no one graph holds "
                "every draw's branch; turn the random skip off in its config (layerdrop: 0.0, or the model's own "
                "name for it), or capture graphs: [inference] only (eval mode draws nothing)")
    if any(k in text for k in _DATA_DEPENDENT):
        if via_export:
            return (f"the model branches on a tensor's values{at}: use mode: auto (the default; dynamo captures "
                    "around the branch), or write the branch with torch.cond")
        return f"the model depends on a tensor's values{at}: write the branch with torch.cond, or capture with mode: dynamo"
    if "DynamicOutputShapeException" in text:
        return (f"an op's output size depends on tensor values{at} (nonzero, boolean indexing): mode: export traces "
                "such ops; in dynamo mode a graph break inside a loop skips the whole function")
    if "captured no graph" in text:
        return ("dynamo ran the model eagerly (a graph break inside a loop skips the whole function; run with -v to "
                "see it): try mode: export")
    if error.startswith("train_step: "):  # a step is made from export's joint: dynamo's fallback cannot help
        return "rerun with -v for torch's traceback"
    if mode == "dynamo" and ("Unsupported" in text or "torch.compile" in text):
        return "try mode: export (torch.export), or rerun with -v for the traceback"
    if via_export:
        return f"try mode: auto (falls back to dynamo){at}, or rerun with -v for torch's traceback"
    return "rerun with -v for torch's traceback"


def with_hint(mode: str, error: str, detail: str = "") -> str:
    """`error` with `; try next: ...` unless it already says what to try."""
    if "; next:" in error:
        return error
    return f"{error}; next: {capture_hint(mode, error, detail)}"
