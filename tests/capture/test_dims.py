"""Shape-polymorphic capture (`dims:`): every graph kind keeps the named sizes symbolic, is
checked at the min, the max and a random size, and a model that cannot be dynamic in a
dimension is refused in one line naming the dimension, torch's reason and the model's line."""

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotpipe.cli import main
from aotpipe.errors import ConfigError
from aotpipe.format import records
from aotpipe.pipeline.config import parse_pipeline
from tests.helpers.forge import reseal

MODELS = ("mlp", "small_cnn", "tiny_transformer")
KINDS = ("inference", "forward", "backward", "joint")


def _manifest(root: Path, model: str) -> records.Manifest:
    return records.read(records.Manifest, root / model / records.MANIFEST, root / model)[1]


def _graph(root: Path, model: str, kind: str) -> tuple[dict, dict]:
    folder = next((root / model).glob(f"{model}_{kind}_0"))
    return json.loads((folder / "graph.json").read_text()), json.loads((folder / "inputs.json").read_text())


@pytest.mark.parametrize("model", MODELS)
def test_every_kind_is_written_with_symbolic_sizes(dynamic_run, model):
    root, _ = dynamic_run
    manifest = _manifest(root, model)
    assert manifest.format_version == records.FORMAT_VERSION == 4
    dims = manifest.dims
    assert dims is not None and all(d.status == "dynamic" for d in dims.dims.values())
    wanted = {"batch", "seq"} if model == "tiny_transformer" else {"batch"}
    assert set(dims.dims) == wanted
    for kind in KINDS:
        graph, inputs = _graph(root, model, kind)
        assert graph["format_version"] == 3
        named = {s["dim"] for s in graph["symbols"].values()}
        assert wanted <= named, (kind, graph["symbols"])
        batch = dims.dims["batch"]
        rec = graph["symbols"][batch.symbol]
        assert (rec["min"], rec["max"], rec["example"]) == (batch.min, batch.max, batch.example)
        # a layout in the symbols beside the example's; the .input file keeps the example sizes
        sym = [i for i in inputs["inputs"] if i.get("sym_shape")]
        assert sym and all(len(i["sym_shape"]) == len(i["shape"]) for i in sym)
        assert any(batch.symbol in str(i["sym_shape"]) for i in sym)
    user = next(i for i in _graph(root, model, "inference")[1]["inputs"] if i["role"] == "user")
    assert user["sym_shape"][0] == dims.dims["batch"].symbol and user["shape"][0] == dims.dims["batch"].example


def test_the_backward_takes_its_sizes_as_symbolic_ints(dynamic_run):
    root, _ = dynamic_run
    _, inputs = _graph(root, "tiny_transformer", "backward")
    sizes = [i for i in inputs["inputs"] if i["role"] == "symint"]
    assert sizes and all(i["sym_value"] for i in sizes)
    assert any("*" in i["sym_value"] for i in sizes)  # e.g. batch * seq, computed at replay


@pytest.mark.parametrize("model", MODELS)
def test_every_graph_passes_its_checks_at_min_max_and_a_random_size(dynamic_run, model):
    root, result = dynamic_run
    dims = _manifest(root, model).dims
    points = {c.point: c for c in dims.checked}
    assert {"min", "max"} <= set(points)
    for name, d in dims.dims.items():
        assert points["min"].sizes[name] == d.min and points["max"].sizes[name] == d.max
    for c in dims.checked:
        assert not c.problems, c.problems
        assert c.checks.run > 0 and c.checks.passed == c.checks.run
        # every graph ran there, the pass chain's too, and left digests for replay to compare with
        keys = set(_manifest(root, model).graphs)
        assert set(c.digests) == keys
    assert f"{model}" in result.output and "checked at min, max" in result.output


def test_a_static_pipeline_keeps_its_fingerprint_and_has_no_dims(quickstart_run):
    root, _ = quickstart_run
    manifest = _manifest(root, "mlp")
    assert manifest.dims is None
    assert "dims" not in manifest.model.model_dump() and "auto_dims" not in manifest.model.model_dump()
    _, inputs = _graph(root, "mlp", "inference")
    assert not any("sym_shape" in i for i in inputs["inputs"])


# ---------------------------------------------------------------------------------------
# models that cannot be dynamic: one line, naming the dimension, torch's reason and the line

