"""benchmarks/_markdown.py: every benchmark's `--markdown [FILE]` writes its table as a page
that names the command that made it."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_markdown", REPO / "benchmarks" / "_markdown.py")
md = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(md)


def test_markdown_without_a_file_writes_the_scripts_page_under_docs_benchmarks(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["evidence_bytes.py", "artifacts/quickstart", "--markdown"])
    assert md.take_markdown_option("evidence_bytes") == REPO / "docs" / "benchmarks" / "evidence_bytes.md"
    assert sys.argv == ["evidence_bytes.py", "artifacts/quickstart"]  # the script reads its roots from argv


def test_markdown_with_a_file_writes_there_and_no_flag_writes_nothing(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["replay_bench.py", "--markdown", "out.md", "artifacts"])
    assert md.take_markdown_option("replay_bench") == Path("out.md")
    assert sys.argv == ["replay_bench.py", "artifacts"]
    monkeypatch.setattr(sys, "argv", ["replay_bench.py", "artifacts"])
    assert md.take_markdown_option("replay_bench") is None
    ap = argparse.ArgumentParser()
    md.add_markdown_option(ap, "executor_bench")
    assert ap.parse_args(["--markdown"]).markdown == REPO / "docs" / "benchmarks" / "executor_bench.md"
    assert ap.parse_args([]).markdown is None


def test_the_page_names_its_command_and_holds_what_was_printed(tmp_path, capsys):
    page = tmp_path / "passes_bench.md"
    with md.tee_page(page, "passes_bench", ["artifacts/quickstart", "--markdown"]):
        print("| model | ms |\n|---|---:|\n| mlp | 1.0 |")
    assert "| mlp | 1.0 |" in capsys.readouterr().out  # still printed
    text = page.read_text()
    assert text.startswith("<!-- Written by `python benchmarks/passes_bench.py artifacts/quickstart --markdown`.")
    assert "\n# passes_bench\n\nMeasured " in text and " at commit " in text and " load average " in text
    assert text.endswith("| model | ms |\n|---|---:|\n| mlp | 1.0 |\n")


def test_plain_text_output_goes_in_a_code_block(tmp_path):
    page = tmp_path / "meta_bench.md"
    with md.tee_page(page, "meta_bench", [], preformatted=True):
        print("target    measured\n  wall    14.9 s")
    assert page.read_text().endswith("```\ntarget    measured\n  wall    14.9 s\n```\n")


def test_nothing_is_written_without_a_page(tmp_path, capsys):
    with md.tee_page(None, "passes_bench"):
        print("| a |")
    assert capsys.readouterr().out == "| a |\n"
    assert list(tmp_path.iterdir()) == []
