"""Allow-listed ops called with hostile arguments, the way a loaded graph calls them, in
guarded memory: the sweep behind tests/artifact/test_hostile_ops.py.

A *base call* is an honest call of an allow-listed op: recorded (a TorchDispatchMode) while
torch's own OpInfo samples (``op_db``) run forward, backward and in place, or, for the ops
those never reach (export's functional batch norms, CPU flash attention, composites such as
``lstm.input``), taken from :data:`HAND_CALLS`. A *case* is a base call with one of its
tensor arguments replaced by a hostile one (:data:`MUTATIONS`, from the schema: any tensor
argument, of any op): one element expanded to its shape (stride 0 from a 4-byte storage),
one element, an emptied first dimension, a dimension expanded, every other element (a
stride of 2), the end of a longer storage, index values far out of range.

Each case goes through what a loaded graph goes through: a one-node FX graph is written as
graph.json data and rebuilt by the loader's ``graph_from_json`` (allow-list, argument
checks), marked for the precheck, and run with ``execution.run_graph`` (fake-tensor
propagation, checked forms, deterministic kernels). If that path admits the call, it runs
five times, every input's storage copied into guarded memory (tests/artifact/guarded.py):
ending at a guard page, starting at one, and padded three times (0x00, 0x00 again, 0x5a).
The case fails when a run faults (the parent sees the worker die), when padding changed
(a write past a storage), or when the two fills give different results where the same fill
twice gives the same (a read past a storage), or when one fill raises and the other does not.

Run as ``python -m tests.artifact.hostile_calls make FILE [--hand]`` (base calls into FILE)
and ``python -m tests.artifact.hostile_calls run FILE --shard I/N --after K [--without OP,...]``
(one JSON line as each case starts and another as it ends; ``--without`` drops those ops'
checked forms, for the test that plants the fault).
"""

from __future__ import annotations

import argparse
import glob
import json
import operator
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from aotpipe.artifact import checked, precheck
from aotpipe.artifact.graph_json import graph_from_json, graph_to_json
from aotpipe.artifact.ops import allowed_ops, op_name, resolve_op
from aotpipe.errors import AotpipeError
from aotpipe.runtime import execution
from tests.artifact.guarded import place

aten = torch.ops.aten
Call = tuple[str, tuple, dict]  # op name, args, kwargs

MAX_STORAGE_BYTES = 1 << 20  # base calls from op_db's larger samples are left out: the sweep's time


