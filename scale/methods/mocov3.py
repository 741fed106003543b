"""MoCo v3 [Chen, Xie, He 2021]: symmetrised InfoNCE between the query of one view (base encoder + projector +
predictor) and the key of the other (momentum encoder + projector, no predictor), with the keys of ALL ranks as
negatives and no queue (paper Alg. 1):

    ctr(q, k) = CE(q k_all^T / tau, labels = arange(N) + N * rank) * 2 tau,   loss = ctr(q1, k2) + ctr(q2, k1)
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale import schedules
from scale.data.batch import Batch
from scale.errors import UserError
from scale.methods import distributed
from scale.methods.base import Method, StepContext
from scale.methods.nets import ProjectionNet, momentum_encoder
from scale.models.heads import moco_predictor, moco_projector


def is_resnet(cfg) -> bool:
    return cfg.model.name.startswith("resnet")


def contrastive(q: torch.Tensor, k: torch.Tensor, tau: float, group: distributed.Group = None) -> torch.Tensor:
    """InfoNCE of this rank's queries q [N, d] against the keys of all ranks of the data-parallel `group`; k [N, d]
    is this rank's keys."""
    q = F.normalize(q.float(), dim=1)
    keys = distributed.all_gather_nograd(F.normalize(k.float(), dim=1), group)
    logits = q @ keys.t() / tau
    labels = torch.arange(q.shape[0], device=q.device) + q.shape[0] * distributed.rank(group)
    return F.cross_entropy(logits, labels) * 2 * tau


def check_two_views(batch: Batch, method: str) -> None:
    if batch.views_per_group[0] != 2:
        raise UserError(
            f"{method} needs 2 global views per image (data.views.n_global=2), got {batch.views_per_group[0]}"
        )


def momentum_forward(method: Method, batch: Batch, name: str, per_view_bn: bool) -> tuple[dict, dict]:
    """The two global views (the first resolution group) through the student and, without gradient, through the
    momentum encoder (MoCo v2/v3, BYOL)."""
    check_two_views(batch, name)
    if per_view_bn and method.cfg.bn_in_heads and batch.batch_size < 2:
        raise UserError(
            f"{name}: BatchNorm in the heads (method.{method.kind}.bn_in_heads) normalises each view over this "
            f"rank's images and needs at least 2 per forward, got {batch.batch_size} (train.global_batch "
            f"/ ranks / engine.grad_accum); raise the batch, or set method.{method.kind}.bn_batching=joint or "
            f"method.{method.kind}.bn_in_heads=false"
        )
    crops, views = batch.crops[:1], batch.views_per_group[:1]
    online = method.student(crops, views, per_view_bn)
    with torch.no_grad():
        target = method.teacher(crops, views, per_view_bn)
    return online, target


class MocoV3(Method):
    kind = "mocov3"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.mocov3
        self.per_view_bn = _bn_batching(mc.bn_batching)
        resnet = is_resnet(cfg)

        def projector(in_dim: int) -> nn.Module:
            return moco_projector(
                in_dim, resnet, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, num_layers=None if resnet else mc.proj_layers
            )

        backbone = backbone_fn()
        self.student = ProjectionNet(
            backbone,
            projector(backbone.embed_dim),
            moco_predictor(resnet, mc.dim, mc.mlp_dim, bn=mc.bn_in_heads, num_layers=mc.pred_layers),
        )
        self.teacher = momentum_encoder(backbone_fn, projector, self.student)
        self.momentum = schedules.encoder_momentum(mc.momentum, mc.momentum_cosine, steps_per_epoch, total_steps)

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        queries, keys = momentum_forward(self, batch, "MoCo v3", self.per_view_bn)
        q1, q2 = queries["p"].chunk(2)
        k1, k2 = keys["z"].chunk(2)
        self.monitor_features = keys["pooled"][: batch.batch_size].detach()
        tau = self.cfg.temperature
        loss = contrastive(q1, k2, tau, self.dp_group) + contrastive(q2, k1, tau, self.dp_group)
        return loss, {"loss": loss.detach()}

    def ema_momentum(self, ctx: StepContext) -> float:
        return self.momentum(ctx.step)


def _bn_batching(value: str) -> bool:
    return value == "per_view"
