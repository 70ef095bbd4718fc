"""The GEMM cpu-fast's loader packs linears for: oneDNN's against MKL's, on the linear shapes
of the CPU benchmark's transformers, side by side in one process.

For each (rows, in, out) shape, three ways to compute ``linear(x, W, b)`` on float32, rounds
interleaved, median ms:

- aten: ``torch.nn.functional.linear`` (what eager and an unpacked graph run);
- MKL packed: ``mkl._mkl_linear`` with W packed by ``mkl._mkl_reorder_linear_weight`` for the
  row count (what jit's and inductor's freezing pack a float32 linear into);
- oneDNN packed: ``mkldnn._linear_pointwise`` with W packed by
  ``mkldnn._reorder_linear_weight`` (what aotpipe's loader packs a cpu-fast linear into,
  aotpipe/artifact/prepack.py), and the same with a GELU fused as its post-op against
  MKL's GEMM followed by ATen's GELU.

The loader's choice of oneDNN rests on this page: rerun it on another CPU (an Intel one,
where MKL is at home) to see whether the choice holds there.

    python benchmarks/gemm_bench.py [--rounds 20] [--markdown [FILE]]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _markdown import add_markdown_option, write_page
from cpu_bench import interleaved

# (model, rows, in, out): batch 8 x 128 tokens (BERT), 8 x 197 (ViT-B/16)
SHAPES = [
    ("bert_4l", 1024, 256, 256), ("bert_4l", 1024, 256, 1024), ("bert_4l", 1024, 1024, 256),
    ("bert_base", 1024, 768, 768), ("bert_base", 1024, 768, 3072), ("bert_base", 1024, 3072, 768),
    ("vit_b16", 1576, 768, 768), ("vit_b16", 1576, 768, 3072), ("vit_b16", 1576, 3072, 768),
]


def measure(rows: int, k: int, n: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, k), torch.randn(n, k) * 0.05, torch.randn(n)
    mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    dnn = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    fns: dict[str, Callable[[], Any]] = {
        "aten": lambda: torch.nn.functional.linear(x, w, b),
        "MKL packed": lambda: torch.ops.mkl._mkl_linear(x, mkl, w, b, rows),
        "oneDNN packed": lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, b, "none", [], None),
        "MKL + GELU": lambda: torch.nn.functional.gelu(torch.ops.mkl._mkl_linear(x, mkl, w, b, rows)),
        "oneDNN GELU fused": lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, b, "gelu", [], "none"),
    }
    with torch.no_grad():
        torch.testing.assert_close(fns["oneDNN packed"](), fns["aten"](), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(fns["oneDNN GELU fused"](), fns["MKL + GELU"](), rtol=1e-4, atol=1e-4)
    return interleaved(fns, rounds)  # cpu_bench's: every way once per round, median ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    add_markdown_option(p, "gemm_bench")
    a = p.parse_args()
    lines = [f"float32 linear, torch {torch.__version__}, {torch.get_num_threads()} threads, median ms of "
             f"{a.rounds} interleaved rounds; speed-up = MKL's time over oneDNN's (higher: oneDNN faster).", "",
             "| model | rows x in -> out | aten | MKL packed | oneDNN packed | speed-up | MKL + GELU "
             "| oneDNN GELU fused | speed-up |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model, rows, k, n in SHAPES:
        r = measure(rows, k, n, a.rounds)
        lines.append(f"| {model} | {rows} x {k} -> {n} | {r['aten']:.2f} | {r['MKL packed']:.2f} "
                     f"| {r['oneDNN packed']:.2f} | {r['MKL packed'] / r['oneDNN packed']:.2f}x "
                     f"| {r['MKL + GELU']:.2f} | {r['oneDNN GELU fused']:.2f} "
                     f"| {r['MKL + GELU'] / r['oneDNN GELU fused']:.2f}x |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    if a.markdown:
        write_page(a.markdown, "gemm_bench", text)


if __name__ == "__main__":
    main()