MODEL_CODE = '''
import torch

class LiteralView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(x).view(4, -1)

class SizeBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        if x.shape[0] > 8:
            return self.fc(x) * 2
        return self.fc(x)

def literal_view():
    return LiteralView()

def size_branch():
    return SizeBranch()


# (below: models the later tests take; added after, so the lines above stay where tests name them)

class Chunked(torch.nn.Module):
    """Mamba's chunked scan in small: the sequence padded to a multiple of 32, cut into chunks."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        b, s, c = x.shape
        pad = (32 - s % 32) % 32
        h = torch.nn.functional.pad(self.fc(x), (0, 0, 0, pad)).reshape(b, -1, 32, c)
        return torch.cumsum(h, dim=2).reshape(b, -1, c)[:, :s]


def chunked():
    return Chunked()


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc(x)
        print("a graph break")
        return h * 2

def broken():
    return Broken()

class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # on the values: export cannot trace it, dynamo breaks the graph here
            return h * 2
        return h - 1

def branchy():
    return Branchy()

class LateLiteral(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = x * 2 if x.sum() > 0 else x - 1  # on the values: export cannot trace it, dynamo breaks here
        return self.fc(h).view(4, -1)        # after the break: dynamo refuses the batch it was marked

def late_literal():
    return LateLiteral()

class KeywordTower(torch.nn.Module):
    """A transformers vision tower's signature: the text inputs arrive through **kwargs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, pixel_values, mask=None, **kwargs):
        return self.fc(pixel_values) + kwargs["input_ids"].float().mean(dim=1, keepdim=True)

def keyword_tower():
    return KeywordTower()

class NamedDefaultGenerator(torch.nn.Module):
    """UnivNet's noise: torch.randn(..., generator=None), the default generator spelled out."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(x + torch.randn(x.shape, generator=None) + torch.rand(x.shape, generator=None))

def named_default_generator():
    return NamedDefaultGenerator()

class CropThenView(torch.nn.Module):
    """LongT5's blocks in small: heads padded to a multiple of 32 and permuted; in the backward
    the pad's gradient crops a permuted gradient, then views it: at run time the crop keeps the
    permuted strides, while torch's shape function at symbolic sizes says contiguous."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.randn(4, 4) / 2)

    def forward(self, x):
        b, s, c = x.shape
        pad = (32 - s % 32) % 32
        h = torch.nn.functional.pad(self.fc(x).view(b, s, 2, 4), (0, 0, 0, 0, 0, pad))
        return h.permute(0, 2, 1, 3) @ self.w

def crop_then_view():
    return CropThenView()
'''


