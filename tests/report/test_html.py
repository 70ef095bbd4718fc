"""report.html: written by `aotpipe run`, rebuilt by `aotpipe report DIR` from the files on
disk, one self-contained page (no network), every artefact-supplied string escaped."""

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from aotpipe.cli import main

HOSTILE_MODEL = "<script>document.title='pwned-model'</script>"
HOSTILE_OP = "aten.<script>document.title='pwned-op'</script>.default"


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.fixture()
def tree(quickstart_run, tmp_path):
    """A copy of the quickstart's output folder, to edit."""
    root, _ = quickstart_run
    dst = tmp_path / "quickstart"
    shutil.copytree(root, dst)
    return dst


def _rows(html):
    return re.findall(r'<tr class="model-row" data-status="(\w+)">\s*<td><a href="#m\d+">([^<]*)</a>', html)


def test_run_writes_a_self_contained_report_html_with_a_row_per_model_and_its_plots(quickstart_run):
    root, result = quickstart_run
    html = (root / "report.html").read_text()
    assert "report.html" in result.output
    assert [name for _, name in _rows(html)] == ["mlp", "small_cnn", "tiny_transformer", "running_norm"]
    for plot in ("plot-capture", "plot-stages", "plot-ratios"):
        assert re.search(rf'<figure id="{plot}"><svg class="plot"', html), plot
    assert 'id="plot-bench"' not in html  # no bench has run
    # Nothing fetched: no external script, style sheet, image or font; the CSP forbids any.
    assert not re.search(r"<link\b|\bsrc=|url\((?!#)|@import|href=\"(?!#|\./mlp/)", html)  # url(#clip): the SVG's own
    assert "default-src 'none'" in html
    # Per model: op histogram per graph, what each pass changed, errors against the bound.
    details = html.split('id="details"', 1)[1]
    assert "aten.addmm.default" in details and "What each pass changed" in details
    assert "frozen 6" in details  # mlp's freeze pass froze its six parameters
    assert "Errors against the bound" in details


def test_report_rebuilds_the_same_page_from_disk(tree):
    before = (tree / "report.html").read_bytes()
    (tree / "report.html").unlink()
    r = cli("report", tree)
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"wrote {tree / 'report.html'}"
    assert (tree / "report.html").read_bytes() == before  # deterministic, and the run's page is this one


def test_report_of_a_folder_without_artefacts_is_one_line_and_exit_2(tmp_path):
    r = cli("report", tmp_path)
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"error: {tmp_path}: no run.json and no artefacts (manifest.json) found in it or below; pass a pipeline's "
        "output folder, e.g. artifacts/quickstart"]


def test_a_broken_run_json_is_named_in_one_line(tree):
    run = json.loads((tree / "run.json").read_text())
    del run["models"][0]["name"]
    (tree / "run.json").write_text(json.dumps(run))
    r = cli("report", tree)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert r.output.startswith(f"error: {tree / 'run.json'}: field models.0.name: Field required")


def test_hostile_model_and_op_names_are_escaped(tree):
    run = json.loads((tree / "run.json").read_text())
    run["models"][0]["name"] = HOSTILE_MODEL
    run["models"][0]["notes"] = ["<img src=x onerror=alert(1)>"]
    (tree / "run.json").write_text(json.dumps(run))
    graph = tree / "mlp" / "mlp_forward_0" / "graph.json"
    g = json.loads(graph.read_text())
    next(n for n in g["nodes"] if n["op"] == "call_function")["target"] = HOSTILE_OP
    graph.write_text(json.dumps(g))
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert "<script>document" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#39;pwned-model&#39;&lt;/script&gt;" in html
    assert "aten.&lt;script&gt;document.title=&#39;pwned-op&#39;&lt;/script&gt;.default" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.count("<script>") == 1  # the page's own


def test_a_failed_model_is_counted_shown_open_with_its_error(tree):
    run = json.loads((tree / "run.json").read_text())
    m = run["models"][1]
    m.update(status="failed", stage="capture", error="planted: the model raised")
    (tree / "run.json").write_text(json.dumps(run))
    shutil.rmtree(tree / m["name"])  # a model that failed at capture leaves no artefact
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert ("failed", "small_cnn") in _rows(html)
    assert [s for s, _ in _rows(html)].count("ok") == 3
    assert re.search(r'id="sum-failed" class="failed">1<', html)
    assert re.search(r'<details class="model" id="m1" open>.*?capture: planted: the model raised', html, re.S)


