"""The collective operations the losses need, over the group the caller names: the data-parallel group of the run's
parallel context (`Method.dp_group`). `group=None` means no process group (unit tests, one process): the identity.
Naming no group inside a multi-rank process group is an error, so that a loss can never silently reduce over the
wrong ranks."""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

Group = dist.ProcessGroup | None


def active(group: Group) -> bool:
    """Whether collectives over `group` communicate (it has more than one rank)."""
    if group is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError("a collective was called without its data-parallel group (ParallelContext.dp_group)")
        return False
    return dist.get_world_size(group) > 1


def rank(group: Group) -> int:
    return dist.get_rank(group) if active(group) else 0


def world_size(group: Group) -> int:
    return dist.get_world_size(group) if active(group) else 1


@torch.no_grad()
def all_reduce_mean(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """Average of `tensor` over the group's ranks (a new tensor; DINO's center)."""
    return all_reduce_sum(tensor, group) / world_size(group)


@torch.no_grad()
def all_reduce_sum(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    out = tensor.clone()
    if active(group):
        dist.all_reduce(out, group=group)
    return out


@torch.no_grad()
def all_reduce_max(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    out = tensor.clone()
    if active(group):
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


@torch.no_grad()
def all_gather_nograd(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """Rows of every rank of the group concatenated in group-rank order, without gradient (MoCo's keys)."""
    if not active(group):
        return tensor.detach()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def all_gather_grad(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """Rows of every rank of the group concatenated in group-rank order, with the gradient flowing back to each
    rank's own rows (SimCLR's negatives)."""
    if not active(group):
        return tensor
    return torch.cat(dist_fn.all_gather(tensor.contiguous(), group=group))
