"""Checked forms: each op whose kernel indexes memory with values it is given refuses
hostile arguments in one line before its kernel runs, and returns exactly the kernel's
result otherwise."""

import json
import os
import subprocess
import sys

import pytest
import torch

from aotpipe.artifact import checked
from aotpipe.artifact.ops import op_name
from aotpipe.errors import ArtifactError

aten = torch.ops.aten
T, F = True, False


def _i(*values):
    return torch.tensor(values, dtype=torch.int64)


def _r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _pool_indices(n=4):
    return torch.zeros(1, 1, 2, 2, dtype=torch.int64).fill_(n)


HOSTILE = {
    "max_pool2d backward, index past the input": (
        aten.max_pool2d_with_indices_backward.default,
        (_r(1, 1, 2, 2), _r(1, 1, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False, _pool_indices(10**6)),
        "indices holds 1000000, outside [0, 16)"),
    "max_pool2d backward, negative index": (
        aten.max_pool2d_with_indices_backward.default,
        (_r(1, 1, 2, 2), _r(1, 1, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False, _pool_indices(-5)),
        "indices holds -5, outside [0, 16)"),
    "max_pool3d backward": (
        aten.max_pool3d_with_indices_backward.default,
        (_r(1, 1, 1, 1, 1), _r(1, 1, 2, 2, 2), [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False,
         torch.full((1, 1, 1, 1, 1), 4096, dtype=torch.int64)),
        "indices holds 4096, outside [0, 8)"),
    "adaptive_max_pool2d backward": (
        aten.adaptive_max_pool2d_backward.default, (_r(1, 1, 2, 2), _r(1, 1, 4, 4), _pool_indices(99)),
        "indices holds 99, outside [0, 16)"),
    "adaptive_max_pool3d backward": (
        aten.adaptive_max_pool3d_backward.default,
        (_r(1, 1, 1, 1, 1), _r(1, 1, 2, 2, 2), torch.full((1, 1, 1, 1, 1), 8, dtype=torch.int64)),
        "indices holds 8, outside [0, 8)"),
    "pool backward, indices smaller than grad": (
        aten.max_pool2d_with_indices_backward.default,
        (_r(1, 1, 2, 2), _r(1, 1, 4, 4), [2, 2], [2, 2], [0, 0], [1, 1], False, _i(0)),
        "indices has shape [1], grad_output [1, 1, 2, 2]"),
    "embedding dense backward, scale_grad_by_freq": (
        aten.embedding_dense_backward.default, (_r(3, 4), _i(0, 1, 10**6), 10, -1, True),
        "indices (num_weights 10) holds 1000000, outside [0, 10)"),
    "embedding dense backward, grad shorter than indices": (
        aten.embedding_dense_backward.default, (_r(2, 4), _i(0, 1, 2), 10, -1, False),
        "grad_output has shape [2, 4] for indices of shape [3]"),
    "embedding_bag backward": (
        aten._embedding_bag_backward.default,
        (_r(2, 4), _i(0, 1, 10**6), _i(0, 2), _i(0, 0, 1), _i(2, 1), _i(0, 0), 10, False, 0, False, None, -1),
        "indices (num_weights 10) holds 1000000, outside [0, 10)"),
    "embedding_bag backward, offset2bag to rebuild past the bags": (  # 3 offsets (bags) for a grad of 2
        aten._embedding_bag_backward.default,
        (_r(2, 4), _i(0, 1, 2), _i(0, 1, 2), _i(), _i(1, 1, 1), _i(), 10, False, 0, False, None, -1),
        "offset2bag (2 bags) holds 2, outside [0, 2)"),
    "embedding_bag dense backward, offset2bag past the bags": (
        aten._embedding_bag_dense_backward.default,
        (_r(2, 4), _i(0, 1, 2), _i(0, 0, 7), _i(2, 1), _i(0, 0), 10, False, 0, None, -1),
        "offset2bag (2 bags) holds 7, outside [0, 2)"),
    "embedding_bag dense backward, max mode": (
        aten._embedding_bag_dense_backward.default,
        (_r(2, 4), _i(0, 1, 2), _i(0, 0, 1), _i(2, 1), torch.full((2, 4), 50, dtype=torch.int64), 10, False, 2,
         None, -1),
        "maximum_indices (num_weights 10) holds 50, outside [0, 10)"),
    "embedding_bag per-sample-weights backward": (
        aten._embedding_bag_per_sample_weights_backward.default,
        (_r(2, 4), _r(10, 4), _i(0, 1, 99), _i(0, 2), _i(0, 0, 1), 0, -1),
        "indices (num_weights 10) holds 99, outside [0, 10)"),
    "embedding_bag per-sample-weights backward, offset2bag empty (rebuilt from offsets)": (
        aten._embedding_bag_per_sample_weights_backward.default,
        (_r(2, 4), _r(10, 4), _i(0, 1, 99), _i(0, 2), _i(), 0, -1),
        "indices (num_weights 10) holds 99, outside [0, 10)"),
    "embedding_bag per-sample-weights backward, offset2bag empty, grad short of the bags": (
        aten._embedding_bag_per_sample_weights_backward.default,
        (_r(0, 4), _r(10, 4), _i(0, 1, 2), _i(0, 2), _i(), 0, -1),
        "grad has 0 rows for the 2 bags offsets make"),
    "embedding_bag, offsets past the indices": (
        aten._embedding_bag.default, (_r(10, 4), _i(0, 1, 2), _i(0, 9)),
        "offsets holds 9, outside [0, 4)"),
    "layer norm backward, short statistics": (
        aten.native_layer_norm_backward.default,
        (_r(4, 8), _r(4, 8), [8], _r(1, 1), _r(1, 1), _r(8), _r(8), [T, T, T]),
        "mean has 1 elements where the input needs 4"),
    "layer norm backward, short weight": (
        aten.native_layer_norm_backward.default,
        (_r(4, 8), _r(4, 8), [8], _r(4, 1), _r(4, 1), _r(2), _r(8), [T, T, T]),
        "weight has 2 elements where the input needs 8"),
    "batch norm backward, short statistics": (
        aten.native_batch_norm_backward.default,
        (_r(2, 3, 4), _r(2, 3, 4), _r(3), None, None, _r(1), _r(1), True, 1e-5, [T, T, T]),
        "save_mean has 1 elements where the input needs 3"),
    "batch_norm_backward, short running stats": (
        aten.batch_norm_backward.default,
        (_r(2, 3, 4), _r(2, 3, 4), _r(3), _r(1), _r(3), _r(3), _r(3), False, 1e-5, [T, T, T],
         torch.empty(0, dtype=torch.uint8)),
        "running_mean has 1 elements where the input needs 3"),
    "batch norm forward, short running stats": (
        aten._native_batch_norm_legit_functional.default, (_r(2, 3, 4), _r(3), _r(3), _r(1), _r(3), True, 0.1, 1e-5),
        "running_mean has 1 elements where the input needs 3"),
    # the red team's: export's batch norms, whose CPU kernels read (and the first writes) as many
    # statistics as the input has channels
    "batch norm with update, short running stats": (
        aten._batch_norm_with_update_functional.default, (_r(2, 3, 4), _r(3), _r(3), _r(1), _r(1), 0.1, 1e-5),
        "running_mean has 1 elements where the input needs 3"),
    "batch norm without update, short running var": (
        aten._batch_norm_no_update.default, (_r(2, 3, 4), _r(3), _r(3), _r(3), _r(1), 0.1, 1e-5),
        "running_var has 1 elements where the input needs 3"),
    "batch norm without update, short weight": (
        aten._batch_norm_no_update.default, (_r(2, 3, 4), _r(1), None, _r(3), _r(3), 0.1, 1e-5),
        "weight has 1 elements where the input needs 3"),
    # the CPU flash attention kernel walks key and value with query's batch and heads and
    # value's positions, and reads each head's vector as dense
    "flash attention, key expanded from one element": (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        (_r(1, 1, 8, 4), torch.ones(1).expand(1, 1, 8, 4), _r(1, 1, 8, 4)),
        "key's last dimension (4 elements) has stride 0 where the kernel reads it densely (stride 1)"),
    "flash attention, value's head vectors strided": (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        (_r(1, 1, 8, 4), _r(1, 1, 8, 4), _r(1, 1, 8, 8)[..., ::2]),
        "value's last dimension (4 elements) has stride 2 where the kernel reads it densely (stride 1)"),
    "flash attention, key with one batch for query's two": (
        aten._scaled_dot_product_flash_attention_for_cpu.default, (_r(2, 1, 8, 4), _r(1, 1, 8, 4), _r(2, 1, 8, 4)),
        "query, key and value have batch sizes 2, 1, 2 where the kernel needs one"),
    "flash attention, heads that do not group": (
        aten._scaled_dot_product_flash_attention_for_cpu.default, (_r(1, 4, 8, 4), _r(1, 3, 8, 4), _r(1, 3, 8, 4)),
        "key and value have 3 and 3 heads for query's 4 (the kernel needs one number, dividing query's)"),
    "flash attention, more key heads than query heads": (
        aten._scaled_dot_product_flash_attention_for_cpu.default, (_r(1, 2, 8, 4), _r(1, 4, 8, 4), _r(1, 4, 8, 4)),
        "key and value have 4 and 4 heads for query's 2 (the kernel needs one number, dividing query's)"),
    "flash attention, key shorter than value": (
        aten._scaled_dot_product_flash_attention_for_cpu.default, (_r(1, 1, 8, 4), _r(1, 1, 2, 4), _r(1, 1, 8, 4)),
        "query, key and value have 8, 2 and 8 positions (the kernel needs at least one, and as many in key as in "
        "value)"),
    "flash attention, no positions": (  # the kernel divides by its block of positions
        aten._scaled_dot_product_flash_attention_for_cpu.default, (_r(1, 1, 0, 4), _r(1, 1, 8, 4), _r(1, 1, 8, 4)),
        "query, key and value have 0, 8 and 8 positions"),
    "group norm backward, short statistics": (
        aten.native_group_norm_backward.default,
        (_r(2, 4, 3), _r(2, 4, 3), _r(1), _r(1), _r(4), 2, 4, 3, 2, [T, T, T]),
        "mean has 1 elements where the input needs 4"),
    "group norm backward, N past the input": (
        aten.native_group_norm_backward.default,
        (_r(2, 4, 3), _r(2, 4, 3), _r(400), _r(400), _r(4), 200, 4, 3, 2, [T, T, T]),
        "N=200, C=4, HxW=3 do not describe an input of shape [2, 4, 3]"),
    "group norm forward, C past the input": (
        aten.native_group_norm.default, (_r(2, 4, 3), _r(40), _r(40), 2, 40, 3, 2, 1e-5),
        "N=2, C=40, HxW=3 do not describe an input of shape [2, 4, 3]"),
    "pdist backward, short pdist": (
        aten._pdist_backward.default, (_r(1), _r(4, 3), 2.0, _r(1)),
        "pdist has 1 elements where the input needs 6"),
    "cdist backward, short cdist": (
        aten._cdist_backward.default, (_r(2, 2), _r(2, 3), _r(5, 3), 2.0, _r(2, 2)),
        "cdist has shape [2, 2] for x1 [2, 3] and x2 [5, 3]"),
    "weight norm backward, short norms": (
        aten._weight_norm_interface_backward.default, (_r(4, 3), _r(4, 3), _r(4, 1), _r(1, 1), 0),
        "saved_norms has 1 elements where the input needs 4"),
    "segment_reduce, unsafe": (
        aten.segment_reduce.default, (_r(4), "sum"), "unsafe=True skips the kernel's own checks",
    ),
    "segment_reduce, lengths past the data": (
        aten.segment_reduce.default, (_r(4), "sum"), "lengths add up to 1000000, the data has 4 along the axis",
    ),
    "segment_reduce backward, lengths past the data": (
        aten._segment_reduce_backward.default, (_r(1), _r(1), _r(4), "sum"),
        "lengths add up to 1000000, the data has 4 along the axis"),
    "bincount of a huge value": (
        aten.bincount.default, (_i(0, 10**12),), "its values makes 1,000,000,000,001 elements"),
    "repeat_interleave of a huge count": (
        aten.repeat_interleave.Tensor, (_i(10**12),), "its repeats makes 1,000,000,000,000 elements"),
    # the FFT kernels read the input's sizes at `dim` and switch on `normalization` unchecked
    "complex FFT, dim past the input": (
        aten._fft_c2c.default, (_r(4, 8).to(torch.cfloat), [5], 0, True),
        "dim [5] names a dimension self (2-d) does not have"),
    "real FFT, dim past the input": (
        aten._fft_r2c.default, (_r(4, 8), [-3], 0, True), "dim [-3] names a dimension self (2-d) does not have"),
    "real FFT, a dimension twice": (
        aten._fft_r2c.default, (_r(4, 8), [1, 1], 0, True), "dim [1, 1] names a dimension twice"),
    "complex FFT, unknown normalization": (
        aten._fft_c2c.default, (_r(4, 8).to(torch.cfloat), [1], 7, True), "normalization 7 is not 0, 1 or 2"),
    # the grid sampler's CPU kernels take any int as a mode
    "grid sampler, unknown interpolation": (
        aten.grid_sampler_2d.default, (_r(1, 1, 4, 4), _r(1, 4, 4, 2), 7, 0, False),
        "interpolation_mode 7 is not 0, 1 or 2"),
    "grid sampler backward, unknown padding": (
        aten.grid_sampler_2d_backward.default, (_r(1, 1, 4, 4), _r(1, 1, 4, 4), _r(1, 4, 4, 2), 0, -1, False,
                                                [True, True]), "padding_mode -1 is not 0, 1 or 2"),
    # found by the sweep (tests/artifact/test_hostile_ops.py): kernels that read an argument
    # densely by sizes they take from another
    "group norm, weight expanded from one element": (
        aten.native_group_norm.default, (_r(2, 4, 3), torch.ones(1).expand(4), None, 2, 4, 3, 2, 1e-5),
        "weight is not dense (sizes [4], strides [0]) where the kernel reads it so"),
    "group norm backward, grad_out expanded": (
        aten.native_group_norm_backward.default,
        (torch.ones(1).expand(2, 4, 3), _r(2, 4, 3), _r(2, 2), _r(2, 2), _r(4), 2, 4, 3, 2, [T, T, T]),
        "grad_out is not dense (sizes [2, 4, 3], strides [0, 0, 0])"),
    "weight norm, g expanded": (
        aten._weight_norm_interface.default, (_r(4, 3), torch.ones(1).expand(4, 1), 0),
        "g is not dense (sizes [4, 1], strides [0, 1])"),
    "weight norm backward, grad_w expanded": (
        aten._weight_norm_interface_backward.default,
        (torch.ones(1).expand(4, 3), _r(4, 3), _r(4, 1), _r(4, 1), 0), "grad_w is not dense"),
    "embedding_bag, offsets expanded": (
        aten._embedding_bag.default, (_r(10, 4), _i(0, 1, 2), torch.zeros(1, dtype=torch.int64).expand(2)),
        "offsets is not dense (sizes [2], strides [0])"),
    "adaptive max pool3d backward, indices expanded": (
        aten.adaptive_max_pool3d_backward.default,
        (_r(1, 1, 2, 2, 2), _r(1, 1, 4, 4, 4), torch.zeros(1, dtype=torch.int64).expand(1, 1, 2, 2, 2)),
        "indices is not dense"),
    "log softmax backward, output of one element": (
        aten._log_softmax_backward_data.default, (_r(2, 3), _r(1, 1), 1, torch.float32),
        "grad_output has shape [2, 3], output [1, 1]"),
    "adaptive avg pool2d backward, grad of one plane": (
        aten._adaptive_avg_pool2d_backward.default, (_r(1, 1, 2, 2), _r(2, 3, 4, 4)),
        "grad_output has shape [1, 1, 2, 2] for an input of shape [2, 3, 4, 4]"),
    "avg pool2d backward, input emptied": (
        aten.avg_pool2d_backward.default, (_r(2, 3, 2, 2), _r(0, 3, 4, 4), [2, 2], [2, 2], [0, 0], False, True, None),
        "grad_output has shape [2, 3, 2, 2] for an input of shape [0, 3, 4, 4]"),
    "replication pad backward, grad emptied": (
        aten.replication_pad2d_backward.default, (_r(0, 2, 5, 6), _r(1, 2, 3, 4), [1, 1, 1, 1]),
        "grad_output has shape [0, 2, 5, 6] for an input of shape [1, 2, 3, 4]"),
    "reflection pad backward, grad the wrong size": (
        aten.reflection_pad1d_backward.default, (_r(1, 2, 5), _r(1, 2, 4), [1, 1]),
        "grad_output has shape [1, 2, 5] where self [1, 2, 4] padded by [1, 1] gives [1, 2, 6]"),
    "grid sampler backward, grad of one element": (
        aten.grid_sampler_2d_backward.default, (_r(1, 1, 1, 1), _r(2, 3, 5, 5), _r(2, 5, 5, 2), 0, 0, False,
                                                [True, True]),
        "grad_output has shape [1, 1, 1, 1] where input and grid give [2, 3, 5, 5]"),
    "pdist backward, no rows": (
        aten._pdist_backward.default, (_r(0), _r(0, 1), 2.0, _r(0)), "self has no rows"),
    "lstm, a weight of one element": (
        aten.lstm.input, (_r(5, 2, 3), [_r(1, 2, 4), _r(1, 2, 4)], [_r(1, 1), _r(16, 4), _r(16), _r(16)], True, 1,
                          0.0, False, False, False),
        "params[0] has shape [1, 1] where its layer needs [16, 3]"),
    "inverse real FFT, huge last size": (
        aten._fft_c2r.default, (_r(4, 5).to(torch.cfloat), [1], 0, 10**12), "last_dim_size makes 4,000,000,000,000"),
    # found by the sweep over the derived list (tests/artifact/test_hostile_ops.py)
    "CPU flash attention backward, grad_out of one element": (
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        (_r(1, 1, 1, 1), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8), 0.0, False),
        "grad_out is torch.float32 [1, 1, 1, 1] where query and value give torch.float32 [2, 4, 8, 16]"),
    "CPU flash attention backward, short logsumexp": (
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        (_r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(1, 4, 8), 0.0, False),
        "logsumexp is torch.float32 [1, 4, 8] where query gives [batch, heads, positions] [2, 4, 8]"),
    "CPU flash attention backward, key expanded along its head size": (
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        (_r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 1).expand(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16),
         _r(2, 4, 8), 0.0, False),
        "key's last dimension (16 elements) has stride 0"),
    "CPU flash attention backward, out's head size strided": (
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        (_r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 16), _r(2, 4, 8, 32)[..., ::2],
         _r(2, 4, 8), 0.0, False),
        "out's last dimension has stride 2"),
    "cholesky_solve's helper, self of one row": (
        aten._cholesky_solve_helper.default, (_r(1, 1), torch.eye(3), False),
        "self has shape [1, 1] for A of shape [3, 3]"),
    "cholesky_solve's helper, batch dimensions not broadcast": (
        aten._cholesky_solve_helper.default, (_r(2, 3, 1), torch.eye(3).expand(4, 3, 3), False),
        "self has shape [2, 3, 1] for A of shape [4, 3, 3]"),
    "ldl_solve, a 2x2 block begun at the last row": (
        aten.linalg_ldl_solve.default, (_r(3, 3), torch.tensor([-1, -1, -1], dtype=torch.int32), _r(3, 2)),
        "pivots [-1, -1, -1] has a 2x2 block (negative pivots, in equal pairs) cut at row 2"),
    "ldl_solve, a 2x2 block of unequal pivots": (
        aten.linalg_ldl_solve.default, (_r(3, 3), torch.tensor([-2, -3, 3], dtype=torch.int32), _r(3, 2)),
        "cut at row 0"),
    "adaptive avg pool3d backward, input of one element": (
        aten._adaptive_avg_pool3d_backward.default, (_r(1, 2, 2, 2, 2), _r(1, 1, 1, 1, 1)),
        "grad_output has shape [1, 2, 2, 2, 2] for an input of shape [1, 1, 1, 1, 1]"),
    "avg pool3d backward, grad emptied": (
        aten.avg_pool3d_backward.default,
        (_r(0, 2, 1, 1, 1), _r(1, 2, 2, 2, 2), [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None),
        "grad_output has shape [0, 2, 1, 1, 1] for an input of shape [1, 2, 2, 2, 2]"),
    "fractional max pool2d backward, indices expanded": (
        aten.fractional_max_pool2d_backward.default,
        (_r(1, 1, 2, 2), _r(1, 1, 4, 4), [2, 2], [2, 2], torch.zeros(1, dtype=torch.int64).expand(1, 1, 2, 2)),
        "indices is not dense"),
    "fractional max pool3d backward, index past the input": (
        aten.fractional_max_pool3d_backward.default,
        (_r(1, 1, 1, 1, 1), _r(1, 1, 2, 2, 2), [2, 2, 2], [1, 1, 1], torch.full((1, 1, 1, 1, 1), 8, dtype=torch.int64)),
        "indices holds 8, outside [0, 8)"),
    "grid sampler 3d backward, grad emptied": (
        aten.grid_sampler_3d_backward.default,
        (_r(0, 3, 2, 2, 2), _r(2, 3, 4, 4, 4), _r(2, 2, 2, 2, 3), 0, 0, False, [True, True]),
        "grad_output has shape [0, 3, 2, 2, 2] where input and grid give [2, 3, 2, 2, 2]"),
    "lu_unpack, no pivots": (
        aten.lu_unpack.default, (_r(4, 4), torch.zeros(0, dtype=torch.int32)),
        "LU_pivots has shape [0] where LU_data [4, 4] needs [4]"),
    "grid sampler's CPU fallback, an unknown mode": (
        aten._grid_sampler_2d_cpu_fallback.default, (_r(1, 2, 4, 4), _r(1, 3, 3, 2), 7, 0, False),
        "interpolation_mode 7 is not 0, 1 or 2"),
}
KWARGS = {
    "segment_reduce, unsafe": {"lengths": _i(2, 2), "unsafe": True},
    "segment_reduce, lengths past the data": {"lengths": _i(10**6)},
    "segment_reduce backward, lengths past the data": {"lengths": _i(10**6)},
}


@pytest.fixture()
def kernel_guard(monkeypatch):
    """Fails the test if a checked form calls its kernel."""
    reached = []

    def guard(op, args, kwargs):
        reached.append(op)
        raise AssertionError(f"the kernel of {op} was reached")

    monkeypatch.setattr(checked, "call_kernel", guard)
    return reached


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_arguments_are_refused_before_the_kernel(kernel_guard, case):
    op, args, message = HOSTILE[case]
    form = checked.CheckedOp(op, checked.CHECKS[op], "g/graph.json: node 'n'")
    with pytest.raises(ArtifactError) as e:
        form(*args, **KWARGS.get(case, {}))
    text = str(e.value)
    assert message in text and text.startswith(f"g/graph.json: node 'n' ({op_name(op)}): ") and "\n" not in text
    assert text.endswith("the kernel was not run")
    assert not kernel_guard


GOOD = {
    aten.max_pool2d_with_indices_backward.default: lambda: (
        lambda x: (torch.ones(1, 1, 2, 2), x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                   aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])[1]))(_r(1, 1, 4, 4)),
    aten.embedding_dense_backward.default: lambda: (_r(3, 4), _i(0, 1, 1), 10, -1, True),
    aten.native_layer_norm_backward.default: lambda: (
        lambda x, w, b: (torch.ones(4, 8), x, [8], *aten.native_layer_norm.default(x, [8], w, b, 1e-5)[1:], w, b,
                         [T, T, T]))(_r(4, 8), _r(8), _r(8)),
    aten.native_group_norm_backward.default: lambda: (
        lambda x, w: (torch.ones(2, 4, 3), x, *aten.native_group_norm.default(x, w, None, 2, 4, 3, 2, 1e-5)[1:], w,
                      2, 4, 3, 2, [T, T, F]))(_r(2, 4, 3), _r(4)),
    aten._pdist_backward.default: lambda: (lambda x: (torch.ones(6), x, 2.0, aten._pdist_forward.default(x, 2.0)))(
        _r(4, 3)),
    aten.bincount.default: lambda: (_i(0, 3, 3, 1),),
    # mode sum, 2 bags of 3: the forward's offset2bag is empty, the backward rebuilds it
    aten._embedding_bag_backward.default: lambda: (
        lambda ids, off, psw: (torch.ones(2, 4), ids, off, *aten._embedding_bag.default(
            _r(10, 4), ids, off, False, 0, False, psw)[1:], 10, False, 0, False, psw, -1))(
        _i(1, 2, 3, 4, 5, 6), _i(0, 3), _r(6)),
    # the forward's offset2bag is empty (mode sum): the kernel rebuilds it from the offsets
    aten._embedding_bag_per_sample_weights_backward.default: lambda: (
        _r(2, 4), _r(10, 4), _i(1, 2, 3, 4, 5, 6), _i(0, 3), _i(), 0, -1),
    aten._batch_norm_with_update_functional.default: lambda: (_r(2, 3, 4), _r(3), _r(3), _r(3), _r(3).abs(), 0.1,
                                                              1e-5),
    aten._batch_norm_no_update.default: lambda: (_r(2, 3, 4), _r(3), None, _r(3), _r(3).abs(), 0.1, 1e-5),
    # grouped heads (4 query heads over 2), key and value transposed from [batch, positions, heads, size]
    aten._scaled_dot_product_flash_attention_for_cpu.default: lambda: (
        _r(2, 4, 8, 16), _r(2, 5, 2, 16).transpose(1, 2), _r(2, 5, 2, 16).transpose(1, 2), 0.0, True),
    aten._fft_c2c.default: lambda: (_r(3, 4, 8).to(torch.cfloat), [1, 2], 2, False),
    aten._fft_r2c.default: lambda: (_r(4, 8), [1], 1, True),
    aten._fft_c2r.default: lambda: (_r(4, 5).to(torch.cfloat), [1], 2, 8),
    aten.grid_sampler_2d.default: lambda: (_r(1, 2, 4, 4), _r(1, 3, 3, 2), 2, 2, True),
    aten.grid_sampler_2d_backward.default: lambda: (_r(1, 2, 3, 3), _r(1, 2, 4, 4), _r(1, 3, 3, 2), 0, 1, False,
                                                    [True, True]),
    # grouped heads, as autograd calls it for scaled_dot_product_attention(..., enable_gqa=True)
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: lambda: (
        lambda q, kv: (torch.ones(2, 4, 8, 16), q, kv, kv,
                       *aten._scaled_dot_product_flash_attention_for_cpu.default(q, kv, kv), 0.0, False))(
        _r(2, 4, 8, 16), _r(2, 5, 2, 16).transpose(1, 2).contiguous()),
    aten.lu_unpack.default: lambda: tuple(torch.linalg.lu_factor(_r(2, 4, 3))),
    aten.fractional_max_pool2d_backward.default: lambda: (
        lambda x: (torch.ones(1, 2, 3, 3), x, [2, 2], [3, 3],
                   aten.fractional_max_pool2d.default(x, [2, 2], [3, 3], torch.rand(1, 2, 2))[1]))(_r(1, 2, 6, 6)),
    aten.grid_sampler_3d_backward.default: lambda: (_r(1, 2, 3, 3, 3), _r(1, 2, 4, 4, 4), _r(1, 3, 3, 3, 3).tanh(),
                                                    0, 0, False, [True, True]),
    aten._cholesky_solve_helper.default: lambda: (
        lambda m: (_r(2, 3, 2), torch.linalg.cholesky(m @ m.mT + 3 * torch.eye(3)), False))(_r(2, 3, 3)),
    aten.linalg_ldl_solve.default: lambda: (
        lambda s: (*aten.linalg_ldl_factor_ex.default(s)[:2], _r(4, 2)))(
        (lambda m: m + m.T)(torch.tensor([[0.0, 1, 2, 3], [1, 0, 4, 5], [2, 4, 0, 6], [3, 5, 6, 0]]))),
}


