"""Run torch's own op and module corpora through `aotpipe run` and write their pass rates and failures.

pipelines/torch-ops.yaml and pipelines/torch-modules.yaml (tools/torch_corpus.py) hold one model
per op_db operator and per module_db sample. This runs them, or an evenly spaced sample of each
(`--ops N --modules N`), through the real command (`aotpipe run`, process executor, a fresh
output folder), reads each run.json, and prints per corpus the share of models that captured
every graph asked for and passed every check, then every failing model grouped by failure class
(a rule on the stage it stopped at and its error; the first matching rule names it).

    .venv/bin/python benchmarks/torch_corpus_bench.py --ops 60 --modules 40 --markdown
    .venv/bin/python benchmarks/torch_corpus_bench.py              # both corpora whole: hours
    .venv/bin/python benchmarks/torch_corpus_bench.py --from-run OUT --markdown   # an earlier run's folder
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import _markdown  # noqa: E402

CORPORA = {"torch-ops": REPO / "pipelines" / "torch-ops.yaml",
           "torch-modules": REPO / "pipelines" / "torch-modules.yaml"}

# (class, stage regex, error regex): the first that matches a failed model's stage and error
# names its class. Ordered from the specific to the general.
CLASSES: list[tuple[str, str, str]] = [
    ("timeout or worker crash", r"worker|timeout|killed", r""),
    ("op not on the allow-list", r"", r"allow-list|not on the .*list|which is not allowed|unknown op"),
    ("library op with no ATen decomposition", r"", r"library namespace|no ATen decomposition"),
    ("effect tokens", r"", r"[Ee]ffect|with_effects|token"),
    ("sparse tensors", r"", r"[Ss]parse"),
    ("complex values", r"", r"[Cc]omplex|conjugat|view_as_real"),
    ("lazy module (uninitialized parameters)", r"", r"[Ll]azy|[Uu]ninitialized"),
    ("mutated user input", r"", r"mutat\w* (user )?input|input mutation|mutates? (its|an) input"),
    ("a Python bool decided by values (no graph returns one)", r"",
     r"DataDependentOutputException: aten\.(allclose|equal)\.default"),
    ("graph break / partial capture", r"", r"graph break|partial|subgraph"),
    ("data-dependent sizes", r"", r"[Dd]ata.dependent|GuardOnDataDependent|unbacked|nonzero"),
    ("no gradient to compute", r"", r"no gradient to compute|NothingToDifferentiate|does not require grad"),
    ("check against eager failed", r"verify", r"eager|fp64|float64|mismatch|error .* bound"),
    ("replay or chain mismatch", r"verify", r""),
    ("capture failed (other)", r"capture", r""),
    ("source failed", r"source", r""),
    ("write failed", r"write", r""),
]


# Failures whose cause is torch's, by model name: (name regex, the smallest reproduction under
# benchmarks/torch_repros/, what it shows). tests/test_torch_repros.py runs each: it fails once
# torch no longer behaves so, and the entry (and maybe a refusal in aotpipe) can go.
TORCH_CAUSES: list[tuple[str, str, str]] = [
    (r"^nn\.MultiLabelMarginLoss\.", "multilabel_margin_loss_decomposition_shape.py",
     "torch's decomposition of multilabel_margin_loss_forward returns shape [1] where eager returns []"),
    (r"^nn\.Transformer\.", "transformer_fastpath_padding.py",
     "eager's nested-tensor fast path zeroes padded encoder positions; the exported program does not"),
    (r"^sparse\.(mm\.reduce|sampled_addmm)\.", "sparse_csr_run_decompositions_abort.py",
     "run_decompositions aborts the process on a sparse CSR input that needs grad (aotpipe refuses it first)"),
    (r"^linalg\.lstsq\.", "lstsq_dynamic_output_shape.py",
     "linalg_lstsq's output sizes depend on values on CPU (DynamicOutputShapeException)"),
]


def torch_cause(name: str) -> Optional[tuple[str, str]]:
    """(repro file, what it shows) where a failed model's cause is a known torch behaviour."""
    for pattern, repro, what in TORCH_CAUSES:
        if re.search(pattern, name):
            return repro, what
    return None


def classify(stage: Optional[str], error: Optional[str]) -> str:
    """The failure class of a failed model from its run.json stage and error."""
    stage, error = stage or "", error or ""
    for name, stage_re, error_re in CLASSES:
        if (not stage_re or re.search(stage_re, stage)) and (not error_re or re.search(error_re, error)):
            return name
    return "other"