def _run(tmp_path: Path, models: str, defaults: str = "dims: {batch: {min: 1, max: 64, example: 4}}"):
    (tmp_path / "shapes_models.py").write_text(MODEL_CODE)
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        name: p
        output: {tmp_path / 'out'}
        executor: {{kind: local}}
        defaults:
          mode: export
          {defaults}
        models:
        """) + textwrap.indent(textwrap.dedent(models), "  "))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "--no-progress", "--no-sign"])
    runs = json.loads((tmp_path / "out" / "p" / "run.json").read_text())["models"]
    return result, {m["name"]: m for m in runs}


def test_a_literal_size_view_is_refused_naming_the_dimension_and_the_line(tmp_path):
    result, runs = _run(tmp_path, """\
        - name: lit
          source: shapes_models:literal_view
          inputs: [{shape: [batch, 32]}]
        """)
    assert result.exit_code != 0
    error = runs["lit"]["error"]
    assert "\n" not in error
    assert error.startswith("dims: batch (arg0.size(0)) cannot be dynamic in [1, 64]")
    assert "the model fixes it to 4" in error
    assert "shapes_models.py:10 (`return self.fc(x).view(4, -1)`)" in error
    assert "make batch static (write 4 in the shape)" in error
    assert "mode: auto" not in error  # its own fix, not capture's generic hint
    assert not (tmp_path / "out" / "p" / "lit").exists()


def test_a_branch_on_the_size_is_refused_with_the_range_that_works(tmp_path):
    _, runs = _run(tmp_path, """\
        - name: branch
          source: shapes_models:size_branch
          inputs: [{shape: [batch, 32]}]
        """)
    error = runs["branch"]["error"]
    assert "the model only runs for 2 <= arg0.size(0) and arg0.size(0) <= 8" in error
    assert "shapes_models.py:18 (`if x.shape[0] > 8:`)" in error
    assert "narrow the range (batch: {max: 8} under dims:)" in error


def test_the_branch_model_captures_once_the_range_is_narrowed(tmp_path):
    # just inside the bound torch derived: dynamic, checked at 1 and 8
    _, runs = _run(tmp_path, """\
        - name: branch
          source: shapes_models:size_branch
          inputs: [{shape: [batch, 32]}]
        """, defaults="dims: {batch: {min: 1, max: 8, example: 4}}")
    assert runs["branch"]["status"] == "ok", runs["branch"].get("error")
    dims = _manifest(tmp_path / "out" / "p", "branch").dims
    assert {c.point: c.sizes["batch"] for c in dims.checked if c.point != "random"} == {"min": 1, "max": 8}


def test_dims_auto_reports_what_stayed_dynamic_and_what_was_specialised(tmp_path):
    result, runs = _run(tmp_path, """\
        - name: lit
          source: shapes_models:literal_view
          inputs: [{shape: [4, 32]}]
        - name: mlp
          source: aotpipe.zoo:mlp
          inputs: [{shape: [4, 32]}]
        """, defaults="dims: auto")
    assert result.exit_code == 0, result.output
    lit = _manifest(tmp_path / "out" / "p", "lit").dims
    assert lit.auto_dims and lit.dims["arg0.size(0)"].status == "specialised"
    assert "specialised to 4 by Eq(" in lit.dims["arg0.size(0)"].reason
    assert "shapes_models.py:10" in lit.dims["arg0.size(0)"].reason
    assert not lit.checked  # nothing dynamic: nothing to check at other sizes
    mlp = _manifest(tmp_path / "out" / "p", "mlp").dims
    d = mlp.dims["arg0.size(0)"]
    assert d.status == "dynamic" and d.max is None  # torch's own range: unbounded
    assert {c.point for c in mlp.checked} >= {"min", "max"} and all(not c.problems for c in mlp.checked)
    assert "arg0.size(0) 2..inf dynamic" in result.output


def test_a_graph_that_is_not_polymorphic_fails_the_size_checks(tmp_path, monkeypatch):
    """The checks at other sizes are what hold the claim: an inference graph quietly captured at
    the example's sizes (torch.export given no dynamic shapes for it) fails at the min."""
    from aotpipe.capture import export

    real = export._export

    def inference_static(model, args, kwargs, what, notes=None, shapes=None, *rest):
        return real(model, args, kwargs, what, notes, None if what == "inference" else shapes, *rest)

    monkeypatch.setattr(export, "_export", inference_static)
    _, runs = _run(tmp_path, """\
        - name: tt
          source: aotpipe.zoo:tiny_transformer
          dims: {seq: {min: 4, max: 32, example: 16}}
          inputs:
            - {name: input_ids, shape: [batch, seq], dtype: int64, high: 1000}
        """)
    assert runs["tt"]["status"] == "failed"
    assert runs["tt"]["stage"] == "verify"
    assert runs["tt"]["error"].startswith("at min (batch=1, seq=4): inference graph does not run")


def test_a_named_dimension_no_graph_keeps_is_a_failure(tmp_path, monkeypatch):
    """torch accepted the range but every graph came out static: the dims were not honoured."""
    from aotpipe.capture import dynamic

    monkeypatch.setattr(dynamic, "export_shapes", lambda *a, **k: None)
    _, runs = _run(tmp_path, """\
        - name: mlp
          source: aotpipe.zoo:mlp
          inputs: [{shape: [batch, 32]}]
        """)
    assert runs["mlp"]["status"] == "failed"
    assert "dims: batch is static in every graph" in runs["mlp"]["error"]


# ---------------------------------------------------------------------------------------
# the YAML: each mistake one line with its place and fix

BASE = """\
version: 1
name: t
defaults:
  mode: export
  dims: {batch: {min: 1, max: 16, example: 4}}
models:
  - name: m
    source: aotpipe.zoo:mlp
"""


def _problems(text: str) -> list:
    with pytest.raises(ConfigError) as e:
        parse_pipeline(text, "p.yaml", check_sources=False)
    return e.value.problems


