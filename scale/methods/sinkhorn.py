"""Sinkhorn-Knopp equipartition of SwAV (also DINO Table 7 rows 3 and 9), over the global batch."""

import torch
import torch.distributed as dist

from scale.methods import distributed


@torch.no_grad()
def sinkhorn_knopp(scores: torch.Tensor, epsilon: float, iterations: int = 3) -> torch.Tensor:
    """scores [N, K] (this rank's rows) -> assignments [N, K] whose rows sum to 1 and whose columns are (nearly)
    equally used over the whole batch of all ranks: Q = diag(u) exp(scores / eps) diag(v) with alternating row /
    column normalisation."""
    logits = scores.float() / epsilon
    peak = logits.max()
    if distributed.active():  # one shift for all ranks so that the global normalisation is unchanged
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    q = torch.exp(logits - peak).t()  # [K, N]
    num_prototypes = q.shape[0]
    total_rows = q.shape[1] * distributed.world_size()
    q /= distributed.all_reduce_sum(q.sum())
    for _ in range(iterations):
        q /= distributed.all_reduce_sum(q.sum(dim=1, keepdim=True))  # each prototype gets mass 1/K
        q /= num_prototypes
        q /= q.sum(dim=0, keepdim=True)  # each sample gets mass 1/N
        q /= total_rows
    return (q * total_rows).t()
