"""What `aotpipe bench` does once its arguments are parsed: bench, print, write, gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aotpipe.corpus.bench import baseline as baselines
from aotpipe.corpus.bench.backends import parse_backend
from aotpipe.corpus.bench.crashes import CrashTask
from aotpipe.corpus.bench.locate import LocateTask, locate_failures
from aotpipe.corpus.bench.minimize import MinimizeTask
from aotpipe.corpus.bench.output import failures, table, write_csv
from aotpipe.corpus.bench.run import bench, parse_collectives, parse_kinds
from aotpipe.corpus.bench.sizes import parse_sizes
from aotpipe.corpus.bench.triage import lines as triage_lines
from aotpipe.corpus.bench.triage import triage
from aotpipe.errors import AotpipeError
from aotpipe.format.graph_keys import parse_graph_key


@dataclass(frozen=True)
class BenchOptions:
    paths: tuple[str, ...]
    backend: str
    graphs: str | None = None
    baseline: str | None = None
    write_baseline: str | None = None
    locate: bool = False
    as_json: bool = False
    csv: str | None = None
    inputs: str = "saved"
    seed: int = 0
    timeout_s: float = 600.0
    rounds: int = 10
    key: str | None = None
    trusted: bool = False
    trust_ops: tuple[str, ...] = ()
    progress: bool = True
    locate_dir: str | None = None
    threads: int | None = 1
    clock: str = "auto"
    removed: tuple[str, ...] = ()  # --removed MODEL[/GRAPH]: baseline graphs no longer benched on purpose
    sizes: tuple[str, ...] = ()  # --sizes NAME=v1,v2,...: bench each graph at these sizes (sizes.py)
    collectives: str | None = None  # --collectives: a distributed rank's (ranks.MODES; None: recorded)
    minimize: bool = False  # --minimize: --locate, then each culprit cut down to the few nodes that still fail
    brief: bool = False  # aotpipe minimize: the failing graphs only, not the timing table and scores


def run_bench(o: BenchOptions, say: Callable[..., None], emit: Callable[..., None]) -> int:
    """Bench, print the table (or JSON), write the files asked for; the exit status.

    `say` prints a line that may hold names from artefacts (escaped); `emit` prints JSON as
    it is (json.dumps escapes every control character itself).

    0: every graph passed, or (with --baseline) no graph that passed in the baseline fails
    now, or (with --write-baseline) the baseline was written; 1 otherwise."""
    from tqdm import tqdm

    kinds = parse_kinds(o.graphs)
    points = parse_sizes(o.sizes)
    if points:
        # A baseline has one row per graph, and --locate bisects at the captured sizes.
        for given, name in ((o.baseline, "--baseline"), (o.write_baseline, "--write-baseline"), (o.locate, "--locate"),
                            (o.minimize, "--minimize")):
            if given:
                raise AotpipeError(f"{name} does not go with --sizes (a baseline holds one status per graph, and "
                                   f"--locate bisects at the captured sizes); run it in a bench without --sizes")
    expected = baselines.read_baseline(Path(o.baseline)) if o.baseline else None  # a bad file fails first
    if o.removed and expected is None:
        raise AotpipeError(f"--removed {o.removed[0]}: names a graph of a baseline; give the baseline with --baseline")
    if expected is not None:
        baselines.check_removed(expected, o.removed, o.baseline)
    bar: list[tqdm] = []

    def on_plan(n: int) -> None:
        bar.append(tqdm(total=n, unit="graph", disable=None if o.progress and not o.as_json else True,
                        dynamic_ncols=True))

    def on_result(r: object) -> None:
        if bar:
            bar[0].update(1)

    result = bench([Path(p) for p in o.paths], o.backend, kinds=kinds, inputs=o.inputs, seed=o.seed,
                   timeout_s=o.timeout_s, rounds=o.rounds, key=o.key, trusted=o.trusted, trust_ops=o.trust_ops,
                   threads=o.threads, clock=o.clock, on_result=on_result, on_plan=on_plan, sizes=points,
                   collectives=parse_collectives(o.collectives))
    if bar:
        bar[0].close()
    located = []
    if o.locate or o.minimize:
        located = locate_failures(result, Path(o.locate_dir or "bench-repros"), timeout_s=o.timeout_s,
                                  trust_ops=o.trust_ops, threads=o.threads,
                                  task=MinimizeTask if o.minimize else LocateTask,
                                  errors=CrashTask if o.minimize else None)
    comparison = None
    if expected is not None:
        inference_only = parse_backend(o.backend).inference_only

        def benched(graph: str) -> bool:  # a graph of this key is one this bench would have run
            parsed = parse_graph_key(graph)
            kind = parsed.kind if parsed is not None else graph
            return (kinds is None or kind in kinds) and (not inference_only or kind == "inference")

        comparison = baselines.compare(result.results, expected, benched_kinds=benched,
                                       removed=o.removed)
    if o.csv:
        write_csv(Path(o.csv), result)
    if o.write_baseline:
        baselines.write_baseline(Path(o.write_baseline), result.results)
    out = result.to_json()
    out["located"] = [loc.to_json() for loc in located]
    bugs = triage(result.results, located) if o.minimize else None
    if o.as_json:
        if bugs is not None:
            out["bugs"] = [b.to_json() for b in bugs]
        if comparison is not None:
            out["baseline"] = comparison.__dict__
        emit(json.dumps(out, indent=2, sort_keys=True))
    else:
        for line in failures(result) if o.brief else table(result):
            say(line)
        for note in result.notes:
            say(f"note: {note}")
        for loc in located:
            for line in loc.lines():
                say(line)
        if bugs:
            for line in triage_lines(bugs):
                say(line)
        if comparison is not None:
            for title, items in (("regressions (passed in the baseline, fail now)", comparison.regressions),
                                 ("regressions (passed in the baseline, gone now)", comparison.vanished),
                                 ("improvements", comparison.improvements),
                                 ("removed on purpose (--removed)", comparison.removed),
                                 ("changed failures", comparison.changed),
                                 ("not in the baseline", comparison.new),
                                 ("in the baseline, not benched", comparison.missing)):
                if items:
                    say(f"{title}: {len(items)}")
                    for item in items:
                        say(f"    {item}")
            if comparison.ok:
                say(f"baseline {o.baseline}: no regressions")
        if o.write_baseline:
            say(f"wrote baseline {o.write_baseline} ({len(result.results)} graphs)")
    if comparison is not None:
        return 0 if comparison.ok else 1
    if o.write_baseline:
        return 0
    return 0 if all(r.status == "pass" for r in result.results) else 1
