"""A model captured as one rank of a parallel world, on one machine (spec/distributed.py
says which strategies and what their graphs hold).

One process plays rank r of a world of N: torch.distributed's ``fake`` process group (its
collectives do nothing, and tracing needs no peer) and a device mesh over it. The model
(built once, the same weights for every rank) is laid out as the strategy lays it:

- tensor parallel: torch's own ``parallelize_module`` with ColwiseParallel / RowwiseParallel
  on the plan's modules, over the mesh's ``tp`` dimension (each rank slices its shard from the
  whole weight: ``src_data_rank=None``, no communication);
- data parallel: every parameter a DTensor over the whole mesh, sharded on dimension 0 over
  ``dp`` (fsdp2; stacked on the tensor-parallel shard as FSDP2 does, torch's ``_StridedShard``)
  or replicated (ddp). Before use it is redistributed to whole over ``dp``, and its gradient
  is declared partial over ``dp`` (``to_local(grad_placements=[Partial])``): the forward
  all-gathers, the backward reduce-scatters (fsdp2) or all-reduces (ddp). This is how
  torchtitan's SimpleFSDP writes FSDP in a traceable form. fsdp2 does it unit by unit, as
  ``fully_shard`` on each block groups parameters (:func:`fsdp_units`): a unit's shards laid
  end to end, each padded to its even share, in one all-gather, its gradients in one
  reduce-scatter; with ``reshard_after_forward`` (FSDP2's default) the unit's gather is tagged
  for the partitioner to recompute in the backward, which so gathers it again. FSDP2's hooks,
  prefetching and memory management are not what is traced; its collectives, units, shards
  and math are. ddp all-reduces each gradient (its size-based buckets are not modelled).

The rank's graphs are traced by AOTAutograd from a module whose parameters are the rank's
local shards, plain tensors (:class:`RankModule`: it wraps them into DTensors inside
forward), so the graphs take and return plain tensors and carry the functional collectives
(``_c10d_functional.all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_reduce``,
``wait_tensor``) with their process group by name; :func:`rank_record` says which ranks and
mesh dimension each name stands for, and each parameter's shard. A data-parallel rank takes
its slice of the batch (dimension 0 of each input that has the batch's size), and its loss is
its slice of the whole batch's loss (the weights of the "weighted" loss at the global
positions), so the ranks' losses add up to the whole model's and the reassembled
gradients are the whole model's: checks/distributed.py runs the ranks together over gloo
and holds them to the single-process eager model.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._export.utils import _compiling_state_context
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils.checkpoint import CheckpointPolicy

from aotpipe.capture import export as _export
from aotpipe.errors import CaptureError
from aotpipe.format.ir import CapturedGraph, CapturedGraphs, GraphInput, GraphOutput
from aotpipe.format.records import CollectiveRecord, DistributedRecord, GroupRecord, ParamShardRecord
from aotpipe.format.vocabulary import GRAPH_KINDS, TRAINING_KINDS, GraphKind
from aotpipe.models.eager import NoLossError
from aotpipe.runtime.tensors import loss_weights
from aotpipe.spec.distributed import DistributedSpec
from aotpipe.spec.modes import DEFAULT_LOSS

# The functional collectives a rank's graph may hold (what DTensor's redistributions trace to).
COLLECTIVE_OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_to_all_single", "broadcast")
COLLECTIVE_NAMESPACE = "_c10d_functional"


@contextlib.contextmanager
def fake_world(rank: int, spec: DistributedSpec) -> Iterator[DeviceMesh]:
    """This process as rank `rank` of `spec`'s world on torch's fake process group, and the
    mesh over it; the process group is destroyed when the block ends."""
    # torch's fake backend registers itself when its module is imported (torch.distributed has no
    # public spelling of it); FakeStore is the store it takes
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise CaptureError("a process group is already set up in this process; a distributed capture sets up its "
                           "own fake one (run it in a process of its own)")
    dist.init_process_group("fake", rank=rank, world_size=spec.world_size, store=FakeStore())
    try:
        _forget_meshes()
        yield init_device_mesh("cpu", spec.shape, mesh_dim_names=spec.dims)
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """Clear DTensor's caches of sharding decisions and redistribution plans. They are keyed by
    mesh, and a mesh of another world in this process compares equal (same shape, same rank
    numbers) while its process groups are another rank's: a cached plan would call them.
    (:func:`collectives` refuses a graph that calls a group outside its rank's mesh.)"""
    from torch.distributed.tensor import _collective_utils, _redistribute  # the caches' owners

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's own (as torch's debug helpers clear it)
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()


