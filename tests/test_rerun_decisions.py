"""A rerun's one decision per model: is the artefact on disk up to date (kept) or not (redone)?

Nothing is captured here. An artefact is a copy of tests/data/format_v3_early/mlp carrying the
fingerprint under test (its manifest resealed, as the writer seals it), and a model that is
redone fails at once at its source, so a test tells "kept" from "redone" in a few tenths of a
second. The fingerprint names the file of the module a source names: one changed byte of it,
of a pt2 archive or of an input's data file redoes the model."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import aotpipe.models.zoo
from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.format.records import FORMAT_VERSION
from aotpipe.pipeline import incremental
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.pipeline.incremental import check, model_fingerprint, source_file, up_to_date
from aotpipe.pipeline.results import VERIFIED
from aotpipe.trust.signing import signer

ARTEFACT = Path(__file__).resolve().parent / "data" / "format_v3_early" / "mlp"
_names = itertools.count()


def unique(prefix: str) -> str:
    """A module name no other test (nor an earlier import) uses."""
    return f"{prefix}_{next(_names)}_{id(_names)}"


@pytest.fixture(autouse=True)
def clean_modules():
    """Modules a test's find_spec imported (a package's parents) leave with the test."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("stale_", "pkg_", "rebuilt_", "raises_")):
            del sys.modules[name]


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """report.html without its plots (matplotlib's drawing is most of a kept run's time)."""
    import aotpipe.pipeline.htmlreport as page

    blank = lambda *args, **kwargs: ""  # noqa: E731
    monkeypatch.setattr(page, "plots", SimpleNamespace(
        STAGES=page.plots.STAGES, capture_vs_parameters=blank, seconds_per_stage=blank, ratio_histogram=blank,
        bench_speedups=blank))


def pipeline_text(source: str, inputs: str = "[{shape: [2, 8]}]") -> str:
    return ("version: 1\nname: p\nexecutor: {kind: local}\n"
            "defaults: {mode: export, graphs: [inference], passes: []}\n"
            f"models:\n  - {{name: m, source: '{source}', inputs: {inputs}}}\n")


