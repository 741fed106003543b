"""Linear probe on a frozen backbone with a grid of learning rates trained at once (DINO eval_linear.py, extended).

One Linear head per learning rate, all fed the same features, so one backbone forward per batch serves the whole
grid. Every head starts from the same initial weights (N(0, 0.01), bias 0, drawn from `seed`) and has its own SGD
param group (momentum 0.9, no weight decay, cosine to 0 per epoch), so head i trains exactly as a probe run alone
with lr i would. The heads' losses are summed: their parameters are disjoint, so each gets its own gradient.

A validation split is carved from the training set by sample key (a stable hash, so the same samples on every rank
and run); the head with the best validation accuracy is chosen and its test accuracy reported.
"""

import copy
import logging
import math
import zlib
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from scale.data.batch import Batch
from scale.data.evaluation import dataset_info, eval_views_cfg
from scale.data.factory import build_loader
from scale.data.spec import LoaderSpec
from scale.errors import UserError
from scale.eval.features import FeatureFn, last_blocks, pooled, world

log = logging.getLogger(__name__)

FeatureBatch = tuple[torch.Tensor, torch.Tensor, list[str]]  # features [B, D], labels [B], keys


class LinearHeads(nn.Module):
    def __init__(self, dim: int, num_classes: int, count: int, seed: int = 0):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(count))
        generator = torch.Generator().manual_seed(seed)
        weight = torch.empty(num_classes, dim).normal_(0.0, 0.01, generator=generator)
        with torch.no_grad():
            for head in self.heads:
                head.weight.copy_(weight)
                head.bias.zero_()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits of every head: [H, B, C]."""
        return torch.stack([head(features) for head in self.heads])


def build_optimizer(heads: LinearHeads, lrs: list[float]) -> torch.optim.SGD:
    groups = [{"params": list(head.parameters()), "lr": lr} for head, lr in zip(heads.heads, lrs)]
    return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9, weight_decay=0.0)


def in_val_split(key: str, fraction: float, seed: int = 0) -> bool:
    """Whether a training sample belongs to the held-out validation split: a stable hash of its key."""
    return zlib.crc32(f"{seed}/{key}".encode()) < fraction * 2**32


def val_mask(keys: list[str], fraction: float, seed: int, device) -> torch.Tensor:
    return torch.tensor([in_val_split(k, fraction, seed) for k in keys], dtype=torch.bool, device=device)


def backbone_features(
    backbone: nn.Module, feature_fn: FeatureFn, batches: Iterable[Batch], device: torch.device
) -> Iterator[FeatureBatch]:
    """Frozen features of every batch (one view per image)."""
    for batch in batches:
        with torch.no_grad():
            feats = feature_fn(backbone, batch.crops[0].to(device, non_blocking=True)).float()
        yield feats, batch.labels.to(device), list(batch.keys)


def _global_count(rows: int, device) -> int:
    """Training rows of this step over all ranks (the loss is normalised by it, as one process would)."""
    return int(_global_sum(float(rows), device))


def _global_sum(value: float, device) -> float:
    """Sum of a per-rank float over ranks (each rank's loss is its share of the global step loss)."""
    packed = torch.tensor([value], dtype=torch.float64, device=device)
    if world()[1] > 1:
        dist.all_reduce(packed)
    return float(packed.item())


def _sum_grads(heads: nn.Module) -> None:
    if world()[1] > 1:
        for param in heads.parameters():
            dist.all_reduce(param.grad)


def train_epoch(
    heads: LinearHeads,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[FeatureBatch],
    val_fraction: float,
    seed: int,
) -> float:
    """One epoch over the training batches, skipping the validation split; returns the mean loss over heads.

    Each rank sums its rows' losses and the sum is divided by the step's row count over all ranks, so the summed
    gradients equal those of one process holding the whole global batch. Under torch.distributed every rank must
    yield the same number of batches (the training loader guarantees it).
    """
    heads.train()
    total, steps = 0.0, 0
    for feats, labels, keys in batches:
        train_rows = ~val_mask(keys, val_fraction, seed, labels.device)
        logits = heads(feats[train_rows])
        target = labels[train_rows]
        rows = _global_count(target.numel(), labels.device)
        # a rank whose rows are all validation still joins the gradient all-reduce, with zero gradients
        loss = sum(F.cross_entropy(head_logits, target, reduction="sum") for head_logits in logits) / max(1, rows)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        _sum_grads(heads)
        optimizer.step()
        total += float(loss.detach()) / len(heads.heads)
        steps += 1
    return _global_sum(total, next(heads.parameters()).device) / max(1, steps)


@torch.no_grad()
def evaluate(
    heads: LinearHeads, batches: Iterable[FeatureBatch], select: Callable[[list[str]], torch.Tensor] | None = None
) -> dict:
    """Top-1/top-5 (%) of every head on the selected rows of the batches, summed over ranks."""
    heads.eval()
    counts, seen = None, 0
    for feats, labels, keys in batches:
        if select is not None:
            rows = select(keys)
            feats, labels = feats[rows], labels[rows]
        logits = heads(feats)  # [H, B, C]
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hits = top == labels[None, :, None]
        batch_counts = torch.stack([hits[..., 0].sum(1), hits.any(-1).sum(1)], 1).double()  # [H, 2]
        counts = batch_counts if counts is None else counts + batch_counts
        seen += labels.numel()
    return _reduce_counts(counts, len(heads.heads), seen, next(heads.parameters()).device)


def _reduce_counts(counts: torch.Tensor | None, num_heads: int, seen: int, device: torch.device) -> dict:
    packed = torch.zeros(num_heads * 2 + 1, dtype=torch.float64, device=device)
    if counts is not None:
        packed[:-1] = counts.flatten()
    packed[-1] = seen
    if world()[1] > 1:
        dist.all_reduce(packed)
    total = float(packed[-1])
    if total == 0:
        raise UserError("linear probe: an evaluation split has no samples")
    per_head = packed[:-1].view(num_heads, 2) * 100.0 / total
    return {"top1": per_head[:, 0].tolist(), "top5": per_head[:, 1].tolist(), "samples": int(total)}


def check_lrs(lrs: list[float]) -> None:
    if not lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise UserError(f"eval.linear_lrs must be a non-empty list of positive learning rates, got {list(lrs)}")


def run_probe(
    heads: LinearHeads,
    lrs: list[float],
    epochs: int,
    train_batches: Callable[[int], Iterable[FeatureBatch]],
    val_batches: Callable[[], Iterable[FeatureBatch]],
    test_batches: Callable[[], Iterable[FeatureBatch]],
    val_fraction: float,
    seed: int = 0,
    on_epoch: Callable[[int, float], None] | None = None,
) -> dict:
    """Train every head, pick the best on the validation split, report its test accuracy.

    `train_batches(epoch)` yields augmented training features; `val_batches()` the training set with eval views
    (only the validation rows are scored); `test_batches()` the test set.
    """
    check_lrs(lrs)
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"eval.linear_val_fraction must be in (0, 1), got {val_fraction}")
    optimizer = build_optimizer(heads, lrs)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, epochs), eta_min=0.0)
    losses = []
    for epoch in range(epochs):
        losses.append(train_epoch(heads, optimizer, train_batches(epoch), val_fraction, seed))
        scheduler.step()
        if on_epoch is not None:
            on_epoch(epoch, losses[-1])
    device = next(heads.parameters()).device
    val = evaluate(heads, val_batches(), select=lambda keys: val_mask(keys, val_fraction, seed, device))
    test = evaluate(heads, test_batches())
    best = max(range(len(lrs)), key=lambda i: (val["top1"][i], -i))  # ties: the lr listed first
    return {
        "lrs": list(lrs),
        "best_lr": lrs[best],
        "best_index": best,
        "val_top1": val["top1"],
        "val_samples": val["samples"],
        "test_top1_all": test["top1"],
        "test_top5_all": test["top5"],
        "test_samples": test["samples"],
        "top1": test["top1"][best],
        "top5": test["top5"][best],
        "train_loss": losses,
    }


