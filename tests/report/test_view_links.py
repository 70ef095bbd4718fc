"""report.html links each graph's model-explorer view where it is written: <tree>/views/<model>/
(`aotpipe show DIR --model-explorer-all`), or, in trees made before that, the model folder's
own views/ folder. In headless Chromium every link resolves to a file that model-explorer's
classes load as a graph collection."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.pipeline.htmlreport import build_html
from aotpipe.pipeline.views import view_path, write_explorer
from tests.helpers.model_explorer_web import CHROMIUM, load_collection

pytest.importorskip("model_explorer.graph_builder", reason="model-explorer (ai-edge-model-explorer) is not installed")

LINK = re.compile(r'<a class="view" href="([^"]+)"')
MODELS = ("mlp", "small_cnn", "tiny_transformer", "running_norm")


@pytest.fixture(scope="module")
def viewed_tree(quickstart_run, tmp_path_factory):
    """A copy of the quickstart tree with every view written by the CLI and its page rebuilt."""
    root, _ = quickstart_run
    tree = tmp_path_factory.mktemp("links") / "quickstart"
    shutil.copytree(root, tree)
    r = CliRunner().invoke(main, ["show", str(tree), "--model-explorer-all"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, ["report", str(tree)]).exit_code == 0
    return tree


def _keys(tree: Path, model: str) -> list[str]:
    return list(json.loads((tree / model / "manifest.json").read_text())["graphs"])


@pytest.mark.slow  # writing 20 views and the page: seconds
def test_the_page_links_every_view_where_show_writes_them(viewed_tree):
    links = LINK.findall((viewed_tree / "report.html").read_text())
    expected = [f"./views/{m}/{k.replace('+', '%2B')}.model-explorer.json" for m in MODELS for k in _keys(viewed_tree, m)]
    assert sorted(links) == sorted(expected) and len(links) == 20


def test_a_tree_without_views_links_none(quickstart_run):
    root, _ = quickstart_run
    assert not (root / "views").exists() and not (root / "mlp" / "views").exists()
    assert LINK.findall((root / "report.html").read_text()) == []  # the page aotpipe run wrote


def test_a_view_in_a_model_folder_as_older_docs_said_is_still_linked_and_the_tree_s_wins(quickstart_run, tmp_path):
    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root / "mlp", tree / "mlp")  # a tree of one model: quicker to copy and to draw
    (tree / "mlp" / "views").mkdir()
    for key in ("joint", "forward"):  # the command older docs gave, into the model folder
        r = CliRunner().invoke(main, ["show", str(tree / "mlp"), "--graph", key, "--model-explorer",
                                      str(tree / "mlp" / "views" / f"{key}.model-explorer.json")])
        assert r.exit_code == 0, r.output
    write_explorer(tree / "mlp", view_path(tree, "mlp", "forward"), "forward")  # where views go now
    assert LINK.findall(build_html(tree)) == ["./views/mlp/forward.model-explorer.json",
                                              "./mlp/views/joint.model-explorer.json"]


def test_a_views_folder_linked_out_of_the_tree_gets_no_link(quickstart_run, tmp_path):
    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root / "mlp", tree / "mlp")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "mlp").mkdir(parents=True)
    (elsewhere / "mlp" / "joint.model-explorer.json").write_text("{}")
    (tree / "views").symlink_to(elsewhere, target_is_directory=True)
    assert LINK.findall(build_html(tree)) == []


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs it)")
def test_in_chromium_every_view_link_resolves_to_a_model_explorer_graph_collection(viewed_tree, tmp_path):
    from tests.report.test_html_chromium import _dom

    page = viewed_tree / "report.html"
    dom = _dom(tmp_path, page)
    assert re.search(r'data-shown="4"', dom)  # the page's own script ran: this is the page as drawn
    links = LINK.findall(dom)
    assert len(links) == 20
    found = {}
    for link in links:
        target = urlsplit(urljoin(page.as_uri(), link.replace("&amp;", "&")))
        assert target.scheme == "file", link
        path = Path(unquote(target.path))
        assert path.is_file() and path.is_relative_to(viewed_tree / "views"), link
        collection = load_collection(path)
        found.setdefault(collection.label, set()).update(g.id for g in collection.graphs)
    assert found == {m: set(_keys(viewed_tree, m)) for m in MODELS}

