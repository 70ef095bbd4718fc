"""Cold run vs warm re-run of an unchanged pipeline (the warm run keeps every artefact).

Target: the warm run takes under 5% of the cold run's time. Measured two ways, side by
side: the pipeline work in one process (run_pipeline: config, fingerprints, checks,
reports) and the whole `aotpipe run` command (which adds Python start-up and importing
torch, the same for any tool built on torch).

    python benchmarks/incremental_bench.py [PIPELINE.yaml ...] [--markdown [FILE]]   # default: quickstart and zoo-hf
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from _markdown import take_markdown_option, tee_page  # noqa: E402

from aotpipe.pipeline.config import load_pipeline  # noqa: E402
from aotpipe.pipeline.runner import run_pipeline  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def command_seconds(pipeline: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "aotpipe.cli", "run", str(pipeline), "-o", str(out), "--no-progress"],
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def main(paths: list[Path]) -> None:
    print("| pipeline | cold run_pipeline s | warm run_pipeline s | warm/cold | cold command s | warm command s "
          "| warm/cold |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        pipeline = load_pipeline(path)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            cold = run_pipeline(pipeline, output=tmp, progress=False)
            cold_s = time.perf_counter() - t0
            assert cold.ok and not any(m.skipped for m in cold.models)
            t0 = time.perf_counter()
            warm = run_pipeline(pipeline, output=tmp, progress=False)
            warm_s = time.perf_counter() - t0
            assert all(m.skipped for m in warm.models)
        with tempfile.TemporaryDirectory() as tmp:
            cold_cmd = command_seconds(path, Path(tmp))
            warm_cmd = command_seconds(path, Path(tmp))
        print(f"| {pipeline.name} | {cold_s:.2f} | {warm_s:.3f} | {warm_s / cold_s:.1%} | {cold_cmd:.2f} "
              f"| {warm_cmd:.2f} | {warm_cmd / cold_cmd:.1%} |")


if __name__ == "__main__":
    page = take_markdown_option("incremental_bench")
    args = [Path(a) for a in sys.argv[1:]] or [REPO / "pipelines" / "quickstart.yaml", REPO / "pipelines" / "zoo-hf.yaml"]
    with tee_page(page, "incremental_bench"):
        main(args)
