"""EsViT [Li et al. 2021]: DINO's view-level loss plus a region-level loss on every output token.

For a pair (teacher view i, student view v != i), each student token j is matched to the teacher token
j* = argmax_{j'} cos(z_s^j, z_t^{j'}) of the BACKBONE features (non-differentiable); the region loss is
-1/N_s sum_j P_t^{j*} log P_s^j with P_t = softmax((g_t - c_r) / T_t) of a second (region) DINO head, c_r its own
center. Loss = (1 - w) L_view + w L_region, w = 0.5, both averaged over the same pairs; from epoch
method.esvit.region_from_epoch on (continual pre-training from a view-only checkpoint), before it the view loss alone.

The region head has 65536 outputs on every token, so the loss never materialises an fp32 [tokens, 65536] tensor:
the teacher's targets are made row by row when a matched student token needs them (`CenteredSoftmaxRows`), each
student view's log-softmax is taken once for all the teacher views it is paired with (the loss is linear in the
targets), and the gradient is formed during the forward a chunk of rows at a time, in the storage of the student's
region logits (`SoftTargetCrossEntropy`).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from scale.data.batch import Batch
from scale.methods import distributed
from scale.methods.base import StepContext
from scale.methods.dino import Dino, pair_count
from scale.methods.nets import MultiCropNet

WORK_ELEMENTS = 2**18  # elements of one chunk of rows (1 MiB in fp32: the work buffers stay in cache)

# (row indices [n], out [n, K] fp32) -> out filled with those rows of the targets
TargetRows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def chunk_rows(classes: int) -> int:
    return max(1, WORK_ELEMENTS // classes)


@torch.no_grad()
def match_tokens(student_tokens: torch.Tensor, teacher_tokens: torch.Tensor) -> torch.Tensor:
    """[B, N_s, D], [B, N_t, D] -> [B, N_s] index of the most cosine-similar teacher token of each student token."""
    sim = torch.einsum(
        "bsd,btd->bst", F.normalize(student_tokens.float(), dim=-1), F.normalize(teacher_tokens.float(), dim=-1)
    )
    return sim.argmax(dim=-1)


def probability_rows(probs: torch.Tensor) -> TargetRows:
    """Targets given as distributions [M, K] (Sinkhorn-Knopp assignments)."""
    return lambda index, out: torch.index_select(probs, 0, index, out=out)


class CenteredSoftmaxRows:
    """The targets softmax((t - c) / T) of teacher logits t [M, K], made row by row when asked for: only each row's
    log-normaliser is kept ([M]), not the [M, K] fp32 distributions. The pass that computes the normalisers also
    sums the logits over the rows (`logit_sum` [1, K], for the center update)."""

    @torch.no_grad()
    def __init__(self, logits: torch.Tensor, center: torch.Tensor, temp: float):
        self.logits, self.center, self.temp = logits, center.float(), temp
        rows, classes = logits.shape
        step = min(chunk_rows(classes), rows)
        work = torch.empty(step, classes, device=logits.device)
        self.log_norm = torch.empty(rows, device=logits.device)
        self.logit_sum = torch.zeros(1, classes, device=logits.device)
        for start in range(0, rows, step):
            x = work[: min(step, rows - start)].copy_(logits[start : start + step])
            self.logit_sum += x.sum(0, keepdim=True)
            self.log_norm[start : start + step] = torch.logsumexp(x.sub_(self.center).div_(temp), dim=-1)

    @torch.no_grad()
    def __call__(self, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.copy_(self.logits.index_select(0, index)).sub_(self.center).div_(self.temp)
        return out.sub_(self.log_norm[index].unsqueeze(-1)).exp_()


class SoftTargetCrossEntropy(torch.autograd.Function):
    """Cross-entropy of logits s [R, K] against soft targets (no gradient), by segments of rows: a segment
    (first, weight, index) covers rows r = first .. first + n - 1 and adds
        -weight * sum_r sum_k W_rk log softmax(s_r / T)_k,   W_r = sum_i targets(index_i)[r - first]
    (index: one [n] tensor of target rows per source, e.g. per teacher view a student view is paired with).

    The gradient, weight * (softmax(s_r / T) sum_k W_rk - W_r) / T, is computed in the forward, a chunk of rows at
    a time in reused fp32 buffers, and written over the logits, row after row once they are read: the logits'
    storage is what backward keeps (no [R, K] tensor is allocated, no fp32 one at all). After the call the logits
    tensor holds that gradient, so it must be needed by nothing else (EsViT's region head output is not: a linear
    layer's backward does not read its output; a graph that saved it would fail autograd's in-place check).
    `grad_weight` is the weight the caller gives this loss in its total: the gradient is formed for it, so that
    backward passes it on without another pass over [R, K] unless the total is scaled further (a loss scaler)."""

    @staticmethod
    def forward(ctx, logits, targets: TargetRows, segments, temp, grad_weight):
        grad = logits.detach() if ctx.needs_input_grad[0] else None  # the same storage, overwritten
        step = min(chunk_rows(logits.shape[-1]), logits.shape[0])
        scaled, log_ps, mixed, other = (torch.empty(step, logits.shape[-1], device=logits.device) for _ in range(4))
        total = torch.zeros((), device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):  # the loss arithmetic is fp32 by design
            for first, weight, index in segments:
                for start in range(0, len(index[0]), step):
                    rows = [i[start : start + step] for i in index]
                    n = len(rows[0])
                    part = slice(first + start, first + start + n)
                    w = targets(rows[0], mixed[:n])
                    for r in rows[1:]:
                        w.add_(targets(r, other[:n]))
                    ls = torch.log_softmax(scaled[:n].copy_(logits[part]).div_(temp), dim=-1, out=log_ps[:n])
                    total -= weight * torch.dot(w.flatten(), ls.flatten())
                    if grad is not None:
                        scale = grad_weight * weight / temp
                        grad[part] = ls.exp_().mul_(w.sum(-1, keepdim=True).mul_(scale)).sub_(w, alpha=scale)
        ctx.save_for_backward(grad)
        ctx.grad_weight = grad_weight
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        weight = grad_output.new_tensor(ctx.grad_weight)  # rounded as the caller's weight * loss rounds it
        if not torch.equal(grad_output, weight):
            # scaled in place: backpropagating twice through the same graph then fails autograd's check of saved
            # tensors modified in place, as it should
            grad.mul_(grad_output / weight)
        return grad, None, None, None, None


def flat_rows(match: torch.Tensor, teacher_tokens: int, first: int = 0) -> torch.Tensor:
    """[B, N_s] teacher token index per student token -> [B*N_s] row of the teacher view's flattening [B*N_t, ...],
    counted from row `first`."""
    offsets = torch.arange(match.shape[0], device=match.device).unsqueeze(1) * teacher_tokens + first
    return (match + offsets).flatten()


def split_views(per_group: list[torch.Tensor], views_per_group: list[int]) -> list[torch.Tensor]:
    """Group tensors [V_g*B, ...] (view-major) -> one tensor [B, ...] per view, groups in order."""
    return [view for t, v in zip(per_group, views_per_group) for view in t.chunk(v)]


def region_loss_pairs(
    student_tokens: list[torch.Tensor],
    teacher_tokens: list[torch.Tensor],
    student_region: torch.Tensor,
    teacher_targets: torch.Tensor | TargetRows,
    student_temp: float,
    grad_weight: float = 1.0,
) -> torch.Tensor:
    """Mean of the region loss over the pairs (teacher view i, student view v != i).

    Tokens are per view ([B, N_v, D]); the region outputs are flat with the views' rows in order, view v's
    [B*N_v] rows image-major: student logits [sum_v B*N_v, K], teacher targets [V_t*B*N_t, K] (distributions, or
    `TargetRows` making them). Each student view's log-softmax is taken once, against the sum of the targets of
    its matched tokens in every teacher view it is paired with. `grad_weight`: the loss's weight in the caller's
    total (see SoftTargetCrossEntropy)."""
    if isinstance(teacher_targets, torch.Tensor):
        teacher_targets = probability_rows(teacher_targets)
    pairs = pair_count(len(teacher_tokens), len(student_tokens))
    teacher_first = [sum(t.shape[0] * t.shape[1] for t in teacher_tokens[:i]) for i in range(len(teacher_tokens))]
    segments, first = [], 0
    for v, tokens in enumerate(student_tokens):
        batch, n = tokens.shape[:2]
        index = [
            flat_rows(match_tokens(tokens, teacher_tokens[i]), teacher_tokens[i].shape[1], teacher_first[i])
            for i in range(len(teacher_tokens))
            if i != v  # the pairs of pair_mask, listed on the host
        ]
        segments.append((first, 1.0 / (pairs * batch * n), index))
        first += batch * n
    if first != student_region.shape[0]:
        raise ValueError(f"{student_region.shape[0]} rows of student region logits for {first} student tokens")
    return SoftTargetCrossEntropy.apply(student_region, teacher_targets, segments, student_temp, grad_weight)


class Esvit(Dino):
    kind = "esvit"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        super().__init__(cfg, steps_per_epoch, total_steps, backbone_fn)
        self.region = cfg.method.esvit  # region_weight, region_from_epoch; the rest is method.dino (self.cfg)
        self.region_center = torch.zeros(1, self.cfg.out_dim, device="cpu")

    def _build(self, backbone: nn.Module, norm_last_layer: bool, predictor: bool) -> MultiCropNet:
        return MultiCropNet(
            backbone,
            self._head(backbone.embed_dim, norm_last_layer, predictor),
            self._head(backbone.token_dim, norm_last_layer, False),
        )

    def region_active(self, ctx: StepContext) -> bool:
        return ctx.epoch >= self.region.region_from_epoch

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        region = self.region_active(ctx)
        n_teacher, n_student = batch.views_per_group[0], sum(batch.views_per_group)
        temp = self.temperature(ctx)
        with torch.no_grad():
            teacher = self.teacher(batch.crops[:1], region=region)
            if region:  # the teacher's region targets and center before the student's activations exist
                targets, region_center = self.region_targets(teacher["region_logits"], temp)
        self.monitor_features = teacher["pooled"][: batch.batch_size].detach()
        student = self.student(batch.crops, region=region)
        view, metrics = self.view_loss(student["logits"], teacher["logits"], temp, n_teacher, n_student, ctx.log)
        if not region:
            return view, {"loss": view.detach(), "view_loss": view.detach(), "teacher_temp": temp, **metrics}

        w = self.region.region_weight
        # overwrites student["region_logits"] with the gradient of w * region_loss (see SoftTargetCrossEntropy)
        region_loss = region_loss_pairs(
            split_views(student["tokens"], batch.views_per_group),
            split_views(teacher["tokens"], batch.views_per_group[:1]),
            student["region_logits"],
            targets,
            self.cfg.student_temp,
            grad_weight=w,
        )
        self.region_center = region_center
        loss = (1 - w) * view + w * region_loss
        return loss, {
            "loss": loss.detach(),
            "view_loss": view.detach(),
            "region_loss": region_loss.detach(),
            "teacher_temp": temp,
            **metrics,
        }

    def region_targets(self, teacher_region: torch.Tensor, temp: float) -> tuple[TargetRows, torch.Tensor]:
        """Teacher region logits [V_t*B*N_t, K] -> (targets P_t from the current center, the center updated with
        this batch: an EMA of the mean teacher output over the global batch, as the view head's)."""
        center = self.region_center.to(teacher_region.device)
        if self.cfg.centering == "sinkhorn":
            return probability_rows(self._targets(teacher_region, None, temp)), center
        targets = CenteredSoftmaxRows(teacher_region, center, temp)
        batch_mean = distributed.all_reduce_mean(targets.logit_sum / teacher_region.shape[0], self.dp_group)
        momentum = self.cfg.center_momentum
        return targets, center * momentum + batch_mean * (1 - momentum)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "region_center": self.region_center.cpu()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "region_center" in state:  # absent when continuing from a view-only (DINO) checkpoint
            self.region_center = state["region_center"].clone()
