"""What A and B are (two artefacts, or two output trees), and the whole comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from aotpipe.corpus.diff.artifacts import compare_artifacts, describe_node, read_side
from aotpipe.corpus.diff.model import Diff
from aotpipe.corpus.diff.trees import RUN_JSON, compare_trees
from aotpipe.errors import AotpipeError, SandboxUnavailable
from aotpipe.format.folders import is_model_folder, model_folder
from aotpipe.trust.sandbox.decide import decide_sandbox

_WHAT = ("pass two artefact folders (each holding manifest.json) or two output trees "
         "(each holding run.json, as `aotpipe run` writes them)")


def _kind(label: str, path: Path) -> tuple[str, Path]:
    """("artifact" | "tree", the folder) for a path the user gave; a one-line AotpipeError otherwise."""
    if not path.exists():
        raise AotpipeError(f"{label} {path}: no such file or folder; {_WHAT}")
    if not path.is_dir():
        raise AotpipeError(f"{label} {path}: a file, not a folder; {_WHAT}")
    path = model_folder(path)  # a graph folder: its model
    if is_model_folder(path):
        return "artifact", path
    if (path / RUN_JSON).exists():
        return "tree", path
    # An --output folder holding one pipeline's tree.
    inner = [p for p in sorted(path.iterdir()) if p.is_dir() and (p / RUN_JSON).exists()] if path.is_dir() else []
    if len(inner) == 1:
        return "tree", inner[0]
    more = f" (it holds {len(inner)} pipeline trees: name one)" if len(inner) > 1 else ""
    raise AotpipeError(f"{label} {path}: neither an artefact (no manifest.json) nor an output tree "
                       f"(no run.json){more}; {_WHAT}")


def diff_paths(a: str | Path, b: str | Path, *, threshold: float = 0.5, values: bool = True,
               in_process: bool = False, key: Optional[str] = None, trust_ops: Sequence[str] = ()) -> Diff:
    """Compare A and B: two artefacts, or two output trees.

    For two artefacts with `values`, their graphs also run on the same inputs (see
    :mod:`aotpipe.corpus.diff.values`): in this process if `in_process` (artefacts the user made
    or trusts) or both are signed by `key`, else in the sandbox; where the sandbox cannot
    start, the values are not compared and a note says why. `threshold`: a model's
    time or bytes count as changed beyond a ratio of 1 + threshold (trees)."""
    ka, pa = _kind("A", Path(a))
    kb, pb = _kind("B", Path(b))
    if ka != kb:
        raise AotpipeError(f"A is {'an artefact' if ka == 'artifact' else 'an output tree'} ({pa}) but B is "
                           f"{'an artefact' if kb == 'artifact' else 'an output tree'} ({pb}); {_WHAT}")
    diff = Diff(ka, str(pa), str(pb))
    if ka == "tree":
        compare_trees(pa, pb, diff, threshold)
        return diff
    sa, sb = read_side(pa), read_side(pb)
    aligned = compare_artifacts(sa, sb, diff)
    if not values:
        diff.notes.append("values not compared (--no-values)")
        return diff
    _compare_values(diff, sa, sb, dict(aligned), in_process, key, trust_ops)
    return diff


def _compare_values(diff: Diff, sa, sb, aligned: dict[str, dict[str, str]], in_process: bool,
                    key: Optional[str], trust_ops: Sequence[str]) -> None:
    # torch (diff.values runs graphs): kept off the torch-free path of a records-only diff
    from aotpipe.corpus.diff import values

    decision = decide_sandbox([sa.path, sb.path], key=key, no_sandbox=in_process)  # both sides, or the sandbox
    in_process = decision.in_process
    if decision.why and key is not None:  # without --key, the sandbox is simply the default
        diff.notes.append(f"not both signed by {key}, so their graphs ran in the sandbox: {decision.why}")
    try:
        if in_process:
            result = values.compare_values(str(sa.path), str(sb.path), aligned, trust_ops=tuple(trust_ops))
        else:
            result = values.compare_values_sandboxed(str(sa.path), str(sb.path), aligned,
                                                     trust_ops=tuple(trust_ops))
    except SandboxUnavailable as e:
        diff.notes.append(f"values not compared: running the graphs needs the sandbox, which cannot start here "
                          f"({e}); for artefacts you made or trust, pass --no-sandbox or --key KEY")
        return
    except AotpipeError as e:
        # A graph refused at load, or one that crashed or overran the sandboxed worker: said,
        # and what the records show stands.
        diff.notes.append(f"values not compared: {e.lines()[0]}")
        return
    for graph, r in result.items():
        if r.status == "skipped":
            diff.notes.append(f"values of {graph} not compared: {r.reason}")
            continue
        if r.status != "diverged":
            diff.first_divergence[graph] = None
            continue
        a_node, b_node = str(r.a_node), str(r.b_node)
        diff.first_divergence[graph] = a_node
        ga = sa.graph(graph)
        node = next((n for n in ga.nodes if n.name == a_node), None) if ga is not None else None
        named = describe_node(node) if node is not None else a_node
        diff.add("values", graph, f"first diverging node: A {named}, B {b_node}: {r.why}",
                 a_node=a_node, b_node=b_node, why=r.why, compared=r.compared)
