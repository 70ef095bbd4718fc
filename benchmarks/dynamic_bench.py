"""What shape-polymorphic capture costs: the same models captured static and with `dims:`,
side by side in one process, in alternating rounds.

    python benchmarks/dynamic_bench.py [--pipeline pipelines/quickstart-dynamic.yaml] [--rounds 3]
                                       [--markdown [FILE]]

Each model of the dynamic pipeline runs as a worker runs it (``run_model``, forced), once as
written and once with its `dims:` removed (every size at the example's: the static capture of
the same inputs), alternating which goes first. Per model: the capture's seconds (torch.export
and AOTAutograd), the checks' seconds (at the example, and for the dynamic capture also at
min, max and a random size), and the ratio dynamic / static of each, medians over the rounds.
The tool a user would otherwise pick for a shape-polymorphic graph is torch.export with the
same `Dim`s; its export is the first part of both captures, so the capture ratio says what
aotpipe's training graphs and records add on top of a dynamic export versus a static one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # measure this checkout's aotpipe, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _markdown import add_markdown_option, tee_page  # noqa: E402


def static_of(spec: Any) -> Any:
    """`spec` with every size at its example: no dims, no named input dimensions."""
    from aotpipe.spec import InputSpec, ModelSpec

    inputs = [InputSpec(**{**{f: getattr(i, f) for f in InputSpec.model_fields}, "dims": []}) for i in spec.inputs]
    return ModelSpec(**{**{f: getattr(spec, f) for f in ModelSpec.model_fields}, "inputs": inputs, "dims": {},
                        "auto_dims": False})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", type=Path, default=REPO / "pipelines" / "quickstart-dynamic.yaml")
    p.add_argument("--rounds", type=int, default=3)
    add_markdown_option(p, "dynamic_bench")
    a = p.parse_args()

    from aotpipe.pipeline.config import load_pipeline
    from aotpipe.pipeline.job import run_model

    pipeline = load_pipeline(a.pipeline)
    base = a.pipeline.parent
    times: dict[tuple[str, str], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run_model(static_of(pipeline.models[0]), Path(tmp) / "warm", base, force=True)  # torch's lazy imports
        for r in range(a.rounds):
            for spec in pipeline.models:
                pair = [("dynamic", spec), ("static", static_of(spec))]
                for how, s in (pair if r % 2 == 0 else pair[::-1]):
                    res = run_model(s, Path(tmp) / how, base, force=True)
                    if res.status != "ok":
                        print(f"{spec.name} ({how}) failed: {res.error}", file=sys.stderr)
                        return 1
                    t = times.setdefault((spec.name, how), {"capture": [], "checks": []})
                    t["capture"].append(res.capture_seconds or 0.0)
                    t["checks"].append(res.checks_seconds or 0.0)
    with tee_page(a.markdown, "dynamic_bench"):
        print(f"{a.rounds} rounds, alternating; medians in seconds\n")
        print("| model | capture static | capture dynamic | ratio | checks static | checks dynamic | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        ratios: dict[str, list[float]] = {"capture": [], "checks": []}
        for spec in pipeline.models:
            cells = []
            for part in ("capture", "checks"):
                st = statistics.median(times[(spec.name, "static")][part])
                dy = statistics.median(times[(spec.name, "dynamic")][part])
                ratios[part].append(dy / st if st else float("nan"))
                cells += [f"{st:.2f}", f"{dy:.2f}", f"{ratios[part][-1]:.2f}x"]
            print(f"| {spec.name} | " + " | ".join(cells) + " |")
        print(f"\nGeometric mean, dynamic / static: capture {statistics.geometric_mean(ratios['capture']):.2f}x, "
              f"checks {statistics.geometric_mean(ratios['checks']):.2f}x (the dynamic checks run every graph at "
              "three more sizes: min, max and a random one).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
