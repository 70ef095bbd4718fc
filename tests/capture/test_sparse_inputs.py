"""A sparse input is refused in one line before capture: torch.export's decompositions abort the
whole process on one (torch 2.13), which a worker would otherwise report as a crash."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.models.eager import layout_problem


class _MM(torch.nn.Module):
    def __init__(self, sparse_weight: bool = False):
        super().__init__()
        w = torch.randn(3, 3)
        self.w = torch.nn.Parameter(w.to_sparse_csr() if sparse_weight else w)

    def forward(self, a, b):
        return a @ b + self.w.to_dense().sum()


def test_a_sparse_input_is_named_with_its_layout_and_the_fix():
    a = torch.eye(3).to_sparse_csr()
    line = layout_problem(_MM(), (a, torch.randn(3, 2)), {}, ["a", "b"])
    assert line is not None and line.startswith("input 'a' is a sparse_csr tensor:") and ".to_dense()" in line
    coo = layout_problem(_MM(), (torch.randn(3, 3), torch.randn(3, 2).to_sparse()), {}, ["a"])
    assert coo is not None and coo.startswith("input 'input 1' is a sparse_coo tensor:")  # unnamed: its position


def test_dense_inputs_and_state_pass_and_a_sparse_parameter_is_named():
    assert layout_problem(_MM(), (torch.randn(3, 3), torch.randn(3, 2)), {"x": 1}, ["a", "b"]) is None
    line = layout_problem(_MM(sparse_weight=True), (torch.randn(3, 3), torch.randn(3, 2)), {}, ["a", "b"])
    assert line is not None and line.startswith("parameter 'w' is a sparse_csr tensor:")


@pytest.mark.slow
def test_torch_op_with_sparse_input_fails_in_one_line_not_a_worker_crash(tmp_path):
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""\
        version: 1
        name: sp
        executor: {kind: process, workers: 1, timeout_s: 300}
        models:
          - {name: mm, source: 'torch-op:sparse.mm.reduce', args: {sample: 0}}
    """))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-progress",
                                  "--json"])
    assert r.exit_code == 1, r.output[-2000:]
    (m,) = json.loads(r.stdout)["models"]
    assert m["status"] == "failed" and "is a sparse_csr tensor" in m["error"], m
    assert "crash" not in m["error"] and "\n" not in m["error"]
