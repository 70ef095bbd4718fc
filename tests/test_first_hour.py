"""A new user's mistakes: each gets one line naming the file, line or field, and the fix."""

import sys
import textwrap

import pytest
from click.testing import CliRunner

from aotpipe.cli import main
from tests.helpers.pipelines import run_yaml

EMBEDDING_MODEL = textwrap.dedent("""\
    import torch
    from torch import nn

    class Bag(nn.Module):
        def __init__(self, rows):
            super().__init__()
            self.table = nn.Embedding(rows, 4)

        def forward(self, ids):
            return self.table(ids).sum(1)

    def build(rows=100):
        return Bag(rows)
    """)


def _cli(*args):
    return CliRunner().invoke(main, list(args))


CUSTOM_BACKWARD_MODEL = textwrap.dedent("""\
    import torch

    class _ApproxSin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sin(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2 * x  # not sin's derivative: export traces the forward and differentiates that

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return _ApproxSin.apply(self.fc(x))

    def build():
        return Model()
    """)


@pytest.fixture(scope="module")
def failed_artefact(tmp_path_factory):
    """A model folder whose capture FAILED its checks: mode export differentiates a custom
    autograd.Function's forward, not its own backward. (Inputs out of an embedding's range, the
    mistake this once was, now fail before capture: an input mistake leaves no artefact.)"""
    tmp = tmp_path_factory.mktemp("failed")
    (tmp / "cbmodel.py").write_text(CUSTOM_BACKWARD_MODEL)
    result, out = run_yaml(tmp, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [forward, backward], mode: export}
        models:
          - {name: bag, source: "cbmodel:build", inputs: [{shape: [2, 4]}]}
        """))
    assert "FAILED  bag                      verify: backward graph differs" in result.output, result.output
    return out / "p" / "bag"


def test_verify_on_a_path_with_no_artefacts_exits_2_and_says_nothing_was_checked(tmp_path):
    r = _cli("verify", str(tmp_path))
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: {tmp_path}: no artefacts found (looked for manifest.json in it and every "
                                "folder below); nothing was checked: pass a pipeline's output folder or a model folder")


def test_verify_says_a_failed_artefact_is_intact_but_failed_when_captured(failed_artefact):
    r = _cli("verify", str(failed_artefact))
    assert r.exit_code == 0, r.output
    assert (f"ok      {failed_artefact}  (files intact; the artefact itself FAILED when captured: 2 check(s) "
            "failed)") in r.output
    assert "artefacts ok (integrity: hashes, format, safe loading, module.py" in r.output


def test_replay_of_a_failed_artefact_says_it_failed_when_captured_and_why(failed_artefact):
    r = _cli("replay", str(failed_artefact))
    assert "note: this artefact FAILED when captured: 2 check(s) failed\n" in r.output, r.output


def test_show_of_a_failed_artefact_says_why_and_prints_no_none(failed_artefact):
    r = _cli("show", str(failed_artefact))
    assert r.exit_code == 0, r.output
    assert "FAILED when captured: 2 check(s) failed; fix the model or pipeline and run it again" in r.output
    assert "None" not in r.output


def test_replay_on_a_pipeline_folder_names_a_model_folder(failed_artefact):
    pipeline_folder = failed_artefact.parent
    r = _cli("replay", str(pipeline_folder))
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: {pipeline_folder} is not an artefact folder; pass a model folder such as "
                                f"{failed_artefact}")


def _validate(tmp_path, yaml_text):
    (tmp_path / "embmodel.py").write_text(EMBEDDING_MODEL)
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    return path, _cli("validate", str(path))


def test_validate_refuses_an_input_range_over_the_embedding_table(tmp_path):
    path, r = _validate(tmp_path, """\
        version: 1
        name: p
        models:
          - name: bag
            source: embmodel:build
            args: {rows: 100}
            inputs:
              - shape: [2, 3]
                dtype: int64
                high: 1000
        """)
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: {path}:10: models[0].inputs[0].high: high: 1000 does not fit embedding "
                                "'table', which has 100 rows (indices must lie in [0, 100)); set high: 100 or less")


def test_validate_accepts_an_input_range_that_fits_the_table(tmp_path):
    _, r = _validate(tmp_path, """\
        version: 1
        name: p
        models:
          - {name: bag, source: "embmodel:build", args: {rows: 100}, inputs: [{shape: [2, 3], dtype: int64, high: 100}]}
        """)
    assert r.exit_code == 0, r.output


def test_validate_refuses_args_the_callable_does_not_take_naming_the_valid_ones(tmp_path):
    path, r = _validate(tmp_path, """\
        version: 1
        name: p
        models:
          - name: tt
            source: aotpipe.zoo:tiny_transformer
            args:
              vocab: 100
              head: 2
            inputs: [{shape: [2, 3], dtype: int64, high: 100}]
        """)
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: {path}:8: models[0].args.head: aotpipe.zoo:tiny_transformer takes no "
                                "argument 'head'; it takes: vocab, dim, heads, layers, max_len")


def test_verbose_works_after_the_subcommand(tmp_path):
    path, quiet = _validate(tmp_path, """\
        version: 1
        name: p
        models:
          - {name: tt, source: "aotpipe.zoo:tiny_transformer", args: {head: 2}, inputs: [{shape: [2, 3]}]}
        """)
    assert quiet.exit_code == 2 and "Traceback" not in quiet.output
    loud = _cli("validate", str(path), "-v")
    assert type(loud.exception).__name__ == "ConfigError"  # -v re-raises: the traceback is shown
    assert "takes no argument 'head'" in str(loud.exception)


def test_top_level_help_cuts_no_description_and_every_command_has_an_example():
    top = _cli("--help").output
    commands = top.split("Commands:")[1].strip().splitlines()
    from aotpipe.cli import main

    assert len(commands) == len(main.commands)  # one line each: none wrapped, none left out
    assert not [c for c in commands if c.rstrip().endswith("...")]
    for line in commands:
        name = line.split()[0]
        assert "Examples:\n    aotpipe " + name.replace("_cmd", "") in _cli(name, "--help").output, name


def test_replay_trust_code_says_why_there_is_no_eager_comparison(tmp_path, monkeypatch):
    # The source (embmodel.py) sits beside the pipeline, not in the working directory.
    (tmp_path / "embmodel.py").write_text(EMBEDDING_MODEL)
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference]}
        models:
          - {name: bag, source: "embmodel:build", inputs: [{shape: [2, 3], dtype: int64, high: 100}]}
        """))
    assert result.exit_code == 0, result.output
    monkeypatch.delitem(sys.modules, "embmodel")  # as in a new process: the run imported it here
    r = _cli("replay", str(out / "p" / "bag"), "--trust-code", "--bench", "1")
    assert "note: no eager comparison: the model's source does not import from " in r.output
    assert "cannot import module 'embmodel'" in r.output and "put the module on PYTHONPATH" in r.output


