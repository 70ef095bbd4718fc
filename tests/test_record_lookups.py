"""Records are read through their classes: tools/record_lookups.py counts the string-key
lookups of record fields left in aotpipe/, and this holds the count where it stands. Lookups
on data not yet validated (typed RawYaml, RawJson, ErrorDetails, OpKwargs) are counted apart."""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("record_lookups", ROOT / "tools" / "record_lookups.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

# What is left: a diff finding's free data (diff/trees.py) and report.html's per-stage
# seconds (htmlreport), dicts of the page and the diff, not records.
ALLOWED = 2


@pytest.fixture(scope="module")
def fields():
    return tool.record_fields(ROOT, None)


def on_records(found):
    return [f for f in found if not f[3]]


def test_no_new_lookup_on_a_record_field_in_aotpipe(fields):
    left = on_records(tool.lookups(ROOT, fields))
    assert len(left) <= ALLOWED, "read these through the record classes (aotpipe/format/records.py):\n" + \
        "\n".join(f"{rel}:{line}: {text}" for rel, line, text, _ in left)


def test_a_lookup_planted_in_a_copy_of_aotpipe_is_counted_and_named(fields, tmp_path):
    shutil.copytree(ROOT / "aotpipe", tmp_path / "aotpipe", ignore=shutil.ignore_patterns("__pycache__"))
    before = on_records(tool.lookups(tmp_path, fields))
    with open(tmp_path / "aotpipe" / "pipeline" / "views.py", "a") as f:
        f.write("\n\ndef _planted(manifest):\n    return manifest.get('fingerprint')\n")
    after = on_records(tool.lookups(tmp_path, fields))
    assert len(after) == len(before) + 1
    assert ("aotpipe/pipeline/views.py", "manifest.get('fingerprint')") in {(rel, text) for rel, _, text, _ in after}


def test_a_lookup_on_a_record_is_counted_whatever_its_form(fields):
    found = tool.lookups_in(textwrap.dedent("""
        def f(m, d):
            a = m["graphs"]
            b = m.get("fingerprint", None)
            m["checksum"] = 1            # a store, not a read
            c = d["no such field"]       # not a record field's name
            return node.meta["val"], a, b, c
    """), fields)
    assert [(text, raw) for _, text, raw in found] == [("m['graphs']", False), ("m.get('fingerprint', None)", False)]


def test_raw_yaml_and_what_is_taken_from_it_are_counted_apart(fields):
    found = tool.lookups_in(textwrap.dedent("""
        def parse(data: RawYaml, err: ErrorDetails, other):
            models = data.get("models") if isinstance(data.get("models"), list) else []
            for i, m in enumerate(models):
                m["source"]
            first = models[0]
            first.get("name")
            err["type"]
            return other["source"]           # not annotated: a record, as far as anyone can tell

        def elsewhere(m):
            return m["source"]               # another function's m: not raw
    """), fields)
    raw = {(line, text) for line, text, r in found if r}
    counted = [text for _, text, r in found if not r]
    assert counted == ["other['source']", "m['source']"]
    assert {text for _, text in raw} == {"data.get('models')", "m['source']", "first.get('name')", "err['type']"}


def test_a_raw_annotation_on_a_variable_covers_it_and_what_is_taken_from_it(fields):
    found = tool.lookups_in(textwrap.dedent("""
        def load(path):
            data: RawJson
            data = read(path)
            nodes = data["nodes"]
            record = parse(data)
            return nodes, record["nodes"]    # the validated record: counted
    """), fields)
    assert [(text, raw) for _, text, raw in found] == [("data['nodes']", True), ("record['nodes']", False)]
