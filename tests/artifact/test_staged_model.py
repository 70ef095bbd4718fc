"""staged_model: the writer's steps (graphs written, checked, sealed and signed, renamed into
place) with the caller's own work between them, so that the job, not the writer, says which
stage it is at. A block that raises or never finishes leaves nothing behind."""

from __future__ import annotations

import pytest
import torch

from aotpipe.artifact.writer import CheckOutcome, staged_model
from aotpipe.capture import capture_export
from aotpipe.format.folders import is_model_folder


@pytest.fixture(scope="module")
def captured():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    return capture_export(model, (torch.randn(2, 4),), {}, name="m", graphs=["inference"], input_names=["x"])


def _stage(tmp_path, captured):
    return staged_model(tmp_path, captured, model_record={"name": "m", "source": "tests"}, fingerprint="0" * 64)


def test_the_folder_is_put_in_place_only_when_the_finished_block_ends(tmp_path, captured):
    seen = []
    with _stage(tmp_path, captured) as staged:
        assert not (tmp_path / "m").exists() and staged.folder.parent == tmp_path
        assert staged.check(lambda folder: seen.append(folder) or CheckOutcome()) is not None
        written = staged.finish(CheckOutcome(), sign=lambda folder: seen.append(("signed", folder)))
        assert not (tmp_path / "m").exists()  # sealed and signed, not yet renamed
    assert seen == [staged.folder, ("signed", staged.folder)]
    assert written.path == tmp_path / "m" and is_model_folder(tmp_path / "m")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_block_that_never_finishes_leaves_nothing(tmp_path, captured):
    with pytest.raises(RuntimeError, match="never finished; nothing was put in place"):
        with _stage(tmp_path, captured):
            pass
    assert list(tmp_path.iterdir()) == []


def test_a_block_that_raises_leaves_nothing(tmp_path, captured):
    with pytest.raises(ValueError, match="the check broke"):
        with _stage(tmp_path, captured) as staged:
            staged.check(lambda folder: (_ for _ in ()).throw(ValueError("the check broke")))
    assert list(tmp_path.iterdir()) == []


def test_the_check_runs_at_the_thread_count_the_manifest_records(tmp_path, captured):
    threads = []
    before = torch.get_num_threads()
    with _stage(tmp_path, captured) as staged:
        staged.check(lambda folder: threads.append(torch.get_num_threads()) or CheckOutcome())
        staged.finish()
    assert threads == [staged.threads] and torch.get_num_threads() == before
