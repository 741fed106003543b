"""DINO [Caron et al. 2021]: self-distillation of a momentum teacher into a student over multi-crop views.

Loss = mean over the pairs (teacher global view i, student view v != i) of
    H(P_t^i, P_s^v) = -sum_k softmax((t_i - c) / T_t)_k * log_softmax(s_v / T_s)_k      (paper Eq. 1-3)
with the center c an EMA (0.9) of the teacher outputs of the global batch. The variants of Table 7 (no momentum,
Sinkhorn-Knopp, no multi-crop through the views config, MSE, predictor) are options of `DinoConfig`.
"""

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale import schedules
from scale.data.batch import Batch
from scale.methods import distributed
from scale.methods.base import Method, StepContext
from scale.methods.nets import MultiCropNet, init_teacher
from scale.methods.sinkhorn import sinkhorn_knopp
from scale.models.heads import DinoHead

BackboneFn = Callable[..., nn.Module]  # backbone_fn(drop_path=None) -> a fresh backbone


def teacher_probs(
    teacher_logits: torch.Tensor,
    center: torch.Tensor | None,
    temp: float,
    sinkhorn_iters: int = 0,
    group: distributed.Group = None,
) -> torch.Tensor:
    """Targets: softmax((t - c) / T_t) (centering and sharpening) or, with `sinkhorn_iters` > 0, Sinkhorn-Knopp
    assignments of t / T_t (Table 7 row 3)."""
    if sinkhorn_iters > 0:
        return sinkhorn_knopp(teacher_logits, temp, sinkhorn_iters, group)
    return F.softmax((teacher_logits - center) / temp, dim=-1)  # in fp32: the center is (no cast launch)


def pair_mask(teacher_views: int, student_views: int, device=None) -> torch.Tensor:
    """[V_t, V_s] True for the pairs DINO uses: every student view except the teacher view itself (the global
    views come first in the student's view order). Made without indexing: an indexed assignment waits for the
    device on a GPU (seen by CUDA's sync debug mode on an H100)."""
    return ~torch.eye(teacher_views, student_views, dtype=torch.bool, device=device)


def pair_count(teacher_views: int, student_views: int) -> int:
    """How many pairs `pair_mask` keeps."""
    return teacher_views * student_views - min(teacher_views, student_views)


def cross_entropy_pairs(
    student_logits: torch.Tensor, targets: torch.Tensor, student_temp: float, teacher_views: int, student_views: int
) -> torch.Tensor:
    """Mean over pairs (i, v != i) of the batch-mean cross-entropy -sum_k P_t^i log P_s^v.
    student_logits [V_s*B, K], targets [V_t*B, K], both view-major."""
    log_ps = F.log_softmax(student_logits.float() / student_temp, dim=-1).unflatten(0, (student_views, -1))
    pt = targets.unflatten(0, (teacher_views, -1))
    batch = pt.shape[1]
    # in fp32 as the official loss (an elementwise product and sum): autocast would run the einsum's matmul on
    # inputs rounded to bf16, and return the loss in bf16
    device = log_ps.device.type
    with torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else contextlib.nullcontext():
        ce = -torch.einsum("tbk,sbk->ts", pt, log_ps) / batch  # [V_t, V_s]
    mask = pair_mask(teacher_views, student_views, ce.device)
    # a masked sum over a count known on the host (indexing by the mask would wait for the device on a GPU)
    return torch.where(mask, ce, 0.0).sum() / pair_count(teacher_views, student_views)


