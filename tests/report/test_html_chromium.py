"""report.html in a real browser: Debian's chromium, headless, renders the quickstart's page
from disk; the DOM it built has a table row per model and the plots' SVGs; the page's own
script filters and sorts the table from the URL's hash; a screenshot is saved.

Skipped (with the reason) only where no chromium is installed; .ci/run installs it.
"""

import json
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          ".ci/run installs it)")


def _chromium(tmp_path, *args):
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={profile}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _dom(tmp_path, page, fragment=""):
    return _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri() + fragment)


def _shown_rows(dom):
    """Names of the table rows the script left visible, in order."""
    rows = re.findall(r'<tr class="model-row" data-status="\w+"( hidden="")?>\s*<td><a href="#m\d+">([^<]*)</a>', dom)
    return [name for hidden, name in rows if not hidden]


def test_chromium_renders_a_row_per_model_and_the_plots_and_takes_a_screenshot(quickstart_run, tmp_path):
    root, _ = quickstart_run
    page = root / "report.html"
    dom = _dom(tmp_path, page)
    assert _shown_rows(dom) == ["mlp", "small_cnn", "tiny_transformer", "running_norm"]
    assert 'data-shown="4"' in dom and "4 of 4 models shown" in dom  # the script ran
    for plot in ("plot-capture", "plot-stages", "plot-ratios"):
        assert re.search(rf'<figure id="{plot}"><svg class="plot"[^>]*>.*?<path', dom, re.S), plot
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_hash_filters_and_sorts_the_table_in_the_browser(quickstart_run, tmp_path):
    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root, tree)
    run = json.loads((tree / "run.json").read_text())
    run["models"][2].update(status="failed", stage="capture", error="planted")
    (tree / "run.json").write_text(json.dumps(run))
    from aotpipe.pipeline.htmlreport import write_html

    page = write_html(tree)
    assert _shown_rows(_dom(tmp_path, page, "#status=failed")) == ["tiny_transformer"]
    assert _shown_rows(_dom(tmp_path, page, "#filter=small")) == ["small_cnn"]
    by_nodes = sorted(run["models"], key=lambda m: -next(g["nodes"] for g in m["graphs"] if g["kind"] == "joint"))
    assert _shown_rows(_dom(tmp_path, page, "#sort=joint nodes-desc")) == [m["name"] for m in by_nodes]
    assert _shown_rows(_dom(tmp_path, page, "#sort=model")) == sorted(m["name"] for m in run["models"])


def test_a_hostile_model_name_runs_no_script_in_the_browser(quickstart_run, tmp_path):
    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root, tree)
    run = json.loads((tree / "run.json").read_text())
    run["models"][0]["name"] = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
    (tree / "run.json").write_text(json.dumps(run))
    from aotpipe.pipeline.htmlreport import write_html

    dom = _dom(tmp_path, write_html(tree))
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body, body
    assert "&lt;img src=x" in dom


def test_a_script_the_page_does_not_own_is_refused_by_its_csp_and_its_own_still_runs(quickstart_run, tmp_path):
    """An escaping slip that let a name's `<script>` into the page: the CSP allows only the
    page's own script (by its hash), so the planted one does not run and the table still sorts."""
    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root, tree)
    from aotpipe.pipeline.htmlreport import write_html

    page = write_html(tree)
    planted = "<script>document.body.setAttribute('data-pwned','1')</script>"
    html = page.read_text()
    page.write_text(html.replace('<td><a href="#m0">mlp</a>', f'<td><a href="#m0">mlp</a>{planted}', 1))
    assert planted in page.read_text()
    dom = _dom(tmp_path, page, "#sort=model")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body, body
    assert 'data-shown="4"' in body  # the page's own script ran
    assert _shown_rows(dom) == ["mlp", "running_norm", "small_cnn", "tiny_transformer"]


def test_a_model_folder_named_javascript_links_to_its_own_file_and_runs_nothing(quickstart_run, tmp_path):
    from urllib.parse import unquote, urljoin, urlsplit

    root, _ = quickstart_run
    tree = tmp_path / "quickstart"
    shutil.copytree(root, tree)
    folder = tree / "javascript:document.title='pwned'"
    (tree / "mlp").rename(folder)
    (folder / "views").mkdir()
    (folder / "views" / "joint.model-explorer.json").write_text("{}")
    run = json.loads((tree / "run.json").read_text())
    run["models"][1]["name"] = "\"><script>document.title='pwned'</script>"
    (tree / "run.json").write_text(json.dumps(run))
    from aotpipe.pipeline.htmlreport import write_html

    page = write_html(tree)
    dom = _dom(tmp_path, page)
    assert "<title>aotpipe run: quickstart</title>" in dom and "pwned'</title>" not in dom
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert re.search(r'data-shown="\d+"', body), body  # the page's own script ran
    views = re.findall(r'<a class="view" href="([^"]+)"', dom)
    assert len(views) == 1
    target = urlsplit(urljoin(page.as_uri(), views[0].replace("&amp;", "&")))
    assert target.scheme == "file" and unquote(target.path) == str(folder / "views" / "joint.model-explorer.json")
