"""DRLoc [Liu et al. 2021]: supervised cross-entropy + lambda * dense relative localization loss.

On the final k x k grid G_x of embeddings (grids larger than `grid` average-pooled to it), m pairs (e_ij, e_ph) are
sampled uniformly per image and a localization MLP f predicts their offset from the concatenated pair:

  Eq. 2 (l1)       targets t = (|i-p|/k, |j-h|/k), loss E|t - f|_1
  Eq. 3 (signed)   targets t' = ((i-p)/k, (j-h)/k), same L1
  Eq. 5 (ce)       classes c = (i-p, j-h) in {-k..k} (2k+1 each), loss E[-log p_u[c_u] - log p_v[c_v]]
  Eq. 6 (gaussian) mu, sigma^2 of the class posteriors, loss E[(c-mu)^2/sigma^2 + alpha log sigma] over u and v
  Eq. 7 (every_block) Eq. 2 on the grid of every block, one MLP per block, summed over blocks
  Eq. 8 (exhaustive) every e_ij once, each with a random partner (m = k^2)

Pairs and images are averaged (the paper sums over the images of the batch; the official code averages, which keeps
lambda independent of the batch size). The official code (yhlleo/VTs-Drloc), which produced the tables, departs
from these equations; method.drloc's switches select either (defaults: the official code, see DrlocConfig):
raw integer offsets (`normalize_targets`), |delta| classes (`use_abs`), L1 averaged over (u, v) (`l1_reduction`),
alpha log sigma^2 (`gaussian_log`), a 3x3/2 pooling (`pool`), lambda ramped over epochs (`weight_schedule`) and an
extra Linear in the class head (`class_head_extra_linear`).
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


def pool_grid(grid: torch.Tensor, k: int, pool: str = "avg2x2") -> torch.Tensor:
    """[B, D, h, w] -> average-pooled towards k x k when larger: avg2x2 (the paper: 14 x 14 to 7 x 7 by 2 x 2
    pooling, adaptive for other sizes) or avg3x3s2 (official: AvgPool2d(3, 2, padding 1, count_include_pad False),
    repeated while the grid is larger than k)."""
    if pool == "avg3x3s2":
        # NCHW: token_grid's view is channels-last, and torch's CUDA avg_pool2d backward of a channels-last input
        # with padding maps pixels to the wrong windows (pytorch#188344, fixed in PR #188345 after torch 2.11;
        # found by the device check's fp32 experiment, issue 46: DRLoc's pos_embed gradient off by 3e-3)
        grid = grid.contiguous()
        while grid.shape[-2] > k or grid.shape[-1] > k:
            grid = F.avg_pool2d(grid, 3, stride=2, padding=1, count_include_pad=False)
        return grid
    if grid.shape[-2] > k or grid.shape[-1] > k:
        return F.adaptive_avg_pool2d(grid, (min(k, grid.shape[-2]), min(k, grid.shape[-1])))
    return grid


def lambda_at(cfg, epoch: int) -> float:
    """lambda at this (0-based) epoch: constant (the paper) or the official ramp (main.py `_weight_decay`):
    lambda * min(epoch / warmup, 1) up to the warmup, then lambda * (1 - (epoch - warmup) / (total - warmup))."""
    if cfg.weight_schedule == "constant":
        return float(cfg.weight)
    warmup, total = cfg.weight_warmup_epochs, cfg.weight_total_epochs
    if epoch <= warmup:
        return float(cfg.weight) * (min(epoch / warmup, 1.0) if warmup > 0 else 1.0)
    return float(cfg.weight) * (1.0 - (epoch - warmup) / (total - warmup))


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


def targets(
    pos1: torch.Tensor, pos2: torch.Tensor, k: int, mode: str, normalize: bool = True, use_abs: bool = False
) -> torch.Tensor:
    """[B, m, 2] regression targets (l1: |delta|/k, signed: delta/k; raw offsets without `normalize`) or class
    indices (ce, gaussian): c + k in [0, 2k] (Eq. 4; k is then the classes' half-width), or with `use_abs` |c| in
    [0, k) (the official --use_abs), delta = pos1 - pos2 = (i-p, j-h)."""
    delta = pos1 - pos2
    if mode in ("ce", "gaussian"):
        return delta.abs() if use_abs else delta + k
    value = delta.abs().float() if mode == "l1" else delta.float()
    return value / k if normalize else value


def localization_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    k: int,
    mode: str,
    alpha: float = 1e-3,
    l1_reduction: str = "sum",
    gaussian_log: str = "sigma",
    use_abs: bool = False,
) -> torch.Tensor:
    """pred [B, m, 2] (l1, signed) or [B, m, 2, C] logits (ce, gaussian; C = 2k+1, or k with `use_abs`); target
    from `targets`. Defaults are the paper's equations; DrlocConfig's defaults the official code's."""
    if mode in ("l1", "signed"):
        error = (pred.float() - target).abs()
        return error.sum(-1).mean() if l1_reduction == "sum" else error.mean()
    log_p = F.log_softmax(pred.float(), dim=-1)
    if mode == "ce":
        return -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1).sum(-1).mean()
    first = 0 if use_abs else -k
    classes = torch.arange(first, first + pred.shape[-1], device=pred.device, dtype=torch.float32)
    p = log_p.exp()
    mu = (p * classes).sum(-1)
    var = (p * (classes - mu.unsqueeze(-1)) ** 2).sum(-1) + 1e-8  # the official EPSILON
    c = (target + first).float()
    log_term = torch.log(var) if gaussian_log == "variance" else 0.5 * torch.log(var)
    return ((c - mu) ** 2 / var + alpha * log_term).sum(-1).mean()


class Drloc(Supervised):
    kind = "drloc"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.drloc = dc = cfg.method.drloc
        if dc.every_block and dc.mode not in ("l1", "signed"):
            raise UserError("method.drloc.every_block is Eq. 7, an L1 loss: use mode l1 (or signed)")
        if dc.weight_schedule == "ramp" and dc.weight_total_epochs <= dc.weight_warmup_epochs:
            raise UserError("method.drloc.weight_total_epochs must exceed weight_warmup_epochs (the ramp's end)")
        super().__init__(cfg, steps_per_epoch, total_steps, backbone_fn)

    def _build(self, backbone: nn.Module, head: nn.Module) -> ClassifierNet:
        dc = self.drloc
        classes = (dc.grid if dc.use_abs else 2 * dc.grid + 1) if dc.mode in ("ce", "gaussian") else None
        dims = block_dims(backbone) if dc.every_block else [backbone.token_dim]
        heads = DrlocHeads([DrlocHead(d, dc.hidden_dim, classes, dc.class_head_extra_linear) for d in dims])
        return ClassifierNet(backbone, head, heads, dc.every_block)

    def sampler(self, grids: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple]]:
        """Pairs on each grid (the final grid pooled to `grid`; every-block grids at their own size)."""
        dc = self.drloc
        pairs, positions = [], []
        for grid in grids:
            if not dc.every_block:
                grid = pool_grid(grid, dc.grid, dc.pool)
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
            target = targets(pos1, pos2, scale, dc.mode, dc.normalize_targets, dc.use_abs)
            terms.append(
                localization_loss(
                    pred, target, scale, dc.mode, dc.gaussian_alpha, dc.l1_reduction, dc.gaussian_log, dc.use_abs
                )
            )
        loc = torch.stack(terms).sum()
        loss = ce + lambda_at(dc, ctx.epoch) * loc
        return loss, {"loss": loss.detach(), "ce_loss": ce.detach(), "drloc_loss": loc.detach()}