# ---------------------------------------------------------------------------------------
# base calls


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _i(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _rnn_params(gates: int, inputs: int, hidden: int, layers: int = 1) -> list[torch.Tensor]:
    out = []
    for layer in range(layers):
        width = inputs if layer == 0 else hidden
        out += [_r(gates * hidden, width, seed=layer), _r(gates * hidden, hidden, seed=layer + 1),
                _r(gates * hidden, seed=layer + 2), _r(gates * hidden, seed=layer + 3)]
    return out


def _hand_calls() -> list[Call]:
    x = _r(2, 3, 4)
    c = lambda seed: _r(3, seed=seed)  # noqa: E731 - a channel's worth of statistics
    q, kv = _r(2, 4, 8, 16), _r(2, 2, 8, 16, seed=1)
    seq, packed = _r(5, 2, 3), _r(6, 3)  # [time, batch, features]; 6 rows packed for batch sizes 3, 2, 1
    bag_ids, bag_offsets = _i(1, 2, 4, 5, 4, 3, 2, 9), _i(0, 4)
    calls: list[Call] = [
        ("aten._batch_norm_with_update_functional.default", (x, c(1), c(2), c(3), c(4).abs(), 0.1, 1e-5), {}),
        ("aten._batch_norm_no_update.default", (x, c(1), c(2), c(3), c(4).abs(), 0.1, 1e-5), {}),
        ("aten._native_batch_norm_legit_functional.default", (x, c(1), c(2), c(3), c(4).abs(), True, 0.1, 1e-5), {}),
        ("aten._native_batch_norm_legit_no_training.default", (x, c(1), c(2), c(3), c(4).abs(), 0.1, 1e-5), {}),
        ("aten._native_batch_norm_legit.no_stats", (x, c(1), c(2), True, 0.1, 1e-5), {}),
        ("aten.native_batch_norm.default", (x, c(1), c(2), c(3), c(4).abs(), False, 0.1, 1e-5), {}),
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", (q, kv, kv), {}),
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", (q, q, q), {"attn_mask": _r(8, 8)}),
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", (q, q, q, 0.0, True), {}),
        ("aten.scaled_dot_product_attention.default", (q, q, q, _r(2, 1, 8, 8)), {}),
        ("aten.scaled_dot_product_attention.default", (q, kv, kv), {"enable_gqa": True}),
        ("aten._fused_rms_norm.default", (x, [4], _r(4), 1e-5), {}),
        ("aten._weight_norm_interface.default", (_r(4, 3), _r(4, 1), 0), {}),
        ("aten._weight_norm_interface_backward.default",
         (_r(4, 3), _r(4, 3, seed=1), _r(4, 1), _r(4, 1, seed=2).abs(), 0), {}),
        ("aten._unsafe_index.Tensor", (_r(4, 5), [_i(0, 3, 1), None]), {}),
        ("aten._unsafe_index_put.default", (_r(4, 5), [_i(0, 3, 1)], _r(3, 5), False), {}),
        ("aten._unsafe_masked_index.default", (_r(4, 5), torch.tensor([[True], [False], [True]]), [_i(0, 3, 1)], 0.0),
         {}),
        ("aten._unsafe_masked_index_put_accumulate.default",
         (_r(4, 5), torch.tensor([True, False, True])[:, None], [_i(0, 3, 1)], _r(3, 5)), {}),
        ("aten._embedding_bag_forward_only.default", (_r(10, 4), bag_ids, bag_offsets), {}),
        ("aten._embedding_bag_dense_backward.default",
         (_r(2, 4), bag_ids, _i(0, 0, 0, 0, 1, 1, 1, 1), _i(4, 4), _i(), 10, False, 0, None, -1), {}),
        ("aten._euclidean_dist.default", (_r(3, 4), _r(5, 4)), {}),
        ("aten.lerp.Tensor", (_r(3, 4), _r(3, 4, seed=1), _r(4, seed=2)), {}),
        ("aten.prelu.default", (x, c(1)), {}),
        ("aten.copy.default", (_r(3, 4), _r(4, seed=1)), {}),
        ("aten.fill.Tensor", (_r(3, 4), torch.tensor(2.0)), {}),
        ("aten.where.self", (_r(3, 4) > 0, _r(3, 4), _r(4)), {}),
        ("aten.nll_loss.default", (_r(3, 5).log_softmax(-1), _i(0, 4, 2), _r(5).abs()), {}),
        ("aten.margin_ranking_loss.default", (_r(4), _r(4, seed=1), _r(4, seed=2).sign()), {}),
        ("aten.hinge_embedding_loss.default", (_r(4), _r(4, seed=1).sign()), {}),
        ("aten.pairwise_distance.default", (_r(3, 4), _r(3, 4, seed=1)), {}),
        ("aten.isin.Tensor_Tensor", (_i(1, 2, 3, 4), _i(2, 4)), {}),
        ("aten.searchsorted.Tensor", (_r(5).sort().values, _r(3)), {}),
        ("aten.bucketize.Tensor", (_r(3), _r(5).sort().values), {}),
        ("aten.lstm.input", (seq, [_r(1, 2, 4), _r(1, 2, 4, seed=1)], _rnn_params(4, 3, 4), True, 1, 0.0, False, False,
                             False), {}),
        ("aten.gru.input", (seq, _r(1, 2, 4), _rnn_params(3, 3, 4), True, 1, 0.0, False, False, False), {}),
        ("aten.rnn_tanh.input", (seq, _r(1, 2, 4), _rnn_params(1, 3, 4), True, 1, 0.0, False, False, False), {}),
        ("aten.rnn_relu.input", (seq, _r(1, 2, 4), _rnn_params(1, 3, 4), True, 1, 0.0, False, False, False), {}),
        ("aten.lstm.data", (packed, _i(3, 2, 1), [_r(1, 3, 4), _r(1, 3, 4, seed=1)], _rnn_params(4, 3, 4), True, 1,
                            0.0, False, False), {}),
        ("aten.gru.data", (packed, _i(3, 2, 1), _r(1, 3, 4), _rnn_params(3, 3, 4), True, 1, 0.0, False, False), {}),
        ("aten.rnn_tanh.data", (packed, _i(3, 2, 1), _r(1, 3, 4), _rnn_params(1, 3, 4), True, 1, 0.0, False,
                                False), {}),
        ("aten.rnn_relu.data", (packed, _i(3, 2, 1), _r(1, 3, 4), _rnn_params(1, 3, 4), True, 1, 0.0, False,
                                False), {}),
        ("aten._addmm_activation.default", (_r(3), _r(2, 4), _r(4, 3)), {"use_gelu": True}),
        ("aten.linear.default", (_r(2, 4), _r(3, 4), _r(3)), {}),
        ("aten.fill_.Tensor", (_r(3, 4), torch.tensor(2.0)), {}),
        ("aten.is_same_size.default", (_r(3, 4), _r(3, 4)), {}),
        ("aten.reflection_pad2d_backward.default", (_r(1, 2, 5, 6), _r(1, 2, 3, 4), [1, 1, 1, 1]), {}),
        ("aten.reflection_pad3d_backward.default", (_r(1, 2, 4, 5, 6), _r(1, 2, 2, 3, 4), [1, 1, 1, 1, 1, 1]), {}),
        ("aten.replication_pad3d_backward.default", (_r(1, 2, 4, 5, 6), _r(1, 2, 2, 3, 4), [1, 1, 1, 1, 1, 1]), {}),
        ("aten.searchsorted.Scalar", (_r(5).sort().values, 0.5), {"sorter": _i(0, 1, 2, 3, 4)}),
        ("aten.where.ScalarOther", (_r(3, 4) > 0, _r(3, 4), 1.0), {}),
        ("aten.where.ScalarSelf", (_r(3, 4) > 0, 1.0, _r(3, 4)), {}),
        ("aten._functional_assert_async.msg", (torch.tensor(True), "ok", torch.empty(0)), {}),
        ("mkldnn._convolution_pointwise.default", (_r(1, 2, 5, 5), _r(4, 2, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], 1,
                                                   "relu", [], ""), {}),
        ("mkldnn._convolution_pointwise.binary", (_r(1, 2, 5, 5), _r(1, 4, 5, 5), _r(4, 2, 3, 3), _r(4), [1, 1],
                                                  [1, 1], [1, 1], 1, "add", None, None, [], None), {}),
    ]
    # The ops of the derived list (tools/allowed_ops.py) with a CPU kernel that op_db's samples
    # never reach: fused and internal kernels, their in-place forms, the slow convolutions.
    e, heads = 8, 2  # an attention's embedding width and heads
    mha = [_r(3 * e, e, seed=3), _r(3 * e, seed=4), _r(e, e, seed=5), _r(e, seed=6)]  # qkv and projection
    spd = _r(3, 3) @ _r(3, 3).T + 3 * torch.eye(3)
    flash_out, flash_lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q)
    index_2d = _i(0, 4, 2).reshape(3, 1)
    # a 2x2 block first (pivots -3, -3, 3): one pivot expanded cuts a block at the last row
    ldl = torch.tensor([[0.0, 2, 4], [2, 0, 8], [4, 8, 0]])
    calls += [
        ("aten._add_relu.Tensor", (_r(3, 4), _r(3, 4, seed=1)), {}),
        ("aten.linalg_ldl_solve.default", (*aten.linalg_ldl_factor_ex.default(ldl)[:2], _r(3, 2)), {}),
        ("aten.lu_unpack.default", tuple(torch.linalg.lu_factor(_r(4, 4))), {}),
        ("aten._add_relu_.Tensor", (_r(3, 4), _r(4, seed=1)), {}),
        ("aten._cholesky_solve_helper.default", (_r(3, 2), torch.linalg.cholesky(spd), False), {}),
        ("aten._compute_linear_combination.default", (_r(3, 4, 5), _r(2, 3)), {}),
        ("aten._convolution.default", (_r(1, 2, 5, 5), _r(4, 2, 3, 3), _r(4), [1, 1], [1, 1], [1, 1], False, [0, 0],
                                       1, False, False, False, False), {}),
        ("aten._dirichlet_grad.default", (_r(3, 4).sigmoid(), _r(3, 4, seed=1).exp(), _r(3, 4, seed=2).exp() + 2), {}),
        ("aten._fused_sdp_choice.default", (q, kv, kv), {}),
        ("aten._grid_sampler_2d_cpu_fallback.default", (_r(1, 2, 4, 4), _r(1, 3, 3, 2, seed=1).tanh(), 0, 0, False),
         {}),
        ("aten._grid_sampler_2d_cpu_fallback_backward.default",
         (_r(1, 2, 3, 3), _r(1, 2, 4, 4), _r(1, 3, 3, 2, seed=1).tanh(), 0, 0, False), {}),
        ("aten._grouped_mm.default", (_r(6, 4), _r(2, 4, 8, seed=1), torch.tensor([2, 6], dtype=torch.int32)), {}),
        ("aten._index_put_impl.default", (_r(4, 5), [_i(0, 3, 1)], _r(3, 5), False, False), {}),
        ("aten._index_put_impl_.default", (_r(4, 5), [_i(0, 3, 1)], _r(3, 5), True, False), {}),
        ("aten._masked_softmax.default", (x, _r(2, 3, 4, seed=1) > 0, 2, None), {}),
        ("aten._masked_softmax_backward.default", (x, _r(2, 3, 4, seed=1).softmax(-1), _r(2, 3, 4, seed=2) > 0, 2),
         {}),
        ("aten._native_multi_head_attention.default",
         (_r(2, 5, e), _r(2, 5, e, seed=1), _r(2, 5, e, seed=2), e, heads, *mha), {}),
        ("aten._pack_padded_sequence.default", (seq, _i(5, 3), False), {}),
        ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
         (_r(2, 4, 8, 16, seed=3), q, q, q, flash_out, flash_lse, 0.0, False), {}),
        ("aten._slow_conv2d_forward.default", (_r(1, 2, 5, 5), _r(4, 2, 3, 3), [3, 3], _r(4), [1, 1], [1, 1]), {}),
        ("aten._slow_conv2d_backward.output_mask",
         (_r(1, 4, 5, 5), _r(1, 2, 5, 5), _r(4, 2, 3, 3), [3, 3], [1, 1], [1, 1], [True, True, True]), {}),
        ("aten._standard_gamma_grad.default", (_r(3, 4).exp(), _r(3, 4, seed=1).exp()), {}),
        ("aten._transform_bias_rescale_qkv.default", (_r(2, 5, 3 * e), _r(3 * e), heads), {}),
        ("aten._transformer_encoder_layer_fwd.default",
         (_r(2, 5, e), e, heads, *mha, False, False, 1e-5, _r(e, seed=7), _r(e, seed=8), _r(e, seed=9),
          _r(e, seed=10), _r(16, e, seed=11), _r(16, seed=12), _r(e, 16, seed=13), _r(e, seed=14)), {}),
        ("aten.batch_norm_update_stats.default", (x, c(1), c(2).abs(), 0.1), {}),
        ("aten.bernoulli.Tensor", (_r(3, 4), _r(3, 4, seed=1).sigmoid()), {}),
        ("aten.bernoulli_.Tensor", (_r(3, 4), _r(3, 4, seed=1).sigmoid()), {}),
        ("aten.binomial.default", (torch.full((3, 4), 5.0), _r(3, 4, seed=1).sigmoid()), {}),
        ("aten.conv_tbc.default", (seq, _r(3, 3, 4, seed=1), _r(4, seed=2), 1), {}),
        ("aten.embedding_renorm.default", (_r(10, 4), _i(1, 2, 4, 2), 1.0, 2.0), {}),
        ("aten.embedding_renorm_.default", (_r(10, 4), _i(1, 2, 4, 2), 1.0, 2.0), {}),
        ("aten.glu_jvp.default", (_r(3, 2), _r(3, 4, seed=1), _r(3, 4, seed=2), 1), {}),
        ("aten.glu_backward_jvp.default",
         (_r(3, 4), _r(3, 2, seed=1), _r(3, 4, seed=2), _r(3, 2, seed=3), _r(3, 4, seed=4), 1), {}),
        ("aten.randint_like.Tensor", (_r(3, 4), torch.tensor(10)), {"dtype": torch.int64}),
        ("aten.randint_like.Tensor_generator", (_r(3, 4), torch.tensor(10)), {"generator": None, "dtype": torch.int64}),
        ("aten.rrelu_with_noise_functional.default", (_r(3, 4), torch.zeros(3, 4), 0.125, 0.3, True), {}),
        ("aten.scatter.reduce", (_r(3, 5), 1, index_2d.expand(3, 2).clone(), _r(3, 2, seed=1)), {"reduce": "add"}),
        ("aten.scatter_.reduce", (_r(3, 5), 1, index_2d.expand(3, 2).clone(), _r(3, 2, seed=1)),
         {"reduce": "multiply"}),
        ("aten.scatter.value_reduce", (_r(3, 5), 1, index_2d, 2.0), {"reduce": "multiply"}),
        ("aten.scatter_.value_reduce", (_r(3, 5), 1, index_2d, 2.0), {"reduce": "add"}),
        ("aten.slice_inverse.default", (_r(4, 5)[1:3], _r(4, 5, seed=1), 0, 1, 3), {}),
        ("aten.slow_conv3d_forward.default",
         (_r(1, 2, 4, 4, 4), _r(3, 2, 2, 2, 2), [2, 2, 2], _r(3), [1, 1, 1], [0, 0, 0]), {}),
        ("aten.slow_conv_dilated2d.default", (_r(1, 2, 6, 6), _r(3, 2, 2, 2), [2, 2], _r(3), [1, 1], [0, 0], [2, 2]),
         {}),
        ("aten.slow_conv_dilated3d.default",
         (_r(1, 2, 5, 5, 5), _r(3, 2, 2, 2, 2), [2, 2, 2], _r(3), [1, 1, 1], [0, 0, 0], [2, 2, 2]), {}),
        ("aten.slow_conv_transpose2d.default",
         (_r(1, 2, 4, 4), _r(2, 3, 2, 2), [2, 2], _r(3), [2, 2], [0, 0], [1, 1], [1, 1]), {}),
        ("aten.slow_conv_transpose3d.default",
         (_r(1, 2, 3, 3, 3), _r(2, 3, 2, 2, 2), [2, 2, 2], _r(3), [1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]), {}),
    ]
    return calls


