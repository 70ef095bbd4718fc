"""How a graph is named: its key in CapturedGraphs, the manifest, replay --graph and folders.

A capture gives one group of graphs (inference, forward, backward, joint) per compiled
subgraph: one for export, one per graph break plus one for dynamo. Subgraph 0's graphs are
keyed by their kind alone ("forward"), as export's always were; subgraph i > 0's by kind
and index ("forward_1"). A graph made by passes is keyed "<base key>.<pass chain>". Folders
follow graph_dumper_aot: ``<model>_<kind>_<i>``, then ``.<chain>`` for a derived graph.

No torch import: reading a manifest needs none.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from aotpipe.format.vocabulary import GRAPH_KINDS, GraphKind, words

# A base graph's key: a kind, then "_<index>" for a subgraph other than the first.
BASE_KEY_PATTERN = rf"^({words(GraphKind)})(_[1-9][0-9]{{0,5}})?$"
_KEY = re.compile(rf"^({words(GraphKind)})(?:_([1-9][0-9]{{0,5}}))?(?:\.(.+))?$")


class GraphKey(NamedTuple):
    """A graph key taken apart: kind, subgraph index, and the pass chain of a derived graph."""

    kind: GraphKind
    subgraph: int
    chain: str | None

    @property
    def base(self) -> str:
        """The key of the captured graph (the derived graph's base; itself for a base graph)."""
        return graph_key(self.kind, self.subgraph)


def graph_key(kind: str, subgraph: int = 0) -> str:
    """The key of subgraph `subgraph`'s graph of `kind`: "forward", "forward_1", ..."""
    return kind if subgraph == 0 else f"{kind}_{subgraph}"


def parse_graph_key(key: str) -> GraphKey | None:
    """`key` taken apart, or None when it names no graph ("forward_1.freeze" -> forward, 1, "freeze")."""
    m = _KEY.match(key)
    if m is None:
        return None
    return GraphKey(GraphKind(m.group(1)), int(m.group(2) or 0), m.group(3))


def graph_folder_name(model: str, key: str) -> str:
    """The graph_dumper_aot folder of a graph: <model>_<kind>_<index>[.<chain>]."""
    parsed = parse_graph_key(key)
    if parsed is None:
        raise ValueError(f"{key!r} is not a graph key (kind, optional _<index>, optional .<passes>)")
    folder = f"{model}_{parsed.kind}_{parsed.subgraph}"
    return f"{folder}.{parsed.chain}" if parsed.chain else folder


def key_order(key: str) -> tuple[int, int, int, str]:
    """A sort key: by subgraph, then inference, its derived graphs, forward, backward, joint."""
    parsed = parse_graph_key(key)
    if parsed is None:
        return (1 << 30, 0, 0, key)
    rank = GRAPH_KINDS.index(parsed.kind)
    return (parsed.subgraph, rank, 0 if parsed.chain is None else 1, parsed.chain or "")