def mse_pairs(
    student_logits: torch.Tensor, targets: torch.Tensor, student_temp: float, teacher_views: int, student_views: int
) -> torch.Tensor:
    """Table 7 row 5: the cross-entropy replaced by the squared error sum_k (P_t^i - P_s^v)^2, same pairs. (The
    paper does not spell out the MSE; this keeps everything else of DINO, including the temperatures.)"""
    ps = F.softmax(student_logits.float() / student_temp, dim=-1).unflatten(0, (student_views, -1))
    pt = targets.unflatten(0, (teacher_views, -1))
    pairs = [(i, v) for i in range(teacher_views) for v in range(student_views) if i != v]  # pair_mask's
    terms = [((pt[i] - ps[v]) ** 2).sum(-1).mean() for i, v in pairs]
    return torch.stack(terms).mean()


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over rows of h(P) = -sum_k P_k log P_k (DINO Fig. 7, left)."""
    return -(probs * torch.log(probs.clamp_min(1e-12))).sum(-1).mean()


@torch.no_grad()
def updated_center(
    center: torch.Tensor, teacher_logits: torch.Tensor, momentum: float, group: distributed.Group = None
) -> torch.Tensor:
    """EMA of the mean teacher output over the global batch (the data-parallel ranks of `group`)."""
    batch_mean = distributed.all_reduce_mean(teacher_logits.float().mean(dim=0, keepdim=True), group)
    return center * momentum + batch_mean * (1 - momentum)


class Dino(Method):
    kind = "dino"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: BackboneFn):
        self.cfg = dc = cfg.method.dino
        self.teacher_classes = dc.out_dim
        self.student = self._build(backbone_fn(), norm_last_layer=dc.norm_last_layer, predictor=dc.predictor)
        self.teacher = init_teacher(
            self._build(backbone_fn(drop_path=0.0), norm_last_layer=dc.norm_last_layer, predictor=False), self.student
        )
        epochs = math.ceil(total_steps / steps_per_epoch)
        self.momentum = schedules.cosine(dc.momentum_teacher, 1.0, total_steps)
        self.teacher_temp = schedules.teacher_temperature(
            dc.warmup_teacher_temp, dc.teacher_temp, dc.warmup_teacher_temp_epochs, epochs
        )
        # created with the method (not lazily) so that a checkpoint template always has it to load into
        self.center = torch.zeros(1, dc.out_dim, device="cpu")  # not on the meta device of a meta build

    def _head(self, in_dim: int, norm_last_layer: bool, predictor: bool) -> DinoHead:
        dc = self.cfg
        return DinoHead(
            in_dim,
            dc.out_dim,
            dc.hidden_dim,
            dc.bottleneck_dim,
            dc.head_layers,
            dc.use_bn_in_head,
            norm_last_layer,
            predictor,
        )

    def _build(self, backbone: nn.Module, norm_last_layer: bool, predictor: bool) -> MultiCropNet:
        return MultiCropNet(backbone, self._head(backbone.embed_dim, norm_last_layer, predictor))

    def temperature(self, ctx: StepContext) -> float:
        return float(self.teacher_temp[min(ctx.epoch, len(self.teacher_temp) - 1)])

    def _targets(self, teacher_logits: torch.Tensor, center: torch.Tensor | None, temp: float) -> torch.Tensor:
        iters = self.cfg.sinkhorn_iters if self.cfg.centering == "sinkhorn" else 0
        return teacher_probs(teacher_logits, center, temp, iters, self.dp_group)

    def view_loss(
        self, student_logits, teacher_logits, temp, n_teacher, n_student, log: bool = True
    ) -> tuple[torch.Tensor, dict]:
        """The loss and, when `log` (a step whose record is read), the teacher entropy and teacher-student KL."""
        self.center = self.center.to(teacher_logits.device)
        targets = self._targets(teacher_logits, self.center, temp)
        mse = self.cfg.loss == "mse"
        ce = (
            cross_entropy_pairs(student_logits, targets, self.cfg.student_temp, n_teacher, n_student)
            if log or not mse
            else None
        )
        loss = mse_pairs(student_logits, targets, self.cfg.student_temp, n_teacher, n_student) if mse else ce
        if self.cfg.centering == "center":
            self.center = updated_center(self.center, teacher_logits, self.cfg.center_momentum, self.dp_group)
        if not log:
            return loss, {}
        h = entropy(targets).detach()
        # H(P_t, P_s) = h(P_t) + KL(P_t || P_s) (paper Eq. 5); every teacher view is in the same number of pairs
        return loss, {"teacher_entropy": h, "teacher_student_kl": ce.detach() - h}

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        n_teacher, n_student = batch.views_per_group[0], sum(batch.views_per_group)
        with torch.no_grad():
            teacher = self.teacher(batch.crops[:1], region=False)
        teacher_logits = teacher["logits"]
        self.monitor_features = teacher["pooled"][: batch.batch_size].detach()
        student_logits = self.student(batch.crops, region=False)["logits"]
        loss, metrics = self.view_loss(
            student_logits, teacher_logits, self.temperature(ctx), n_teacher, n_student, ctx.log
        )
        return loss, {"loss": loss.detach(), "teacher_temp": self.temperature(ctx), **metrics}

    def ema_momentum(self, ctx: StepContext) -> float:
        return 0.0 if self.cfg.teacher == "copy" else self.momentum(ctx.step)

    def frozen_params(self, ctx: StepContext) -> Callable[[str], bool] | None:
        if ctx.epoch < self.cfg.freeze_last_layer:
            return lambda name: "last_layer" in name
        return None

    def state_dict(self) -> dict:
        return {"center": self.center.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.center = state["center"].clone()
