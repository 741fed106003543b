"""Sinkhorn-Knopp equipartition of SwAV (also DINO Table 7 rows 3 and 9), over the global batch."""

import torch

from scale.methods import distributed


@torch.no_grad()
def sinkhorn_knopp(
    scores: torch.Tensor, epsilon: float, iterations: int = 3, group: distributed.Group = None
) -> torch.Tensor:
    """scores [N, K] (this rank's rows) -> assignments [N, K] whose rows sum to 1 and whose columns are (nearly)
    equally used over the whole batch of all ranks: Q = diag(u) exp(scores / eps) diag(v) with alternating row /
    column normalisation. `group`: the data-parallel group whose ranks hold the rest of the batch."""
    logits = scores.float() / epsilon
    peak = distributed.all_reduce_max(logits.max(), group)  # one shift for all ranks: the normalisation is unchanged
    q = torch.exp(logits - peak).t()  # [K, N]
    num_prototypes = q.shape[0]
    total_rows = q.shape[1] * distributed.world_size(group)
    q /= distributed.all_reduce_sum(q.sum(), group)
    for _ in range(iterations):
        q /= distributed.all_reduce_sum(q.sum(dim=1, keepdim=True), group)  # each prototype gets mass 1/K
        q /= num_prototypes
        q /= q.sum(dim=0, keepdim=True)  # each sample gets mass 1/N
        q /= total_rows
    return (q * total_rows).t()
