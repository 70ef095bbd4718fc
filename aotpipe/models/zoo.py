"""Small builtin models for the quickstart pipeline and the tests.

Each is a function returning an nn.Module, usable as ``source: aotpipe.zoo:<name>``.
They are small enough to capture in seconds and cover the graph features that matter:
convolution with batchnorm, attention, layernorm, GELU, buffer mutation, recurrent layers
(lstm, gru, rnn), data-dependent sizes (topk_moe) and a data-dependent branch (sign_branch).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int, depth: int):
        super().__init__()
        dims = [in_features] + [hidden] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(dims[-1], out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


def mlp(in_features: int = 32, hidden: int = 64, out_features: int = 10, depth: int = 2) -> nn.Module:
    """Linear + ReLU stack."""
    return MLP(in_features, hidden, out_features, depth)


class SmallCNN(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels * 2, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * 2)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(channels * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def small_cnn(channels: int = 16, num_classes: int = 10) -> nn.Module:
    """Conv, batchnorm, ReLU, max-pooling, global average pooling, linear."""
    return SmallCNN(channels, num_classes)


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, ff)
        self.ff2 = nn.Linear(ff, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, 4 * dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.pooler = nn.Linear(dim, dim)  # unused by the outputs: gets no gradient

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        t = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.bool()
        x = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        for layer in self.layers:
            x = layer(x, mask)
        x = self.norm(x)
        return {"last_hidden_state": x, "mean": x.mean(1)}


def tiny_transformer(vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128) -> nn.Module:
    """Embedding, multi-head attention with a padding mask, layernorm, GELU MLP; dict output."""
    return TinyTransformer(vocab, dim, heads, layers, max_len)


class RunningNorm(nn.Module):
    """Normalises by running statistics it updates in place on every call."""

    def __init__(self, features: int, momentum: float):
        super().__init__()
        self.momentum = momentum
        self.fc = nn.Linear(features, features)
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.running_mean.mul_(1 - self.momentum).add_(x.mean(0), alpha=self.momentum)
            self.calls.add_(1)
        return self.fc(x - self.running_mean)


def running_norm(features: int = 16, momentum: float = 0.1) -> nn.Module:
    """A model that mutates two buffers (a float running mean and an int counter) in forward."""
    return RunningNorm(features, momentum)


class Recurrent(nn.Module):
    """An nn.LSTM, nn.GRU or nn.RNN followed by a linear head on every step's output."""

    def __init__(self, cell: type[nn.RNNBase], input_size: int, hidden: int, out_features: int, **rnn_args: Any):
        super().__init__()
        self.rnn = cell(input_size, hidden, **rnn_args)
        width = (rnn_args.get("proj_size") or hidden) * (2 if rnn_args.get("bidirectional") else 1)
        self.head = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y)


def lstm(input_size: int = 8, hidden: int = 16, out_features: int = 4, num_layers: int = 1,
         bidirectional: bool = False, batch_first: bool = False, dropout: float = 0.0, proj_size: int = 0) -> nn.Module:
    """nn.LSTM (any layer count, direction, batch layout, inter-layer dropout, projection) and a linear head."""
    return Recurrent(nn.LSTM, input_size, hidden, out_features, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first, dropout=dropout, proj_size=proj_size)


def gru(input_size: int = 8, hidden: int = 16, out_features: int = 4, num_layers: int = 1,
        bidirectional: bool = False, batch_first: bool = False, dropout: float = 0.0) -> nn.Module:
    """nn.GRU and a linear head."""
    return Recurrent(nn.GRU, input_size, hidden, out_features, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first, dropout=dropout)


def rnn(input_size: int = 8, hidden: int = 16, out_features: int = 4, num_layers: int = 1,
        bidirectional: bool = False, batch_first: bool = False, dropout: float = 0.0,
        nonlinearity: str = "tanh") -> nn.Module:
    """nn.RNN (tanh or relu) and a linear head."""
    return Recurrent(nn.RNN, input_size, hidden, out_features, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first, dropout=dropout, nonlinearity=nonlinearity)


class TopKMoE(nn.Module):
    """Top-k routing over expert MLPs: each token goes to its k best experts, found with
    ``torch.where`` on the routing mask (data-dependent sizes)."""

    def __init__(self, dim: int, experts: int, k: int, hidden: int):
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            out = out.index_add(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


def topk_moe(dim: int = 16, experts: int = 4, k: int = 2, hidden: int = 32) -> nn.Module:
    """A mixture of experts with top-k routing (data-dependent token counts per expert)."""
    return TopKMoE(dim, experts, k, hidden)


class SignBranch(nn.Module):
    """Takes one of two paths depending on the input's values (``if x.sum() > 0``)."""

    def __init__(self, features: int):
        super().__init__()
        self.up = nn.Linear(features, features)
        self.down = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return torch.relu(self.up(x))
        return torch.tanh(self.down(x))


def sign_branch(features: int = 16) -> nn.Module:
    """A data-dependent Python branch: torch.export refuses it, dynamo breaks the graph there."""
    return SignBranch(features)


ZOO = {"mlp": mlp, "small_cnn": small_cnn, "tiny_transformer": tiny_transformer, "running_norm": running_norm,
       "lstm": lstm, "gru": gru, "rnn": rnn, "topk_moe": topk_moe, "sign_branch": sign_branch}
