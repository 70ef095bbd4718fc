"""The documentation: README is a front door, its links resolve, generated pages are fresh.

Generated pages (docs/generated/) are made by tools/gen_docs.py from the code and data they
describe; the staleness test regenerates them into a temporary folder and compares.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"

_spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
gen_docs = importlib.util.module_from_spec(_spec)
sys.modules["gen_docs"] = gen_docs
_spec.loader.exec_module(gen_docs)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_a_front_door_under_20_kb():
    size = len(README.read_bytes())
    assert size < 20_000, f"README.md is {size:,} bytes; keep it under 20,000 and move reference text to docs/"


def test_committed_generated_pages_are_what_the_generator_makes(tmp_path):
    gen_docs.write_all(tmp_path)
    problems = gen_docs.stale(DOCS / "generated", tmp_path)
    assert problems == [], "\n".join(problems)


def test_a_hand_edited_generated_page_is_named_stale_with_the_command_to_run(tmp_path):
    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    gen_docs.write_all(committed)
    gen_docs.write_all(fresh)
    page = committed / "passes.md"
    page.write_text(page.read_text().replace("| `freeze` | inference |", "| `freeze` | inference, joint |"))
    (committed / "typed-by-hand.md").write_text("# not generated\n")
    assert gen_docs.stale(committed, fresh) == [
        "docs/generated/passes.md is stale (edited by hand, or its source changed): run `python tools/gen_docs.py`",
        "docs/generated/typed-by-hand.md is not made by python tools/gen_docs.py: remove it, or add its "
        "generator to PAGES",
    ]


def test_the_pass_table_follows_the_registry(monkeypatch):
    from aotpipe import passes
    from aotpipe.passes.options import FreezeOptions

    info = passes.PASSES["freeze"]
    monkeypatch.setitem(passes.PASSES, "freeze", type(info)(
        info.name, info.fn, FreezeOptions, passes.ALL_KINDS, "a summary changed in the registry"))
    row = next(line for line in gen_docs.passes_page().splitlines() if line.startswith("| `freeze`"))
    assert row.startswith("| `freeze` | inference, forward, backward, joint | - | no |")
    assert row.endswith("| a summary changed in the registry |")


def test_the_code_map_lists_every_module_by_its_docstring():
    text = gen_docs.code_map_page()
    modules = sorted((REPO / "aotpipe").rglob("*.py"))
    for p in modules:
        rel = p.relative_to(REPO).as_posix()
        name = rel[: -len("/__init__.py")] + "/" if p.name == "__init__.py" else rel
        assert f"| `{name}` |" in text, f"{rel} is missing from the code map"


def test_a_module_without_a_docstring_stops_the_code_map_naming_it(tmp_path, monkeypatch):
    (tmp_path / "aotpipe").mkdir()
    (tmp_path / "aotpipe" / "orphan.py").write_text("x = 1\n")
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    with pytest.raises(SystemExit, match=r"^aotpipe/orphan\.py: no module docstring; the code map takes"):
        gen_docs.code_map_page()


def test_the_zoo_summary_is_computed_from_its_rows():
    import json

    data = json.loads((DOCS / "data" / "hf-zoo.json").read_text())
    data["models"] = data["models"][:3] + [dict(data["models"][0], name="broken", status="failed", passed=None,
                                                skipped=None, reason="capture: boom | (1, 2)")]
    spec = importlib.util.spec_from_file_location("zoo_table", REPO / "tools" / "zoo_table.py")
    zoo_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_table)
    text = zoo_table.render(data)
    assert text.startswith("**3/4 ok (75.0%)**")
    assert "| broken | export | failed | 4 | - | capture: boom \\| (1, 2) |" in text


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_names_a_file_that_exists(page):
    missing = []
    for link in _links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        target = (page.parent / link.split("#")[0]).resolve()
        if not target.exists():
            missing.append(link)
    assert missing == [], f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_every_page_under_docs_is_linked_from_readme_or_another_page():
    linked = set()
    for page in _pages():
        for link in _links(page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", link) and not link.startswith("#"):
                linked.add((page.parent / link.split("#")[0]).resolve())
    orphans = [p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md") if p.resolve() not in linked]
    assert orphans == [], f"pages nobody links to: {orphans}"


def test_no_page_cites_an_issue_number():
    cited = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in _pages()
             for m in re.finditer(r"[Ii]ssues? ?#?\d+", p.read_text(encoding="utf-8"))]
    assert cited == []


def _prose_paragraphs(text: str) -> list[str]:
    """README's paragraphs and list items outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n|\n(?=- )", text) if p.strip()]


_FIGURE = re.compile(r"\d(?:[\d.,-]*\d)?x\b|\d+(?:\.\d+)?%|\b\d[\d,]* of \d[\d,]*\b|\b\d+/\d+\b")