# The ops of :func:`_hand_calls` that the default test run sweeps: the red team's three and
# their siblings (the rest of the hand calls run in the slow sweep).
QUICK_OPS = frozenset({
    "aten._batch_norm_with_update_functional.default", "aten._batch_norm_no_update.default",
    "aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit_no_training.default",
    "aten.native_batch_norm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten.scaled_dot_product_attention.default",
})


def _kept(value: Any) -> Any:
    """A tensor argument as a tensor of its own: the same sizes, strides, offset and storage
    bytes, none shared with any other (a recorded call outlives the sample it came from)."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        copy = torch.empty(0, dtype=torch.uint8).set_(storage).clone()
        return copy.view(value.dtype).as_strided(value.shape, value.stride(), value.storage_offset()) \
            if storage.nbytes() else torch.empty(0, dtype=value.dtype).as_strided(value.shape, value.stride(),
                                                                                    value.storage_offset())
    if isinstance(value, (list, tuple)):
        return type(value)(_kept(v) for v in value)
    return value


_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _storable(values: Any) -> bool:
    leaves = torch.utils._pytree.tree_leaves(values)
    return all(isinstance(v, _PLAIN) or (isinstance(v, torch.Tensor) and v.layout == torch.strided
                                         and v.device.type == "cpu" and not v.is_quantized
                                         and v.untyped_storage().nbytes() <= MAX_STORAGE_BYTES)
               for v in leaves)


def recorded_calls(allowed: frozenset[str], per_op: int = 1) -> list[Call]:
    """Calls of the allowed ops made while torch's OpInfo samples run on CPU (float32 where
    supported, else int64 or the first dtype; forward with a backward, and in place): at most
    `per_op` per op, those first seen."""
    # seconds to import, and it sets process state: only in the process that makes the calls
    from torch.testing._internal.common_methods_invocations import op_db


    found: dict[str, list[Call]] = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = op_name(func)
            if name in allowed and len(found.setdefault(name, [])) < per_op and _storable((args, kwargs)):
                found[name].append((name, _kept(args), _kept(kwargs)))
            return func(*args, **kwargs)

    for info in op_db:
        dtypes = info.supported_dtypes("cpu")
        dtype = next((d for d in (torch.float32, torch.int64) if d in dtypes), next(iter(dtypes), None))
        if dtype is None:
            continue
        grad = dtype.is_floating_point and info.supports_autograd
        try:
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))[:3]
        except Exception:  # a sample generator that does not run here: its op is left out
            continue
        for s in samples:
            for variant in (info.op, info.inplace_variant):
                if variant is None:
                    continue
                with warnings.catch_warnings(), Recorder():
                    warnings.simplefilter("ignore")
                    try:
                        if variant is info.op:
                            out = variant(s.input, *s.args, **s.kwargs)
                            grads = [o for o in torch.utils._pytree.tree_leaves(out)
                                     if isinstance(o, torch.Tensor) and o.requires_grad]
                            if grads:
                                sum(o.sum().real for o in grads).backward()
                        else:
                            variant(*[v.detach().clone() if isinstance(v, torch.Tensor) else v
                                      for v in (s.input, *s.args)], **s.kwargs)
                    except Exception:  # a sample that fails: what ran before is kept
                        pass
    return [call for calls in found.values() for call in calls]


def base_calls(hand_only: bool) -> list[Call]:
    """The sweep's base calls: :data:`QUICK_OPS`'s hand calls; or every hand call and the
    recorded ones of ops the hand calls do not cover. Only of ops the loader allows: a hand
    call of one the list no longer admits (``nll_loss``, ``gru.data``: CompositeImplicitAutograd
    ops the derived list leaves out) is no call a loaded graph can make."""

    allowed = frozenset(allowed_ops())
    hand = [c for c in _hand_calls() if c[0] in allowed]
    if hand_only:
        return [c for c in hand if c[0] in QUICK_OPS]
    covered = {c[0] for c in hand}
    return hand + [c for c in recorded_calls(allowed) if c[0] not in covered]


# ---------------------------------------------------------------------------------------
# hostile arguments


def _one_element_expanded(t: torch.Tensor) -> Optional[torch.Tensor]:
    if t.numel() <= 1:
        return None
    return t.reshape(-1)[:1].clone().as_strided(t.shape, [0] * t.dim())


def _one_element(t: torch.Tensor) -> Optional[torch.Tensor]:
    if t.dim() == 0 or t.numel() == 1:
        return None
    return t.reshape(-1)[:1].clone().reshape([1] * t.dim()) if t.numel() else torch.zeros([1] * t.dim(),
                                                                                         dtype=t.dtype)


def _emptied(t: torch.Tensor) -> Optional[torch.Tensor]:
    if t.dim() == 0 or t.shape[0] == 0:
        return None
    return t[:0].clone()


def _every_other(t: torch.Tensor) -> Optional[torch.Tensor]:
    if t.dim() == 0 or t.shape[-1] < 2:
        return None
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def _at_storage_end(t: torch.Tensor) -> Optional[torch.Tensor]:
    flat = torch.zeros(3 + t.numel(), dtype=t.dtype)
    flat[3:] = t.reshape(-1)
    return flat[3:].view(t.shape) if t.dim() else flat[3:].reshape(())


def _expanded_along(d: int) -> Callable[[torch.Tensor], Optional[torch.Tensor]]:
    def mutate(t: torch.Tensor) -> Optional[torch.Tensor]:
        if t.dim() <= d or t.shape[d] < 2 or sum(s > 1 for s in t.shape) < 2:  # one such dim: _one_element_expanded
            return None
        return t.narrow(d, 0, 1).clone().expand(t.shape)
    return mutate


def _filled(value: int) -> Callable[[torch.Tensor], Optional[torch.Tensor]]:
    def mutate(t: torch.Tensor) -> Optional[torch.Tensor]:
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.numel() == 0:
            return None
        return torch.full_like(t, value) if torch.iinfo(t.dtype).min <= value <= torch.iinfo(t.dtype).max else None
    return mutate


MUTATIONS: dict[str, Callable[[torch.Tensor], Optional[torch.Tensor]]] = {
    "one element expanded": _one_element_expanded,
    "one element": _one_element,
    "first dimension emptied": _emptied,
    "every other element": _every_other,
    "at the end of a longer storage": _at_storage_end,
    **{f"expanded along dimension {d}": _expanded_along(d) for d in range(4)},
    "index values far past": _filled(1 << 20),
    "index values far before": _filled(-(1 << 20)),
}


@dataclass(frozen=True)
class Case:
    index: int
    call: int  # its base call
    leaf: Optional[int]  # the tensor argument replaced (in pytree order), None: the base call itself
    mutation: str

    def describe(self, calls: list[Call]) -> str:
        name = calls[self.call][0]
        if self.leaf is None:
            return f"{name} as given"
        return f"{name}, {_leaf_names(calls[self.call])[self.leaf]}: {self.mutation}"


def _leaf_names(call: Call) -> list[str]:
    """The schema's name of each tensor in a call's arguments (pytree order), `params[2]` in a list."""

    op = resolve_op(call[0])
    names = [a.name for a in op._schema.arguments]
    bound = {names[i]: v for i, v in enumerate(call[1])}
    bound.update(call[2])
    out = []
    for arg in names:
        v = bound.get(arg)
        if isinstance(v, torch.Tensor):
            out.append(arg)
        elif isinstance(v, (list, tuple)):
            out += [f"{arg}[{j}]" for j, x in enumerate(v) if isinstance(x, torch.Tensor)]
    return out


def _leaves(call: Call) -> tuple[list[Any], Any]:
    return torch.utils._pytree.tree_flatten((call[1], call[2]))


def cases(calls: list[Call]) -> list[Case]:
    """Every base call as given, then each with one tensor argument mutated each way that
    applies to it."""
    out: list[Case] = []
    for i, call in enumerate(calls):
        out.append(Case(len(out), i, None, "as given"))
        leaves, _ = _leaves(call)
        tensors = [j for j, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        for k, j in enumerate(tensors):
            for name, mutate in MUTATIONS.items():
                if mutate(leaves[j]) is not None:
                    out.append(Case(len(out), i, k, name))
    return out


def hostile_call(call: Call, case: Case) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Call]]:
    """The case's tensors (the base call's, one mutated) and how to make the call from them."""
    leaves, spec = _leaves(call)
    slots = [j for j, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[j] for j in slots]
    if case.leaf is not None:
        tensors[case.leaf] = MUTATIONS[case.mutation](tensors[case.leaf])

    def make(values: list[torch.Tensor]) -> Call:
        filled = list(leaves)
        for j, v in zip(slots, values):
            filled[j] = v
        args, kwargs = torch.utils._pytree.tree_unflatten(filled, spec)
        return call[0], args, kwargs
    return tensors, make


# ---------------------------------------------------------------------------------------
# one case, the loader's way


def _one_node_graph(call: Call) -> tuple[torch.fx.GraphModule, int]:
    """A graph of one call whose tensors are its inputs (placeholders in pytree order)."""

    op = resolve_op(call[0])
    leaves, spec = _leaves(call)
    graph = torch.fx.Graph()
    count = 0
    nodes = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            nodes.append(graph.placeholder(f"in{count}"))
            count += 1
        else:
            nodes.append(v)
    args, kwargs = torch.utils._pytree.tree_unflatten(nodes, spec)
    node = graph.call_function(op, tuple(args), kwargs)
    returns = op._schema.returns
    if len(returns) > 1:
        graph.output(tuple(graph.call_function(operator.getitem, (node, i)) for i in range(len(returns))))
    else:
        graph.output(node)
    return torch.fx.GraphModule(torch.nn.Module(), graph), count


WHERE = "sweep/graph.json"
LAYOUTS = (("end", 0), ("start", 0), ("padded", 0x00), ("padded", 0x00), ("padded", 0x5A))


def _fingerprint(values: Any) -> list[Any]:
    """What a run gave, to compare bit for bit: each tensor's bytes (dense), anything else as
    it prints."""
    out = []
    for v in torch.utils._pytree.tree_leaves(values):
        if isinstance(v, torch.Tensor):
            dense = v.detach().clone(memory_format=torch.contiguous_format)
            raw = torch.empty(0, dtype=torch.uint8).set_(dense.untyped_storage())
            out.append((str(v.dtype), tuple(v.shape), raw.numpy().tobytes()))
        else:
            out.append(repr(v))
    return out


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def admit(call: Call, case: Case) -> tuple[Optional[torch.fx.GraphModule], list[torch.Tensor], Optional[dict]]:
    """The case's graph as the loader builds it and marks it, propagated by the precheck on
    the case's tensors, and the tensors; or no graph and the outcome: "not storable" (not
    graph.json data), "refused at load" (the allow-list, argument checks) or "refused before
    running" (the precheck)."""

    tensors, make = hostile_call(call, case)
    built, _ = _one_node_graph(make(tensors))
    try:
        data = graph_to_json(built)
    except AotpipeError as e:
        return None, tensors, {"outcome": "not storable", "detail": _line(e)}
    try:
        gm = graph_from_json(json.loads(json.dumps(data)), where=WHERE)
    except AotpipeError as e:
        return None, tensors, {"outcome": "refused at load", "detail": _line(e)}
    precheck.mark(gm, WHERE)
    try:  # checked once per layout of sizes, strides and storage sizes: the guarded copies' too
        execution.runnable(gm, tensors)
    except (AotpipeError, precheck.GraphWillNotRun) as e:
        return None, tensors, {"outcome": "refused before running", "detail": _line(e)}
    return gm, tensors, None


