"""BYOL [Grill et al. 2020] on the MoCo v3 backbones (MoCo v3 Table 4): the online predictor output of each view
regresses the target projection of the other view, target = momentum encoder (backbone + projector):

    loss = mean_b [ (2 - 2 cos(p1, z2')) + (2 - 2 cos(p2, z1')) ]

Heads follow BYOL (MoCo v3 appendix): 2-layer projector and predictor, BN in the hidden layers only.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale import schedules
from scale.data.batch import Batch
from scale.methods.base import Method, StepContext
from scale.methods.mocov3 import _bn_batching, momentum_forward
from scale.methods.nets import ProjectionNet, momentum_encoder
from scale.models.heads import moco_predictor, moco_projector


def regression(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per-sample 2 - 2 cos(p, z) = || p/|p| - z/|z| ||^2."""
    return 2 - 2 * (F.normalize(p.float(), dim=1) * F.normalize(z.float(), dim=1)).sum(dim=1)


class BYOL(Method):
    kind = "byol"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.byol
        self.per_view_bn = _bn_batching(mc.bn_batching)

        def projector(in_dim: int) -> nn.Module:
            return moco_projector(in_dim, False, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, last_bn=False, num_layers=2)

        backbone = backbone_fn()
        self.student = ProjectionNet(
            backbone,
            projector(backbone.embed_dim),
            moco_predictor(False, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, last_bn=False),
        )
        self.teacher = momentum_encoder(backbone_fn, projector, self.student)
        self.momentum = schedules.encoder_momentum(mc.momentum, mc.momentum_cosine, steps_per_epoch, total_steps)

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        online, target = momentum_forward(self, batch, "BYOL", self.per_view_bn)
        p1, p2 = online["p"].chunk(2)
        z1, z2 = target["z"].chunk(2)
        loss = (regression(p1, z2) + regression(p2, z1)).mean()
        return loss, {"loss": loss.detach()}

    def ema_momentum(self, ctx: StepContext) -> float:
        return self.momentum(ctx.step)