def spec_in(folder: Path, source: str, inputs: str = "[{shape: [2, 8]}]"):
    """(the model spec of a one-model pipeline file written in `folder`, the file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "p.yaml"
    path.write_text(pipeline_text(source, inputs))
    return parse_pipeline(path.read_text(), str(path), check_sources=False).models[0], path


def plant(folder: Path, fp: str, change=None) -> Path:
    """The artefact at `folder`, carrying fingerprint `fp`, its manifest changed by `change`
    (a function of the manifest's JSON) and resealed. It is labelled with the current format
    version (version 4 only adds optional fields to the version 3 it was written as)."""
    shutil.copytree(ARTEFACT, folder)
    m = json.loads((folder / "manifest.json").read_text())
    m["fingerprint"] = fp
    m["format_version"] = FORMAT_VERSION
    if change is not None:
        change(m)
    (folder / "manifest.json").write_bytes(seal(m))
    return folder


def module_file(folder: Path, text: str = "def build():\n    raise ValueError('rebuilt, not kept')\n",
                name: str | None = None) -> tuple[str, Path]:
    name = name or unique("stale")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return name, path


def one_byte_changed(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-2] = ord("X") if data[-2] != ord("X") else ord("Y")
    path.write_bytes(bytes(data))


FP = "ab" * 32
# tests/test_rerun_decisions.py::test_the_fingerprints_recipe_is_kept_so_earlier_artefacts_stay_up_to_date
# As the fingerprints were with format version 3 (the recipe, less the version) and are now.
GOLDEN_V3 = {"data": "9701b6cb7c333bf104c3272a9cc81d15aa81eb8e698837260461e4f88ae49072",
             "plain": "386f87f098f8a85d4ffb795631194cf246faaf5a475ef6f920be414d754fe52c",
             "sum": "184ecb0fa6d7048568e419c562264398d001b13f33a1bd2d7a4c99121af4b618"}
GOLDEN = {"data": "8e5a88fe0ddba4ce9f2681f5b9800a7116b86aca7dee5963acac2133b53547f1",
          "plain": "e802a635bca0e6acfdd1b3d95f4690c921c1bf56fbaf552ece1985efeca15502",
          "sum": "fb7118809135b9ee5ac8e26810665ff38d70f0d5ecaee4645d203268306af48e"}


# ---------------------------------------------------------------------------------------
# the fingerprint: which file names the model's code


def test_a_module_sources_fingerprint_changes_with_one_byte_of_its_file_and_back(tmp_path):
    name, path = module_file(tmp_path)
    spec, _ = spec_in(tmp_path, f"{name}:build")
    assert source_file(spec, tmp_path) == path
    before = model_fingerprint(spec, tmp_path)
    assert model_fingerprint(spec, tmp_path) == before  # the same file: the same fingerprint
    original = path.read_bytes()
    one_byte_changed(path)
    assert model_fingerprint(spec, tmp_path) != before
    path.write_bytes(original)
    assert model_fingerprint(spec, tmp_path) == before


def test_a_dotted_sources_fingerprint_is_its_modules_file_not_its_packages_init(tmp_path):
    pkg = unique("pkg")
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    _, mod = module_file(tmp_path / pkg, name="mod")
    spec, _ = spec_in(tmp_path, f"{pkg}.mod:build")
    assert source_file(spec, tmp_path) == mod
    before = model_fingerprint(spec, tmp_path)
    one_byte_changed(mod)  # pkg/mod.py edited: the artefact is stale
    assert model_fingerprint(spec, tmp_path) != before


def test_a_packages_own_callable_is_fingerprinted_by_its_init(tmp_path):
    pkg = unique("pkg")
    (tmp_path / pkg).mkdir()
    init = tmp_path / pkg / "__init__.py"
    init.write_text("def build():\n    raise ValueError('x')\n")
    spec, _ = spec_in(tmp_path, f"{pkg}:build")
    assert source_file(spec, tmp_path) == init


def test_the_module_is_found_beside_the_pipeline_and_the_path_is_left_as_it_was(tmp_path):
    name, path = module_file(tmp_path / "beside")
    spec, _ = spec_in(tmp_path / "beside", f"{name}:build")
    path_before = list(sys.path)
    assert source_file(spec, tmp_path / "beside") == path
    assert sys.path == path_before
    assert source_file(spec, None) is None  # not on the path without the pipeline's folder
    assert source_file(spec, tmp_path) is None  # nor from another folder


def test_a_builtin_zoo_models_fingerprint_is_the_zoos_file(tmp_path):
    spec, _ = spec_in(tmp_path, "aotpipe.zoo:mlp")
    assert source_file(spec) == Path(aotpipe.models.zoo.__file__)


@pytest.mark.parametrize("source", ["no_such_module_here:build", "os.path.no_such:build", ".relative:build"])
def test_a_module_that_cannot_be_found_has_no_file_and_still_a_fingerprint(tmp_path, source):
    spec, _ = spec_in(tmp_path, source)
    assert source_file(spec, tmp_path) is None
    assert len(model_fingerprint(spec, tmp_path)) == 64


def test_a_package_that_raises_as_it_is_imported_has_no_file(tmp_path):
    pkg = unique("raises")
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("raise RuntimeError('broken package')\n")
    module_file(tmp_path / pkg, name="mod")
    spec, _ = spec_in(tmp_path, f"{pkg}.mod:build")
    assert source_file(spec, tmp_path) is None
    assert len(model_fingerprint(spec, tmp_path)) == 64


def test_a_builtin_module_has_no_file(tmp_path):
    spec, _ = spec_in(tmp_path, "sys:build")
    assert source_file(spec, tmp_path) is None


def test_a_pt2_sources_fingerprint_is_its_archive(tmp_path):
    archive = tmp_path / "m.pt2"
    archive.write_bytes(b"an archive, in bytes")
    spec, _ = spec_in(tmp_path, "pt2:m.pt2")
    assert source_file(spec, tmp_path) == archive
    before = model_fingerprint(spec, tmp_path)
    one_byte_changed(archive)
    assert model_fingerprint(spec, tmp_path) != before
    changed = model_fingerprint(spec, tmp_path)
    archive.unlink()
    assert model_fingerprint(spec, tmp_path) not in (before, changed)


def test_an_hf_sources_fingerprint_follows_the_installed_transformers(tmp_path, monkeypatch):
    spec, _ = spec_in(tmp_path, "hf:BertModel")
    assert source_file(spec, tmp_path) is None
    versions = {"transformers": "4.0.0"}

    def version(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    incremental._transformers_code.cache_clear()
    try:
        old = model_fingerprint(spec, tmp_path)
        incremental._transformers_code.cache_clear()
        versions["transformers"] = "4.0.1"
        new = model_fingerprint(spec, tmp_path)
        assert new != old  # an upgrade redoes every hf model
        incremental._transformers_code.cache_clear()
        del versions["transformers"]
        assert model_fingerprint(spec, tmp_path) not in (old, new)  # none installed: a fingerprint still
    finally:
        incremental._transformers_code.cache_clear()


def test_an_inputs_data_file_is_part_of_the_fingerprint_one_byte_at_a_time(tmp_path):
    data = tmp_path / "x.npy"
    data.write_bytes(b"\x93NUMPY one input's values")
    spec, _ = spec_in(tmp_path, "aotpipe.zoo:mlp", "[{shape: [2, 8], data: x.npy}]")
    before = model_fingerprint(spec, tmp_path)
    one_byte_changed(data)
    changed = model_fingerprint(spec, tmp_path)
    assert changed != before
    data.unlink()
    assert model_fingerprint(spec, tmp_path) not in (before, changed)  # missing: redone (and it says why)


def test_every_data_file_counts_after_one_made_by_code(tmp_path):
    data = tmp_path / "y.npy"
    data.write_bytes(b"\x93NUMPY values")
    spec, _ = spec_in(tmp_path, "aotpipe.zoo:mlp",
                      "[{shape: [2, 8], data: 'mymod:make'}, {name: y, shape: [2, 8], data: y.npy}]")
    before = model_fingerprint(spec, tmp_path)
    one_byte_changed(data)
    assert model_fingerprint(spec, tmp_path) != before


def test_a_data_file_with_an_absolute_path_is_read_there(tmp_path):
    data = tmp_path / "abs" / "x.npy"
    data.parent.mkdir()
    data.write_bytes(b"\x93NUMPY values")
    spec, _ = spec_in(tmp_path / "p", "aotpipe.zoo:mlp", f"[{{shape: [2, 8], data: '{data}'}}]")
    before = model_fingerprint(spec, tmp_path / "p")
    assert model_fingerprint(spec, None) == before
    one_byte_changed(data)
    assert model_fingerprint(spec, tmp_path / "p") != before


def test_a_relative_data_file_without_a_pipeline_folder_is_read_from_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY values")
    spec, _ = spec_in(tmp_path, "aotpipe.zoo:mlp", "[{shape: [2, 8], data: x.npy}]")
    monkeypatch.chdir(tmp_path)
    assert model_fingerprint(spec, None) == model_fingerprint(spec, tmp_path)


# ---------------------------------------------------------------------------------------
# up to date: the artefact's fingerprint, files, checks and signature


def test_an_artefact_with_the_fingerprint_and_its_checks_passed_is_up_to_date(tmp_path):
    folder = plant(tmp_path / "m", FP)
    manifest = up_to_date(folder, FP)
    assert manifest is not None and manifest.fingerprint == FP and manifest.checks.failed == 0


def test_a_fingerprint_that_differs_in_its_last_character_is_not_up_to_date(tmp_path):
    folder = plant(tmp_path / "m", FP)
    assert up_to_date(folder, FP[:-1] + "c") is None


@pytest.mark.parametrize("older", [2, 3])
def test_an_artefact_of_an_older_format_is_redone(tmp_path, older):
    assert FORMAT_VERSION == 4
    assert up_to_date(plant(tmp_path / "m", FP), FP) is not None  # the same artefact at the current version is kept
    folder = plant(tmp_path / "o", FP, lambda m: m.update(format_version=older))
    assert up_to_date(folder, FP) is None


@pytest.mark.parametrize("failed", [1, 2])
def test_an_artefact_whose_checks_failed_is_never_up_to_date(tmp_path, failed):
    def failing(m):
        m["checks"].update(failed=failed, passed=m["checks"]["passed"] - 1)

    assert up_to_date(plant(tmp_path / "m", FP, failing), FP) is None


@pytest.mark.parametrize("status", ["mismatch", "error", "changed"])
def test_an_artefact_whose_graph_did_not_run_as_recorded_is_redone(tmp_path, status):
    def problem(m):
        m["verification"]["inference"] = {"status": status, "error": "it differed"}

    assert up_to_date(plant(tmp_path / "m", FP, problem), FP) is None


@pytest.mark.parametrize("status", VERIFIED)
def test_every_verification_status_that_is_no_problem_keeps_the_artefact(tmp_path, status):
    assert set(VERIFIED) == {"recorded", "shapes only", "match", "ran"}

    def fine(m):
        m["verification"]["inference"] = {"status": status}

    assert up_to_date(plant(tmp_path / "m", FP, fine), FP) is not None


def test_an_artefact_whose_pass_chain_failed_is_redone(tmp_path):
    folder = plant(tmp_path / "m", FP, lambda m: m.update(pass_failures=["inference.freeze: differs"]))
    assert up_to_date(folder, FP) is None


def test_an_artefact_with_a_changed_file_is_redone(tmp_path):
    folder = plant(tmp_path / "m", FP)
    blob = next(p for p in sorted((folder / "blobs").iterdir()) if p.is_file())
    one_byte_changed(blob)
    assert up_to_date(folder, FP) is None


@pytest.mark.parametrize("damage", ["absent", "not json", "unsealed"])
def test_no_manifest_or_a_damaged_one_is_not_up_to_date(tmp_path, damage):
    folder = plant(tmp_path / "m", FP)
    path = folder / "manifest.json"
    if damage == "absent":
        path.unlink()
    elif damage == "not json":
        path.write_text("{")
    else:
        path.write_text(path.read_text().replace(FP, "cd" * 32))
    assert up_to_date(folder, FP) is None and up_to_date(folder, "cd" * 32) is None


def test_with_a_key_only_an_artefact_signed_by_it_is_up_to_date(tmp_path):
    key, other = tmp_path / "secret.key", tmp_path / "other.key"
    key.write_bytes(bytes(range(32)) * 2)
    other.write_bytes(bytes(range(1, 33)) * 2)
    folder = plant(tmp_path / "m", FP)
    assert up_to_date(folder, FP) is not None  # no key asked for: unsigned is fine
    assert up_to_date(folder, FP, key) is None  # unsigned
    signer(other)(folder)
    assert up_to_date(folder, FP, key) is None  # signed by another key
    signer(key)(folder)
    assert up_to_date(folder, FP, key) is not None


# ---------------------------------------------------------------------------------------
# what a kept model reports


def test_a_kept_models_result_is_the_artefacts_own(tmp_path):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp")
    out = tmp_path / "out"
    folder = plant(out / "m", model_fingerprint(spec, path.parent))
    r = check(spec, out, path.parent)
    assert r is not None and (r.name, r.status, r.skipped) == ("m", "ok", True)
    assert [g.kind for g in r.graphs] == ["inference", "forward", "inference.freeze+reinplace"]  # captured first
    assert r.checks.run == 3 and r.checks.failed == 0 and set(r.eager) == {"inference", "inference.freeze+reinplace",
                                                                            "forward"}
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert (r.files, r.bytes) == (len(files), sum(p.stat().st_size for p in files))
    assert r.verification is not None and r.verification.ok and r.outside_graphs is None
    assert r.notes == json.loads((folder / "manifest.json").read_text())["capture"]["notes"]
    assert r.total_seconds > 0 and r.skipped_passes == []


def test_a_kept_artefact_that_records_its_skipped_passes_and_no_verification_says_so(tmp_path):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp")

    def change(m):
        m["verification"] = None
        m["skipped_passes"] = [{"graph": "inference", "name": "reinplace", "error": "it could not"}]

    plant(tmp_path / "out" / "m", model_fingerprint(spec, path.parent), change)
    r = check(spec, tmp_path / "out", path.parent)
    assert r.verification is None and [s.name for s in r.skipped_passes] == ["reinplace"]


def test_a_kept_partial_capture_is_partial_and_says_what_ran_outside(tmp_path):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp")

    def partial(m):
        m["capture"]["outside_graphs"] = [{"compile": "inference", "ops": {"aten.nonzero.default": 1}}]

    plant(tmp_path / "out" / "m", model_fingerprint(spec, path.parent), partial)
    r = check(spec, tmp_path / "out", path.parent)
    assert (r.status, r.skipped) == ("partial", True)
    assert r.outside_graphs == ["inference: outside the graphs ran aten.nonzero.default x1"]


@pytest.mark.parametrize("world", [2, 3])
def test_a_distributed_model_is_kept_only_when_every_ranks_artefact_is_up_to_date(tmp_path, world):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp",
                         f"[{{shape: [{world}, 8]}}], distributed: {{world_size: {world}, strategy: ddp}}")
    assert spec.distributed is not None and spec.distributed.world_size == world
    out = tmp_path / "out"
    fp = model_fingerprint(spec, path.parent)
    last = world - 1
    assert incremental.artefact_folders(spec, out) == [out / f"m.rank{r}" for r in range(world)]
    for r in range(last):
        plant(out / f"m.rank{r}", fp)
    assert check(spec, out, path.parent) is None  # the last rank is missing
    plant(out / f"m.rank{last}", "cd" * 32)
    assert check(spec, out, path.parent) is None  # the last rank is another model's
    shutil.rmtree(out / f"m.rank{last}")
    plant(out / f"m.rank{last}", fp)
    plant(out / "m", fp)  # a folder of the model's own name is no rank: not counted
    r = check(spec, out, path.parent)
    assert r is not None and (r.name, r.status, r.skipped) == ("m", "ok", True)
    files = [p for k in range(world) for p in (out / f"m.rank{k}").rglob("*") if p.is_file()]
    assert (r.files, r.bytes) == (len(files), sum(p.stat().st_size for p in files))
    assert [g.kind for g in r.graphs] == ["inference", "forward", "inference.freeze+reinplace"]  # rank 0's
    one = json.loads((out / "m.rank0" / "manifest.json").read_text())["checks"]
    assert r.checks.run == world * one["run"] and r.checks.failed == world * one["failed"]  # every rank's
    assert r.checks.fp64 == (world * one["fp64"] if one.get("fp64") is not None else None)


def test_summed_checks_add_each_count_and_keep_none_where_no_rank_has_one():
    from aotpipe.format.records import CheckTotals

    a = CheckTotals(run=3, passed=2, failed=1, skipped=0, exact=1, floor=2)
    b = CheckTotals(run=4, passed=4, failed=0, skipped=1, exact=0, floor=3, fp64=1)
    s = incremental.summed_checks([a, None, b])
    assert (s.run, s.passed, s.failed, s.skipped, s.exact, s.floor, s.fp64, s.within_noise) == (7, 6, 1, 1, 1, 5, 1,
                                                                                                None)
    assert incremental.summed_checks([None, None]) is None
    # skipped checks' reasons are every rank's
    from aotpipe.format.records import CheckSummary

    c = CheckSummary(run=1, passed=1, failed=0, skipped=1, skipped_reasons=["joint: why"])
    assert incremental.summed_checks([c, a, c]).skipped_reasons == ["joint: why", "joint: why"]


def test_a_model_with_no_artefact_is_run(tmp_path):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp")
    assert check(spec, tmp_path / "out", path.parent) is None


# ---------------------------------------------------------------------------------------
# from the command line: kept, or redone (the source raises, so a redone model fails at once)


def cli_run(path: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["run", str(path), "-o", str(out), "--executor", "local", "--no-progress",
                                     "--no-sign", *extra])


@pytest.fixture()
def stale(tmp_path):
    """A pipeline of one model whose source module raises when built, and its artefact planted
    as up to date (its manifest changed by the function given)."""
    name, module = module_file(tmp_path / "pipe", name=unique("rebuilt"))
    spec, path = spec_in(tmp_path / "pipe", f"{name}:build")
    out = tmp_path / "out"

    def planted(change=None):
        shutil.rmtree(out / "p" / "m", ignore_errors=True)
        plant(out / "p" / "m", model_fingerprint(spec, path.parent.resolve()), change)

    return SimpleNamespace(path=path, out=out, module=module, plant=planted)


def test_an_up_to_date_artefact_is_kept_with_exit_0(stale):
    stale.plant()
    r = cli_run(stale.path, stale.out)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("kept    m") and "up to date" in r.output and "1/1 models ok" in r.output
    entry = json.loads((stale.out / "p" / "run.json").read_text())["models"][0]
    assert (entry["status"], entry["skipped"]) == ("ok", True)


def test_after_a_run_whose_checks_failed_the_next_run_redoes_the_model(stale):
    stale.plant(lambda m: m["checks"].update(failed=1, passed=2))
    r = cli_run(stale.path, stale.out)
    assert r.exit_code == 1, r.output  # redone, not kept as "up to date" with exit 0
    assert "up to date" not in r.output and "rebuilt, not kept" in r.output
    entry = json.loads((stale.out / "p" / "run.json").read_text())["models"][0]
    assert (entry["status"], entry["skipped"]) == ("failed", False)


def test_one_changed_byte_of_the_models_module_redoes_it(stale):
    stale.plant()
    stale.module.write_text(stale.module.read_text().replace("kept", "kepT"))  # one byte
    r = cli_run(stale.path, stale.out)
    assert r.exit_code == 1 and "rebuilt, not kepT" in r.output, r.output


def test_force_redoes_an_up_to_date_artefact(stale):
    stale.plant()
    r = cli_run(stale.path, stale.out, "--force")
    assert r.exit_code == 1 and "rebuilt, not kept" in r.output, r.output


def test_a_module_in_the_working_folder_is_fingerprinted_as_it_is_built(tmp_path, monkeypatch):
    """Building imports a source from beside the pipeline or from the working folder
    (spec.source_import_path): the fingerprint finds the same file, so editing it redoes the model
    (it was None there: the stale artefact was kept, whatever the file said)."""
    name, path = module_file(tmp_path / "work")
    spec, _ = spec_in(tmp_path / "pipe", f"{name}:build")
    monkeypatch.chdir(tmp_path / "work")
    path_before = list(sys.path)
    assert source_file(spec, tmp_path / "pipe") == path
    assert sys.path == path_before
    before = model_fingerprint(spec, tmp_path / "pipe")
    one_byte_changed(path)
    assert model_fingerprint(spec, tmp_path / "pipe") != before


def test_a_module_beside_the_pipeline_comes_before_one_in_the_working_folder(tmp_path, monkeypatch):
    name, beside = module_file(tmp_path / "pipe")
    module_file(tmp_path / "work", name=name)
    spec, _ = spec_in(tmp_path / "pipe", f"{name}:build")
    monkeypatch.chdir(tmp_path / "work")
    assert source_file(spec, tmp_path / "pipe") == beside



# ---------------------------------------------------------------------------------------
# more boundaries: no graph loaded, a signing key passed on, the fingerprint's recipe kept


def test_deciding_up_to_date_loads_no_graph(tmp_path, monkeypatch):
    """The warm rerun reads manifests and digests only (torch-free): a graph that would fail to
    load is not looked at, and the artefact is kept."""
    import aotpipe.artifact.load as loader

    def no_loading(*args, **kwargs):
        raise RuntimeError("a graph was loaded")

    monkeypatch.setattr(loader, "load", no_loading)
    assert up_to_date(plant(tmp_path / "m", FP), FP) is not None


def test_check_passes_the_signing_key_on(tmp_path):
    spec, path = spec_in(tmp_path / "pipe", "aotpipe.zoo:mlp")
    key = tmp_path / "secret.key"
    key.write_bytes(bytes(range(32)) * 2)
    plant(tmp_path / "out" / "m", model_fingerprint(spec, path.parent))
    assert check(spec, tmp_path / "out", path.parent) is not None
    assert check(spec, tmp_path / "out", path.parent, key) is None  # unsigned: redone (and signed)
    signer(key)(tmp_path / "out" / "m")
    kept = check(spec, tmp_path / "out", path.parent, key)
    assert kept is not None and 0 < kept.total_seconds < 60


def test_an_hf_source_never_names_a_local_module_called_hf(tmp_path):
    module_file(tmp_path, name="hf")
    spec, _ = spec_in(tmp_path, "hf:BertModel")
    assert source_file(spec, tmp_path) is None


@pytest.mark.parametrize("module", ["_frozen_importlib", "zipimport", "sys"])
def test_a_frozen_or_built_in_module_names_no_file(tmp_path, module):
    spec, _ = spec_in(tmp_path, f"{module}:build")
    assert source_file(spec, tmp_path) is None


def test_the_fingerprints_recipe_is_kept_so_earlier_artefacts_stay_up_to_date(tmp_path, monkeypatch):
    """With aotpipe's and torch's versions fixed, a spec, its module file, an input's data file
    (and one missing) fingerprint as they did when this test was written: a change to the recipe
    would redo every artefact of every user."""
    import aotpipe.artifact.manifest as manifest_module

    fixed = manifest_module.versions().model_copy(update={"aotpipe": "0.0.0", "torch": "0.0.0"})
    monkeypatch.setattr(manifest_module, "versions", lambda: fixed)
    (tmp_path / "golden_model.py").write_bytes(b"def build():\n    pass\n")
    (tmp_path / "x.npy").write_bytes(b"values")
    spec, _ = spec_in(tmp_path, "golden_model:build",
                      "[{shape: [2, 8], data: x.npy}, {name: y, shape: [2], data: gone.npy}]")
    got = {"data": model_fingerprint(spec, tmp_path)}
    spec, _ = spec_in(tmp_path, "golden_model:build")
    got["plain"] = model_fingerprint(spec, tmp_path)
    got["sum"] = model_fingerprint(spec.model_copy(update={"loss": "sum"}), tmp_path)
    assert got == GOLDEN
    # the format version is all that changed since version 3: a static spec's part is as it was
    monkeypatch.setattr(manifest_module, "FORMAT_VERSION", 3)
    assert {k: model_fingerprint(s, tmp_path) for k, s in (
        ("data", spec_in(tmp_path, "golden_model:build",
                         "[{shape: [2, 8], data: x.npy}, {name: y, shape: [2], data: gone.npy}]")[0]),
        ("plain", spec), ("sum", spec.model_copy(update={"loss": "sum"})))} == GOLDEN_V3


def test_the_module_is_what_comes_before_the_first_colon_as_building_reads_it(tmp_path):
    name, path = module_file(tmp_path)
    spec, _ = spec_in(tmp_path, f"{name}:build:extra")
    assert source_file(spec, tmp_path) == path