def run_layouts(gm: torch.fx.GraphModule, tensors: list[torch.Tensor], report: Callable[[dict], None]) -> dict:
    """An admitted case run in each of :data:`LAYOUTS`: "refused at run" (a checked form),
    "raised" (the kernel's own checks), "ran", or what the padding showed."""

    runs: list[tuple[str, Any]] = []
    for where, fill in LAYOUTS:
        report({"layout": where, "fill": fill})
        placed = [place(t, where, fill) for t in tensors]
        inputs = [p[0] for p in placed]
        try:
            try:
                out = execution.run_graph(gm, inputs)
                runs.append(("ran", _fingerprint(out) + _fingerprint(inputs)))
            except AotpipeError as e:
                runs.append(("refused at run", _line(e)))
            except Exception as e:  # torch's own checks in the kernel
                runs.append(("raised", _line(e)))
            out = None
            if not all(p.padding_intact() for _, p in placed):
                return {"outcome": "writes past its storage", "detail": f"the bytes past a storage ({fill:#04x}) "
                                                                        "changed"}
        finally:
            inputs = None
            for _, p in placed:
                p.release()
            del placed
    padded, again, other = runs[2], runs[3], runs[4]
    if padded == again and padded != other:
        said = {"ran": "ran"}
        detail = (f"with 0x00 past its storages it {said.get(padded[0], padded[1])}, with 0x5a "
                  f"{'other values' if padded[0] == other[0] == 'ran' else said.get(other[0], other[1])}")
        return {"outcome": "reads past its storage", "detail": detail[:400]}
    kind, what = runs[0]
    return {"outcome": kind, "detail": "" if kind == "ran" else what,
            **({} if padded == again else {"note": "not deterministic: the bytes past its storages were not judged"})}


