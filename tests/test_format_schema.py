"""docs/format/ is generated from the records (tools/format_schema.py), and field changes keep to
the compatibility rule of docs/format/README.md."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Optional

import pytest
from pydantic import create_model

from aotpipe.format import records

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("format_schema", ROOT / "tools" / "format_schema.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


@pytest.fixture
def committed(tmp_path):
    """A copy of the committed docs/format/ to regenerate into."""
    out = tmp_path / "format"
    shutil.copytree(ROOT / "docs" / "format", out)
    return out


def _lock(out):
    return json.loads((out / tool.LOCK).read_text())


def test_committed_schema_is_what_the_code_generates():
    problems = tool.stale()
    assert problems == [], "\n".join(problems) + "\nrun: python tools/format_schema.py"


def test_schema_covers_the_record_files_other_tools_read():
    names = sorted(p.name for p in (ROOT / "docs" / "format").glob("*.schema.json"))
    assert {"manifest.schema.json", "graph.schema.json", "inputs.schema.json", "run.schema.json"} <= set(names)
    run = json.loads((ROOT / "docs" / "format" / "run.schema.json").read_text())
    assert run["title"] == "RunRecord" and "ModelRun" in run["$defs"]


def test_a_field_added_without_regenerating_is_stale(monkeypatch, committed):
    grown = create_model("GraphRecord", __base__=records.GraphRecord, provenance=(Optional[str], None))
    monkeypatch.setitem(records.RECORDS, records.GRAPH_JSON, grown)
    problems = tool.stale(committed)
    assert "docs/format/graph.schema.json differs from the records in aotpipe/format/records.py" in problems
    assert "docs/format/schema-lock.json: graph.json's entry is out of date (its fields changed)" in problems
    # regenerating takes it, a compatible change: the revision counts up, the version stays
    before = _lock(committed)["graph.json"]
    assert tool.write(committed) == []
    after = _lock(committed)["graph.json"]
    assert after["revision"] == before["revision"] + 1 and after["version"] == before["version"]
    assert after["fields"]["provenance"] == {"type": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                             "required": False, "record": "GraphRecord"}
    assert tool.stale(committed) == []


def test_a_required_new_field_is_refused(monkeypatch, committed):
    grown = create_model("RunRecord", __base__=records.RunRecord, host=(str, ...))
    monkeypatch.setitem(records.RECORDS, records.RUN_JSON, grown)
    problems = tool.write(committed)
    assert len(problems) == 1 and problems[0].startswith("run.json: host was added as a required field, "
                                                         "but the run.json files this aotpipe reads (versions 1, 2, 3) may hold it")
    assert "a new field must be Optional" in problems[0]
    assert tool.stale(committed)[0] == problems[0]  # the check says the same
    assert (committed / "run.schema.json").read_text() == (ROOT / "docs" / "format" / "run.schema.json").read_text()


def test_a_retyped_field_is_refused_unless_the_version_is_bumped(monkeypatch, committed):
    retyped = create_model("RunRecord", __base__=records.RunRecord, seconds=(str, ...))
    monkeypatch.setitem(records.RECORDS, records.RUN_JSON, retyped)
    (problem,) = tool.write(committed)
    assert problem.startswith('run.json: seconds changed type from {"type":"number"} to {"type":"string"}')
    assert "bump run.json's version in aotpipe/format/records.py and keep reading the old one" in problem
    monkeypatch.setitem(records.RECORD_VERSIONS, records.RUN_JSON, (4, (1, 2, 3, 4)))
    assert tool.write(committed) == []
    assert _lock(committed)["run.json"]["version"] == 4 and _lock(committed)["run.json"]["revision"] == 0


def test_a_removed_field_is_refused_naming_the_versions_still_read(committed):
    lock = _lock(committed)
    # as if the code had dropped a field the lock still holds
    lock["manifest.json"]["fields"]["graphs{}.colour"] = {"type": {"type": "string"}, "required": False,
                                                          "record": "GraphEntry"}
    (committed / tool.LOCK).write_text(json.dumps(lock))
    (problem,) = tool.write(committed)
    assert problem.startswith("manifest.json: graphs{}.colour was removed, but the manifest.json files this "
                              "aotpipe reads (versions 1, 2, 3, 4) may hold it")


def test_a_hand_edited_schema_file_is_stale(committed):
    p = committed / "inputs.schema.json"
    p.write_text(p.read_text().replace('"StorageRecord"', '"Storage"', 1))
    assert tool.stale(committed) == ["docs/format/inputs.schema.json differs from the records in "
                                     "aotpipe/format/records.py"]


def test_fields_are_named_by_where_they_stand_so_a_renamed_class_is_no_change(monkeypatch, committed):
    fields = _lock(committed)["manifest.json"]["fields"]
    assert fields["graphs{}.passes[].nodes_after"]["record"] == "PassRecord"
    assert fields["graphs{}.checks.items[].ratio"]["required"] is False
    renamed = create_model("ExecutorOfTheRun", __base__=records.ExecutorRecord)
    grown = create_model("RunRecord", __base__=records.RunRecord, executor=(renamed, ...))
    monkeypatch.setitem(records.RECORDS, records.RUN_JSON, grown)
    before = _lock(committed)["run.json"]["revision"]
    assert tool.write(committed) == []
    assert _lock(committed)["run.json"]["revision"] == before  # the file may hold the same as before


def test_a_new_kind_of_node_argument_is_compatible(monkeypatch, committed):
    old, new = tool.fields(json.loads((committed / "graph.schema.json").read_text())), None
    new = dict(old)
    new["nodes[].args[].symbol"] = {"type": {"type": "string"}, "required": True, "record": "SymbolArg"}
    ok, bad = tool.changes(old, new)
    assert bad == [] and ok == ["nodes[].args[].symbol was added with its record SymbolArg"]
    new["nodes[].args[].node_kind"] = {"type": {"type": "string"}, "required": True, "record": "NodeRef"}
    ok, bad = tool.changes(old, new)
    assert bad == ["nodes[].args[].node_kind was added as a required field"]


def _typed(t):
    return {"f": {"type": t, "required": True, "record": "R"}}


@pytest.mark.parametrize("old,new,compatible", [
    # a word added to an enum (a graph kind, a role): every file written before still reads
    ({"enum": ["a", "b"], "type": "string"}, {"enum": ["a", "b", "c"], "type": "string"}, True),
    # a word taken away: a file that holds it no longer reads
    ({"enum": ["a", "b"], "type": "string"}, {"enum": ["a"], "type": "string"}, False),
    ({"anyOf": [{"enum": ["a"], "type": "string"}, {"type": "null"}]},
     {"anyOf": [{"enum": ["a", "b"], "type": "string"}, {"type": "null"}]}, True),
    ({"enum": ["a"], "type": "string"}, {"enum": ["a"], "type": "integer"}, False),
    # the leading alternatives of a pattern widened, the rest as it was
    ({"pattern": "^(a|b)(_[1-9])?$", "type": "string"}, {"pattern": "^(a|b|c_d)(_[1-9])?$", "type": "string"}, True),
    ({"pattern": "^(a|b)(_[1-9])?$", "type": "string"}, {"pattern": "^(a)(_[1-9])?$", "type": "string"}, False),
    ({"pattern": "^(a|b)(_[1-9])?$", "type": "string"}, {"pattern": "^(a|b|c)(_[0-9])?$", "type": "string"}, False),
    ({"pattern": "^[a-z]+$", "type": "string"}, {"pattern": "^[a-z0-9]+$", "type": "string"}, False),
])
def test_a_type_that_takes_more_words_is_compatible_and_one_that_takes_fewer_is_not(old, new, compatible):
    ok, bad = tool.changes(_typed(old), _typed(new))
    assert (bad == [] and len(ok) == 1) if compatible else (ok == [] and len(bad) == 1)
