"""aotpipe's words for what a graph is, how a model's run ended and where it stopped: each
an enum, defined here once, and the only place the words are spelled out.

The members are strings (``GraphKind.FORWARD == "forward"``, and their repr is the word's),
so they are written to JSON, compared with what older files hold and formatted into messages
as the plain words. A record field typed ``KindField`` (``StatusField``) takes the word, even
in a strict record, and holds the member; its JSON schema is the list of words, the same as a
``Literal`` of them, so the format's schema and its lock do not change with the type.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Strict, WithJsonSchema


class Word(str, Enum):
    """A member is its word: equal to it, and str(), format() and repr() give the word's.
    (enum.StrEnum would do but for repr, and is Python 3.11's: aotpipe runs on 3.10.)"""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    def __repr__(self) -> str:
        return str.__repr__(self)


class GraphKind(Word):
    """The kinds of graph a capture saves, in the order they are listed and replayed."""

    INFERENCE = "inference"
    FORWARD = "forward"
    BACKWARD = "backward"
    JOINT = "joint"
    # forward, loss, backward and the optimizer's update in one functional graph (capture/train_step.py)
    TRAIN_STEP = "train_step"


class ModelStatus(Word):
    """How a model's run ended (run.json's `status`)."""

    OK = "ok"
    PARTIAL = "partial"  # written and checked, but part of the model ran outside its graphs
    FAILED = "failed"


class Stage(Word):
    """The stages of a model's job, in order; a failure's `stage` in run.json is the one the
    job was at (`worker`: the executor lost the worker)."""

    SOURCE = "source"
    CAPTURE = "capture"
    PASSES = "passes"
    WRITE = "write"
    VERIFY = "verify"
    WORKER = "worker"


GRAPH_KINDS: tuple[GraphKind, ...] = tuple(GraphKind)
TRAINING_KINDS: tuple[GraphKind, ...] = (GraphKind.FORWARD, GraphKind.BACKWARD, GraphKind.JOINT)
# What `graphs:` holds when a pipeline does not say: a train_step needs an optimizer, so it is asked for by name.
DEFAULT_KINDS: tuple[GraphKind, ...] = (GraphKind.INFERENCE, *TRAINING_KINDS)
STAGES: tuple[Stage, ...] = tuple(Stage)


def words(enum: type[Word]) -> str:
    """The members' words joined by "|", for a regular expression: "inference|forward|..."."""
    return "|".join(m.value for m in enum)


def _inline(enum: type[Word]) -> WithJsonSchema:
    return WithJsonSchema({"enum": [m.value for m in enum], "type": "string"})


# Record and spec field types: the word in, the member out (lax even in a strict record: a
# strict enum field would take only members from Python, and no file holds a member).
KindField = Annotated[GraphKind, Strict(False), _inline(GraphKind)]
StatusField = Annotated[ModelStatus, Strict(False), _inline(ModelStatus)]