def _where(layout: Optional[dict]) -> str:
    if layout is None:
        return ""
    if layout["layout"] == "padded":
        return f" (its storages padded with {layout['fill']:#04x})"
    return f" (its storages {'ending' if layout['layout'] == 'end' else 'starting'} at a guard page)"


def run_case(call: Call, case: Case, report: Callable[[dict], None] = lambda record: None) -> dict:
    """The case through the loader's path: {"outcome": ..., "detail": ...}, the outcome one
    of :func:`admit`'s or :func:`run_layouts`'; each layout `report`ed as it starts."""
    gm, tensors, refused = admit(call, case)
    return refused if refused is not None else run_layouts(gm, tensors, report)


def serve(calls: list[Call], todo: list[Case], seconds: float, report: Callable[[dict], None]) -> None:
    """Runs the cases in a forked child of this process (which has imported and warmed up
    torch once), `report`ing {"start": i}, {"layout": ...} and {"done": i, ...} as they come:
    a case that kills the child (a fault) is "crashed", one that runs past `seconds` "hung",
    and a new child goes on after it. Forking costs tens of milliseconds; starting a worker
    afresh, seconds."""
    position = {case.index: n for n, case in enumerate(todo)}
    # Warmed up here, once (a second in the first case: imports, caches), not in every child.
    warm = ("aten.mul.Tensor", (torch.ones(2), torch.ones(2)), {})
    run_case(warm, Case(-1, -1, None, "as given"))
    n = 0
    while n < len(todo):
        sys.stdout.flush()
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: runs cases until they are done or one kills it
            os.close(read_fd)
            try:
                def send(record: dict) -> None:
                    os.write(write_fd, (json.dumps(record) + "\n").encode())
                for case in todo[n:]:
                    send({"start": case.index})
                    send({"done": case.index, **run_case(calls[case.call], case, send)})
            except BaseException as e:  # a bug of the sweep's: reported, fails the sweep
                os.write(write_fd, (json.dumps({"error": _line(e)}) + "\n").encode())
                os._exit(1)
            os._exit(0)
        os.close(write_fd)
        current, layout, hung, buffer = None, None, False, b""
        with selectors.DefaultSelector() as sel:
            sel.register(read_fd, selectors.EVENT_READ)
            while True:
                if not sel.select(seconds):
                    os.kill(pid, signal.SIGKILL)
                    hung = True
                    break
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    record = json.loads(line)
                    if "error" in record:
                        raise RuntimeError(f"the sweep failed in a case: {record['error']}")
                    if "start" in record:
                        current, layout = record["start"], None
                    elif "layout" in record:
                        layout = record
                    elif "done" in record:
                        current = None
                    report(record)
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        if current is None:
            return
        if hung:
            died = f"ran past {seconds:.0f} s"
        elif os.WIFSIGNALED(status):
            died = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            died = f"exit {os.WEXITSTATUS(status)}"
        report({"done": current, "outcome": "hung" if hung else "crashed", "detail": died + _where(layout)})
        n = position[current] + 1


