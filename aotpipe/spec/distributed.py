"""The YAML's ``distributed:`` block: a model captured as the ranks of a data- or
tensor-parallel world, on one machine.

``distributed: {world_size: 4, strategy: fsdp2}`` or ``{world_size: 4, strategy: fsdp2+tp,
mesh: [2, 2]}``. The strategies and what each rank's graphs hold:

- ``ddp``: every parameter whole on every rank; each rank takes its slice of the batch, and the
  backward all-reduces each gradient (``_c10d_functional.all_reduce``, sum).
- ``fsdp2``: every parameter sharded on its first dimension over the ranks, grouped in units
  as ``fully_shard`` groups them (each block, ``block`` or the model's own, then the rest): the
  forward all-gathers each unit in one collective before use, the backward gathers it again
  (``reshard_after_forward``, FSDP2's default) and reduce-scatters its gradients in one
  (``all_gather_into_tensor``, ``reduce_scatter_tensor``): FSDP2's collectives.
- ``tp``: the layers the tensor-parallel plan names split column- or row-wise (torch's
  ColwiseParallel and RowwiseParallel); the batch whole on every rank.
- ``fsdp2+tp`` and ``ddp+tp``: a 2-D mesh ``[dp, tp]``: tensor parallel inside each row of
  the mesh, data parallel across them (FSDP2 shards the tensor-parallel shard again).

The plan (``tp_plan``: module path pattern -> ``colwise`` | ``rowwise``) defaults to the one
a transformers model carries (``config.base_model_tp_plan``). ``sequence_parallel: true``
adds Megatron's sequence parallelism inside each block the plan's layers are in (their norms
on the rank's part of the sequence). Torch-free: the pipeline is
validated in a process that never imports torch; capture/distributed.py does the rest.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The largest world a pipeline may name: the ranks are captured one after another in one
# process, and the check runs them as that many local processes.
MAX_WORLD = 64

STRATEGIES = ("ddp", "fsdp2", "tp", "fsdp2+tp", "ddp+tp")
Strategy = Literal["ddp", "fsdp2", "tp", "fsdp2+tp", "ddp+tp"]
TpStyle = Literal["colwise", "rowwise"]

# The mesh's dimensions by strategy: "dp" shards the batch (and, for fsdp2, the parameters),
# "tp" the layers the plan names.
MESH_DIMS: dict[str, tuple[str, ...]] = {
    "ddp": ("dp",), "fsdp2": ("dp",), "tp": ("tp",), "fsdp2+tp": ("dp", "tp"), "ddp+tp": ("dp", "tp"),
}


class DistributedSpec(BaseModel):
    """The YAML's ``distributed:``: the world a model's graphs are captured in, rank by rank."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    world_size: int = Field(ge=2, le=MAX_WORLD, description=f"how many ranks (2 to {MAX_WORLD}); every rank's "
                            "graphs are captured and written")
    strategy: Strategy = Field(description="ddp, fsdp2 (parameters sharded, FSDP2's all-gather and "
                               "reduce-scatter), tp (tensor parallel), fsdp2+tp or ddp+tp (a 2-D mesh)")
    mesh: list[int] | None = Field(None, description="the mesh's sizes: [dp, tp] for the 2-D strategies (their "
                                   "product is world_size); a 1-D strategy's is [world_size]")
    tp_plan: dict[str, TpStyle] | None = Field(
        None, description="module path pattern (fnmatch: layers.*.mlp.up_proj) -> colwise or rowwise; default: "
        "the transformers model's own base_model_tp_plan")
    sequence_parallel: bool = Field(
        False, description="tensor parallel: also shard each block's activations on the sequence dimension "
        "(dimension 1) between its tensor-parallel layers: its norms computed on the rank's part of the sequence "
        "(torch's SequenceParallel), its colwise layers gathering the sequence, its rowwise layers "
        "reduce-scattering onto it (Megatron's sequence parallelism)")
    reshard_after_forward: bool | None = Field(
        None, description="fsdp2: free each unit's gathered parameters after its forward and gather them again for "
        "its backward (true, FSDP2's default: the backward graph all-gathers too); false: the backward keeps them "
        "from the forward")
    block: str | None = Field(None, description="fsdp2: the class of the modules fully_shard makes units of (each "
                              "block's parameters gathered in one all-gather); default: the transformers model's "
                              "_no_split_modules, else the children of its ModuleLists")

    @model_validator(mode="after")
    def _fits(self) -> DistributedSpec:
        dims = MESH_DIMS[self.strategy]
        if self.mesh is None:
            if len(dims) > 1:
                half = next((d for d in range(2, self.world_size) if self.world_size % d == 0), None)
                example = f"[{half}, {self.world_size // half}]" if half else "[dp, tp]"
                raise ValueError(f"strategy {self.strategy} runs on a 2-D mesh [dp, tp]: add mesh: {example}")
        else:
            if len(self.mesh) != len(dims):
                raise ValueError(f"strategy {self.strategy}'s mesh has {len(dims)} dimension(s) "
                                 f"({', '.join(dims)}), not {len(self.mesh)}: mesh: "
                                 + ("[dp, tp]" if len(dims) > 1 else f"[{self.world_size}]"))
            if any(m < 1 for m in self.mesh):
                raise ValueError(f"mesh {self.mesh}: every size is at least 1")
            if math.prod(self.mesh) != self.world_size:
                raise ValueError(f"mesh {self.mesh} holds {math.prod(self.mesh)} ranks and world_size is "
                                 f"{self.world_size}: the mesh's sizes multiply to the world size")
        for key in ("block", "reshard_after_forward"):
            if getattr(self, key) is not None and not self.sharded_params:
                raise ValueError(f"{key} is for the fsdp2 strategies (fsdp2, fsdp2+tp), which shard parameters by "
                                 f"block, not {self.strategy}: drop it or change the strategy")
        if self.sequence_parallel and "tp" not in dims:
            raise ValueError(f"sequence_parallel is for the tensor-parallel strategies (tp, fsdp2+tp, ddp+tp), not "
                             f"{self.strategy}: drop it or change the strategy")
        if self.tp_plan is not None and "tp" not in dims:
            raise ValueError(f"tp_plan is for the tensor-parallel strategies (tp, fsdp2+tp, ddp+tp), not "
                             f"{self.strategy}: drop it or change the strategy")
        return self

    @property
    def dims(self) -> tuple[str, ...]:
        """The mesh's dimension names, outermost first."""
        return MESH_DIMS[self.strategy]

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh's sizes."""
        return tuple(self.mesh) if self.mesh is not None else (self.world_size,)

    def size(self, dim: str) -> int:
        """The size of mesh dimension `dim` ("dp" or "tp"); 1 where the strategy has none."""
        return self.shape[self.dims.index(dim)] if dim in self.dims else 1

    def coords(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s place on the mesh (row-major, as torch's init_device_mesh lays it)."""
        out, rest = {}, rank
        for dim, n in reversed(list(zip(self.dims, self.shape, strict=True))):
            out[dim] = rest % n
            rest //= n
        return {d: out[d] for d in self.dims}

    @property
    def reshards(self) -> bool:
        """fsdp2: whether the backward gathers each unit's parameters again (FSDP2's default)."""
        return self.reshard_after_forward is not False

    @property
    def sharded_params(self) -> bool:
        """Whether data parallelism shards the parameters (fsdp2) rather than replicating them."""
        return self.strategy.startswith("fsdp2")
