"""model-explorer's own loading of a graph JSON file, in both its halves, for the view tests.

- `load_collection`: the Python side. The file is built back, strictly, as the pinned
  model-explorer's `graph_builder.GraphCollection` (an unknown key is the dataclass
  constructor's TypeError; nested items become the classes they are) and `asdict` of it must
  give the file back unchanged.
- `web_load`: the web app, in headless Chromium. `model-explorer FILE` (and its web UI's
  file upload) read a .json with the JSON loader of the pinned app's bundle (main-*.js), then
  hand each graph to its worker (worker-*.js), which builds the layers from the namespaces
  and lays the graph out. Both run here as the app ships them: the loader's functions are
  cut from main-*.js (found by their code, the minifier's names vary by release), the worker
  runs whole, on the page's thread, behind a stand-in for its `self` and `postMessage`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def load_collection(path: Path) -> Any:
    """The view file at `path` as model-explorer's GraphCollection (AssertionError where it is not one)."""
    from model_explorer import graph_builder as gb

    nested = {
        gb.GraphCollection: {"graphs": gb.Graph},
        gb.Graph: {"nodes": gb.GraphNode},
        gb.GraphNode: {"incomingEdges": gb.IncomingEdge, "attrs": gb.KeyValue, "outputsMetadata": gb.MetadataItem,
                       "inputsMetadata": gb.MetadataItem},
        gb.MetadataItem: {"attrs": gb.KeyValue},
    }

    def build(cls: Any, data: dict) -> Any:
        inner = nested.get(cls, {})
        return cls(**{k: [build(inner[k], x) for x in v] if k in inner else v for k, v in data.items()})

    data = json.loads(Path(path).read_text())
    assert isinstance(data, dict) and isinstance(data.get("label"), str) and data["label"] \
        and isinstance(data.get("graphs"), list), f"{path}: not a GraphCollection (label, graphs): {sorted(data)}"
    collection = build(gb.GraphCollection, data)
    assert dataclasses.asdict(collection) == data, f"{path}: changed in model-explorer's round trip"
    return collection


