"""pipelines/families.yaml: recurrent layers, a top-k MoE and a data-dependent branch capture
in the default mode with every check passing."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from aotpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_families_pipeline_captures_every_model_with_every_check(tmp_path):
    result = CliRunner().invoke(main, ["run", str(ROOT / "pipelines" / "families.yaml"), "--output",
                                       str(tmp_path), "--executor", "local", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "8/8 models ok" in result.output
    for line in result.output.splitlines():
        if line.startswith("ok "):
            done, total = line.split(" checks")[0].split()[-1].split("/")
            assert done == total, line
