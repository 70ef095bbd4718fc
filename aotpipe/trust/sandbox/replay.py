"""``aotpipe replay`` as one computation: in this process (trusted) or in the sandbox.

- :func:`replay_outcome` loads the artefact and replays it here: for artefacts you trust
  (signed by a key you trust, or made by you). :func:`aotpipe.replay.replay` is the same
  kind of call, graph by graph.
- :func:`replay_sandboxed` does the same in a sandboxed worker (:mod:`aotpipe.trust.sandbox`)
  and rebuilds the results from the JSON it sends back; a crash or corruption there is a
  :class:`~aotpipe.errors.SandboxError`.
- Which of the two runs an artefact's graphs: :mod:`aotpipe.trust.sandbox.decide`.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotpipe.errors import AotpipeError, SandboxError
from aotpipe.format.folders import is_graph_folder
from aotpipe.format.records import RawJson
from aotpipe.trust.sandbox.launch import run_task

if TYPE_CHECKING:
    from aotpipe.replay.run import ChainReplay, GraphReplay
    from aotpipe.replay.steps import StepsReplay
    from aotpipe.trust.sandbox.launch import SandboxLimits
    from aotpipe.trust.sandbox.worker import Worker


@dataclass
class ReplayOutcome:
    """What ``aotpipe replay`` reports: each graph's replay, the chain's, and why there is
    no eager comparison (if there is none)."""

    artifact: str
    graphs: list[GraphReplay]
    chain: ChainReplay | None = None
    no_eager: str | None = None
    sandboxed: bool = False
    notes: list[str] = field(default_factory=list)
    sizes: dict[str, int] | None = None  # replayed at these sizes (every dimension), not the example's
    steps: StepsReplay | None = None  # --steps N: a train_step graph's chained steps

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.graphs) and (self.chain is None or self.chain.status == "match") \
            and (self.steps is None or self.steps.ok)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"artifact": self.artifact, "ok": self.ok, "sandboxed": self.sandboxed,
                               "graphs": [r.to_json() for r in self.graphs]}
        if self.chain is not None:
            out["chain"] = self.chain.to_json()
        if self.no_eager:
            out["no_eager_comparison"] = self.no_eager
        if self.sizes is not None:
            out["sizes"] = self.sizes
        if self.notes:
            out["notes"] = self.notes
        if self.steps is not None:
            out["steps"] = self.steps.to_json()
        return out

    @classmethod
    def from_json(cls, data: RawJson, *, sandboxed: bool) -> ReplayOutcome:
        """Rebuilt from :meth:`to_json`'s data, validated (it comes from the worker)."""
        import pydantic

        from aotpipe.replay.run import ChainReplay, GraphReplay  # torch: kept off the torch-free path
        from aotpipe.replay.steps import StepsReplay  # torch: kept off the torch-free path

        try:
            if not isinstance(data, dict):
                raise ValueError(f"a {type(data).__name__}, not an object")
            graphs = pydantic.TypeAdapter(list[GraphReplay]).validate_python(data.get("graphs"))
            chain = data.get("chain")
            chain = None if chain is None else pydantic.TypeAdapter(ChainReplay).validate_python(chain)
            no_eager = data.get("no_eager_comparison")
            notes = pydantic.TypeAdapter(list[str]).validate_python(data.get("notes", []))
            sizes = pydantic.TypeAdapter(dict[str, int] | None).validate_python(data.get("sizes"))
            steps = data.get("steps")
            steps = None if steps is None else pydantic.TypeAdapter(StepsReplay).validate_python(steps)
            return cls(str(data.get("artifact", "")), graphs, chain,
                       str(no_eager) if no_eager is not None else None, sandboxed, notes, sizes, steps)
        except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError

            first = " ".join(str(e).split())[:200]
            raise SandboxError(f"the sandboxed worker sent back a malformed result ({first})", "malformed") from None