def test_bench_json_adds_the_bench_plot_and_table(tree):
    (tree / "bench.json").write_text(json.dumps({
        "backend": "inductor", "scores": {"S(0)": 1.25},
        "results": [{"model": "mlp", "graph": "inference", "status": "ok", "speedup": 1.8},
                    {"model": "small_cnn", "graph": "forward", "status": "fail_accuracy", "speedup": None}]}))
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert re.search(r'<figure id="plot-bench"><svg class="plot"', html)
    assert "<h2>Bench: inductor</h2>" in html and "S(0) 1.25" in html and "fail_accuracy" in html


def test_what_bench_json_prints_is_a_bench_json_the_page_reads(tree):
    r = cli("bench", tree / "mlp", "--backend", "eager", "--graphs", "inference", "--rounds", "2", "--json",
            "--no-progress")
    assert r.exit_code == 0, r.output
    (tree / "bench.json").write_text(r.output)
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert "not a bench result" not in html and "<h2>Bench: eager</h2>" in html
    assert re.search(r"Scores: all: 2/2 pass, geomean [\d.]+x; inference: 2/2 pass", html)
    assert re.search(r"<tr><td>mlp</td><td>inference</td><td>eager</td><td>pass</td>", html)
    assert 'id="triage"' not in html  # a bench without --minimize groups nothing


def test_the_bugs_of_bench_minimize_are_the_pages_triage_table(tree):
    from aotpipe.corpus.bench.triage import Bug

    bugs = [Bug("fail_accuracy at aten.gelu.default(float32)", "fail_accuracy",
                ["bert inference", "vit inference", "vit forward"], ["bert", "vit"], "repros/bert-inference-gelu-min", 1),
            Bug(HOSTILE_MODEL, "crashed", ["resnet backward"], ["resnet"], None, None)]
    (tree / "bench.json").write_text(json.dumps({"backend": "b", "graphs": [], "scores": {},
                                                 "bugs": [b.to_json() for b in bugs]}))
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert '<h3 id="triage">Triage: 2 unique bug(s) among 4 failing graph(s)</h3>' in html
    assert ('<tr><td>fail_accuracy at aten.gelu.default(float32)</td><td class="n">3</td><td class="n" '
            'title="bert, vit">2</td><td>bert inference</td><td>repros/bert-inference-gelu-min (1 node(s))</td></tr>'
            in html)
    assert HOSTILE_MODEL not in html and "&lt;script&gt;" in html


def test_a_malformed_bench_json_is_named_and_the_page_still_written(tree):
    (tree / "bench.json").write_text(json.dumps({"results": "fast"}))
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert 'id="plot-bench"' not in html
    assert f"{tree / 'bench.json'}: not a bench result (field results: Input should be a valid list" in html


def test_a_graph_links_its_model_explorer_view_only_where_the_file_exists(tree):
    views = tree / "mlp" / "views"
    views.mkdir()
    (views / "joint.model-explorer.json").write_text("{}")
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert re.findall(r'<a class="view" href="([^"]+)"', html) == ["./mlp/views/joint.model-explorer.json"]


def test_a_tree_without_run_json_reports_from_its_manifests():
    from pathlib import Path

    from aotpipe.pipeline.htmlreport import build_html

    for version in ("format_v1", "format_v2"):
        html = build_html(Path(__file__).parent.parent / "data" / version)
        assert sorted(name for _, name in _rows(html)) == ["mlp", "running_norm"], version
        assert 'id="plot-ratios"' in html or version == "format_v1"


def test_without_matplotlib_the_page_says_so_and_is_still_written(tree, monkeypatch):
    import sys

    from aotpipe.pipeline.htmlreport import build_html

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    html = build_html(tree)
    assert "no plots: matplotlib is not installed (pip install matplotlib -c constraints.txt)" in html
    assert "<figure" not in html and len(_rows(html)) == 4


def test_report_writes_nothing_into_a_model_folder_unless_told_where(tree, tmp_path):
    r = cli("report", tree / "mlp")
    assert r.exit_code == 2 and not (tree / "mlp" / "report.html").exists()
    assert r.output == (f"error: {tree / 'mlp'} is a model folder; write its page elsewhere (aotpipe report "
                        f"{tree / 'mlp'} -o FILE) or pass the output folder above it\n")
    r = cli("report", tree / "mlp", "-o", tmp_path / "mlp.html")
    assert r.exit_code == 0 and _rows((tmp_path / "mlp.html").read_text()) == [("ok", "mlp")]


def test_the_page_reads_op_counts_and_keeps_no_graph_nodes(tree, monkeypatch):
    # A zoo's nodes, all held at once while the page was gathered, took 7 GB.
    from aotpipe.pipeline import htmlreport
    from aotpipe.pipeline import tree as tree_mod

    kept = tree_mod.read_tree(tree)
    read = []
    real = tree_mod.read_tree
    monkeypatch.setattr(htmlreport, "read_tree", lambda *a, **k: read.extend(real(*a, **k)) or read)
    page = htmlreport.gather(tree)
    assert read and all(g.nodes is None and g.op_counts for v in read for g in v.graphs)
    assert [[g.ops() for g in v.graphs] for v in read] == [[g.ops() for g in v.graphs] for v in kept]
    assert [r.graphs for r in page.rows] and all(gr.ops for r in page.rows for gr in r.graphs)


