"""The collective operations the losses need, falling back to the identity in a single process without a process
group (tests, one-device runs)."""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


@torch.no_grad()
def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average of `tensor` over ranks (a new tensor; DINO's center)."""
    if not active():
        return tensor.clone()
    out = tensor.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()


@torch.no_grad()
def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if not active():
        return tensor.clone()
    out = tensor.clone()
    dist.all_reduce(out)
    return out


@torch.no_grad()
def all_gather_nograd(tensor: torch.Tensor) -> torch.Tensor:
    """Rows of every rank concatenated in rank order, without gradient (MoCo's keys)."""
    if not active():
        return tensor.detach()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def all_gather_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Rows of every rank concatenated in rank order, with the gradient flowing back to each rank's own rows
    (SimCLR's negatives)."""
    if not active():
        return tensor
    return torch.cat(dist_fn.all_gather(tensor.contiguous()))
