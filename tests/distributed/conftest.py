"""The distributed tests' shared world."""

from __future__ import annotations

import pytest

from aotpipe.pipeline.job import run_model
from tests.helpers.parallel_models import assert_ok, mlp_spec


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """An fsdp2 world of two ranks, written and checked (read only: copy it to change it)."""
    root = tmp_path_factory.mktemp("world")
    assert_ok(run_model(mlp_spec("fsdp2"), root))
    return root
