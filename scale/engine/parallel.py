"""The parallel context: which ranks shard the model together and which ones see different data, built once from the
launcher's environment and the recipe's engine.shard_size (`init_parallel`, right after the process group exists;
`parallel_context` without a group or over an existing one), then passed to the loader, the methods, the engines,
clipping and the checkpointer: nothing past the training entry takes a plain DistInfo.

The ranks form a named 2-D DeviceMesh ("replicate", "shard"): groups of `shard_size` consecutive ranks (one node
under Slurm) each hold one copy of the model sharded over the group, and the copies are replicated across groups
(HSDP; shard_size = world size is plain FSDP, shard_size = 1 plain replication, which engine.kind=fsdp2 runs as DDP:
scale.engine.kinds.runs_as). Every rank is data-parallel, so the
data-parallel group (the one the losses' collectives, SyncBatchNorm, the k-NN monitor and the step's agreements
use) is every rank of the mesh; a later tensor- or sequence-parallel axis would shrink it, and only this module
would change.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scale.engine.dist import DistInfo, init_distributed
from scale.errors import UserError

MESH_DIMS = ("replicate", "shard")


@dataclass(frozen=True)
class ParallelContext(DistInfo):
    """A DistInfo (rank, world_size, local_rank, launcher, is_main...) plus the mesh and the data-parallel group.
    Without a process group (unit tests, one process), `mesh` and `dp_group` are None and collectives are local."""

    shard_size: int = 1
    mesh: DeviceMesh | None = None
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: dist.ProcessGroup | None = None

    @property
    def replicas(self) -> int:
        return self.world_size // self.shard_size

    def describe(self) -> str:
        return f"{self.replicas} replica(s) x {self.shard_size} shard(s)"


def resolve_shard_size(shard_size: int, world_size: int) -> int:
    """engine.shard_size: 0 = every rank (plain FSDP); otherwise it must divide the world size."""
    if shard_size < 0:
        raise UserError(f"engine.shard_size={shard_size} must be >= 0 (0: shard over all {world_size} ranks)")
    if shard_size == 0:
        return world_size
    if world_size % shard_size:
        raise UserError(f"engine.shard_size={shard_size} must divide the number of ranks ({world_size})")
    return shard_size


def parallel_context(info: DistInfo, device: torch.device, shard_size: int = 0) -> ParallelContext:
    """Collective when a process group exists (every rank builds the mesh's subgroups)."""
    size = resolve_shard_size(shard_size, info.world_size)
    fields = {name: getattr(info, name) for name in DistInfo.__dataclass_fields__}
    if not dist.is_initialized():
        return ParallelContext(**fields, shard_size=size)
    mesh = init_device_mesh(device.type, (info.world_size // size, size), mesh_dim_names=MESH_DIMS)
    # every rank is data-parallel: the data-parallel group is the whole mesh, i.e. the default group's ranks
    dp_group = dist.group.WORLD
    return ParallelContext(
        **fields,
        shard_size=size,
        mesh=mesh,
        dp_rank=dist.get_rank(dp_group),
        dp_size=dist.get_world_size(dp_group),
        dp_group=dp_group,
    )


def init_parallel(shard_size: int = 0, timeout_minutes: int = 30) -> tuple[ParallelContext, torch.device]:
    """The process group (scale.engine.dist.init_distributed), then the run's context over it: how the training
    entry, the tools and the tests that need a process group start. Collective."""
    info, device = init_distributed(timeout_minutes)
    return parallel_context(info, device, shard_size), device