def test_replay_trust_code_replays_the_packed_graph_it_recorded_not_module_py(tmp_path):
    from aotpipe.artifact.load import load
    from aotpipe.runtime.devices import is_packed

    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: cf
        defaults: {graphs: [inference], passes: cpu-fast}
        models:
          - {name: cnn, source: "aotpipe.zoo:small_cnn", args: {channels: 4}, inputs: [{shape: [1, 3, 8, 8]}]}
        """))
    assert result.exit_code == 0, result.output
    folder = out / "cf" / "cnn"
    art = load(folder, trust_code=True)
    fast = next(k for k in art.graphs if k.startswith("inference."))
    assert is_packed(art.graphs[fast].module)  # built from graph.json and packed, as when it was recorded
    r = _cli("replay", str(folder), "--trust-code", "--graph", fast)
    assert r.exit_code == 0, r.output
    assert " match " in r.output and "mismatch" not in r.output


def _cpu_fast_cnn(tmp_path):
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: cf
        defaults: {graphs: [inference], passes: cpu-fast}
        models:
          - {name: cnn, source: "aotpipe.zoo:small_cnn", args: {channels: 4}, inputs: [{shape: [1, 3, 8, 8]}]}
        """))
    assert result.exit_code == 0, result.output
    from aotpipe.artifact.load import load

    art = load(out / "cf" / "cnn")
    return art.graphs[next(k for k in art.graphs if k.startswith("inference."))]


