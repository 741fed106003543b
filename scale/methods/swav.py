"""SwAV [Caron et al. 2020] on the MoCo v3 backbones (MoCo v3 Table 4): codes q = Sinkhorn-Knopp of the
prototype scores of each global view (no gradient); every other view predicts them,

    loss = mean over pairs (i global, v != i) of -sum_k q_i,k log softmax(scores_v / T)_k,

no BN in the heads (MoCo v3 appendix), no queue (batch 4096 in the paper), prototypes frozen for the first steps.
"""

from collections.abc import Callable

import torch
from torch import nn

from scale.data.batch import Batch
from scale.methods.base import Method, StepContext
from scale.methods.dino import cross_entropy_pairs
from scale.methods.mocov3 import _bn_batching
from scale.methods.nets import ProjectionNet, Prototypes
from scale.methods.sinkhorn import sinkhorn_knopp
from scale.models.heads import moco_projector


class SwAV(Method):
    kind = "swav"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.swav
        self.per_view_bn = _bn_batching(mc.bn_batching)
        backbone = backbone_fn()
        self.student = ProjectionNet(
            backbone,
            moco_projector(backbone.embed_dim, False, mc.dim, mc.mlp_dim, bn=False, num_layers=2),
            prototypes=Prototypes(mc.dim, mc.prototypes),
        )

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        scores = self.student(batch.crops, batch.views_per_group, self.per_view_bn)["scores"]
        n_global, n_views = batch.views_per_group[0], sum(batch.views_per_group)
        global_scores = scores[: scores.shape[0] // n_views * n_global].detach()
        codes = torch.cat(
            [
                sinkhorn_knopp(s, self.cfg.epsilon, self.cfg.sinkhorn_iters, self.dp_group)
                for s in global_scores.chunk(n_global)
            ]
        )
        loss = cross_entropy_pairs(scores, codes, self.cfg.temperature, n_global, n_views)
        return loss, {"loss": loss.detach()}

    def frozen_params(self, ctx: StepContext) -> Callable[[str], bool] | None:
        if ctx.step < self.cfg.freeze_prototypes_steps:
            return lambda name: name.startswith("prototypes")
        return None