@pytest.mark.parametrize("op", list(GOOD), ids=lambda op: op.__name__)
def test_checked_forms_return_exactly_what_the_kernel_returns(op):
    args = GOOD[op]()
    form = checked.CheckedOp(op, checked.CHECKS[op], "g")
    got, want = form(*args), op(*args)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert (g is None and w is None) or (g.dtype == w.dtype and torch.equal(g, w))


# --- through the loader, in a separate process: a crash there fails the test, not pytest


def _forge_pool_backward(folder, index):
    """mlp's inference graph with a max-pool backward whose indices are `index`."""
    path = folder / "mlp_inference_0" / "graph.json"
    data = json.loads(path.read_text())
    out = data["nodes"].pop()
    x = {"node": "x"}  # float32[8, 32]
    data["nodes"] += [
        {"name": "img", "op": "call_function", "target": "aten.view.default", "args": [x, [4, 1, 8, 8]], "kwargs": {}},
        {"name": "grad", "op": "call_function", "target": "aten.full.default", "args": [[4, 1, 4, 4], 1.0],
         "kwargs": {}},
        {"name": "idx", "op": "call_function", "target": "aten.full.default", "args": [[4, 1, 4, 4], index],
         "kwargs": {"dtype": {"dtype": "int64"}}},
        {"name": "pool_bw", "op": "call_function", "target": "aten.max_pool2d_with_indices_backward.default",
         "args": [{"node": "grad"}, {"node": "img"}, [2, 2], [2, 2], [0, 0], [1, 1], False, {"node": "idx"}],
         "kwargs": {}},
    ]
    data["nodes"].append(out)
    path.write_text(json.dumps(data))