@pytest.mark.parametrize("dims, message", [
    ("{min: 5, max: 4, example: 4}", "min 5 is above max 4; set min at most max"),
    ("{min: 1, max: 16, example: 17}", "example 17 is outside [1, 16]; pick an example in range"),
    ("{min: 1, max: 16, example: 0}", "example 0 is outside [1, 16]"),
    ("{min: 1, max: 16, example: 1}", "example 1 is below 2: torch specialises sizes 0 and 1 while tracing"),
    ("{min: 1, max: 1}", "max 1 leaves no example size of 2 or more"),
    ("{min: 0, max: 16, example: 4}", "greater than or equal to 1"),
])
def test_a_bad_range_is_one_line_with_its_place(dims, message):
    text = BASE.replace("dims: {batch: {min: 1, max: 16, example: 4}}", f"dims: {{batch: {dims}}}") + \
        "    inputs: [{shape: [batch, 32]}]\n"
    (p,) = _problems(text)
    assert p.line == 5 and p.field.startswith("defaults.dims")
    assert message in p.message


def test_the_boundaries_of_a_range_are_accepted():
    for dims, example in (("{min: 2, max: 2}", 2), ("{min: 1, max: 16, example: 16}", 16), ("{min: 1, max: 16}", 2)):
        text = BASE.replace("{batch: {min: 1, max: 16, example: 4}}", f"{{batch: {dims}}}") + \
            "    inputs: [{shape: [batch, 32]}]\n"
        (m,) = parse_pipeline(text, "p.yaml", check_sources=False).models
        assert m.inputs[0].shape == [example, 32] and m.inputs[0].dims == ["batch", None]


def test_an_undeclared_dimension_is_named_with_its_line():
    (p,) = _problems(BASE + "    inputs: [{shape: [batch, seq]}]\n")
    assert (p.line, p.field) == (9, "models[0].inputs[0].shape[1]")
    assert p.message.startswith("names dimension 'seq', which dims: does not declare; declare it")


def test_a_dimension_on_loaded_data_is_refused():
    (p,) = _problems(BASE + "    inputs: [{shape: [batch, 32], data: x.pt}]\n")
    assert "loaded from data:" in p.message


def test_mode_meta_captures_static_sizes_and_is_refused_dims():
    (p,) = _problems(BASE.replace("mode: export", "mode: meta") + "    inputs: [{shape: [batch, 32]}]\n")
    assert p.message.startswith("mode meta captures static sizes")


def test_mode_dynamo_takes_named_dimensions_but_not_dims_auto():
    spec = parse_pipeline(BASE.replace("mode: export", "mode: dynamo") + "    inputs: [{shape: [batch, 32]}]\n",
                          "p.yaml", check_sources=False)
    assert spec.models[0].dynamic
    auto = BASE.replace("mode: export", "mode: dynamo").replace("dims: {batch: {min: 1, max: 16, example: 4}}",
                                                                "dims: auto")
    assert auto != BASE.replace("mode: export", "mode: dynamo")
    (p,) = _problems(auto + "    inputs: [{shape: [4, 32]}]\n")
    assert p.message.startswith("mode dynamo takes no dims: auto; name the dimensions")


def test_a_model_dimension_no_input_names_is_refused():
    (p,) = _problems(BASE + "    dims: {seq: {min: 1, max: 8}}\n    inputs: [{shape: [batch, 32]}]\n")
    assert p.field == "models[0].dims.seq" and "no input's shape names it" in p.message


def test_auto_with_a_named_size_is_refused():
    (p,) = _problems(BASE + "    dims: auto\n    inputs: [{shape: [batch, 32]}]\n")
    assert "dims: auto picks the dynamic dimensions itself" in p.message


def test_model_dims_add_to_and_override_the_defaults():
    text = BASE + "    dims: {batch: {min: 2, max: 8}, seq: {min: 4, max: 64, example: 8}}\n" \
                  "    inputs: [{shape: [batch, seq]}]\n"
    (m,) = parse_pipeline(text, "p.yaml", check_sources=False).models
    assert {k: (d.min, d.max, d.size) for k, d in m.dims.items()} == {"batch": (2, 8, 2), "seq": (4, 64, 8)}
    assert m.inputs[0].shape == [2, 8]
    assert m.to_json()["dims"] == {"batch": {"min": 2, "max": 8, "example": None},
                                   "seq": {"min": 4, "max": 64, "example": 8}}
    assert m.at({"batch": 5}).inputs[0].shape == [5, 8]


