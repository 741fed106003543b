"""MoCo v2 [Chen et al. 2020], as DINO's Table 7 row 8 compares it: InfoNCE of the query of one view against the
key of the other (momentum encoder), with negatives from a queue of the keys of past batches of every rank, an MLP
projector without BN and no predictor; symmetrised over the two views:

    ctr(q, k) = CE([q.k, q.queue^T] / tau, label 0),   loss = ctr(q1, k2) + ctr(q2, k1)
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scale import schedules
from scale.data.batch import Batch
from scale.methods import distributed
from scale.methods.base import Method, StepContext
from scale.methods.mocov3 import momentum_forward
from scale.methods.nets import ProjectionNet, momentum_encoder


def projector(in_dim: int, hidden: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out))


def queue_contrastive(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, tau: float) -> torch.Tensor:
    """InfoNCE with the positive key k (same image) at index 0 and the queue's keys as negatives."""
    q, k = F.normalize(q.float(), dim=1), F.normalize(k.float(), dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))


class MocoV2(Method):
    kind = "mocov2"

    def __init__(self, cfg, steps_per_epoch: int, total_steps: int, backbone_fn: Callable[..., nn.Module]):
        self.cfg = mc = cfg.method.mocov2
        backbone = backbone_fn()
        self.student = ProjectionNet(backbone, projector(backbone.embed_dim, mc.mlp_dim, mc.dim))
        self.teacher = momentum_encoder(backbone_fn, lambda width: projector(width, mc.mlp_dim, mc.dim), self.student)
        # the paper's constant 0.999 (recipes/dino/table7/row8_mocov2.yaml), or MoCo v3's cosine with momentum_cosine
        self.momentum = schedules.encoder_momentum(mc.momentum, mc.momentum_cosine, steps_per_epoch, total_steps)
        # created with the method so that a checkpoint template has them; random unit keys, as MoCo starts
        self.queue = F.normalize(torch.randn(mc.queue_size, mc.dim, device="cpu"), dim=1)
        self.queue_ptr = torch.zeros((), dtype=torch.long, device="cpu")
        self.pending_keys: torch.Tensor | None = None  # the last loss() call's gathered keys, not yet in the queue

    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        queries, keys = momentum_forward(self, batch, "MoCo v2", False)
        q1, q2 = queries["z"].chunk(2)
        k1, k2 = keys["z"].chunk(2)
        self.monitor_features = keys["pooled"][: batch.batch_size].detach()
        self.queue = self.queue.to(q1.device)
        # the last step's keys go in now that its backward, which needed the queue as it was, is done: the queue is
        # updated in place (no copy of it per step) and this step's logits see the keys of every earlier step
        self._enqueue_pending()
        tau = self.cfg.temperature
        loss = queue_contrastive(q1, k2, self.queue, tau) + queue_contrastive(q2, k1, self.queue, tau)
        # gathered now: every rank runs loss() at the same point, and the keys are needed only at the next step
        self.pending_keys = distributed.all_gather_nograd(
            F.normalize(torch.cat([k1, k2]).float(), dim=1), self.dp_group
        )
        return loss, {"loss": loss.detach()}

    def _enqueue_pending(self) -> None:
        """Replace the oldest queue entries with the pending keys of every rank (after they served as positives)."""
        if self.pending_keys is None:
            return
        keys, size, ptr = self.pending_keys, self.queue.shape[0], int(self.queue_ptr)
        if keys.shape[0] > size:  # more keys than the queue holds: the newest fill it
            keys, ptr = keys[-size:], (ptr + keys.shape[0] - size) % size
        index = (torch.arange(keys.shape[0], device=keys.device) + ptr) % size
        self.queue[index] = keys
        self.queue_ptr = torch.tensor((ptr + keys.shape[0]) % size)
        self.pending_keys = None

    def ema_momentum(self, ctx: StepContext) -> float:
        return self.momentum(ctx.step)

    def state_dict(self) -> dict:
        self._enqueue_pending()  # between steps: no graph needs the queue any more
        return {"queue": self.queue.cpu(), "queue_ptr": self.queue_ptr.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.queue, self.queue_ptr = state["queue"].clone(), state["queue_ptr"].clone()
        self.pending_keys = None
