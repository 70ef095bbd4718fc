"""What a replay's evidence costs on disk: its share of each artefact's bytes.

Evidence (aotpipe/runtime/evidence.py) is, per recorded output, a blob of at most 1024 sampled values
plus a few numbers in inputs.json. This prints, per model folder: its bytes, the bytes of
the blobs only evidence uses (a sample that is also a stored value costs nothing more),
the bytes of the evidence records in inputs.json, and their share of the folder.

    python benchmarks/evidence_bytes.py ARTIFACT_OR_TREE ... [--markdown [FILE]]

For the share at real size, next to the folder / .pt2 ratio:

    python benchmarks/realsize_bench.py pipelines/real-size.yaml --only bert_base \\
        --tools export,aotpipe --output /tmp/rs
    python benchmarks/evidence_bytes.py /tmp/rs/real-size
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _markdown import take_markdown_option, tee_page


def measure(folder: Path) -> dict:
    """Bytes of one model folder, and of its evidence."""
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    evidence_blobs: set[str] = set()
    other_blobs: set[str] = set()
    record_bytes = outputs = 0
    for ij in folder.rglob("inputs.json"):
        rec = json.loads(ij.read_text())
        other_blobs |= {s["blob"] for s in rec["storages"] if s.get("blob")}
        for o in rec["outputs"]:
            if o.get("blob"):
                other_blobs.add(o["blob"])
            if o.get("evidence"):
                outputs += 1
                evidence_blobs.add(o["evidence"]["blob"])
                record_bytes += len(json.dumps({"evidence": o["evidence"]}, separators=(",", ":")))
    for gj in folder.rglob("graph.json"):
        other_blobs |= {n["blob"] for n in json.loads(gj.read_text())["nodes"] if n.get("blob")}
    only = evidence_blobs - other_blobs
    blob_bytes = sum((folder / "blobs" / f"{b}.safetensors").stat().st_size for b in only
                     if (folder / "blobs" / f"{b}.safetensors").is_file())
    return {"model": folder.name, "bytes": total, "outputs": outputs, "evidence_blobs": len(only),
            "evidence_blob_bytes": blob_bytes, "evidence_record_bytes": record_bytes,
            "share": (blob_bytes + record_bytes) / total if total else 0.0}


def main(paths: list[Path]) -> None:
    folders = sorted({m.parent for p in paths for m in ([p / "manifest.json"] if (p / "manifest.json").is_file()
                                                          else p.rglob("manifest.json"))})
    print("| model | folder bytes | outputs with evidence | evidence blobs (bytes) | evidence records in "
          "inputs.json (bytes) | evidence share |")
    print("|---|---:|---:|---:|---:|---:|")
    for f in folders:
        m = measure(f)
        print(f"| {m['model']} | {m['bytes']:,} | {m['outputs']} | {m['evidence_blobs']} "
              f"({m['evidence_blob_bytes']:,}) | {m['evidence_record_bytes']:,} | {100 * m['share']:.2f}% |")


if __name__ == "__main__":
    page = take_markdown_option("evidence_bytes")
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with tee_page(page, "evidence_bytes"):
        main([Path(a) for a in sys.argv[1:]])