def test_a_torch_symbolic_size_is_read_without_specialising():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from aotpipe.format.ir import TensorMeta, size_expr, size_hint

    env = ShapeEnv()
    mode = torch._subclasses.fake_tensor.FakeTensorMode(shape_env=env)
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    t = mode.from_tensor(torch.empty(4, 3), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]), source=ConstantSource("x"))
    meta = TensorMeta.of(t)
    assert meta.shape == (4, 3) and meta.sym_shape is not None and isinstance(meta.sym_shape[0], str)
    assert size_hint(t.shape[0]) == 4 and isinstance(size_expr(t.shape[0]), str)
    assert not env.guards  # reading the layout added no guard


def test_verify_reads_size_arithmetic_in_module_py_as_graph_json_makes_it(dynamic_run, tmp_path):
    import shutil

    root, _ = dynamic_run
    r = CliRunner().invoke(main, ["verify", str(root)])
    assert r.exit_code == 0 and "3/3 artefacts ok" in r.output, r.output
    # and a size computed differently in module.py is still a mismatch
    copy = tmp_path / "lib" / "tiny_transformer"
    shutil.copytree(root / "tiny_transformer", copy)
    module = next(copy.glob("*_forward_0")) / "module.py"
    text = module.read_text()
    assert "sym_size_int * sym_size_int_1" in text
    module.write_text(text.replace("sym_size_int * sym_size_int_1", "sym_size_int + sym_size_int_1", 1))
    reseal(copy)  # the manifest's hashes follow: only module.py's code is left to tell
    r = CliRunner().invoke(main, ["verify", str(copy.parent)])
    assert r.exit_code == 1 and "shows `mul_23 = sym_size_int + sym_size_int_1`" in r.output, r.output


def test_mode_auto_does_not_fall_back_to_dynamos_static_capture_on_a_refused_range(tmp_path):
    _, runs = _run(tmp_path, """\
        - name: lit
          source: shapes_models:literal_view
          mode: auto
          inputs: [{shape: [batch, 32]}]
        """)
    assert runs["lit"]["status"] == "failed"
    assert runs["lit"]["error"].startswith("dims: batch (arg0.size(0)) cannot be dynamic")


def test_a_guard_kept_as_a_runtime_assertion_that_fails_at_a_checked_size_says_torchs_reason(tmp_path):
    """torch refuses the range for a guard it cannot prove ((seq + 3) // 4 != 1); the capture
    keeps it as a run-time assertion and the size checks find it false at the min: the model
    fails, in one line with torch's reason and the model's line."""
    (tmp_path / "padded.py").write_text(textwrap.dedent('''
        import torch
        import torch.nn.functional as F

        class Padded(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(32, 8)

            def forward(self, x):
                b, s, c = x.shape
                m = (s + 3) // 4
                x = F.pad(x, (0, 0, 0, m * 4 - s))
                return self.fc(x.reshape(b, m, 4 * c)).sum(1)

        def padded():
            return Padded()
        '''))
    _, runs = _run(tmp_path, """\
        - name: padded
          source: padded:padded
          dims: {seq: {min: 4, max: 64, example: 16}}
          inputs: [{shape: [batch, seq, 8]}]
        """)
    assert runs["padded"]["status"] == "failed" and runs["padded"]["stage"] == "verify"
    error = runs["padded"]["error"]
    # the assertion that is false at this size leads, its symbols named by their dimensions
    lead = "dims: at min (batch=1, seq=4) a run-time assertion the capture kept fails: "
    assert error.startswith(lead), error
    named = error.removeprefix(lead).split(" is false here (")[0]
    assert "seq" in named and "//4" in named.replace(" ", "") and not re.search(r"\bs\d+\b", named), error
    # then torch's first refusal, with the model's line
    assert ("the first guard torch could not prove at capture: seq (arg0.size(1)) cannot be dynamic in [4, 64]"
            in error), error
    assert "((3 + arg0.size(1)) // 4) != 1" in error and "padded.py:14" in error
    # where the failing assertion holds, walked over the range: the fix in YAML
    assert error.endswith("; it holds for seq in [5, 64]; set seq: {min: 5}, or make the dimension static"), error


