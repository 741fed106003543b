"""Weighted k-NN on L2-normalised features (Wu et al. 2018, as in DINO's eval_knn.py) and the gather of rows that
differ in count over ranks: the math the k-NN monitor (scale/loop/knn_monitor.py) shares with `scale eval knn`
(scale/eval/knn.py). Below both: the loop and eval/ never import each other."""

import torch
import torch.distributed as dist


def nearest(
    queries: torch.Tensor, bank: torch.Tensor, k: int, bank_chunk: int = 65536
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k cosine similarities and bank indices of each query ([Q, k] each, best first); inputs are normalised."""
    k = min(k, bank.shape[0])
    best_sim = best_idx = None
    for start in range(0, bank.shape[0], bank_chunk):
        block = bank[start : start + bank_chunk].to(queries.device, queries.dtype, non_blocking=True)
        sim, idx = (queries @ block.T).topk(min(k, block.shape[0]), dim=1)
        idx += start
        if best_sim is not None:
            sim, idx = torch.cat([best_sim, sim], 1), torch.cat([best_idx, idx], 1)
            sim, order = sim.topk(min(k, sim.shape[1]), dim=1)
            idx = idx.gather(1, order)
        best_sim, best_idx = sim, idx
    return best_sim, best_idx


def vote(sim: torch.Tensor, neighbour_labels: torch.Tensor, num_classes: int, temperature: float) -> torch.Tensor:
    """Class scores [Q, C]: the sum over neighbours of one-hot(label) * exp(sim / T)."""
    scores = torch.zeros(sim.shape[0], num_classes, device=sim.device, dtype=sim.dtype)
    return scores.scatter_add_(1, neighbour_labels, (sim / temperature).exp())


def gather_rows(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate along dim 0 the tensors of all ranks of `group` (in rank order; None: every rank, as the eval
    commands run); ranks may hold different row counts."""
    if not dist.is_initialized():
        return tensor
    group = group or dist.group.WORLD
    size = dist.get_world_size(group)
    if size == 1:
        return tensor
    counts = torch.tensor([tensor.shape[0]], device=tensor.device)
    all_counts = [torch.zeros_like(counts) for _ in range(size)]
    dist.all_gather(all_counts, counts, group=group)
    longest = int(max(c.item() for c in all_counts))
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[: int(c.item())] for p, c in zip(parts, all_counts)])