def test_every_measured_figure_in_readme_links_the_generated_page_it_comes_from():
    untraced = [p.strip()[:80] for p in _prose_paragraphs(README.read_text(encoding="utf-8"))
                if _FIGURE.search(p) and not re.search(r"\]\(docs/(generated|benchmarks)/", p)]
    assert untraced == [], f"README figures with no generated source linked beside them: {untraced}"


def test_a_figure_without_its_source_is_caught():
    text = "Intro.\n\n- cpu-fast runs 1.2x faster than eager.\n\n```sh\n$ run  # 3/4 ok\n```\n"
    found = [p for p in _prose_paragraphs(text) if _FIGURE.search(p)]
    assert found == ["- cpu-fast runs 1.2x faster than eager."]


def test_the_two_setup_commands_name_what_the_repository_has():
    text = README.read_text(encoding="utf-8")
    one = ("python3 -m venv .venv && .venv/bin/pip install -e . -c constraints.txt && "
           ".venv/bin/aotpipe run pipelines/quickstart.yaml")
    two = ("python3 -m venv .venv && .venv/bin/pip install -e '.[test]' -c constraints.txt && "
           ".venv/bin/python -m pytest -m \"not slow\" -n 2")
    assert one in text and two in text
    assert "torch==" in (REPO / "constraints.txt").read_text()
    assert (REPO / "pipelines" / "quickstart.yaml").is_file()
    pyproject = (REPO / "pyproject.toml").read_text()  # no tomllib: Python 3.10 is supported
    assert re.search(r'(?m)^aotpipe = "aotpipe\.cli:main"$', pyproject)
    extras = re.search(r"(?ms)^\[project\.optional-dependencies\]\n(.*?)^\[", pyproject).group(1)
    declared = set(re.findall(r"(?m)^(\w+) = \[", extras))
    for extra in re.findall(r"`(\w+)` \((?:transformers|the Ray|the benchmarks)", text) + ["test"]:
        assert extra in declared, f"README names the extra {extra!r}; pyproject.toml does not declare it"
    ci = (REPO / ".ci" / "run").read_text()
    assert ".venv/bin/pip install -e '.[test]' -c constraints.txt" in ci


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_file_a_page_names_in_code_exists(page):
    """`capture/rnn.py`, `tools/hf_zoo.py`: a file that moved or went leaves its page wrong."""
    named = set(re.findall(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|txt|yaml|json|png))(?::\w+)?`", page.read_text(encoding="utf-8")))
    # Only paths in this repository: torch's own files and placeholders like DIR/run.json are not ours.
    ours = {p.name for p in REPO.iterdir()} | {p.name for p in (REPO / "aotpipe").iterdir()}
    named = {n for n in named if n.split("/")[0] in ours}
    missing = sorted(n for n in named if not (REPO / n).exists() and not (REPO / "aotpipe" / n).exists())
    assert missing == [], f"{page.relative_to(REPO)} names files that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_python_name_a_page_gives_resolves(page):
    """`aotpipe.passes.prepack.unpacked`, `aotpipe.get_inputs`: a name that moved leaves its page wrong."""
    # `aotpipe.zoo:<name>` is a source scheme users write, not a Python name (no colon follows a name)
    names = set(re.findall(r"(?<![\w/.])(aotpipe(?:\.[A-Za-z_]\w*)+)(?![\w:])", page.read_text(encoding="utf-8")))
    names = {n for n in names if not re.search(r"\.(json|ya?ml|py|md|txt|pt2)$", n)}  # file names
    missing = sorted(n for n in names if not _resolves(n))
    assert missing == [], f"{page.relative_to(REPO)} names Python objects that do not exist: {missing}"


def test_a_zoo_run_becomes_rows_that_render_and_round_trip(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location("zoo_table", REPO / "tools" / "zoo_table.py")
    zoo_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_table)
    root = tmp_path / "hf-zoo"
    (root / "bert").mkdir(parents=True)
    (root / "bert" / "manifest.json").write_text(json.dumps({"capture": {"mode": "dynamo"}}))
    (root / "run.json").write_text(json.dumps({"seconds": 12.4, "executor": {"kind": "process"}, "models": [
        {"name": "bert", "status": "ok", "stage": None, "error": None, "graphs": ["a", "b"],
         "checks": {"passed": 7, "skipped": 1}},
        {"name": "vits", "status": "failed", "stage": "capture", "error": "GuardOnDataDependentSymNode: u0",
         "graphs": [], "checks": {}}]}))
    data = zoo_table.rows_from_run(root)
    assert json.loads(zoo_table.dump(data)) == data
    text = zoo_table.render(data)
    assert text.startswith("**1/2 ok (50.0%)**; of the ok ones 1 captured with dynamo. Checks of the ok models: "
                           "7 passed, 1 skipped. The run took 12 s.")
    assert "| bert | dynamo | ok | 2 | 7 / 1 |  |" in text
    assert "| vits | - | failed | 0 | - | capture: GuardOnDataDependentSymNode: u0 |" in text
