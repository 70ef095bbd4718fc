"""Example inputs that do not fit the model are named as input mistakes before capture (an
eager forward, eval mode, no grad), not blamed on tracing or on the written graph."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from aotpipe.models import zoo
from aotpipe.models.eager import input_problem
from tests.helpers.pipelines import run_yaml


def _mlp():
    torch.manual_seed(0)
    return zoo.mlp(in_features=8, hidden=16, out_features=4)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
def test_an_input_of_another_dtype_than_the_model_is_named_with_the_dtype_to_set(dtype):
    x = torch.ones(2, 8, dtype=dtype)
    msg = input_problem(_mlp(), (x,), {}, ["inputs[0]"])
    want = str(dtype).removeprefix("torch.")
    assert msg.startswith(f"input 'inputs[0]' is {want}, but the model computes in float32 (in layers.0 (Linear), "
                          "F.linear: RuntimeError: mat1 and mat2 must have the same dtype"), msg
    assert msg.endswith("; set its dtype: float32"), msg


def test_inputs_that_fit_give_no_problem():
    assert input_problem(_mlp(), (torch.ones(2, 8),), {}, ["inputs[0]"]) is None


def test_a_last_size_a_linear_layer_does_not_take_is_named_with_its_in_features():
    msg = input_problem(_mlp(), (torch.ones(2, 7),), {}, ["x"])
    assert msg.startswith("input 'x' (shape [2, 7], float32) does not fit the model: in layers.0 (Linear), "
                          "F.linear: RuntimeError: mat1 and mat2 shapes cannot be multiplied"), msg
    assert msg.endswith("; its last size must be 8 (the layer's in_features)"), msg


def test_an_input_missing_its_batch_dimension_is_named():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    msg = input_problem(model, (torch.ones(3, 8, 8),), {}, ["inputs[0]"])
    assert msg == ("input 'inputs[0]' has 3 dimensions (shape [3, 8, 8]), where 4 are wanted (in 1 (BatchNorm2d), "
                   "ValueError: expected 4D input (got 3D input)); add the batch dimension: shape [1, 3, 8, 8]"), msg
    assert input_problem(model, (torch.ones(1, 3, 8, 8),), {}, ["inputs[0]"]) is None


def test_indices_past_an_embedding_table_are_named_with_the_high_to_set():
    model = nn.Embedding(10, 4)
    msg = input_problem(model, (torch.tensor([[3, 12]]),), {}, ["ids"])
    assert msg.startswith("input 'ids' (shape [1, 2], int64) does not fit the model: F.embedding: IndexError"), msg
    assert msg.endswith("its values must lie in [0, 10), the table's rows: set high: 10 or less"), msg
    assert input_problem(model, (torch.tensor([[3, 9]]),), {}, ["ids"]) is None


class _Counting(nn.Module):
    """Changes its buffer, replaces another, changes its input, draws a random number."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))
        self.register_buffer("last", torch.zeros(2))
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        self.seen += 1
        self.last = x.sum(0)
        x.mul_(2)
        return self.fc(x) + torch.rand(())


def test_the_eager_try_leaves_model_inputs_and_rng_as_they_were():
    model = _Counting().train()
    model.fc.eval()  # a mixed mode is kept too
    x = torch.ones(3, 2)
    last = model.last
    rng = torch.get_rng_state()
    assert input_problem(model, (x,), {}, ["x"]) is None
    assert model.seen.item() == 0 and model.last is last and torch.equal(last, torch.zeros(2))
    assert torch.equal(x, torch.ones(3, 2))
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training and not model.fc.training


class _Rescaling(nn.Module):
    """RWKV's rescaling in small: an eval forward divides a weight in place (undone by a
    factor on the hidden state) and sets a flag; a training forward multiplies it back."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        self.rescaled = False

    def forward(self, x):
        if self.rescaled != (not self.training):
            with torch.no_grad():
                if self.training:
                    self.out.weight.mul_(2)
                else:
                    self.out.weight.div_(2)
            self.rescaled = not self.training
        h = torch.relu(self.fc(x))
        return self.out(h if self.training else h * 2)


def rescaling():
    torch.manual_seed(0)
    return _Rescaling()


def test_the_eager_try_leaves_weights_changed_in_place_and_attributes_as_they_were():
    model = rescaling().train()
    weight, before = model.out.weight, model.out.weight.detach().clone()
    model.cache = "kept"
    assert input_problem(model, (torch.ones(3, 4),), {}, ["x"]) is None
    assert model.out.weight is weight and torch.equal(weight, before)
    assert model.rescaled is False and model.training and model.cache == "kept"
    assert not hasattr(model, "added")
    # an attribute the forward adds is taken away again
    model.forward = lambda x: setattr(model, "added", 1) or x
    assert input_problem(model, (torch.ones(3, 4),), {}, ["x"]) is None and not hasattr(model, "added")


def test_a_model_that_rescales_its_weights_in_eval_captures_as_eager_runs(tmp_path):
    """The eager try before capture once left RWKV's weights rescaled and its flag set: the
    training graphs then differed from eager (gradients of the rescaled weights off by 1.8 RMS)."""
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference, forward, backward, joint]}
        models:
          - {name: rescaling, source: "tests.test_input_mistakes:rescaling", inputs: [{shape: [3, 4]}]}
        """))
    assert result.exit_code == 0, result.output


def test_a_model_failing_for_its_own_reasons_is_not_blamed_on_an_input():
    class Broken(nn.Module):
        def forward(self, x):
            raise KeyError("no such layer")

    msg = input_problem(Broken(), (torch.ones(2),), {}, ["x"])
    assert msg == ("the model does not run on its example inputs (KeyError: 'no such layer'); check the inputs' "
                   "shapes and dtypes against what its forward expects"), msg


def test_run_names_an_int64_input_to_a_float_model_and_writes_no_artefact(tmp_path):
    result, out = run_yaml(tmp_path, textwrap.dedent("""\
        version: 1
        name: p
        defaults: {graphs: [inference]}
        models:
          - {name: ints, source: "aotpipe.zoo:mlp", inputs: [{shape: [4, 32], dtype: int64, high: 5}]}
        """))
    assert result.exit_code == 1, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("FAILED"))
    assert line.startswith("FAILED  ints                     source: input 'inputs[0]' is int64, but the model "
                           "computes in float32 ("), line
    assert line.endswith("; set its dtype: float32"), line
    assert "Traceback" not in result.output and "does not run" not in result.output
    assert not (out / "p" / "ints" / "manifest.json").exists()
