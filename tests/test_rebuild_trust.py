"""Rebuilding the model an artefact names: builtin zoo models only, unless trusted; bounded.

Every entry point that rebuilds a model from a manifest (replay --chain, replay --bench,
replay_chain, eager_bench, rebuild_model) goes through sources.rebuild_refusal; a hostile
manifest naming `aotpipe.zoo:<attribute path>` reaches nothing but the zoo table.
"""

import json
import textwrap

import pytest
from click.testing import CliRunner

import aotpipe
from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import ConfigError, LimitError
from aotpipe.models.sources import is_builtin, rebuild_refusal
from aotpipe.pipeline.config import parse_pipeline
from aotpipe.replay import eager_bench, rebuild_model, replay_chain


def _set_model(folder, **fields):
    m = json.loads((folder / "manifest.json").read_text())
    m["model"].update(fields)
    (folder / "manifest.json").write_bytes(seal(m))


# Attribute paths a hostile manifest could put after "aotpipe.zoo:", each writing `marker` if called.
def _hostile_sources(marker):
    return {
        "aotpipe.zoo:os.system": {"command": f"touch {marker}"},
        "aotpipe.zoo:torch.save": {"obj": 1, "f": str(marker)},
        "aotpipe.zoo:math.os.system": {"command": f"touch {marker}"},
    }


@pytest.mark.parametrize("trust", [False, True])
def test_zoo_attribute_paths_in_a_manifest_are_never_called(mlp_copy, tmp_path, trust):
    marker = tmp_path / "pwned"
    for source, args in _hostile_sources(marker).items():
        _set_model(mlp_copy, source=source, args=args)
        art = aotpipe.load(mlp_copy)
        assert rebuild_model(art, trust_code=trust) is None, source
        assert eager_bench(art, "inference", 1, trust_code=trust) is None, source
        assert eager_bench(art, "forward", 1, trust_code=trust) is None, source
        assert replay_chain(mlp_copy, trust_code=trust).max_abs_error_vs_eager is None, source
        cli = ["replay", str(mlp_copy), "--chain", "--bench", "1"] + (["--trust-code"] if trust else [])
        r = CliRunner().invoke(main, cli)
        assert r.exit_code == 0, (source, r.output)
        r = CliRunner().invoke(main, ["verify", str(mlp_copy)])
        assert "Traceback" not in r.output
        assert not marker.exists(), source


def test_zoo_sources_resolve_only_through_the_table():
    assert is_builtin("aotpipe.zoo:mlp") and not is_builtin("aotpipe.zoo:os.system")
    assert not is_builtin("aotpipe.zoo:ZOO") and not is_builtin("aotpipe.zoo:__builtins__")
    assert rebuild_refusal("aotpipe.zoo:tiny_transformer", False) is None
    for source in ["aotpipe.zoo:os.system", "aotpipe.zoo:torch.save", "hf:BertModel", "mymodels:net", None, 7]:
        assert "--trust-code" in rebuild_refusal(source, False), source
    assert rebuild_refusal("hf:BertModel", True) is None and rebuild_refusal("mymodels:net", True) is None


def test_pipeline_naming_a_zoo_attribute_path_is_a_config_error():
    text = textwrap.dedent("""
        version: 1
        name: z
        models: [{name: m, source: "aotpipe.zoo:os.system", inputs: [{shape: [1]}]}]
    """)
    with pytest.raises(ConfigError, match="zoo has no model 'os.system'; it has: .*mlp, .*running_norm"):
        parse_pipeline(text)


def test_module_callable_and_hf_sources_are_rebuilt_only_with_trust(mlp_copy, tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    (tmp_path / "mymodels.py").write_text(textwrap.dedent(f"""
        import torch
        def net(in_features=32):
            open({str(calls)!r}, "a").write("called\\n")
            from aotpipe.models.zoo import mlp
            return mlp(in_features=in_features, hidden=64, depth=2)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    _set_model(mlp_copy, source="mymodels:net", args={"in_features": 32})
    art = aotpipe.load(mlp_copy)
    assert rebuild_model(art) is None and eager_bench(art, "inference", 1) is None
    assert replay_chain(mlp_copy).max_abs_error_vs_eager is None
    r = CliRunner().invoke(main, ["replay", str(mlp_copy), "--chain", "--bench", "1"])
    assert r.exit_code == 0 and "no eager comparison" in r.output and "--trust-code" in r.output
    assert not calls.exists()
    chain = replay_chain(mlp_copy, trust_code=True)
    assert calls.exists() and chain.max_abs_error_vs_eager is not None
    _set_model(mlp_copy, source="hf:BertModel", args={}, config={"hidden_size": 8})
    assert rebuild_model(aotpipe.load(mlp_copy)) is None


def test_builtin_zoo_model_is_rebuilt_without_trust(quickstart_run):
    root, _ = quickstart_run
    chain = replay_chain(root / "mlp")
    assert chain.eager_within_tolerance is True
    r = CliRunner().invoke(main, ["replay", str(root / "mlp"), "--chain"])
    assert r.exit_code == 0 and "no eager comparison" not in r.output


@pytest.mark.parametrize("trust", [False, True])
def test_rebuilding_a_model_over_the_byte_limit_is_one_line_before_allocating(mlp_copy, trust):
    _set_model(mlp_copy, args={"in_features": 32, "hidden": 100_000, "depth": 2})  # ~40 GB of weights
    with pytest.raises(LimitError, match=r"manifest.json: model 'mlp' .*: layers.1.weight: float32\[100000, 100000\] needs 40 GB, "
                                         r"over the limit of 2.15 GB"):
        rebuild_model(aotpipe.load(mlp_copy), trust_code=trust)
    cli = ["replay", str(mlp_copy), "--chain"] + (["--trust-code"] if trust else [])
    r = CliRunner().invoke(main, cli)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "AOTPIPE_MAX_BYTES or --max-bytes" in r.output


def test_example_inputs_over_the_byte_limit_are_refused(mlp_copy):
    _set_model(mlp_copy, inputs=[{"shape": [1_000_000, 1_000_000], "dtype": "float32", "name": None,
                                  "low": None, "high": None}])
    with pytest.raises(LimitError, match=r"input 0: float32\[1000000, 1000000\] needs 4 TB"):
        rebuild_model(aotpipe.load(mlp_copy))