def test_unpacked_gives_the_dense_form_of_a_packed_graph(tmp_path):
    import torch

    from aotpipe.artifact.prepack import is_packed, packed_linear, unpacked

    ga = _cpu_fast_cnn(tmp_path)
    assert is_packed(ga.module)
    dense = unpacked(ga.module)
    assert packed_linear in {n.target for n in ga.module.graph.nodes}
    assert packed_linear not in {n.target for n in dense.graph.nodes}
    assert "mkl._mkl_linear" not in str(dense.code) and "_packed" not in str(dense.code)
    inputs = ga.saved_inputs()
    torch.testing.assert_close(dense(*inputs), ga.module(*inputs))


@pytest.mark.slow
def test_torch_compile_takes_the_unpacked_form_of_a_cpu_fast_graph(tmp_path):
    import torch

    from aotpipe.artifact.prepack import unpacked

    ga = _cpu_fast_cnn(tmp_path)
    inputs = ga.saved_inputs()
    with pytest.raises(Exception, match="LoweringException"):  # why README points at unpacked
        torch.compile(ga.module)(*inputs)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(unpacked(ga.module))(*inputs), ga.module(*inputs))


def test_ls_imports_no_torch(failed_artefact):
    import subprocess

    code = ("import sys; from aotpipe.cli import main; "
            "main(['ls', sys.argv[1]], standalone_mode=False); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch')")
    out = subprocess.run([sys.executable, "-c", code, str(failed_artefact.parent)], capture_output=True, text=True,
                         check=True).stdout
    assert "bag" in out and "FAILED" in out
    assert out.strip().endswith("no torch")


def test_validate_ignores_an_embedding_subclass_that_reads_only_its_inputs_shape(tmp_path):
    (tmp_path / "posmodel.py").write_text(textwrap.dedent("""\
        import torch
        from torch import nn

        class Positions(nn.Embedding):
            def forward(self, ids):  # positions 0..T-1: the ids' values are never indices here
                return self.weight[: ids.shape[1]]

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(1000, 4)
                self.pos = Positions(16, 4)

            def forward(self, ids):
                return self.tok(ids) + self.pos(ids)

        def build():
            return M()
        """))
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        name: p
        models:
          - {name: m, source: "posmodel:build", inputs: [{shape: [2, 8], dtype: int64, high: 1000}]}
        """))
    r = _cli("validate", str(path))
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("command", ["ls", "verify", "sign"])
def test_ls_verify_and_sign_agree_a_folder_without_artefacts_is_exit_2(tmp_path, command):
    from click.testing import CliRunner

    from aotpipe.cli import main

    r = CliRunner().invoke(main, [command, str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        f"error: {tmp_path}: no artefacts found (looked for manifest.json in it and every folder below); nothing "
        f"was {dict(ls='listed', verify='checked', sign='signed')[command]}: pass a pipeline's output folder or a "
        "model folder"]


def test_export_pt2_into_a_folder_that_is_not_there_is_one_line_before_any_work(quickstart_run, tmp_path):
    from click.testing import CliRunner

    from aotpipe.cli import main

    root, _ = quickstart_run
    out = tmp_path / "missing" / "dir" / "m.pt2"
    r = CliRunner().invoke(main, ["export-pt2", str(root / "mlp"), "-o", str(out), "--no-sandbox"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        f"error: -o {out}: the folder {out.parent} does not exist; make it first (mkdir -p {out.parent})"]
    assert not (tmp_path / "missing").exists()


def test_export_pt2_into_a_path_under_a_file_says_it_is_a_file(quickstart_run, tmp_path):
    from click.testing import CliRunner

    from aotpipe.cli import main

    root, _ = quickstart_run
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "m.pt2"
    r = CliRunner().invoke(main, ["export-pt2", str(root / "mlp"), "-o", str(out), "--no-sandbox"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [f"error: -o {out}: {tmp_path / 'afile'} is a file, not a folder; "
                                             "choose another path"]