# Outcomes that fail the sweep: a worker that died in the case (a fault: SIGSEGV past a
# guard, SIGABRT from malloc's checks, SIGFPE) or hung, and what the padding showed.
FAILURES = frozenset({"crashed", "hung", "reads past its storage", "writes past its storage"})


def _run(path: str, shard: int, shards: int, after: int, without: list[str], ops: list[str],
         seconds: float) -> None:

    for name in without:
        del checked.CHECKS[resolve_op(name)]
    torch.set_num_threads(1)
    calls = load_calls(path)
    out = sys.stdout

    def report(record: dict) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    todo = [case for case in cases(calls)
            if case.index % shards == shard and case.index > after and (not ops or calls[case.call][0] in ops)]
    serve(calls, todo, seconds, report)


# ---------------------------------------------------------------------------------------
# the parent's side: workers that may die


REPO = Path(__file__).resolve().parents[2]
# glibc's checking malloc: a write past a buffer the kernel allocated itself (an output) is
# found when that buffer is freed (SIGABRT), where guard pages around inputs cannot see it
MALLOC_DEBUG = sorted(glob.glob("/usr/lib/*/libc_malloc_debug.so.0") + glob.glob("/lib*/libc_malloc_debug.so.0"))


def make(path: Path, hand_only: bool) -> dict:
    """Base calls into `path` (in a process of its own: op_db's import sets process state);
    {"calls": n, "cases": m}."""
    r = subprocess.run([sys.executable, "-m", "tests.artifact.hostile_calls", "make", str(path),
                        *(["--hand"] if hand_only else [])], cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"making base calls failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _worker_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if MALLOC_DEBUG:
        env.update(LD_PRELOAD=MALLOC_DEBUG[0], MALLOC_CHECK_="3")
    return env


def _shard(path: Path, shard: int, shards: int, without: list[str], ops: list[str], results: dict[int, dict],
           case_seconds: float) -> None:
    after = -1
    while True:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.artifact.hostile_calls", "run", str(path), "--shard", f"{shard}/{shards}",
                 "--after", str(after), "--without", ",".join(without), "--ops", ",".join(ops),
                 "--seconds", str(case_seconds)],
                cwd=REPO, env=_worker_env(), stdout=subprocess.PIPE, stderr=err, text=True)
            current, layout, hung = None, None, False
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                while True:
                    if not sel.select(2 * case_seconds + 60 if current is not None else 600):
                        proc.kill()
                        hung = True
                        break
                    line = proc.stdout.readline()
                    if not line:
                        break
                    record = json.loads(line)
                    if "start" in record:
                        current, layout = record["start"], None
                    elif "layout" in record:
                        layout = record
                    elif "done" in record:
                        results[record.pop("done")] = record
                        current = None
            rc = proc.wait()
            if current is None:
                if rc != 0 or hung:
                    err.seek(0)
                    raise RuntimeError(f"a sweep worker failed between cases (exit {rc}):\n"
                                       f"{err.read().decode(errors='replace')[-3000:]}")
                return
            # the worker itself died or hung (it runs the cases in children of its own: serve)
            died = f"the worker hung past {2 * case_seconds + 60:.0f} s" if hung else \
                f"the worker died of {signal.Signals(-rc).name if rc < 0 else f'exit {rc}'}"
            results[current] = {"outcome": "hung" if hung else "crashed", "detail": died + _where(layout)}
            after = current