@pytest.mark.slow
def test_a_guard_torch_cannot_prove_but_that_holds_keeps_the_range_dynamic(tmp_path):
    """XLNet's relative attention takes floor divisions of the sequence length: torch.export
    refuses seq 4..64 on a guard it cannot prove, though it holds at every size. Kept as a
    run-time assertion, every graph is dynamic and passes at min, max and a random size."""
    pytest.importorskip("transformers")
    _, runs = _run(tmp_path, """\
        - name: xlnet
          source: hf:XLNetModel
          config: {n_layer: 2, n_head: 4, d_model: 64, vocab_size: 1024}
          dims: {seq: {min: 4, max: 64, example: 16}}
          inputs:
            - {name: input_ids, shape: [batch, seq], dtype: int64, high: 1024}
            - {name: attention_mask, shape: [batch, seq], dtype: int64, low: 1, high: 2}
        """, defaults="dims: {batch: {min: 1, max: 4, example: 2}}")
    assert runs["xlnet"]["status"] == "ok", runs["xlnet"].get("error")
    manifest = _manifest(tmp_path / "out" / "p", "xlnet")
    assert any(n.startswith("dims: kept as a run-time assertion") for n in manifest.capture.notes)
    assert all(d.status == "dynamic" for d in manifest.dims.dims.values())
    assert {c.point for c in manifest.dims.checked} >= {"min", "max"} and not any(c.problems for c in manifest.dims.checked)



@pytest.mark.parametrize("seq_max,ok", [(31, True), (40, False)])
def test_a_size_torchs_guard_solver_calls_constant_stays_dynamic_where_the_graph_keeps_it(tmp_path, seq_max, ok):
    """Padding to a multiple of 32 makes guards torch cannot simplify (s + (32 - s % 32) % 32);
    its solver concludes seq is the example's 16, though the graph keeps it symbolic (Mamba2,
    the hybrid MoE models). Exported again with Dim.DYNAMIC, the range holds where the guards
    do (max 31: every size one chunk shorter than the padded length) and fails the size checks
    where they do not (max 40), naming the range where they hold."""
    _, runs = _run(tmp_path, f"""\
        - name: chunked
          source: shapes_models:chunked
          graphs: [inference, forward, backward, joint]
          dims: {{seq: {{min: 4, max: {seq_max}, example: 16}}}}
          inputs: [{{shape: [batch, seq, 8]}}]
        """, defaults="dims: {batch: {min: 1, max: 4, example: 2}}")
    run = runs["chunked"]
    if not ok:
        assert run["status"] == "failed" and run["stage"] == "verify", run
        assert "a run-time assertion the capture kept fails" in run["error"] and "shapes_models.py" in run["error"]
        # where every kept assertion holds, walked over the range: the fix, which the case above takes
        assert run["error"].endswith("; it holds for seq in [4, 31]; set seq: {max: 31}, or make the dimension "
                                     "static"), run["error"]
        return
    assert run["status"] == "ok", run.get("error")
    manifest = _manifest(tmp_path / "out" / "p", "chunked")
    assert any(n.startswith("dims: torch's guard solver concluded seq must be a constant")
               for n in manifest.capture.notes), manifest.capture.notes
    assert {name: d.status for name, d in manifest.dims.dims.items()} == {"batch": "dynamic", "seq": "dynamic"}
    assert {c.point for c in manifest.dims.checked} >= {"min", "max"}
    assert not any(c.problems for c in manifest.dims.checked)


def test_the_solver_is_overruled_only_where_the_graph_keeps_every_named_size_symbolic():
    """Where the export with Dim.DYNAMIC specialises a named size after all, torch's refusal is
    raised again: the graph would not be the dynamic one the pipeline asked for."""
    from aotpipe.capture import dynamic as dynamic_capture
    from aotpipe.capture.export import _export_solver_overruled
    from aotpipe.spec.modes import DynamicDims

    models: dict = {}
    exec(MODEL_CODE, models)
    model, x = models["chunked"](), torch.randn(2, 16, 8)
    dyn = DynamicDims(ranges={"seq": (4, 24)}, inputs={"x": (None, "seq", None)})
    refused = RuntimeError("torch refused seq")
    notes: list[str] = []
    hinted = dynamic_capture.export_shapes(model, (x,), {}, ["x"], dyn, hints=True)
    ep = _export_solver_overruled(model, (x,), {}, notes, (hinted, ["x"]), dyn, ["seq"], refused)
    assert dynamic_capture.specialised_dims(ep, ["x"], dyn) == [] and notes
    with pytest.raises(RuntimeError, match="torch refused seq"):  # the static export: seq specialised
        _export_solver_overruled(model, (x,), {}, [], (None, ["x"]), dyn, ["seq"], refused)


# ---------------------------------------------------------------------------------------
# mode dynamo: the named dimensions marked dynamic, dynamo's one graph exported with them


