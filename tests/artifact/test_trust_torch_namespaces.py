"""--trust-ops is for a library's ops: torch's own namespaces (quantized, _quantized, mkldnn,
onednn, quantized_decomposed, ...) are refused, whatever the artefact's manifest records;
their ops are admitted only one by one by the allow-list."""

import pytest
import torch
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact.load import torch_namespaces, trust_problem
from aotpipe.cli import main
from aotpipe.errors import ArtifactError

# Namespaces the loader knows only from the dispatcher (no hand list names them)
DERIVED = ["quantized", "_quantized", "mkldnn_prepacked", "sparse", "inductor", "_c10d_functional"]


@pytest.mark.parametrize("ns", DERIVED + ["quantized_decomposed", "aten", "prims", "onednn"])
def test_torch_namespaces_are_refused_by_trust_ops_one_line_exit_2(mlp_copy, ns):
    for command in (["verify", mlp_copy.parent], ["replay", mlp_copy], ["show", mlp_copy]):
        r = CliRunner().invoke(main, [*map(str, command), "--trust-ops", ns])
        assert r.exit_code == 2, r.output
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: --trust-ops {ns}: "), r.output


def test_quantized_is_refused_naming_why(mlp_copy):
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--trust-ops", "quantized"])
    assert "'quantized' is one of torch's own op namespaces" in r.output
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--trust-ops", "mylib=torch.ao.quantization"])
    assert r.exit_code == 2 and "'torch.ao.quantization' is part of torch" in r.output
    with pytest.raises(ArtifactError, match="trust_ops quantized: 'quantized' is one of torch's own op namespaces"):
        aotpipe.load(mlp_copy, trust_ops={"quantized": None})  # the Python form is checked too


def test_the_set_comes_from_the_dispatcher_and_a_library_namespace_stays_trustable():
    registered = {n.split("::")[0] for n in torch._C._dispatch_get_all_op_names()}
    assert set(DERIVED) <= registered and set(DERIVED) <= torch_namespaces()
    lib = torch.library.Library("keys19_testlib", "DEF")  # a library's ops, registered from Python
    lib.define("twice(Tensor x) -> Tensor")
    try:
        assert "keys19_testlib" not in torch_namespaces()
        assert trust_problem("keys19_testlib") is None
    finally:
        lib._destroy()
