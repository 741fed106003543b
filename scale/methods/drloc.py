"""DRLoc [Liu et al. 2021]: supervised cross-entropy + lambda * dense relative localization loss.

On the final k x k grid G_x of embeddings (grids larger than `grid` average-pooled to it), m pairs (e_ij, e_ph) are
sampled uniformly per image and a localization MLP f predicts their offset from the concatenated pair:

  Eq. 2 (l1)       targets t = (|i-p|/k, |j-h|/k), loss E|t - f|_1
  Eq. 3 (signed)   targets t' = ((i-p)/k, (j-h)/k), same L1
  Eq. 5 (ce)       classes c = (i-p, j-h) in {-k..k} (2k+1 each), loss E[-log p_u[c_u] - log p_v[c_v]]
  Eq. 6 (gaussian) mu, sigma^2 of the class posteriors, loss E[(c-mu)^2/sigma^2 + alpha log sigma] over u and v
  Eq. 7 (every_block) Eq. 2 on the grid of every block, one MLP per block, summed over blocks
  Eq. 8 (exhaustive) every e_ij once, each with a random partner (m = k^2)

Reductions: |.|_1 sums over (u, v) as in Eq. 2; pairs and images are averaged (the paper sums over the images of
the batch; the official pseudocode averages, which keeps lambda independent of the batch size).
`normalize_targets=False` reproduces the official code's raw integer offsets for l1/signed.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale.data.batch import Batch
from scale.errors import UserError
from scale.methods.base import StepContext
from scale.methods.nets import ClassifierNet, DrlocHeads, block_dims
from scale.methods.supervised import Supervised
from scale.models.heads import DrlocHead

MODES = ("l1", "signed", "ce", "gaussian")


def pool_grid(grid: torch.Tensor, k: int) -> torch.Tensor:
    """[B, D, h, w] -> average-pooled to k x k when larger (DRLoc pools 14 x 14 grids to 7 x 7)."""
    if grid.shape[-2] > k or grid.shape[-1] > k:
        return F.adaptive_avg_pool2d(grid, (min(k, grid.shape[-2]), min(k, grid.shape[-1])))
    return grid


def sample_positions(batch: int, k: int, m: int, exhaustive: bool, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(pos1, pos2) [B, m, 2] integer (row, col) on a k x k grid; uniform with replacement, or (exhaustive) pos1
    enumerating the k^2 cells in row-major order with uniform partners."""
    if exhaustive:
        cells = torch.stack(
            torch.meshgrid(torch.arange(k, device=device), torch.arange(k, device=device), indexing="ij"), dim=-1
        ).reshape(1, k * k, 2)
        pos1 = cells.expand(batch, -1, -1)
        pos2 = torch.randint(k, (batch, k * k, 2), device=device)
        return pos1, pos2
    return torch.randint(k, (batch, m, 2), device=device), torch.randint(k, (batch, m, 2), device=device)


def gather_pairs(grid: torch.Tensor, pos1: torch.Tensor, pos2: torch.Tensor) -> torch.Tensor:
    """grid [B, D, k, k], positions [B, m, 2] -> concatenated pair features [B, m, 2D]."""
    b, d, _, w = grid.shape
    flat = grid.flatten(2).transpose(1, 2)  # [B, k*k, D]

    def take(pos):
        index = (pos[..., 0] * w + pos[..., 1]).unsqueeze(-1).expand(-1, -1, d)
        return flat.gather(1, index)

    return torch.cat([take(pos1), take(pos2)], dim=-1)


def targets(pos1: torch.Tensor, pos2: torch.Tensor, k: int, mode: str, normalize: bool = True) -> torch.Tensor:
    """[B, m, 2] regression targets (l1: |delta|/k, signed: delta/k; raw offsets without `normalize`) or class
    indices c + k in [0, 2k] (ce, gaussian; k is then the classes' half-width), delta = pos1 - pos2 = (i-p, j-h)."""
    delta = pos1 - pos2
    if mode in ("ce", "gaussian"):
        return delta + k
    value = delta.abs().float() if mode == "l1" else delta.float()
    return value / k if normalize else value


def localization_loss(pred: torch.Tensor, target: torch.Tensor, k: int, mode: str, alpha: float = 1e-3) -> torch.Tensor:
    """pred [B, m, 2] (l1, signed) or [B, m, 2, 2k+1] logits (ce, gaussian); target from `targets`."""
    if mode in ("l1", "signed"):
        return (pred.float() - target).abs().sum(-1).mean()
    log_p = F.log_softmax(pred.float(), dim=-1)
    if mode == "ce":
        return -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1).sum(-1).mean()
    classes = torch.arange(-k, k + 1, device=pred.device, dtype=torch.float32)
    p = log_p.exp()
    mu = (p * classes).sum(-1)
    var = (p * (classes - mu.unsqueeze(-1)) ** 2).sum(-1).clamp_min(1e-6)
    c = (target - k).float()
    return ((c - mu) ** 2 / var + alpha * 0.5 * torch.log(var)).sum(-1).mean()


class Drloc(Supervised):
    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.drloc = dc = cfg.method.drloc
        if dc.mode not in MODES:
            raise UserError(f"method.drloc.mode: expected one of {', '.join(MODES)}, got '{dc.mode}'")
        if dc.every_block and dc.mode not in ("l1", "signed"):
            raise UserError("method.drloc.every_block is Eq. 7, an L1 loss: use mode l1 (or signed)")
        super().__init__(cfg, steps_per_epoch, total_steps, backbone_fn)

    def _build(self, backbone: nn.Module, head: nn.Module) -> ClassifierNet:
        dc = self.drloc
        classes = 2 * dc.grid + 1 if dc.mode in ("ce", "gaussian") else None
        dims = block_dims(backbone) if dc.every_block else [backbone.token_dim]
        heads = DrlocHeads([DrlocHead(d, dc.hidden_dim, classes) for d in dims])
        return ClassifierNet(backbone, head, heads, dc.every_block)

    def sampler(self, grids: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple]]:
        """Pairs on each grid (the final grid pooled to `grid`; every-block grids at their own size)."""
        dc = self.drloc
        pairs, positions = [], []
        for grid in grids:
            if not dc.every_block:
                grid = pool_grid(grid, dc.grid)
            if grid.shape[-2] != grid.shape[-1]:
                raise UserError(f"DRLoc needs a square token grid, got {tuple(grid.shape[-2:])}")
            k = grid.shape[-1]
            pos1, pos2 = sample_positions(grid.shape[0], k, dc.pairs, dc.exhaustive, grid.device)
            pairs.append(gather_pairs(grid, pos1, pos2))
            positions.append((pos1, pos2, k))
        return pairs, positions

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        dc = self.drloc
        images, labels = self.inputs(batch)
        out = self.student(images, drloc_sampler=self.sampler)
        ce = self.classification_loss(out["logits"], labels)
        terms = []
        for pred, (pos1, pos2, k) in zip(out["drloc"], out["drloc_positions"]):
            # the class heads have 2 * grid + 1 outputs; a smaller (pooled) grid uses the central classes
            scale = dc.grid if dc.mode in ("ce", "gaussian") else k
            target = targets(pos1, pos2, scale, dc.mode, dc.normalize_targets)
            terms.append(localization_loss(pred, target, scale, dc.mode, dc.gaussian_alpha))
        loc = torch.stack(terms).sum()
        loss = ce + dc.weight * loc
        return loss, {"loss": loss.detach(), "ce_loss": ce.detach(), "drloc_loss": loc.detach()}