def test_mode_dynamo_keeps_named_dimensions_symbolic_and_checks_them(tmp_path):
    """The tiny transformer unpacks q, k, v from one tensor (unbind in eager, indexing in
    dynamo's graph: not code outside the graphs) and reads batch and seq from its input."""
    _, runs = _run(tmp_path, """\
        - name: mlp
          source: aotpipe.zoo:mlp
          mode: dynamo
          args: {in_features: 32, hidden: 64, depth: 2}
          inputs: [{shape: [batch, 32]}]
        - name: tiny_transformer
          source: aotpipe.zoo:tiny_transformer
          mode: dynamo
          args: {vocab: 1000, dim: 64, heads: 4, layers: 2}
          dims: {batch: {min: 1, max: 8, example: 2}, seq: {min: 4, max: 128, example: 16}}
          inputs:
            - {name: input_ids, shape: [batch, seq], dtype: int64, high: 1000}
            - {name: attention_mask, shape: [batch, seq], dtype: int64, low: 1, high: 2}
        """)
    for model, wanted in (("mlp", {"batch"}), ("tiny_transformer", {"batch", "seq"})):
        assert runs[model]["status"] == "ok", runs[model].get("error")
        manifest = _manifest(tmp_path / "out" / "p", model)
        assert manifest.capture.mode == "dynamo"
        assert {n: d.status for n, d in manifest.dims.dims.items()} == dict.fromkeys(wanted, "dynamic")
        assert {c.point for c in manifest.dims.checked} >= {"min", "max"}
        assert not any(c.problems for c in manifest.dims.checked)
        for kind in KINDS:
            graph, _ = _graph(tmp_path / "out" / "p", model, kind)
            assert wanted <= {s["dim"] for s in graph["symbols"].values()}, (model, kind)


def test_mode_dynamo_refuses_a_literal_size_naming_the_dimension_and_the_line(tmp_path):
    _, runs = _run(tmp_path, """\
        - name: lit
          source: shapes_models:literal_view
          mode: dynamo
          inputs: [{shape: [batch, 32]}]
        """)
    error = runs["lit"]["error"]
    assert error.startswith("dims: batch (arg0.size(0)) cannot be dynamic in [1, 64] (dynamo, inference): "
                            "the model fixes it to 4"), error
    assert "shapes_models.py:10" in error and "\n" not in error


def test_mode_dynamo_refuses_dims_on_a_model_it_splits_into_several_graphs(tmp_path):
    _, runs = _run(tmp_path, """\
        - name: broken
          source: shapes_models:broken
          mode: dynamo
          inputs: [{shape: [batch, 32]}]
        """)
    assert runs["broken"]["status"] == "failed"
    assert runs["broken"]["error"].startswith("dims: dynamo split the model into 2 graphs"), runs["broken"]["error"]
    assert "remove the graph break, or remove dims for this model" in runs["broken"]["error"]


def test_an_op_dynamo_traces_as_others_is_not_code_outside_the_graphs():
    import collections

    from aotpipe.capture.dynamo import outside_graphs

    eager = collections.Counter({"aten.unbind.int": 2, "aten.mm.default": 4})
    assert outside_graphs(eager, collections.Counter({"aten.select.int": 6, "aten.mm.default": 4}), [], [],
                          "inference") is None
    missing = outside_graphs(eager, collections.Counter({"aten.select.int": 1, "aten.mm.default": 4}), [], [],
                             "inference")
    assert missing is not None and missing.ops == {"aten.unbind.int": 2}



def test_mode_auto_captures_a_model_dynamo_splits_at_the_example_sizes_and_says_why(tmp_path):
    """Export fails (a branch on values), dynamo splits the model, so no graph can keep the named
    dimension: auto still captures the model (its promise), every dimension recorded as static
    with the reason, and the model is not dynamic ok."""
    _, runs = _run(tmp_path, """\
        - name: branchy
          source: shapes_models:branchy
          mode: auto
          inputs: [{shape: [batch, 32]}]
        """)
    assert runs["branchy"]["status"] in ("ok", "partial"), runs["branchy"].get("error")
    manifest = _manifest(tmp_path / "out" / "p", "branchy")
    assert manifest.capture.mode == "dynamo"
    (dim,) = manifest.dims.dims.values()
    assert dim.status == "specialised" and "dynamo split the model into" in dim.reason, dim
    assert any("at the example sizes (dynamo split the model into" in n for n in manifest.capture.notes)


