"""Supervised training: cross-entropy with label smoothing and timm's Mixup/CutMix (DRLoc baselines, fine-tuning)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from timm.data import Mixup
from torch import nn

from scale.data.batch import Batch
from scale.errors import UserError
from scale.methods.base import Method, StepContext
from scale.methods.nets import ClassifierNet
from scale.models.heads import LinearClassifier


def check_labels(batch: Batch, num_classes: int) -> torch.Tensor:
    labels = batch.labels
    if labels.dim() != 1 or labels.dtype not in (torch.int64, torch.int32):
        raise UserError(
            f"supervised training needs one class index per image, got labels of shape "
            f"{tuple(labels.shape)} and dtype {labels.dtype}"
        )
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        i = int(bad.nonzero()[0])
        key = batch.keys[i] if i < len(batch.keys) else f"#{i}"
        raise UserError(f"sample {key}: label {int(labels[i])} outside [0, {num_classes}) (data.num_classes)")
    return labels.long()


class Supervised(Method):
    kind = "supervised"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = sc = cfg.method.supervised
        self.num_classes = cfg.data.num_classes
        backbone = backbone_fn()
        self.student = self._build(backbone, LinearClassifier(backbone.embed_dim, self.num_classes))
        self.mixup = (
            Mixup(
                mixup_alpha=sc.mixup,
                cutmix_alpha=sc.cutmix,
                label_smoothing=sc.label_smoothing,
                num_classes=self.num_classes,
            )
            if sc.mixup > 0 or sc.cutmix > 0
            else None
        )

    def _build(self, backbone: nn.Module, head: nn.Module) -> ClassifierNet:
        return ClassifierNet(backbone, head)

    def check_batch(self, batch: Batch) -> None:
        check_labels(batch, self.num_classes)

    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Images and (soft, with Mixup/CutMix) targets."""
        images, labels = batch.crops[0], batch.labels.long()  # checked on the host by check_batch
        if self.mixup is None:
            return images, labels
        if images.shape[0] % 2:
            raise UserError(f"Mixup/CutMix needs an even per-rank batch, got {images.shape[0]}")
        return self.mixup(images.clone(), labels)  # timm mixes in place

    def classification_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if targets.dim() == 2:  # mixed soft targets, already label-smoothed by Mixup
            return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.cfg.label_smoothing)

    def val_logits(self, images: torch.Tensor) -> torch.Tensor:
        return self.student(images)["logits"]

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        images, targets = self.inputs(batch)
        loss = self.classification_loss(self.student(images)["logits"], targets)
        return loss, {"loss": loss.detach()}