def probe_train_views(views_cfg):
    """DINO's linear-probe training view: RandomResizedCrop(eval_crop, scale 0.08-1, bilinear) and a flip only."""
    cfg = eval_views_cfg(views_cfg, "supervised")
    cfg.global_size, cfg.global_scale, cfg.interpolation = cfg.eval_crop, [0.08, 1.0], "bilinear"
    cfg.flip_p, cfg.color_jitter, cfg.auto_augment, cfg.random_erase_p = 0.5, [0.0, 0.0, 0.0, 0.0], "", 0.0
    return cfg


def probe_feature(eval_cfg) -> FeatureFn:
    """The protocol's feature (eval.linear_feature): the last blocks' (DINO, EsViT) or the final pooled one
    (MoCo v3's main_lincls.py; every official ResNet-50 probe)."""
    if eval_cfg.linear_feature == "pooled":
        return pooled
    if eval_cfg.linear_feature == "last_blocks":
        return last_blocks(int(eval_cfg.linear_n_last_blocks), bool(eval_cfg.linear_avgpool))
    raise UserError(f"eval.linear_feature: expected last_blocks or pooled, got '{eval_cfg.linear_feature}'")


def probe_batch(eval_cfg, world_size: int) -> int:
    """The probe's global batch: eval.linear_batch (MoCo v3: 4096), or eval.batch_size on every rank (DINO)."""
    if not eval_cfg.linear_batch:
        return int(eval_cfg.batch_size) * world_size
    if eval_cfg.linear_batch % world_size:
        raise UserError(f"eval.linear_batch {eval_cfg.linear_batch} does not split over {world_size} ranks")
    return int(eval_cfg.linear_batch)


