"""End-to-end fine-tuning from an exported backbone, DeiT recipe (MoCo v3 Table 5, DINO Table 6).

The backbone (with drop path) gets a new Linear head on its pooled feature (ViT class token, Swin average pool);
everything trains: AdamW (no weight decay on biases and 1-D parameters), lr scaled by global batch / 512, linear
warmup then cosine per step (timm's scheduler), timm RandAugment + random erasing views, timm mixup/cutmix with
label smoothing and a soft-target cross-entropy. DDP across ranks; bf16 autocast on GPUs, fp32 on the CPU.
"""

import copy
import logging
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.data import Mixup
from timm.layers import trunc_normal_
from timm.loss import SoftTargetCrossEntropy
from timm.optim import param_groups_weight_decay
from safetensors.torch import save_file
from timm.scheduler import CosineLRScheduler

from scale.data.loader import build_loader
from scale.errors import NonFiniteLoss, UserError
from scale.eval.data import dataset_info, eval_views_cfg
from scale.eval.weights import load_backbone

log = logging.getLogger(__name__)


class Classifier(nn.Module):
    def __init__(self, backbone: nn.Module, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dim, num_classes)
        trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images)["pooled"])


def train_views_cfg(views_cfg):
    """DeiT's training view: RandomResizedCrop(eval_crop, 0.08-1, bicubic), flip, RandAugment, random erasing."""
    cfg = eval_views_cfg(views_cfg, "supervised")
    cfg.global_size, cfg.global_scale, cfg.interpolation = cfg.eval_crop, [0.08, 1.0], "bicubic"
    return cfg


def build_mixup(cfg, num_classes: int) -> Mixup | None:
    if cfg.finetune_mixup <= 0 and cfg.finetune_cutmix <= 0:
        return None
    return Mixup(mixup_alpha=float(cfg.finetune_mixup), cutmix_alpha=float(cfg.finetune_cutmix),
                 label_smoothing=float(cfg.finetune_label_smoothing), num_classes=num_classes)


def loss_fn(cfg, mixup: Mixup | None):
    if mixup is not None:
        return SoftTargetCrossEntropy()
    return nn.CrossEntropyLoss(label_smoothing=float(cfg.finetune_label_smoothing))


@torch.no_grad()
def evaluate(model: nn.Module, batches, device: torch.device, autocast) -> dict:
    """Top-1/top-5 (%) over every sample of the batches of all ranks."""
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches:
        labels = batch.labels.to(device)
        with autocast():
            logits = model(batch.crops[0].to(device, non_blocking=True)).float()
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        counts += torch.tensor([(top[:, 0] == labels).sum(), (top == labels[:, None]).any(1).sum(), labels.numel()],
                               dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(counts)
    if counts[2] == 0:
        raise UserError("fine-tuning: the validation split has no samples")
    return {"top1": 100.0 * float(counts[0] / counts[2]), "top5": 100.0 * float(counts[1] / counts[2])}


def run(session, save: str | None = None) -> dict:
    """Fine-tune on data.train, evaluate on data.val after every epoch; returns the final and best accuracy."""
    cfg, ecfg, device, info = session.cfg, session.cfg.eval, session.device, session.info
    data = dataset_info(cfg.data.train)
    if data["label_kind"] != "single":
        raise UserError(f"fine-tuning needs single-label data; {cfg.data.train} is {data['label_kind']}")
    num_classes = len(data["classes"])
    if int(ecfg.finetune_epochs) < 1:
        raise UserError(f"eval.finetune_epochs must be at least 1, got {ecfg.finetune_epochs}")
    torch.manual_seed(cfg.train.seed)  # the same head (and random-init backbone) on every rank
    backbone = load_backbone(cfg.model, session.weights, device, drop_path=float(ecfg.finetune_drop_path),
                             frozen=False)
    model = Classifier(backbone, num_classes).to(device)
    global_batch = int(ecfg.batch_size) * info.world_size
    data_cfg = copy.deepcopy(cfg.data)
    data_cfg.mode = "epochs"
    loader = build_loader(data_cfg, "train", global_batch, info.rank, info.world_size, cfg.train.seed,
                          views_cfg=train_views_cfg(cfg.data.views))
    mixup = build_mixup(ecfg, num_classes)
    if mixup is not None and int(ecfg.batch_size) % 2:
        raise UserError(f"mixup/cutmix pair images within a batch: eval.batch_size ({ecfg.batch_size}) must be even")
    criterion = loss_fn(ecfg, mixup)
    lr = float(ecfg.finetune_lr) * global_batch / 512
    optimizer = torch.optim.AdamW(param_groups_weight_decay(model, float(ecfg.finetune_weight_decay)), lr=lr)
    steps_per_epoch = len(loader)
    total_steps = int(ecfg.finetune_epochs) * steps_per_epoch
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps, lr_min=float(ecfg.finetune_min_lr),
                                  warmup_t=int(ecfg.finetune_warmup_epochs) * steps_per_epoch,
                                  warmup_lr_init=float(ecfg.finetune_warmup_lr), t_in_epochs=False)
    wrapped = model
    if info.world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    history, step = [], 0
    for epoch in range(int(ecfg.finetune_epochs)):
        wrapped.train()
        losses = []
        for batch in loader:
            images, labels = batch.crops[0].to(device, non_blocking=True), batch.labels.to(device)
            if mixup is not None:
                images, labels = mixup(images, labels)
            with autocast():
                loss = criterion(wrapped(images).float(), labels)
            value = float(loss.detach())
            if not math.isfinite(value):
                raise NonFiniteLoss(f"fine-tuning loss is {value} at step {step} (epoch {epoch})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if ecfg.finetune_clip_grad:
                nn.utils.clip_grad_norm_(model.parameters(), float(ecfg.finetune_clip_grad))
            optimizer.step()
            step += 1
            scheduler.step_update(step)
            losses.append(value)
        accuracy = evaluate(model, session.batches(cfg.data.val), device, autocast)
        history.append({"epoch": epoch + 1, "loss": sum(losses) / max(1, len(losses)), **accuracy})
        log.info("fine-tuning epoch %d/%d: loss %.4f, val top-1 %.2f", epoch + 1, ecfg.finetune_epochs,
                 history[-1]["loss"], accuracy["top1"])
    if save and info.is_main:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, save)
    return {"eval": "finetune", **session.describe(), "train": cfg.data.train, "val": cfg.data.val,
            "epochs": int(ecfg.finetune_epochs), "global_batch": global_batch, "lr": lr,
            "drop_path": float(ecfg.finetune_drop_path), "mixup": float(ecfg.finetune_mixup),
            "cutmix": float(ecfg.finetune_cutmix), "history": history, "top1": history[-1]["top1"],
            "top5": history[-1]["top5"], "best_top1": max(h["top1"] for h in history), "saved": save}