def replay_outcome(path: str | Path, *, graphs: Sequence[str] = (), inputs: str = "saved", seed: int = 0,
                   device: str | None = None, bench: int = 0, chain: bool = False,
                   threads: int | None = None, trust_code: bool = False, trust_ops: Sequence[str] = (),
                   sizes: dict[str, int] | None = None, steps: int = 0,
                   worker: Worker | None = None) -> ReplayOutcome:
    """Load the artefact at `path` and replay it in this process (see ``aotpipe replay``).

    Runs the graphs here: only for artefacts you trust. `sizes`: replay a shape-polymorphic
    artefact at these sizes (aotpipe.replay.replay_at_sizes; not with `bench` or `chain`, which
    run at the example's). `worker`: the sandboxed worker this runs in, which instruments the
    graphs and keeps the progress. `steps` N > 0: also N chained runs of the train_step graph
    (aotpipe.replay.steps)."""
    from aotpipe.artifact.load import load  # torch: kept off the torch-free path
    from aotpipe.replay import eager_bench, replay_at_sizes, replay_chain  # torch: kept off the torch-free path
    from aotpipe.replay import replay as replay_graphs  # torch: kept off the torch-free path

    if sizes is not None and (bench or chain or steps):
        raise AotpipeError("--sizes replays the graphs alone: --bench, --chain and --steps run at the example "
                           "sizes; drop one or the other")
    p = Path(path)
    if worker is not None:
        worker.mark("while loading the artefact")
    art = load(p, trust_code=trust_code, trust_ops=trust_ops)
    if worker is not None:
        worker.watch(art)
        worker.mark("while making the inputs")
    kinds = list(graphs)
    if not kinds and is_graph_folder(p):
        kinds = [k for k, g in art.graphs.items() if g.folder.resolve() == p.resolve()]
    if sizes is not None:
        at = replay_at_sizes(art, sizes, graphs=kinds or None, inputs=inputs, seed=seed, device=device,
                             threads=threads)
        return ReplayOutcome(art.name, at.graphs, sandboxed=worker is not None, notes=at.notes, sizes=at.sizes)
    results = replay_graphs(art, graphs=kinds or None, inputs=inputs, seed=seed, device=device, bench=bench,
                            threads=threads)
    if bench:
        for r in results:
            if worker is not None:
                worker.mark(f"while timing the eager model for graph {r.kind}")
            r.eager_bench_seconds = eager_bench(art, r.kind.split(".")[0], bench, trust_code=trust_code)
    if chain and worker is not None:
        worker.mark("while making the chain's inputs")
    chained = replay_chain(art, trust_code=trust_code, threads=threads) if chain else None
    stepped = None
    if steps:
        from aotpipe.replay.steps import replay_steps  # torch: kept off the torch-free path

        if worker is not None:
            worker.mark(f"while running {steps} chained steps")
        stepped = replay_steps(art, steps, inputs=inputs, seed=seed, threads=threads)
    no_eager = None
    if bench or chain:
        from aotpipe.models.sources import check_source, rebuild_refusal  # torch: kept off the torch-free path

        source = art.manifest.model.source
        no_eager = rebuild_refusal(source, trust_code)
        if no_eager is None and isinstance(source, str):
            why = check_source(source)  # trusted, but it must import here too
            if why:
                no_eager = (f"the model's source does not import from {Path.cwd()}: {why} (run replay from the "
                            "folder the pipeline ran in, or put the module on PYTHONPATH)")
    return ReplayOutcome(art.name, results, chained, no_eager, sandboxed=worker is not None, steps=stepped)


def replay_task(args: dict[str, Any], worker: Worker) -> dict[str, Any]:
    """The worker's "replay" task: :func:`replay_outcome` as JSON."""
    return replay_outcome(worker=worker, **args).to_json()


def replay_sandboxed(path: str | Path, *, graphs: Sequence[str] = (), inputs: str = "saved", seed: int = 0,
                     device: str | None = None, bench: int = 0, chain: bool = False,
                     threads: int | None = None, trust_code: bool = False, trust_ops: Sequence[str] = (),
                     sizes: dict[str, int] | None = None, steps: int = 0,
                     limits: SandboxLimits | None = None) -> ReplayOutcome:
    """:func:`replay_outcome` in a sandboxed worker: the way to replay an artefact you do
    not trust. Needs bubblewrap (bwrap); a crash, a memory corruption or a limit overrun
    in the worker is a one-line SandboxError, and this process is untouched."""
    if device is not None and device.split(":")[0] not in ("cpu", "meta"):
        raise AotpipeError(f"--device {device}: the sandbox runs graphs on the CPU only; for an artefact you "
                           "trust, sign it and pass --key KEY, or pass --no-sandbox")
    where = os.path.abspath(path)
    args = {"path": where, "graphs": list(graphs), "inputs": inputs, "seed": seed, "device": device,
            "bench": bench, "chain": chain, "threads": threads, "trust_code": trust_code,
            "trust_ops": list(trust_ops), "sizes": sizes, "steps": steps}
    # The results are rebuilt as aotpipe.replay's types, which import torch: import it here
    # while the worker starts (its own import of torch is most of the sandbox's overhead).
    importing = threading.Thread(target=importlib.import_module, args=("aotpipe.replay.run",), daemon=True)
    importing.start()
    try:
        value = run_task("replay", args, limits=limits, read_paths=[where])
    finally:
        importing.join()
    return ReplayOutcome.from_json(value, sandboxed=True)