def sweep(path: Path, workers: int = 2, without: tuple[str, ...] = (), ops: tuple[str, ...] = (),
          case_seconds: float = 120.0) -> dict[int, dict]:
    """Every case of the base calls in `path` (those of `ops`, if given), run in `workers`
    worker processes (without the checked forms of the ops in `without`): each case's
    result by case index. A worker that dies or hangs in a case is started again after it."""
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def shard(i: int) -> None:
        try:
            _shard(path, i, workers, list(without), list(ops), results, case_seconds)
        except BaseException as e:  # raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=shard, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


_FORMATS = {str(f): f for f in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d,
                                 torch.preserve_format)}


def save_calls(calls: list[Call], path: str) -> None:
    """torch.save, but for memory formats (which it cannot pickle), saved by name."""
    portable = torch.utils._pytree.tree_map(
        lambda v: ("memory_format", str(v)) if isinstance(v, torch.memory_format) else v, calls,
        is_leaf=lambda v: isinstance(v, torch.memory_format))
    torch.save(portable, path)


def load_calls(path: str) -> list[Call]:
    return torch.utils._pytree.tree_map(
        lambda v: _FORMATS[v[1]] if isinstance(v, tuple) and len(v) == 2 and v[0] == "memory_format" else v,
        torch.load(path, weights_only=False),
        is_leaf=lambda v: isinstance(v, tuple) and len(v) == 2 and v[0] == "memory_format")


def _make(path: str, hand_only: bool) -> None:
    calls = base_calls(hand_only)
    save_calls(calls, path)
    print(json.dumps({"calls": len(calls), "cases": len(cases(calls))}))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.artifact.hostile_calls")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make")
    make.add_argument("path")
    make.add_argument("--hand", action="store_true")
    run = sub.add_parser("run")
    run.add_argument("path")
    run.add_argument("--shard", default="0/1")
    run.add_argument("--after", type=int, default=-1)
    run.add_argument("--without", default="")
    run.add_argument("--ops", default="")
    run.add_argument("--seconds", type=float, default=120.0)
    a = parser.parse_args(argv)
    if a.command == "make":
        _make(a.path, a.hand)
    else:
        shard, shards = (int(x) for x in a.shard.split("/"))
        _run(a.path, shard, shards, a.after, [w for w in a.without.split(",") if w],
             [o for o in a.ops.split(",") if o], a.seconds)


if __name__ == "__main__":
    main()