# ---------------------------------------------------------------------------------------
# Links and the Content-Security-Policy: a name is never a URL, and no script runs but the page's own.


def _hrefs(html):
    return re.findall(r'\bhref="([^"]*)"', html)


def _with_view(tree, folder):
    """The quickstart's mlp folder renamed `folder`, with a model-explorer view of its joint graph."""
    (tree / "mlp").rename(tree / folder)
    (tree / folder / "views").mkdir()
    (tree / folder / "views" / "joint.model-explorer.json").write_text("{}")


@pytest.mark.parametrize("folder", ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text,x", "%2e%2e",
                                    '"><script>alert(1)<', "x#y?z"])
def test_a_model_folder_named_like_a_url_links_as_a_relative_path_to_itself(tree, folder):
    from urllib.parse import quote, unquote, urljoin, urlsplit

    _with_view(tree, folder)
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    views = re.findall(r'<a class="view" href="([^"]+)"', html)
    assert views == [f"./{quote(folder, safe='')}/views/joint.model-explorer.json"], views
    page = (tree / "report.html").as_uri()
    for href in _hrefs(html):
        if href.startswith("#"):
            continue
        assert href.startswith("./") and not urlsplit(href).scheme, href
        # resolved against the page, it names the view's file in the tree
        target = urlsplit(urljoin(page, href))
        assert (target.scheme, target.query, target.fragment) == ("file", "", "")
        assert unquote(target.path) == str(tree / folder / "views" / "joint.model-explorer.json")
    assert "<script>alert" not in html


def test_a_link_that_is_not_a_path_inside_the_report_folder_is_dropped(tree, tmp_path):
    from aotpipe.pipeline.htmlreport import relative_link

    (tree / "mlp" / "views").mkdir()
    inside = tree / "mlp" / "views" / "joint.model-explorer.json"
    inside.write_text("{}")
    assert relative_link(tree, inside) == "./mlp/views/joint.model-explorer.json"
    assert relative_link(tree, tree / "mlp" / "views" / "absent.json") is None  # no file, no link
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    assert relative_link(tree, outside) is None
    assert relative_link(tree, tree / "mlp" / ".." / ".." / "secret.json") is None
    (tree / "small_cnn" / "views").symlink_to(tmp_path, target_is_directory=True)  # a link out of the tree
    assert relative_link(tree, tree / "small_cnn" / "views" / "secret.json") is None


def test_a_views_folder_linked_out_of_the_tree_gets_no_link_on_the_page(tree, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "joint.model-explorer.json").write_text("{}")
    (tree / "mlp" / "views").symlink_to(elsewhere, target_is_directory=True)
    assert cli("report", tree).exit_code == 0
    assert re.findall(r'<a class="view" href="([^"]+)"', (tree / "report.html").read_text()) == []


def test_the_csp_allows_by_hash_only_the_page_s_own_script(tree):
    import base64
    import hashlib

    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1)
    rules = dict((d.split()[0], d.split()[1:]) for d in (d.strip() for d in policy.split(";")) if d)
    assert rules["default-src"] == ["'none'"]
    assert "'unsafe-inline'" not in rules["script-src"] and "'unsafe-eval'" not in rules["script-src"]
    assert rules["base-uri"] == ["'none'"] and rules["form-action"] == ["'none'"]
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode("utf-8")).digest()).decode()
    assert rules["script-src"] == [f"'sha256-{digest}'"]


@pytest.mark.parametrize("damage", ["manifest", "graph"])
def test_a_model_whose_records_cannot_be_read_now_is_not_shown_ok(tree, damage):
    """run.json says ok (it was, when it ran); the files say otherwise now, as verify does."""
    target = tree / "mlp" / ("manifest.json" if damage == "manifest" else "mlp_forward_0/graph.json")
    target.write_text("{ not json")
    assert cli("report", tree).exit_code == 0
    html = (tree / "report.html").read_text()
    assert ("failed", "mlp") in _rows(html), _rows(html)  # filtered with the failures
    assert re.search(r'<a href="#m0">mlp</a></td>\s*<td[^>]*>unreadable<', html), "the row says why"
    assert [s for s, _ in _rows(html)].count("ok") == 3  # the others as they were
    assert re.search(r'id="sum-failed" class="failed">1<', html)
    assert cli("verify", tree / "mlp").exit_code != 0