def mesh_groups(mesh: DeviceMesh) -> dict[str, GroupRecord]:
    """The process groups of this rank's mesh by the name a graph calls them: the mesh
    dimension and the ranks of each."""
    out = {}
    for dim in mesh.mesh_dim_names or ():
        sub = mesh[dim]
        out[str(sub.get_group().group_name)] = GroupRecord(dim=dim,
                                                           ranks=[int(r) for r in sub.mesh.flatten().tolist()])
    return out


def tp_plan(model: torch.nn.Module, spec: DistributedSpec) -> dict[str, str]:
    """The tensor-parallel plan: the pipeline's, else the one a transformers model carries
    (config.base_model_tp_plan, relative to its base model)."""
    if spec.tp_plan is not None:
        return dict(spec.tp_plan)
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and hasattr(model, prefix):
        plan = {f"{prefix}.{k}": v for k, v in plan.items()}
    return {k: v for k, v in plan.items() if v in ("colwise", "rowwise")}


def _style(module: torch.nn.Module, style: str, **layouts: Any) -> ParallelStyle:
    """torch's parallel style for `module` split `style`-wise. An nn.Linear (or transformers'
    Conv1D): ColwiseParallel (its output split on the last dimension, for the rowwise layer after
    it) or RowwiseParallel (its input so split, its output all-reduced whole). An nn.Embedding:
    its output made whole either way (the layers after it take the whole hidden state): rowwise
    splits the vocabulary (ids in whole, output all-reduced), colwise the embedding dimension
    (output all-gathered). `layouts`: the style's input or output layouts (sequence parallelism)."""
    if isinstance(module, torch.nn.Embedding):
        return RowwiseParallel(input_layouts=Replicate()) if style == "rowwise" else \
            ColwiseParallel(output_layouts=Replicate())
    if is_conv1d(module):
        return _Conv1DRowwise(**layouts) if style == "rowwise" else _Conv1DColwise(**layouts)
    return RowwiseParallel(**layouts) if style == "rowwise" else ColwiseParallel(**layouts)