@pytest.mark.parametrize("executor, resources, budget", [
    ("{kind: local}", "", 4 * 2**30),                           # neither: the default
    ("{kind: local, memory_gb: 2}", "", 2**30),                 # the executor's limit: half of it
    ("{kind: local, memory_gb: 2}", "resources: {memory_gb: 6}", 3 * 2**30),  # the model's own, first
])
def test_the_size_checks_budget_is_half_the_workers_memory_limit(tmp_path, executor, resources, budget):
    (tmp_path / "p.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        name: p
        output: {tmp_path / 'out'}
        executor: {executor}
        defaults:
          mode: export
          graphs: [inference]
          dims: {{batch: {{min: 1, max: 8, example: 2}}}}
        models:
          - name: mlp
            source: aotpipe.zoo:mlp
            args: {{in_features: 8, hidden: 8, depth: 1}}
            inputs: [{{shape: [batch, 8]}}]
            {resources}
        """))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "--no-progress", "--no-sign"])
    assert result.exit_code == 0, result.output
    assert _manifest(tmp_path / "out" / "p", "mlp").dims.budget_bytes == budget



def test_mode_auto_captures_a_model_dynamo_refuses_a_range_of_after_a_break_at_the_example_sizes(tmp_path):
    _, runs = _run(tmp_path, """\
        - name: late
          source: shapes_models:late_literal
          mode: auto
          inputs: [{shape: [batch, 32]}]
        """)
    assert runs["late"]["status"] in ("ok", "partial"), runs["late"].get("error")
    manifest = _manifest(tmp_path / "out" / "p", "late")
    (dim,) = manifest.dims.dims.values()
    assert dim.status == "specialised" and "cannot be dynamic" in dim.reason and "fixes it to 4" in dim.reason, dim


def test_inputs_a_forward_takes_through_its_kwargs_are_dynamic(tmp_path):
    # torch.export cannot take dynamic_shapes for **kwargs (pytorch#150022); the capture names them
    _, runs = _run(tmp_path, """\
        - name: tower
          source: shapes_models:keyword_tower
          inputs:
          - {name: pixel_values, shape: [batch, 32]}
          - {name: input_ids, shape: [batch, seq], dtype: int64, high: 100}
        """, defaults="dims: {batch: {min: 1, max: 4, example: 2}, seq: {min: 2, max: 16, example: 8}}")
    assert runs["tower"]["status"] == "ok", runs["tower"].get("error")
    dims = _manifest(tmp_path / "out" / "p", "tower").dims
    assert {n: d.status for n, d in dims.dims.items()} == {"batch": "dynamic", "seq": "dynamic"}
    assert {c.point for c in dims.checked} >= {"min", "max"} and not any(c.problems for c in dims.checked)


def test_a_draw_from_the_default_generator_named_none_stays_dynamic(tmp_path):
    # rand/randn(..., generator=None) take no symbolic size in torch 2.13; the capture leaves the None out
    _, runs = _run(tmp_path, """\
        - name: noise
          source: shapes_models:named_default_generator
          inputs: [{shape: [batch, 32]}]
        """, defaults="dims: {batch: {min: 1, max: 4, example: 2}}")
    assert runs["noise"]["status"] == "ok", runs["noise"].get("error")
    assert _manifest(tmp_path / "out" / "p", "noise").dims.dims["batch"].status == "dynamic"


def test_a_view_of_a_value_whose_strides_torch_traced_otherwise_runs_at_every_size(tmp_path):
    # torch's shape function says the crop is contiguous, its kernel keeps the permuted strides
    _, runs = _run(tmp_path, """\
        - name: crop
          source: shapes_models:crop_then_view
          inputs: [{shape: [batch, seq, 8]}]
          graphs: [inference, forward, backward, joint]
        """, defaults="dims: {batch: {min: 1, max: 4, example: 2}, seq: {min: 4, max: 31, example: 16}}")
    assert runs["crop"]["status"] == "ok", runs["crop"].get("error")
    manifest = _manifest(tmp_path / "out" / "p", "crop")
    assert any("written as aten.reshape" in n for n in manifest.capture.notes)
    graph, _ = _graph(tmp_path / "out" / "p", "crop", "joint")
    assert any(n.get("target") == "aten.reshape.default" for n in graph["nodes"])
