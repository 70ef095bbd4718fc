"""One vocabulary: graph kinds, model statuses and job stages are enums defined once, in
aotpipe/format/vocabulary.py. Their members are the words themselves (in JSON, messages and
comparisons with what older files hold), records take the words and hold the members, and
no other module spells a set of the words out again."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from aotpipe.format.records import InputsRecord, ModelRun
from aotpipe.format.vocabulary import (
    DEFAULT_KINDS,
    GRAPH_KINDS,
    STAGES,
    TRAINING_KINDS,
    GraphKind,
    ModelStatus,
    Stage,
    words,
)

ROOT = Path(__file__).resolve().parent.parent
VOCABULARY = ROOT / "aotpipe/format/vocabulary.py"


def test_members_are_their_words_wherever_they_are_shown():
    k = GraphKind.FORWARD
    assert k == "forward" and hash(k) == hash("forward") and {"forward": 1}[k] == 1
    assert (str(k), repr(k), f"{k}", f"{k:>8}", " ".join([k])) == ("forward", "'forward'", "forward", " forward", "forward")
    assert json.dumps({"kind": k, "stage": Stage.WORKER}) == '{"kind": "forward", "stage": "worker"}'
    assert GraphKind("joint") is GraphKind.JOINT


def test_the_orders_are_the_documented_ones():
    assert GRAPH_KINDS == ("inference", "forward", "backward", "joint", "train_step")
    assert TRAINING_KINDS == ("forward", "backward", "joint")
    assert DEFAULT_KINDS == ("inference", "forward", "backward", "joint")  # train_step needs an optimizer: asked for
    assert STAGES == ("source", "capture", "passes", "write", "verify", "worker")
    assert list(ModelStatus) == ["ok", "partial", "failed"]
    assert words(GraphKind) == "inference|forward|backward|joint|train_step"


def test_a_strict_record_takes_the_word_holds_the_member_and_refuses_other_words():
    run = ModelRun(name="m", status="partial")
    assert run.status is ModelStatus.PARTIAL
    assert json.loads(run.model_dump_json())["status"] == "partial"
    assert ModelRun.model_validate_json('{"name": "m", "status": "failed"}').status is ModelStatus.FAILED
    with pytest.raises(ValidationError, match="Input should be 'ok', 'partial' or 'failed'"):
        ModelRun(name="m", status="skipped")
    with pytest.raises(ValidationError):
        ModelRun.model_validate({"name": "m", "status": 1})  # still strict about the type
    schema = InputsRecord.model_json_schema()["properties"]["kind"]
    assert schema == {"enum": list(GRAPH_KINDS), "type": "string"}  # the file format's schema: the words


def _sets_of_words(source: str) -> list[tuple[int, list[str]]]:
    """(line, words) of each tuple, list or set literal of two or more strings, all words of
    one vocabulary."""
    vocabularies = [set(GraphKind), set(ModelStatus), set(Stage)]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = [e.value for e in node.elts]
                if any(set(values) <= v for v in vocabularies):
                    found.append((node.lineno, values))
    return found


def test_no_module_spells_out_a_set_of_the_words_again():
    spelled = [f"{p.relative_to(ROOT)}:{line}: {values}"
               for p in sorted((ROOT / "aotpipe").rglob("*.py")) if p != VOCABULARY
               for line, values in _sets_of_words(p.read_text(encoding="utf-8"))]
    assert spelled == [], "use aotpipe.format.vocabulary's enums:\n" + "\n".join(spelled)


def test_a_set_of_words_spelled_out_is_found():
    assert _sets_of_words('KINDS = ("forward", "backward")\nx = ("capture", "checks")\n') == \
        [(1, ["forward", "backward"])]
    assert _sets_of_words('if s in {"ok", "partial"}: pass\n') == [(1, ["ok", "partial"])]
