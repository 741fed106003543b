"""BYOL [Grill et al. 2020] on the MoCo v3 backbones (MoCo v3 Table 4): the online predictor output of each view
regresses the target projection of the other view, target = momentum encoder (backbone + projector):

    loss = mean_b [ (2 - 2 cos(p1, z2')) + (2 - 2 cos(p2, z1')) ]

Heads follow BYOL (MoCo v3 appendix): 2-layer projector and predictor, BN in the hidden layers only.
"""

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale import schedules
from scale.data.batch import Batch
from scale.methods.base import Method, StepContext
from scale.methods.mocov3 import _bn_batching, check_two_views
from scale.methods.nets import ProjectionNet, init_teacher
from scale.models.heads import moco_predictor, moco_projector


def regression(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per-sample 2 - 2 cos(p, z) = || p/|p| - z/|z| ||^2."""
    return 2 - 2 * (F.normalize(p.float(), dim=1) * F.normalize(z.float(), dim=1)).sum(dim=1)


class BYOL(Method):
    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.moco
        self.per_view_bn = _bn_batching(mc.bn_batching)

        def projector(in_dim: int) -> nn.Module:
            return moco_projector(in_dim, False, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, last_bn=False, num_layers=2)

        backbone = backbone_fn()
        self.student = ProjectionNet(backbone, projector(backbone.embed_dim),
                                     moco_predictor(False, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, last_bn=False))
        target = backbone_fn(drop_path=0.0)
        self.teacher = init_teacher(ProjectionNet(target, projector(target.embed_dim)), self.student)
        self.steps_per_epoch = steps_per_epoch
        self.epochs = math.ceil(total_steps / steps_per_epoch)

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict[str, float]]:
        check_two_views(batch, "BYOL")
        crops, views = batch.crops[:1], batch.views_per_group[:1]
        p1, p2 = self.student(crops, views, self.per_view_bn)["p"].chunk(2)
        with torch.no_grad():
            z1, z2 = self.teacher(crops, views, self.per_view_bn)["z"].chunk(2)
        loss = (regression(p1, z2) + regression(p2, z1)).mean()
        return loss, {"loss": loss.item()}

    def ema_momentum(self, ctx: StepContext) -> float:
        if not self.cfg.momentum_cosine:
            return self.cfg.momentum
        return schedules.moco_momentum(self.cfg.momentum, (ctx.step + 1) / self.steps_per_epoch, self.epochs)