def is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's projections): ``x @ weight + bias``, its weight stored
    [in, out] (nn.Linear's transposed), ``nf`` output features. Known by its form, not imported:
    transformers is optional."""
    w = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2 \
        and getattr(module, "nf", None) == w.shape[1]


def _distributed_params(module: torch.nn.Module, mesh: DeviceMesh, placements: dict[str, Placement],
                        src_data_rank: int | None) -> None:
    """`module`'s parameters made DTensors over `mesh`, each placed as `placements` says (by name)."""
    for name, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(name, torch.nn.Parameter(
            distribute_tensor(param, mesh, [placements[name]], src_data_rank=src_data_rank),
            requires_grad=param.requires_grad))


class _Conv1DColwise(ColwiseParallel):
    """torch's ColwiseParallel for transformers' Conv1D, whose weight is nn.Linear's transposed:
    the output features are its dimension 1 (and the bias's 0). torch's style is written for
    nn.Linear and nn.Embedding only; the runtime (inputs whole, output split on the last
    dimension) is the style's own."""

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        return distribute_module(
            module, device_mesh,
            lambda name, m, mesh: _distributed_params(m, mesh, {"weight": Shard(1), "bias": Shard(0)},
                                                      self.src_data_rank),
            functools.partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            functools.partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class _Conv1DRowwise(RowwiseParallel):
    """torch's RowwiseParallel for transformers' Conv1D: the input features are its weight's
    dimension 0; the bias is replicated, the output partial and reduced as the style reduces it."""

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh,
            lambda name, m, mesh: _distributed_params(m, mesh, {"weight": Shard(0), "bias": Replicate()},
                                                      self.src_data_rank),
            functools.partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            functools.partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def _fused_qkv(module: torch.nn.Module) -> bool:
    """A Conv1D projecting to three times its input features: q, k and v side by side."""
    w = getattr(module, "weight", None)
    return is_conv1d(module) and isinstance(w, torch.Tensor) and w.shape[1] == 3 * w.shape[0]


def _splits(module: torch.nn.Module) -> bool:
    """What colwise and rowwise split: nn.Linear, nn.Embedding, transformers' Conv1D."""
    return isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or is_conv1d(module)


def _apply_tp(model: torch.nn.Module, spec: DistributedSpec, mesh: DeviceMesh) -> tuple[list[str], list[str]]:
    """torch's tensor parallelism on the plan's modules; the module paths it split, and the
    norms sequence parallelism runs on the rank's part of the sequence."""
    plan = tp_plan(model, spec)
    if not plan:
        raise CaptureError(f"strategy {spec.strategy} needs a tensor-parallel plan and the model carries none "
                           "(config.base_model_tp_plan): add tp_plan: {'layers.*.mlp.up_proj': colwise, ...} to "
                           "distributed")
    names = [n for n, _ in model.named_modules() if n]
    linear = [n for n, m in model.named_modules() if _splits(m)]
    looks = f"its nn.Linear, nn.Embedding and Conv1D layers: {', '.join(linear[:4])}" + \
        (" ..." if len(linear) > 4 else "") if linear else "it has no nn.Linear, nn.Embedding or Conv1D layer"
    matched = {n: style for pattern, style in plan.items() for n in names if fnmatch.fnmatchcase(n, pattern)}
    unmatched = [p for p in plan if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if not matched:
        raise CaptureError(f"the tensor-parallel plan names no module of the model (patterns: "
                           f"{', '.join(sorted(plan)[:3])}); {looks}")
    not_linear = sorted(n for n in matched if not _splits(model.get_submodule(n)))
    if not_linear:
        raise CaptureError(f"the tensor-parallel plan names {not_linear[0]}, a "
                           f"{type(model.get_submodule(not_linear[0])).__name__}: colwise and rowwise split "
                           "nn.Linear, nn.Embedding and transformers' Conv1D layers; narrow the pattern")
    if unmatched:
        raise CaptureError(f"tp_plan pattern {unmatched[0]!r} matches no module of the model; {looks}")
    fused = sorted(n for n, style in matched.items() if style == "colwise" and _fused_qkv(model.get_submodule(n)))
    if fused:
        raise CaptureError(f"the tensor-parallel plan splits {fused[0]} colwise, a Conv1D of three times its input "
                           "features (q, k and v in one projection, GPT-2's c_attn): split so, each rank would get "
                           "all of q and part of k, and no torch style splits a fused projection by heads; leave it "
                           "whole (plan the MLP: mlp.c_fc colwise, mlp.c_proj rowwise)")
    styles = {n: _style(model.get_submodule(n), s) for n, s in matched.items()}
    blocks: list[str] = []
    if spec.sequence_parallel:
        styles, blocks = _sequence_parallel(model, matched, styles)
    parallelize_module(model, mesh["tp"], styles, src_data_rank=None)
    for block in blocks:
        _sequence_sharded(model.get_submodule(block), block, mesh["tp"])
    return sorted(matched), sorted(n for n, style in styles.items() if isinstance(style, SequenceParallel))


def _block_of(model: torch.nn.Module, name: str) -> str | None:
    """The block module `name` is inside: its ancestor that is a child of an nn.ModuleList
    (``layers.3`` for ``layers.3.mlp.up_proj``); None if it is in none."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):  # innermost first; get_submodule("") is the model itself
        if isinstance(model.get_submodule(".".join(parts[:i - 1])), torch.nn.ModuleList):
            return ".".join(parts[:i])
    return None


def _is_norm(module: torch.nn.Module) -> bool:
    """A normalization over the last dimension (what sequence parallelism computes on a part of
    the sequence): nn.LayerNorm, nn.RMSNorm, or a model's own (a leaf class named ...LayerNorm
    or ...RMSNorm: transformers' LlamaRMSNorm, T5LayerNorm)."""
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return True
    name = type(module).__name__
    return not list(module.children()) and (name.endswith("LayerNorm") or name.endswith("RMSNorm"))


def _sequence_parallel(model: torch.nn.Module, matched: dict[str, str], styles: dict[str, ParallelStyle]
                       ) -> tuple[dict[str, ParallelStyle], list[str]]:
    """Megatron's sequence parallelism inside every block holding a layer of the plan: the
    block's activations between its tensor-parallel layers are split on the sequence
    (dimension 1): its norms computed on the rank's part (torch's SequenceParallel: their
    weights replicated, their gradients all-reduced), its colwise layers gathering the
    sequence first (ColwiseParallel(input_layouts=Shard(1))), its rowwise layers
    reduce-scattering onto it (RowwiseParallel(output_layouts=Shard(1))), and the block's
    input and output whole (:func:`_sequence_sharded`), so the layers outside the blocks are
    as tensor parallelism alone leaves them. The styles, and the blocks."""
    by_block: dict[str, list[str]] = {}
    for n in matched:
        block = _block_of(model, n)
        if block is None:
            continue
        by_block.setdefault(block, []).append(n)
    if not by_block:
        raise CaptureError("sequence_parallel: no layer of the tensor-parallel plan is inside a block (a child of an "
                           "nn.ModuleList), whose activations it would split; drop sequence_parallel")
    out = dict(styles)
    for block, names in by_block.items():
        norms = [f"{block}.{n}" for n, m in model.get_submodule(block).named_modules() if n and _is_norm(m)]
        if not norms:
            raise CaptureError(f"sequence_parallel: block {block} has no norm layer (an nn.LayerNorm, nn.RMSNorm or "
                               "a model's ...LayerNorm/...RMSNorm) to compute on a part of the sequence; drop "
                               "sequence_parallel")
        for n in names:
            module = model.get_submodule(n)
            if isinstance(module, torch.nn.Linear) or is_conv1d(module):
                out[n] = _style(module, matched[n], **({"output_layouts": Shard(1)} if matched[n] == "rowwise"
                                                       else {"input_layouts": Shard(1)}))
        out.update({n: SequenceParallel() for n in norms})
    return out, sorted(by_block)


def _sequence_sharded(block: torch.nn.Module, name: str, tp: DeviceMesh) -> None:
    """Hooks on a sequence-parallel block: its hidden states (its first positional argument, or
    ``hidden_states=``) come in whole and go on as the rank's part of the sequence (a slice,
    no communication; the backward all-gathers its gradient), and its output (the first
    tensor it returns) is gathered whole again (an all-gather)."""
    n = tp.size()

    def split(x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] % n:
            raise CaptureError(f"sequence_parallel: block {name}'s hidden states are {list(x.shape)}; their sequence "
                               f"(dimension 1) must split evenly over the {n} tensor-parallel ranks: make it a "
                               f"multiple of {n}, or drop sequence_parallel")
        return DTensor.from_local(x, tp, [Replicate()], run_check=False).redistribute(tp, [Shard(1)]).to_local()

    def gather(x: torch.Tensor) -> torch.Tensor:
        whole = torch.Size([x.shape[0], x.shape[1] * n, *x.shape[2:]])
        return DTensor.from_local(x, tp, [Shard(1)], run_check=False, shape=whole,
                                  stride=torch.empty(whole, device="meta").stride()).redistribute(
            tp, [Replicate()]).to_local()

    def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args and isinstance(args[0], torch.Tensor):
            return (split(args[0]), *args[1:]), kwargs
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            return args, {**kwargs, "hidden_states": split(kwargs["hidden_states"])}
        raise CaptureError(f"sequence_parallel: block {name} takes its hidden states neither first nor as "
                           "hidden_states=; drop sequence_parallel")

    def after(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            return gather(out)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            return (gather(out[0]), *out[1:])
        raise CaptureError(f"sequence_parallel: block {name} returns {type(out).__name__}, not its hidden states "
                           "(a tensor, or a tuple of them first); drop sequence_parallel")

    block.register_forward_pre_hook(before, with_kwargs=True)
    block.register_forward_hook(after, with_kwargs=True)


def _placement_text(p: Placement) -> str:
    if isinstance(p, _StridedShard):
        return f"StridedShard({p.dim}, split_factor={p.split_factor})"
    return repr(p).replace("(dim=", "(")


@dataclass
class _Param:
    """How one parameter lives on this rank: its whole value's shape, placements over the
    whole mesh, and what the model computes with (tp_placement: its placement over tp)."""

    name: str
    whole: torch.Tensor
    placements: list[Placement]
    tp_placement: Placement | None  # None: not split by tensor parallelism


class RankModule(torch.nn.Module):
    """Rank r's model as AOTAutograd traces it: its parameters are the rank's local shards
    (plain tensors, under the model's names); forward wraps each in a DTensor over the mesh,
    redistributes it as the strategy computes with it, and calls the model with those."""

    def __init__(self, model: torch.nn.Module, mesh: DeviceMesh, params: list[_Param], spec: DistributedSpec,
                 units: list[list[str]] | None = None):
        super().__init__()
        # the laid-out model is called functionally, not registered: its DTensor parameters are
        # not this module's inputs, the local shards are
        self.laid_out: torch.nn.Module
        object.__setattr__(self, "laid_out", model)
        self.mesh, self.spec = mesh, spec
        self.params = {p.name: p for p in params}
        # fsdp2: the parameters gathered (and their gradients reduce-scattered) together, each
        # unit in one collective, as fully_shard on a block does (fsdp_units)
        self.units = units or []
        self.shards: dict[str, ParamShardRecord] = {}
        self.sequence_norms: list[str] = []  # the norms sequence parallelism computes on part of the sequence
        self._names: dict[str, str] = {}
        self._whole_over_dp: dict[str, list[int]] = {}  # each parameter's shape once gathered over dp
        for p in params:
            over_dp = [Replicate() if dim == "dp" else pl for dim, pl in zip(spec.dims, p.placements, strict=True)]
            self._whole_over_dp[p.name] = list(compute_local_shape_and_global_offset(p.whole.shape, mesh, over_dp)[0])
            shape, offset = compute_local_shape_and_global_offset(p.whole.shape, mesh, p.placements)
            local = p.whole[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))].detach().clone()
            self._register(p.name, torch.nn.Parameter(local, requires_grad=p.whole.requires_grad))
            self.shards[p.name] = ParamShardRecord(shape=list(p.whole.shape), local_shape=list(shape),
                                                   offset=[int(o) for o in offset],
                                                   placements=[_placement_text(x) for x in p.placements])
        for name, b in model.named_buffers():
            self._register(name, b, buffer=True)

    def _register(self, name: str, value: torch.Tensor, buffer: bool = False) -> None:
        """Register `value` under the model's own dotted name (as submodules, so AOTAutograd's
        descriptors and the artefact's inputs carry the model's names)."""
        owner: torch.nn.Module = self
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(owner, part) or not isinstance(getattr(owner, part), torch.nn.Module):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if buffer:
            owner.register_buffer(leaf, value)
        else:
            owner.register_parameter(leaf, value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value))

    def _computed(self, name: str, local: torch.Tensor) -> torch.Tensor:
        p = self.params[name]
        mesh, dims = self.mesh, self.spec.dims
        d = DTensor.from_local(local, mesh, p.placements, run_check=False, shape=p.whole.shape,
                               stride=p.whole.stride())
        if "dp" not in dims:  # tensor parallel alone: the model computes with d itself, or its whole value
            if p.tp_placement is None:
                return d.to_local()
            return d
        whole_dp = [Replicate() if dim == "dp" else pl for dim, pl in zip(dims, p.placements, strict=True)]
        gathered = d.redistribute(mesh, whole_dp)
        # its gradient is partial over dp (each rank's batch slice's part): summed into the shard
        grads: list[Placement] = [Partial("sum") if dim == "dp" else (p.tp_placement or Replicate()) for dim in dims]
        local_whole = gathered.to_local(grad_placements=grads)
        if p.tp_placement is None:
            return local_whole
        return DTensor.from_local(local_whole, mesh["tp"], [p.tp_placement], run_check=False, shape=p.whole.shape,
                                  stride=p.whole.stride())

    def _unit(self, names: list[str], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters `names` (one fsdp2 unit) whole over dp, gathered in one all-gather of
        their shards laid end to end (each padded to its dimension 0's even share, as FSDP2 pads
        them), whose gradient is partial over dp: one reduce-scatter in the backward."""
        mesh = self.mesh["dp"] if len(self.spec.dims) > 1 else self.mesh
        n = mesh.size()
        pieces, layout = [], []
        for name in names:
            shape = self._whole_over_dp[name]
            rows = -(-shape[0] // n)
            local = own[name]
            padded = torch.nn.functional.pad(local, [0, 0] * (local.dim() - 1) + [0, rows - local.shape[0]])
            pieces.append(padded.reshape(-1))
            layout.append((name, shape, rows))
        flat = torch.cat(pieces)
        d = DTensor.from_local(flat, mesh, [Shard(0)], run_check=False, shape=torch.Size([n * flat.numel()]),
                               stride=(1,))
        whole = d.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial("sum")]).view(n, -1)
        out, at = {}, 0
        for name, shape, rows in layout:
            size = rows * math.prod(shape[1:])
            value = whole[:, at:at + size].reshape(n * rows, *shape[1:])[:shape[0]]
            at += size
            tp_pl = self.params[name].tp_placement
            out[name] = value if tp_pl is None else DTensor.from_local(
                value, self.mesh["tp"], [tp_pl], run_check=False, shape=self.params[name].whole.shape,
                stride=self.params[name].whole.stride())
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        own: dict[str, torch.Tensor] = dict(self.named_parameters())
        values: dict[str, torch.Tensor] = {}
        for i, unit in enumerate(self.units):
            if self.spec.reshards and self.training:
                # FSDP2's default: the unit's whole parameters are freed after its forward and
                # gathered again for its backward (torch's selective checkpointing: the partitioner
                # recomputes the all-gather in the backward graph rather than saving its result)
                with _recomputed(i + 1):
                    values.update(self._unit(unit, own))
            else:
                values.update(self._unit(unit, own))
        values.update({n: self._computed(n, own[n]) for n in self.params if n not in values})
        values.update(dict(self.named_buffers()))
        return torch.func.functional_call(self.laid_out, values, args, kwargs, strict=False)


def lay_out(model: torch.nn.Module, spec: DistributedSpec, mesh: DeviceMesh) -> tuple[RankModule, list[str]]:
    """`model` (a copy is made) laid out on `mesh` as `spec`'s strategy lays it out; the module
    paths tensor parallelism split."""
    model = copy.deepcopy(model)
    whole = {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in model.named_parameters()}
    split, norms = _apply_tp(model, spec, mesh) if "tp" in spec.dims else ([], [])
    tp = spec.size("tp")
    params = []
    for name, p in model.named_parameters():
        tp_pl = p.placements[0] if isinstance(p, DTensor) else None
        placements: list[Placement] = []
        for dim in spec.dims:
            if dim == "tp":
                placements.append(tp_pl or Replicate())
            elif not spec.sharded_params:
                placements.append(Replicate())
            elif isinstance(tp_pl, Shard) and tp_pl.dim == 0 and tp > 1:
                # FSDP2 over a tensor-parallel shard split on the same dimension: dp shards tp's shard
                placements.append(_StridedShard(0, split_factor=tp))
            else:
                placements.append(Shard(0))
        params.append(_Param(name, whole[name], placements, tp_pl))
    units = fsdp_units(model, spec) if spec.sharded_params else None
    module = RankModule(model, mesh, params, spec, units)
    module.sequence_norms = norms
    return module, split


@contextlib.contextmanager
def _recomputed(region: int) -> Iterator[None]:
    """The nodes traced inside tagged for the partitioner to recompute in the backward rather than
    save (what torch's selective activation checkpointing tags under torch.compile, with
    `region` as its checkpoint region's id; its own context gives no id outside dynamo)."""
    meta = fx_traceback.current_meta
    saved: dict[str, Any] = {k: meta[k] for k in ("recompute", "ac_graph_id") if k in meta}
    meta["recompute"], meta["ac_graph_id"] = CheckpointPolicy.MUST_RECOMPUTE, region
    try:
        yield
    finally:
        for k in ("recompute", "ac_graph_id"):
            meta.pop(k, None)
        meta.update(saved)


def fsdp_units(model: torch.nn.Module, spec: DistributedSpec) -> list[list[str]]:
    """The parameters fsdp2 gathers together, as fully_shard applied to each block and then to the
    model groups them: the root's (those in no block) first, as the root's forward gathers
    them first, then each block's, in the model's order. The blocks: the modules of
    `spec.block`'s class, else of the transformers model's `_no_split_modules` classes, else
    the children of its ModuleLists. Parameters by name, each in the innermost block holding it."""
    if spec.block is not None:
        classes = {spec.block}
    else:
        classes = set(getattr(model, "_no_split_modules", None) or ())
    modules = dict(model.named_modules())
    blocks = [n for n, m in modules.items() if n and type(m).__name__ in classes]
    if spec.block is not None and not blocks:
        kinds = sorted({type(m).__name__ for m in modules.values()})
        raise CaptureError(f"distributed.block {spec.block!r}: no module of the model is one, so fsdp2 has no block to "
                           f"shard; its module classes: {', '.join(kinds[:12])}")
    if not blocks:
        blocks = [f"{n}.{c}" if n else c for n, m in modules.items() if isinstance(m, torch.nn.ModuleList)
                  for c, _ in m.named_children()]
    units: dict[str, list[str]] = {"": []}
    for b in blocks:
        units[b] = []
    for name, _ in model.named_parameters():
        owner = max((b for b in blocks if name.startswith(b + ".")), key=len, default="")
        units[owner].append(name)
    return [u for u in units.values() if u]


def batch_slice(spec: DistributedSpec, rank: int, args: tuple, kwargs: dict) -> tuple[tuple, dict, list[int] | None]:
    """The rank's inputs: with data parallelism, its slice of dimension 0 of every tensor input
    whose dimension 0 is the batch's (the first tensor input's); [offset, size, whole] of the slice."""
    dp = spec.size("dp")
    leaves, tree = pytree.tree_flatten((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
    if dp == 1 or not tensors:
        return args, kwargs, None
    whole = tensors[0].shape[0]
    if whole % dp:
        raise CaptureError(f"strategy {spec.strategy} splits the batch ({whole}) over {dp} data-parallel ranks, which "
                           f"does not divide it; make the first dimension of the inputs a multiple of {dp}")
    size = whole // dp
    offset = spec.coords(rank)["dp"] * size
    out = [t[offset:offset + size] if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == whole else t
           for t in leaves]
    a, k = pytree.tree_unflatten(out, tree)
    return a, k, [offset, size, whole]


class RankLoss(torch.nn.Module):
    """The rank's part of the whole batch's loss (eager.model_loss): each output's weights are
    the whole output's at the rank's batch positions, a mean divides by the whole batch's
    count, so that the ranks' losses add up to the whole model's (one per data-parallel rank)."""

    def __init__(self, model: torch.nn.Module, kind: str = DEFAULT_LOSS, batch: list[int] | None = None):
        super().__init__()
        self.model, self.kind, self.batch = model, kind, batch

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not leaves:
            raise CaptureError(str(NoLossError("the model has no floating-point output to build a loss from")))
        loss = self._part(leaves[0])
        for t in leaves[1:]:
            loss = loss + self._part(t)
        return loss

    def _part(self, t: torch.Tensor) -> torch.Tensor:
        if self.batch is None:
            offset, whole = 0, t.shape[0] if t.dim() else 1
        else:
            offset, size, whole = self.batch
            if t.dim() == 0 or t.shape[0] != size:
                raise CaptureError(f"an output of shape {list(t.shape)} does not have the rank's batch ({size}) "
                                   "first: a data-parallel strategy needs every floating-point output batch-major")
        if self.kind == "weighted":
            shape = (whole, *t.shape[1:]) if t.dim() else ()
            w = loss_weights(shape, t.dtype, t.device)
            if t.dim():
                w = w[offset:offset + t.shape[0]]
            return (t * w).sum()
        if self.kind == "sum":
            return t.sum()
        count = t.numel() * (whole // t.shape[0] if t.dim() and t.shape[0] else 1)
        return t.sum() / count


def _aot_inference(module: RankModule, args: tuple, kwargs: dict, user_names: list[str],
                   int_ranges: dict[str, tuple[int, int]], state: dict[str, torch.Tensor]) -> CapturedGraph:
    """The rank's inference graph, traced by AOTAutograd without gradients (torch.export does
    not take the DTensors the forward makes: its pre-dispatch tracing refuses their spec)."""

    class _Outputs(torch.nn.Module):
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model = model

        def forward(self, *a: Any, **k: Any) -> tuple:
            return tuple(t for t in pytree.tree_leaves(self.model(*a, **k)) if isinstance(t, torch.Tensor))

    with contextlib.ExitStack() as stack, torch.no_grad():
        jd = aot_export_joint_with_descriptors(stack, _Outputs(module), args, kwargs,
                                               decompositions=core_aten_decompositions())  # type: ignore[arg-type]
        gm = _export._flat_graph(jd.graph_module)
    inputs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        role, target = _export._desc_target(node.meta.get("desc"))
        if role == "other":
            raise CaptureError(f"distributed inference capture: input {node.name} is {target}, which aotpipe's "
                               "graphs have no role for")
        if target is None:
            raise CaptureError(f"distributed inference capture: input {node.name} has no name")
        if role == "user":
            target = user_names[int(target)] if int(target) < len(user_names) else target
        else:
            target = _export._strip(target) or target
        meta = _export._meta_of(node)
        rng = None
        if meta is not None and not meta.dtype.is_floating_point and meta.dtype != torch.bool:
            rng = int_ranges.get(target) if role == "user" else (
                _export._observed_range(state[target]) if target in state else None)
        inputs.append(GraphInput(node.name, role, target, meta, _export._scalar_type(node) if meta is None else None,
                                 rng))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [GraphOutput(i, "user", None, _export._meta_of(a) if isinstance(a, torch.fx.Node) else None)
               for i, a in enumerate(out.args[0])]
    return CapturedGraph(GraphKind.INFERENCE, gm, inputs, outputs)


def collectives(captured: CapturedGraphs, groups: dict[str, GroupRecord]) -> list[CollectiveRecord]:
    """Every collective of every graph, in graph order: its graph, node, op, group and the bytes
    it moves (its output's, for this rank)."""
    out: list[CollectiveRecord] = []
    for key, g in captured.graphs.items():
        for node in g.gm.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
                continue
            if target.namespace != COLLECTIVE_NAMESPACE or target._schema.name.split("::")[1] not in COLLECTIVE_OPS:
                continue
            group = node.args[-1] if isinstance(node.args[-1], str) else str(node.kwargs.get("group_name"))
            if group not in groups:
                raise CaptureError(f"graph {key}: {node.name} calls group {group!r}, which is none of the mesh's "
                                   f"({', '.join(sorted(groups))})")
            val = node.meta.get("val")
            nbytes = val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0
            out.append(CollectiveRecord(graph=key, node=node.name, op=target._schema.name.split("::")[1], group=group,
                                        dim=groups[group].dim, bytes=int(nbytes)))
    return out


@dataclass
class RankCapture:
    """One rank's capture: its graphs, its record (manifest `distributed`), its inputs (the
    rank's batch slice) and the state its graphs bind (its local shards)."""

    captured: CapturedGraphs
    record: DistributedRecord
    args: tuple
    kwargs: dict
    state: dict[str, torch.Tensor] = field(default_factory=dict)


@contextlib.contextmanager
def _unplanned_consumer_named(spec: DistributedSpec) -> Iterator[None]:
    """Under sequence parallelism a norm's output is split on the sequence (a DTensor): a layer
    it feeds that the plan leaves whole (GPT-2's fused attention projection beside a plan of its
    MLP) meets it with a plain weight, and torch says only "mixed torch.Tensor and DTensor". Said
    as what to change."""
    try:
        yield
    except Exception as e:
        if not (spec.sequence_parallel and "mixed torch.Tensor and DTensor" in str(e)):
            raise
        raise CaptureError("sequence_parallel: a layer the tensor-parallel plan leaves whole takes a norm's output, "
                           "which sequence parallelism splits on the sequence (torch: mixed torch.Tensor and "
                           "DTensor); every layer a block's norms feed must be in the plan: add it, or drop "
                           "sequence_parallel") from e


def capture_rank(model: torch.nn.Module, args: tuple, kwargs: dict, *, spec: DistributedSpec, rank: int, name: str,
                 graphs: tuple[GraphKind, ...], input_names: tuple[str, ...],
                 int_ranges: dict[str, tuple[int, int]], loss: str = DEFAULT_LOSS) -> RankCapture:
    """Rank `rank`'s graphs of `model` under `spec`, traced on the fake process group."""
    start = time.perf_counter()
    # torch.export's own flags while tracing (torch.compiler.is_exporting() true): a model asks
    # them to take its traceable path (transformers' masks skip a data-dependent shortcut)
    with fake_world(rank, spec) as mesh, _compiling_state_context(), _unplanned_consumer_named(spec):
        module, split = lay_out(model, spec, mesh)
        groups = mesh_groups(mesh)
        largs, lkwargs, batch = batch_slice(spec, rank, args, kwargs)
        user_names = _export.user_input_names(largs, lkwargs, list(input_names))
        state = {**{n: p.detach() for n, p in module.named_parameters()},
                 **{n: b.detach() for n, b in module.named_buffers()}}
        notes = [f"rank {rank} of {spec.world_size} ({spec.strategy}, mesh "
                 f"{' x '.join(f'{d}={n}' for d, n in zip(spec.dims, spec.shape, strict=True))}), traced on torch's fake "
                 "process group" + (f"; tensor parallel: {len(split)} layers" if split else "")
                 + (f"; sequence parallel: {len(module.sequence_norms)} norms on the rank's part of the sequence"
                    if spec.sequence_parallel else "")]
        out: dict[str, CapturedGraph] = {}
        contract = None
        constants: dict[str, torch.Tensor] = {}
        if GraphKind.INFERENCE in graphs:
            module.eval()
            module.laid_out.eval()
            out["inference"] = _aot_inference(module, largs, lkwargs, user_names, int_ranges, state)
        if set(TRAINING_KINDS) & set(graphs):
            module.train()
            module.laid_out.train()
            joint, fw, bw, contract, _ = _export.training_graphs(
                module, largs, lkwargs, user_names, int_ranges, state, constants,
                functools.partial(RankLoss, kind=loss, batch=batch), notes)
            for kind, g in (("joint", joint), ("forward", fw), ("backward", bw)):
                if kind in graphs:
                    out[kind] = g
            module.laid_out.eval()
        captured = CapturedGraphs(model=name, mode="export", graphs={k: out[k] for k in GRAPH_KINDS if k in out},
                                  contract=contract if {GraphKind.FORWARD, GraphKind.BACKWARD} & set(out) else None,
                                  seconds=time.perf_counter() - start,
                                  options={**_export.OPTIONS, "loss": loss, "distributed": spec.strategy},
                                  notes=notes, constants=constants, user_inputs=user_names)
        record = DistributedRecord(
            world_size=spec.world_size, strategy=spec.strategy, mesh=list(spec.shape), mesh_dims=list(spec.dims),
            rank=rank, coords=spec.coords(rank), groups=groups, shards=module.shards, batch=batch,
            tensor_parallel=split, sequence_parallel=module.sequence_norms, collectives=collectives(captured, groups))
        captured.distributed = record
    return RankCapture(captured, record, largs, lkwargs, state)