def test_a_graph_with_a_hostile_pool_backward_ends_as_one_line_from_replay(mlp_copy):
    _forge_pool_backward(mlp_copy, 10**9)
    r = subprocess.run([sys.executable, "-m", "aotpipe.cli", "replay", str(mlp_copy), "--graph", "inference"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("mlp_inference_0/graph.json: node 'pool_bw' (aten.max_pool2d_with_indices_backward.default): "
            "indices holds 1000000000, outside [0, 64); the kernel was not run") in r.stderr, r.stderr


# --- the red team's three, planted in a loaded graph: x, the mlp's input (float32[8, 32]), is
# 8 rows of 32 channels to the batch norms and 2 heads of 8 positions of 16 to attention


def _n(name):
    return {"node": name}


def _full(name, shape, value):
    return (name, "aten.full.default", [shape, value], {"dtype": {"dtype": "float32"}})


def _batch_norm(target, stats):
    """x batch-normed by `target` with running statistics of `stats` elements (32: honest)."""
    return [_full("w", [32], 1.5), _full("b", [32], 0.25), _full("rm", [stats], 0.5), _full("rv", [stats], 2.0),
            ("bn", target, [_n("x"), _n("w"), _n("b"), _n("rm"), _n("rv"), 0.1, 1e-5], {}),
            ("y", "operator.getitem", [_n("bn"), 0], {})]


def _attention(hostile):
    """Flash attention over x's heads, the key (hostile: one element expanded) its own."""
    key = [_full("one", [1], 1.0), ("k", "aten.expand.default", [_n("one"), [1, 2, 8, 16]], {})] if hostile else \
        [("k", "aten.mul.Scalar", [_n("q"), 0.5], {})]
    return [("q", "aten.view.default", [_n("x"), [1, 2, 8, 16]], {}), *key,
            ("attn", "aten._scaled_dot_product_flash_attention_for_cpu.default", [_n("q"), _n("k"), _n("q")], {}),
            ("y", "operator.getitem", [_n("attn"), 0], {})]


def _eager_batch_norm(op):
    def run(x):
        c = torch.ones(32)
        return op(x, 1.5 * c, 0.25 * c, 0.5 * c, 2.0 * c, 0.1, 1e-5)[0]
    return run


def _eager_attention(x):
    q = x.view(1, 2, 8, 16)
    return aten._scaled_dot_product_flash_attention_for_cpu.default(q, q * 0.5, q)[0]


PLANTED = {  # the op: (its nodes, honest or hostile; eager on x; the hostile call's refusal)
    "batch norm with update": (
        lambda hostile: _batch_norm("aten._batch_norm_with_update_functional.default", 1 if hostile else 32),
        _eager_batch_norm(aten._batch_norm_with_update_functional.default),
        "node 'bn' (aten._batch_norm_with_update_functional.default): running_mean has 1 elements where the input "
        "needs 32; the kernel was not run"),
    "batch norm without update": (
        lambda hostile: _batch_norm("aten._batch_norm_no_update.default", 1 if hostile else 32),
        _eager_batch_norm(aten._batch_norm_no_update.default),
        "node 'bn' (aten._batch_norm_no_update.default): running_mean has 1 elements where the input needs 32; "
        "the kernel was not run"),
    "flash attention for cpu": (
        _attention, _eager_attention,
        "node 'attn' (aten._scaled_dot_product_flash_attention_for_cpu.default): key's last dimension (16 elements) "
        "has stride 0 where the kernel reads it densely (stride 1); the kernel was not run"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_red_teams_out_of_bounds_call_in_a_graph_ends_as_one_line_from_replay(mlp_copy, case):
    from tests.artifact.test_precheck import add_nodes

    nodes, _, refusal = PLANTED[case]
    add_nodes(mlp_copy, nodes(True), outputs=["y"])
    r = subprocess.run([sys.executable, "-m", "aotpipe.cli", "replay", str(mlp_copy), "--graph", "inference"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"mlp_inference_0/graph.json: {refusal}" in r.stderr, r.stderr


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_honest_call_in_a_graph_runs_checked_and_gives_what_eager_gives(mlp_copy, case):
    from tests.artifact.test_precheck import _run_inference, add_nodes

    nodes, eager, _ = PLANTED[case]
    add_nodes(mlp_copy, nodes(False), outputs=["y"])
    ga, (out,) = _run_inference(mlp_copy)
    assert torch.equal(out, eager(ga.saved_inputs()[-1]))
    twin = checked.checked_twin(ga.module, "graph.json")
    assert [type(n.target) for n in twin.graph.nodes if n.name in ("bn", "attn")] == [checked.CheckedOp]
