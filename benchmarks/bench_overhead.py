"""The bench's own share of a worker's time, by CPU time: where a loaded machine's wall time lies.

    python benchmarks/bench_overhead.py ARTEFACT BACKEND GRAPH[,GRAPH...]

Benches the graphs of one artefact one after another in this process (as one worker does),
with one intra-op thread and every clock of aotpipe.corpus.bench.graph made the process's CPU time,
and prints one JSON line: the share of the CPU time spent outside the backend's compile and
run, the CPU seconds in all and outside, and each graph's (status, seconds, seconds in the
backend). Run it with PYTHONPATH at two checkouts, alternately, to compare them side by side.
"""

from __future__ import annotations

import json
import sys
import time
import types


def main(argv: list[str]) -> int:
    import torch

    import aotpipe.corpus.bench.graph as G

    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    G.time = types.SimpleNamespace(perf_counter=time.process_time, process_time=time.process_time)
    G.CLOCKS = {"wall": time.process_time, "cpu": time.process_time}
    art, backend, graphs = argv[1], argv[2], argv[3].split(",")
    rs = [G.bench_graph(G.GraphTask(art, "x", g, backend, "saved", 0, 5, (), "cpu")) for g in graphs]
    total = sum(r.wall_s for r in rs)
    inside = sum(r.in_backend_s for r in rs)
    print(json.dumps({"checkout": G.__file__, "share": round((total - inside) / total, 3), "cpu_s": round(total, 2),
                      "own_s": round(total - inside, 2),
                      "graphs": [(r.graph, r.status, round(r.wall_s, 2), round(r.in_backend_s, 2)) for r in rs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