def _function(src: str, name: str) -> str:
    """The source of the top-level `function name(...) {...}` in `src`."""
    m = re.search(r"function %s\(" % re.escape(name), src)
    assert m, f"model-explorer's bundle has no function {name}"
    depth = 0
    for j in range(src.index("{", m.end()), len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[m.start():j + 1]
    raise AssertionError(f"model-explorer's bundle: function {name} does not end")


def _bundle() -> tuple[str, str]:
    """(the JSON loader's functions, ending with `const loadJson = ...`, the worker's source)."""
    import model_explorer

    web = Path(model_explorer.__file__).parent / "web_app"
    main = next(web.glob("main-*.js")).read_text()
    worker = next(web.glob("worker-*.js")).read_text()
    # tk(fileName, json): json.modelTopology == null ? nk(json, fileName) : {graphCollections: [tfjs(...)]}
    m = re.search(r"function (\w+)\((\w+),(\w+)\)\{return \3\.modelTopology==null\?(\w+)\(\3,\2\):"
                  r"\{graphCollections:\[(\w+)\(", main)
    assert m, "model-explorer's bundle: its JSON loader was not found (a new release? update this helper)"
    entry, collections, tfjs = m.group(1), m.group(4), m.group(5)
    body = _function(main, collections)
    assert '"Unsupported JSON format"' in body, body
    parts = [_function(main, entry), body]
    parts += [_function(main, f) for f in sorted(set(re.findall(r"graphCollections:(\w+)\(", body)))]
    parts.append(f"function {tfjs}(){{throw new Error('a tfjs model')}}")
    # the node-data reader, a method of its node-data service: getNodeDataProviderData(text, graph)
    m = re.search(r"getNodeDataProviderData\((\w+),(\w+)\)\{", main)
    assert m, "model-explorer's bundle: its node-data reader was not found (a new release? update this helper)"
    method = _function("function " + main[m.start():], "getNodeDataProviderData")
    parts.append(method.replace("function getNodeDataProviderData(", "function nodeDataOf(", 1))
    assert "</script" not in worker.lower()
    return "\n".join(parts) + f"\nconst loadJson = {entry};\n", worker


_PAGE = r"""
const out = {};
const inbox = [];
const fakeSelf = {listeners: [], addEventListener(type, f) { if (type === 'message') this.listeners.push(f); }};
(function (self, postMessage) {
%(worker)s
})(fakeSelf, m => inbox.push(m));
for (const [name, [text, graphIds]] of Object.entries(NODE_DATA)) {
  // as the app reads a node-data file for each graph shown: {graph id: GraphNodeData}
  out[name] = {};
  for (const id of graphIds) { const d = nodeDataOf(text, {id})[id]; out[name][id] = d ? Object.keys(d.results) : null; }
}
for (const [name, text] of Object.entries(VIEWS)) {
  let r;
  try { r = loadJson(name, JSON.parse(text)); } catch (e) { out[name] = {error: String(e)}; continue; }
  if (r.error) { out[name] = {error: r.error}; continue; }
  out[name] = {collections: []};
  for (const c of r.graphCollections) {
    const graphs = {};
    out[name].collections.push({label: c.label, graphs});
    for (const g of c.graphs) {
      const rec = graphs[g.id] = {errors: []};
      inbox.length = 0;
      try {
        for (const f of fakeSelf.listeners) f({data: {eventType: 0, paneId: name + '#' + g.id, graph: g,
          showOnNodeItemTypes: {}, nodeDataProviderRuns: {}, config: {}, groupNodeChildrenCountThreshold: 1000,
          flattenLayers: false, keepLayersWithASingleChild: false, initialLayout: true}});
      } catch (e) { rec.errors.push(String(e && e.stack || e)); }
      for (const d of inbox) {
        if (d.error) rec.errors.push(d.label + ': ' + d.error);
        if (d.eventType !== 1) continue;
        const mg = d.modelGraph;
        const ops = mg.nodes.filter(n => n.nodeType === 0);
        rec.ops = ops.map(n => n.id);
        rec.opNamespaces = Object.fromEntries(ops.map(n => [n.id, n.namespace]));
        rec.layers = mg.nodes.filter(n => n.nodeType === 1).map(n => [n.namespace, n.label]).sort();
        rec.edges = ops.reduce((k, n) => k + (n.incomingEdges || []).length, 0);
      }
    }
  }
}
document.getElementById('out').textContent = JSON.stringify(out);
"""


def web_load(tmp_path: Path, files: dict[str, Path], node_data: dict[str, tuple[Path, list[str]]] | None = None
             ) -> dict[str, Any]:
    """What model-explorer's web app makes of each file ({name: path}), as {name: {"error": ...}}
    where its loader refuses the file, else {name: {"collections": [{"label", "graphs": {id:
    {"errors", "ops" (op node ids), "opNamespaces", "layers" ([namespace, label] of each layer it
    draws), "edges"}}}]}}; and of each node-data file ({name: (path, graph ids)}), as {name:
    {graph id: the node keys it has results for, or None}}."""
    assert CHROMIUM is not None
    loader, worker = _bundle()
    views = {name: Path(p).read_text() for name, p in files.items()}
    data = {name: [Path(p).read_text(), ids] for name, (p, ids) in (node_data or {}).items()}
    script = (loader + "const VIEWS = " + json.dumps(views).replace("</", "<\\/") + ";\nconst NODE_DATA = "
              + json.dumps(data).replace("</", "<\\/") + ";\n" + _PAGE % {"worker": worker})
    page = tmp_path / "model-explorer-load.html"
    page.write_text('<!doctype html><html><body><pre id="out"></pre><script>' + script + "</script></body></html>")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp_path / 'me-profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="out">(.*?)</pre>', r.stdout, re.S)
    assert m and m.group(1), "the page's script did not finish: " + r.stderr[-2000:]
    import html

    return json.loads(html.unescape(m.group(1)))
