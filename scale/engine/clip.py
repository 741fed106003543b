"""Gradient clipping that sees whole parameters through shards.

Each gradient's squared norm is computed on the local tensor; for DTensor shards the squares are summed over the
mesh dimensions the gradient is sharded on (one all-reduce for all parameters), giving the norm of the full
gradient. Dimensions it is replicated on (HSDP's "replicate") hold the same values and are not summed, so a 2-D mesh
gives the norm of a 1-D one. Two rules:
- per_param (DINO's `clip_gradients`): each parameter's gradient is rescaled to norm <= clip on its own;
- global (torch's `clip_grad_norm_`): all gradients share one factor from the norm over every parameter.
Both use the factor clip / (norm + 1e-6) when it is below 1.
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from scale.engine.params import local

CLIP_MODES = ("per_param", "global")


def grad_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each full gradient, in fp32. The sharded ones are gathered by Python position, not by a list
    index into a tensor: that index is a pageable host-to-device copy, a host sync on CUDA."""
    if not grads:
        return torch.zeros(0)
    sharded = [i for i, g in enumerate(grads) if isinstance(g, DTensor)]
    if len(sharded) not in (0, len(grads)):  # some sharded, some not: the sharded ones summed apart
        norms = list(grad_norms([grads[i] for i in sharded]).unbind())
        plain = sorted(set(range(len(grads))) - set(sharded))
        placed = dict(zip(sharded, norms)) | dict(zip(plain, grad_norms([grads[i] for i in plain]).unbind()))
        return torch.stack([placed[i] for i in range(len(grads))])
    # one launch for every norm (not one per gradient)
    norms = torch.stack(torch._foreach_norm([local(g) for g in grads])).float()
    if not sharded:
        return norms
    squares = norms.pow(2)  # of the local shards: summed over the mesh dimensions the gradients are sharded on
    first = grads[0]  # FSDP2 places every parameter on the same mesh the same way
    for dim, placement in enumerate(first.placements):
        if placement.is_shard():
            dist.all_reduce(squares, group=first.device_mesh.get_group(dim))
    return squares.sqrt()


def clip_gradients(grads: list[torch.Tensor], max_norm: float, mode: str) -> torch.Tensor:
    """Clip in place (max_norm <= 0: no clipping) and return the global gradient norm before clipping, a tensor
    on the gradients' device: the factors stay on the device too, so that the host never waits for the norms."""
    norms = grad_norms(grads)
    total = torch.linalg.vector_norm(norms)  # the norm of the norms: one launch
    if max_norm > 0 and grads:
        locals_ = [local(g) for g in grads]
        if mode == "per_param":  # a factor per gradient (on CUDA one kernel per gradient: eager has no fused form)
            factors = (max_norm / (norms + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(locals_, list(factors.unbind()))
        else:  # one factor on the device for all: one fused launch
            torch._foreach_mul_(locals_, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total
