"""Model folder or graph folder: told apart by aotpipe/format/folders.py alone, the same way
for every command that takes either (replay, bench, diff, views, load, the sandbox)."""

from __future__ import annotations

import re
from pathlib import Path

from aotpipe.format.folders import is_graph_folder, is_model_folder, model_folder

ROOT = Path(__file__).resolve().parent.parent


def _artefact(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "mlp"
    graph = model / "mlp_forward_0"
    graph.mkdir(parents=True)
    (model / "manifest.json").write_text("{}")
    (graph / "graph.json").write_text("{}")
    return model, graph


def test_a_graph_folder_names_its_model(tmp_path):
    model, graph = _artefact(tmp_path)
    assert is_model_folder(model) and not is_graph_folder(model)
    assert is_graph_folder(graph) and not is_model_folder(graph)
    assert model_folder(graph) == model and model_folder(str(model)) == model


def test_a_folder_with_both_files_is_a_model_folder(tmp_path):
    model, _ = _artefact(tmp_path)
    (model / "graph.json").write_text("{}")
    assert is_model_folder(model) and not is_graph_folder(model) and model_folder(model) == model


def test_a_folder_with_neither_is_itself_and_neither_kind(tmp_path):
    (tmp_path / "other").mkdir()
    assert model_folder(tmp_path / "other") == tmp_path / "other"
    assert not is_model_folder(tmp_path / "other") and not is_graph_folder(tmp_path / "other")
    assert model_folder(tmp_path / "missing") == tmp_path / "missing"


_DECIDED = re.compile(r"(GRAPH_JSON|\"graph\.json\")\)\.exists\(\)\s+and\s+not\s+\(\w+ / (\w+\.)?(MANIFEST|\"manifest\.json\")\)")


def test_no_other_module_tells_the_folders_apart_itself():
    here = [f"{p.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
            for p in sorted((ROOT / "aotpipe").rglob("*.py")) if p.name != "folders.py"
            for text in [p.read_text(encoding="utf-8")] for m in _DECIDED.finditer(text)]
    assert here == [], "use aotpipe.format.folders: " + ", ".join(here)
    assert _DECIDED.search('if (p / "graph.json").exists() and not (p / "manifest.json").exists():')
    assert _DECIDED.search("if (path / records.GRAPH_JSON).exists() and not (path / records.MANIFEST).exists():")