def run(session) -> dict:
    """Train the lr grid on data.train (minus the validation split), choose on it, report on data.val."""
    cfg, device = session.cfg, session.device
    info = dataset_info(cfg.data.train)
    if info["label_kind"] != "single":
        raise UserError(f"linear probe needs single-label data; {cfg.data.train} is {info['label_kind']}")
    feature_fn = probe_feature(cfg.eval)
    with torch.no_grad():
        probe = torch.zeros(1, 3, cfg.data.views.eval_crop, cfg.data.views.eval_crop, device=device)
        dim = feature_fn(session.backbone, probe).shape[1]
    base_lrs = [float(lr) for lr in cfg.eval.linear_lrs]
    check_lrs(base_lrs)
    global_batch = probe_batch(cfg.eval, session.info.world_size)
    lrs = [lr * global_batch / 256 for lr in base_lrs]
    heads = LinearHeads(dim, len(info["classes"]), len(lrs), seed=cfg.train.seed).to(device)
    data_cfg = copy.deepcopy(cfg.data)
    data_cfg.mode = "epochs"
    loader = build_loader(
        LoaderSpec(
            data_cfg,
            "train",
            global_batch,
            session.info.rank,
            session.info.world_size,
            cfg.train.seed,
            views=probe_train_views(cfg.data.views),
        )
    )

    def log_epoch(epoch: int, loss: float) -> None:
        log.info("linear probe epoch %d/%d: mean loss over heads %.4f", epoch + 1, cfg.eval.linear_epochs, loss)

    result = run_probe(
        heads,
        lrs,
        int(cfg.eval.linear_epochs),
        train_batches=lambda epoch: backbone_features(session.backbone, feature_fn, loader, device),
        val_batches=lambda: backbone_features(session.backbone, feature_fn, session.batches(cfg.data.train), device),
        test_batches=lambda: backbone_features(session.backbone, feature_fn, session.batches(cfg.data.val), device),
        val_fraction=float(cfg.eval.linear_val_fraction),
        seed=cfg.train.seed,
        on_epoch=log_epoch,
    )
    return {
        "eval": "linear",
        **session.describe(),
        "train": cfg.data.train,
        "val": cfg.data.val,
        "feature": str(cfg.eval.linear_feature),
        "n_last_blocks": int(cfg.eval.linear_n_last_blocks),
        "avgpool": bool(cfg.eval.linear_avgpool),
        "feature_dim": int(dim),
        "epochs": int(cfg.eval.linear_epochs),
        "global_batch": global_batch,
        "base_lrs": base_lrs,
        "best_base_lr": base_lrs[result["best_index"]],
        **result,
    }
