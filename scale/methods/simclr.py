"""SimCLR [Chen et al. 2020] on the MoCo v3 backbones (MoCo v3 Table 4): NT-Xent over the 2N projections of the
global batch; for each view the positive is the other view of the same image, the negatives all other 2N - 2.

    loss = mean_i -log( exp(s(z_i, z_i+) / tau) / sum_{j != i} exp(s(z_i, z_j) / tau) ),  s = cosine similarity
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale.data.batch import Batch
from scale.methods import distributed
from scale.methods.base import Method, StepContext
from scale.methods.mocov3 import _bn_batching, check_two_views, is_resnet
from scale.methods.nets import ProjectionNet
from scale.models.heads import moco_projector


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, tau: float, group: distributed.Group = None) -> torch.Tensor:
    """z1, z2 [N, d]: this rank's projections of the two views. Other ranks' projections are gathered with their
    gradient so that the negatives are the global batch."""
    n, r = z1.shape[0], distributed.rank(group)
    z1, z2 = F.normalize(z1.float(), dim=1), F.normalize(z2.float(), dim=1)
    all1, all2 = distributed.all_gather_grad(z1, group), distributed.all_gather_grad(z2, group)
    total = all1.shape[0]
    keys = torch.cat([all1, all2])  # [2M, d]: view 1 of all images, then view 2
    queries = torch.cat([z1, z2])  # [2N, d]
    own = torch.arange(n, device=z1.device) + n * r
    self_index = torch.cat([own, own + total])
    positive = torch.cat([own + total, own])
    logits = queries @ keys.t() / tau
    logits[torch.arange(2 * n, device=z1.device), self_index] = float("-inf")
    return F.cross_entropy(logits, positive)


class SimCLR(Method):
    kind = "simclr"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.simclr
        self.per_view_bn = _bn_batching(mc.bn_batching)
        backbone = backbone_fn()
        resnet = is_resnet(cfg)
        self.student = ProjectionNet(
            backbone,
            moco_projector(
                backbone.embed_dim,
                resnet,
                mc.dim,
                mc.mlp_dim,
                bn=mc.bn_in_heads,
                num_layers=None if resnet else mc.proj_layers,
            ),
        )

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        check_two_views(batch, "SimCLR")
        z1, z2 = self.student(batch.crops[:1], batch.views_per_group[:1], self.per_view_bn)["z"].chunk(2)
        loss = nt_xent(z1, z2, self.cfg.temperature, self.dp_group)
        return loss, {"loss": loss.detach()}
