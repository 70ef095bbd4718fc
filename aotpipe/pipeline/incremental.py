"""Incremental runs: is a model's artefact on disk up to date, and what to report if so.

No torch import, here or in anything this imports: a warm re-run of an unchanged pipeline
reads each manifest, hashes each file and finishes without loading torch or the models'
libraries. The fingerprint therefore names a model's code by the file of the module its
source names (found without importing it), and a transformers class by the installed
transformers version.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import time
from pathlib import Path
from typing import Optional

from aotpipe.artifact.manifest import file_sha256, fingerprint
from aotpipe.errors import AotpipeError
from aotpipe.format.records import FORMAT_VERSION, CheckSummary, CheckTotals, Manifest
from aotpipe.format.vocabulary import ModelStatus
from aotpipe.models.pt2 import pt2_path
from aotpipe.pipeline.results import (
    ModelResult,
    checks_summary,
    eager_cells,
    failed_last_time,
    graph_results,
    is_partial,
    outside_graphs_lines,
    verification_summary,
    written_manifest,
)
from aotpipe.spec import ZOO_PREFIX, ModelSpec, is_callable_data, source_import_path
from aotpipe.spec.modes import capture_options


def model_fingerprint(spec: ModelSpec, base_dir: Path | None = None) -> str:
    """The fingerprint an up-to-date artefact of `spec` carries (spec, source code, options, versions)."""
    if spec.source.startswith("hf:"):
        code = _transformers_code()
    else:
        src = source_file(spec, base_dir)
        code = file_sha256(src) if src is not None and src.is_file() else None
    data = _data_files_sha256(spec, base_dir)
    if data:  # an input's data file is part of what the artefact holds (none: fingerprints as before)
        code = f"{code};data:{','.join(data)}"
    return fingerprint(spec.to_json(), code, capture_options(spec.mode, spec.loss))


def _data_files_sha256(spec: ModelSpec, base_dir: Path | None) -> list[str]:
    """The sha256 of each data file the spec's inputs load ("missing" where there is none)."""
    out = []
    for inp in spec.inputs:
        if inp.data is None or is_callable_data(inp.data):
            continue
        path = Path(inp.data) if Path(inp.data).is_absolute() or base_dir is None else base_dir / inp.data
        out.append(file_sha256(path) if path.is_file() else "missing")
    return out


@functools.lru_cache(maxsize=None)  # read from its metadata once: 448 hf models asked 1.5 s
def _transformers_code() -> Optional[str]:
    try:
        return f"transformers=={importlib.metadata.version('transformers')}"
    except importlib.metadata.PackageNotFoundError:
        return None


def source_file(spec: ModelSpec, base_dir: Path | None = None) -> Optional[Path]:
    """The file of the module a `module:callable` source names, without importing that
    module (a dotted name imports its parent packages, as Python's finder does), or a pt2:
    source's archive; None for transformers sources or a module that cannot be found (building the model says why)."""
    if spec.source.startswith("hf:"):
        return None
    if spec.source.startswith("pt2:"):
        return pt2_path(spec.source, base_dir)  # the archive: another file, another fingerprint
    module = "aotpipe.models.zoo" if spec.source.startswith(ZOO_PREFIX) else spec.source.partition(":")[0]
    with source_import_path(base_dir):
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        except Exception:  # a parent package raised while importing: the job will report it
            return None
    origin = getattr(found, "origin", None) if found is not None else None
    return Path(origin) if origin and origin not in ("built-in", "frozen") else None


def up_to_date(folder: Path, fp: str, key: Path | None = None) -> Optional[Manifest]:
    """The manifest of `folder` if it carries fingerprint `fp`, its files match their
    digests, it passed its checks, and with a signing `key`, its signature checks."""
    from aotpipe.trust.signing import check_signature  # cryptography: only when used
    from aotpipe.trust.verify import verify_artifact  # cryptography: only when used

    try:
        manifest = written_manifest(folder)
    except (OSError, AotpipeError):
        return None
    if manifest.fingerprint != fp or manifest.format_version != FORMAT_VERSION:
        return None  # another model, options or versions; or an older format: redo it in this one
    if verify_artifact(folder, load_graphs=False):
        return None
    if key is not None and check_signature(folder, key):
        return None  # unsigned, or not by this key: redo it (and sign it)
    if failed_last_time(manifest):
        return None  # try again
    return manifest


def skipped_result(spec: ModelSpec, folder: Path, manifest: Manifest, start: float) -> ModelResult:
    r = ModelResult(name=spec.name, status=ModelStatus.OK, skipped=True)
    r.graphs = graph_results(manifest)
    r.eager = eager_cells(manifest)
    r.checks = checks_summary(manifest)
    files = [p for p in folder.rglob("*") if p.is_file()]
    r.bytes, r.files = sum(p.stat().st_size for p in files), len(files)
    r.notes = list(manifest.capture.notes)
    r.skipped_passes = list(manifest.skipped_passes)  # a kept model still says which passes it got without
    if manifest.verification:
        r.verification = verification_summary(manifest)
    if is_partial(manifest):
        r.status, r.outside_graphs = ModelStatus.PARTIAL, outside_graphs_lines(manifest)
    r.total_seconds = time.perf_counter() - start
    return r


def artefact_folders(spec: ModelSpec, out_root: Path) -> list[Path]:
    """Where `spec`'s artefact lives under `out_root`: its folder, or for a distributed model one
    per rank of its world (``<name>.rank<r>``, docs/distributed.md)."""
    if spec.distributed is None:
        return [out_root / spec.name]
    return [out_root / f"{spec.name}.rank{r}" for r in range(spec.distributed.world_size)]


def kept_result(spec: ModelSpec, out_root: Path, fp: str, key: Path | None, start: float) -> ModelResult | None:
    """The result of keeping `spec`'s artefact (every rank's, for a distributed model) if all of
    it is up to date with fingerprint `fp`, else None (run it)."""
    folders = artefact_folders(spec, out_root)
    manifests = []
    for folder in folders:
        manifest = up_to_date(folder, fp, key)
        if manifest is None:
            return None
        manifests.append(manifest)
    r = skipped_result(spec, folders[0], manifests[0], start)
    if len(folders) > 1:  # the ranks' files and checks together; graphs as rank 0's (as a run says them)
        files = [p for f in folders for p in f.rglob("*") if p.is_file()]
        r.bytes, r.files = sum(p.stat().st_size for p in files), len(files)
        r.checks = summed_checks([checks_summary(m) for m in manifests])
    return r


def summed_checks(totals: list[CheckTotals | None]) -> CheckSummary | None:
    """A distributed model's checks: its ranks' counts added, and their skipped checks' reasons
    (None where no rank has any checks)."""
    present = [t for t in totals if t is not None]
    if not present:
        return None
    counts = {f: (sum(getattr(t, f) or 0 for t in present) if any(getattr(t, f) is not None for t in present)
                  else None) for f in CheckTotals.model_fields}
    reasons = [why for t in present if isinstance(t, CheckSummary) for why in t.skipped_reasons]
    return CheckSummary.model_validate({**counts, "skipped_reasons": reasons})


def check(spec: ModelSpec, out_root: Path, base_dir: Path | None, key: Path | None = None) -> Optional[ModelResult]:
    """The result of keeping `spec`'s artefact if it is up to date, else None (run it)."""
    start = time.perf_counter()
    return kept_result(spec, out_root, model_fingerprint(spec, base_dir), key, start)
