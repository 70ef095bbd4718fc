"""Small models for the distributed tests (tests/distributed/): an MLP block stack whose Linear
layers a tensor-parallel plan names (``blocks.*.up``: colwise, ``blocks.*.down``: rowwise)."""

from __future__ import annotations

from typing import Any

import torch

from aotpipe.spec import ModelSpec


class Block(torch.nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(torch.nn.Module):
    def __init__(self, width: int = 8, hidden: int = 16, depth: int = 2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, hidden) for _ in range(depth))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def stack(width: int = 8, hidden: int = 16, depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return Stack(width, hidden, depth)


class Embedded(torch.nn.Module):
    """Token ids in: an embedding, then the stack's blocks and head."""

    def __init__(self, vocab: int = 16, width: int = 8, hidden: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.stack = Stack(width, hidden, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.stack(self.embed(ids))


def embedded(vocab: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    return Embedded(vocab)


class Conv1DBlock(torch.nn.Module):
    """The block with transformers' Conv1D projections (GPT-2's: weights stored [in, out])."""

    def __init__(self, width: int, hidden: int):
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = Conv1D(hidden, width)
        self.down = Conv1D(width, hidden)
        for conv in (self.up, self.down):  # Conv1D's bias starts at zero: a wrong bias shard would not show
            torch.nn.init.normal_(conv.bias, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def conv1d_stack(width: int = 8, hidden: int = 16, depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Stack(width, hidden, depth)
    model.blocks = torch.nn.ModuleList(Conv1DBlock(width, hidden) for _ in range(depth))
    return model


# the plan a pipeline names for it
PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


def mlp_spec(strategy: str, world: int = 2, mesh: list[int] | None = None, batch: int = 4,
             plan: dict[str, str] | None = None, embedded: bool = False, seq: int = 3, **more: Any) -> ModelSpec:
    """The stack as a pipeline entry under `strategy`: all four graph kinds, inputs saved; with
    `embedded`, the stack behind an embedding, on token ids. `plan`: the tensor-parallel plan
    (default :data:`PLAN`, for the stack alone); `seq`: the inputs' dimension 1; `more`: the
    distributed block's other keys."""
    source, inputs = ("embedded", [{"name": "ids", "shape": [batch, seq], "dtype": "int64", "high": 16}]) \
        if embedded else (more.pop("source", "stack"), [{"name": "x", "shape": [batch, seq, 8]}])
    return ModelSpec.model_validate(dict(
        name="mlp", source=f"tests.helpers.parallel_models:{source}", args={}, config=None, mode="export",
        graphs=["inference", "forward", "backward", "joint"], passes=[], inputs=inputs,
        save_inputs=True, verify=True, loss="weighted", seed=0,
        distributed=dict(world_size=world, strategy=strategy, mesh=mesh,
                         tp_plan=(plan or PLAN) if "tp" in strategy else None, **more)))


def assert_ok(result: Any) -> None:
    """A model's result: written, every check run passed."""
    assert result.status == "ok", (result.stage, result.error)
    assert result.checks is not None and result.checks.run > 0 and result.checks.failed == 0


def fused_conv1d_stack() -> torch.nn.Module:
    """The Conv1D stack whose up projection has three times its input features (GPT-2's c_attn's form)."""
    return conv1d_stack(hidden=24)