def subset(path: Path, n: Optional[int], into: Path) -> tuple[Path, int]:
    """A copy of the corpus pipeline with every k-th model (n in all, evenly spaced; all when
    None), and how many models the whole corpus has."""
    lines = path.read_text().splitlines(keepends=True)
    head = [ln for ln in lines if not ln.startswith("- {")]
    models = [ln for ln in lines if ln.startswith("- {")]
    picked = models if n is None or n >= len(models) else [models[(i * len(models)) // n] for i in range(n)]
    out = into / path.name
    out.write_text("".join(head) + "".join(picked))
    return out, len(models)


def run_corpus(pipeline: Path, output: Path, workers: int, timeout_s: int) -> float:
    """`aotpipe run` the pipeline in a fresh folder with the process executor; its wall time."""
    cmd = [sys.executable, "-m", "aotpipe.cli", "run", str(pipeline), "--output", str(output), "--executor",
           "process", "--workers", str(workers), "--no-progress", "--force"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=timeout_s)
    return time.perf_counter() - t0


def summarise(run_json: Path) -> dict[str, Any]:
    """Per model: name, status, stage, error, class (failed ones) from a run.json."""
    run = json.loads(run_json.read_text())
    out = []
    for m in run["models"]:
        checks = m.get("checks") or {}
        clean = m["status"] == "ok" and not checks.get("failed") and not checks.get("skipped")
        out.append({"name": m["name"], "status": m["status"], "stage": m.get("stage"), "error": m.get("error"),
                    "skipped_checks": checks.get("skipped", 0), "clean": clean,
                    "class": None if m["status"] == "ok" else classify(m.get("stage"), m.get("error"))})
    started = (run.get("run") or {}).get("started")  # run.json v3 names its run
    return {"models": out, "seconds": run.get("seconds"), "started": started}


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| corpus | models run | of | ok | ok, every check run | failed | wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for corpus, r in results.items():
        ms = r["models"]
        ok = sum(m["status"] == "ok" for m in ms)
        clean = sum(m["clean"] for m in ms)
        wall = r["wall"] if r.get("wall") is not None else r.get("seconds")  # a run's own figure, --from-run
        wall = f"{wall:.0f}" if wall is not None else "-"
        lines.append(f"| {corpus} | {len(ms)} | {r['total']} | {ok} ({100 * ok / max(1, len(ms)):.1f}%) | "
                     f"{clean} ({100 * clean / max(1, len(ms)):.1f}%) | {len(ms) - ok} | {wall} |")
    lines.append("")
    lines.append("ok: every graph asked for captured, written and checked with no failure; \"every check run\": "
                 "none of its checks skipped either.")
    started = [f"{corpus} at {r['started']}" for corpus, r in results.items() if r.get("started")]
    if started:
        lines.append(f"Runs started: {', '.join(started)}.")
    for corpus, r in results.items():
        failed = [m for m in r["models"] if m["status"] != "ok"]
        by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for m in failed:
            by_class[m["class"]].append(m)
        lines += ["", f"## {corpus}: failures by class", ""]
        if not failed:
            lines.append("none")
        for cls, ms in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines += [f"### {cls} ({len(ms)})", ""]
            for m in ms:
                err = (m["error"] or "").replace("|", "\\|").replace("\n", " ")
                lines.append(f"- `{m['name']}` ({m['stage']}): {err[:240]}")
                cause = torch_cause(m["name"])
                if cause is not None:
                    lines.append(f"  - torch's cause: {cause[1]}; smallest reproduction: "
                                 f"[{cause[0]}](../../benchmarks/torch_repros/{cause[0]})")
            lines.append("")
        skipped = [m for m in r["models"] if m["status"] == "ok" and m["skipped_checks"]]
        if skipped:
            names = ", ".join("`" + m["name"] + "`" for m in skipped)
            lines.append(f"ok with skipped checks: {names}")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=None, help="run this many ops, evenly spaced (default: all)")
    p.add_argument("--modules", type=int, default=None, help="run this many module samples, evenly spaced (default: all)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=int, default=4 * 3600, help="seconds for each corpus's run")
    p.add_argument("--output", type=Path, default=None, help="keep the artefacts here (default: a temporary folder)")
    p.add_argument("--from-run", type=Path, default=None,
                   help="report an earlier run's folder (OUTPUT, holding torch-ops/ and torch-modules/) instead of running")
    _markdown.add_markdown_option(p, "torch_corpus_bench")
    args = p.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="torch-corpus-") as tmp:
        root = args.from_run or args.output or Path(tmp) / "out"
        for corpus, path in CORPORA.items():
            n = args.ops if corpus == "torch-ops" else args.modules
            if n == 0:
                continue
            pipeline, total = subset(path, n, Path(tmp))
            wall = None
            if args.from_run is None:
                print(f"running {corpus} ({pipeline.read_text().count(chr(10) + '- {')} models) ...", file=sys.stderr)
                wall = run_corpus(pipeline, root, args.workers, args.timeout)
            run_json = root / corpus / "run.json"
            if not run_json.is_file():
                print(f"{corpus}: no run.json at {run_json}", file=sys.stderr)
                continue
            results[corpus] = {**summarise(run_json), "total": total, "wall": wall}
    body = report(results)
    print(body)
    if args.markdown is not None:
        _markdown.write_page(args.markdown, "torch_corpus_bench", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
