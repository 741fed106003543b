"""EsViT [Li et al. 2021]: DINO's view-level loss plus a region-level loss on every output token.

For a pair (teacher view i, student view v != i), each student token j is matched to the teacher token
j* = argmax_{j'} cos(z_s^j, z_t^{j'}) of the BACKBONE features (non-differentiable); the region loss is
-1/N_s sum_j P_t^{j*} log P_s^j with P_t = softmax((g_t - c_r) / T_t) of a second (region) DINO head, c_r its own
center. Loss = (1 - w) L_view + w L_region, w = 0.5, both averaged over the same pairs; from epoch
`region_from_epoch` on (continual pre-training from a view-only checkpoint), before it the view loss alone.
"""

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale.data.batch import Batch
from scale.methods.base import StepContext
from scale.methods.dino import Dino, pair_mask, updated_center
from scale.methods.nets import MultiCropNet


@torch.no_grad()
def match_tokens(student_tokens: torch.Tensor, teacher_tokens: torch.Tensor) -> torch.Tensor:
    """[B, N_s, D], [B, N_t, D] -> [B, N_s] index of the most cosine-similar teacher token of each student token."""
    sim = torch.einsum("bsd,btd->bst", F.normalize(student_tokens.float(), dim=-1),
                       F.normalize(teacher_tokens.float(), dim=-1))
    return sim.argmax(dim=-1)


def region_cross_entropy(student_region: torch.Tensor, teacher_region_probs: torch.Tensor, match: torch.Tensor,
                         student_temp: float) -> torch.Tensor:
    """Mean over images and student tokens of -sum_k P_t[match]_k log P_s_k.
    student_region [B, N_s, K] logits, teacher_region_probs [B, N_t, K], match [B, N_s]."""
    targets = teacher_region_probs.gather(1, match.unsqueeze(-1).expand(-1, -1, teacher_region_probs.shape[-1]))
    log_ps = F.log_softmax(student_region.float() / student_temp, dim=-1)
    return -(targets * log_ps).sum(-1).mean()


def split_views(per_group: list[torch.Tensor], views_per_group: list[int]) -> list[torch.Tensor]:
    """Group tensors [V_g*B, ...] (view-major) -> one tensor [B, ...] per view, groups in order."""
    return [view for t, v in zip(per_group, views_per_group) for view in t.chunk(v)]


def region_loss_pairs(student_tokens: list[torch.Tensor], teacher_tokens: list[torch.Tensor],
                      student_region: list[torch.Tensor], teacher_region_probs: list[torch.Tensor],
                      student_temp: float) -> torch.Tensor:
    """Mean of the region loss over the pairs (teacher view i, student view v != i); arguments are per view."""
    mask = pair_mask(len(teacher_tokens), len(student_tokens))
    terms = [region_cross_entropy(student_region[v], teacher_region_probs[i],
                                  match_tokens(student_tokens[v], teacher_tokens[i]), student_temp)
             for i, v in mask.nonzero().tolist()]
    return torch.stack(terms).mean()


class Esvit(Dino):
    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        super().__init__(cfg, steps_per_epoch, total_steps, backbone_fn)
        self.region_center = torch.zeros(1, self.cfg.out_dim, device="cpu")

    def _build(self, backbone: nn.Module, norm_last_layer: bool, predictor: bool) -> MultiCropNet:
        return MultiCropNet(backbone, self._head(backbone.embed_dim, norm_last_layer, predictor),
                            self._head(backbone.token_dim, norm_last_layer, False))

    def region_active(self, ctx: StepContext) -> bool:
        return ctx.epoch >= self.cfg.region_from_epoch

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict[str, float]]:
        region = self.region_active(ctx)
        n_teacher, n_student = batch.views_per_group[0], sum(batch.views_per_group)
        temp = self.temperature(ctx)
        with torch.no_grad():
            teacher = self.teacher(batch.crops[:1], region=region)
        self.monitor_features = teacher["pooled"][:batch.batch_size].detach()
        student = self.student(batch.crops, region=region)
        view, metrics = self.view_loss(student["logits"], teacher["logits"], temp, n_teacher, n_student)
        if not region:
            return view, {"loss": view.item(), "view_loss": view.item(), "teacher_temp": temp, **metrics}

        teacher_region = teacher["region_logits"][0]  # [V_t*B, N_t, K]
        self.region_center = self.region_center.to(teacher_region.device)
        probs = self._targets(teacher_region.flatten(0, 1), self.region_center, temp).view_as(teacher_region)
        region_loss = region_loss_pairs(
            split_views(student["tokens"], batch.views_per_group),
            split_views(teacher["tokens"], batch.views_per_group[:1]),
            split_views(student["region_logits"], batch.views_per_group),
            split_views([probs], batch.views_per_group[:1]),
            self.cfg.student_temp)
        if self.cfg.centering == "center":
            self.region_center = updated_center(self.region_center, teacher_region.flatten(0, 1),
                                                self.cfg.center_momentum)
        w = self.cfg.region_weight
        loss = (1 - w) * view + w * region_loss
        return loss, {"loss": loss.item(), "view_loss": view.item(), "region_loss": region_loss.item(),
                      "teacher_temp": temp, **metrics}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "region_center": self.region_center.cpu()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "region_center" in state:  # absent when continuing from a view-only (DINO) checkpoint
            self.region_center = state["region_center"].clone()
