"""The collapse alarm: reads the teacher entropy, the teacher-student KL (DINO, EsViT) and the per-dimension std
of the embeddings from the records of log steps (computed on the device each step, read with the record) and
warns once, or stops the run, when they have stayed in a collapse regime for `train.collapse.window_epochs`."""

import logging
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig

from scale.errors import UserError

log = logging.getLogger(__name__)


class RepresentationCollapse(UserError):
    """train.stop_on_collapse: the run stopped in a collapse regime (its checkpoints are kept)."""

    exit_code = 1


@torch.no_grad()
def embedding_std(features: torch.Tensor) -> torch.Tensor:
    """Mean per-dimension std of the l2-normalised embeddings, x sqrt(dim): ~1 spread, 0 collapsed. On the device."""
    normed = F.normalize(features.float(), dim=1)
    return normed.std(dim=0).mean() * math.sqrt(normed.shape[1])


def regime(record: dict, cfg: DictConfig, out_dim: int | None) -> str | None:
    """The collapse this record shows, named, or None."""
    kl, entropy, std = (record.get(k) for k in ("teacher_student_kl", "teacher_entropy", "embedding_std"))
    if isinstance(kl, float) and kl < cfg.kl_below:
        kind = "teacher targets collapsed"
        if isinstance(entropy, float) and out_dim:
            if entropy < 0.1 * math.log(out_dim):
                kind = "one dimension dominates the teacher (entropy -> 0: centering missing or too weak)"
            elif entropy > 0.9 * math.log(out_dim):
                kind = "uniform teacher output (entropy -> log K: sharpening missing or too weak)"
        return f"{kind}; teacher-student KL {kl:.2g} < {cfg.kl_below}"
    if isinstance(std, float) and std < cfg.std_below:
        return f"embeddings collapsed to a point: per-dimension std x sqrt(dim) {std:.2g} < {cfg.std_below}"
    return None


class CollapseAlarm:
    def __init__(self, cfg: DictConfig, steps_per_epoch: int, out_dim: int | None, group=None):
        """`out_dim`: K, the width of the teacher distribution (None: no teacher distribution). `group`: the ranks
        that stop together on train.stop_on_collapse (the data-parallel group)."""
        self.cfg, self.out_dim, self.group = cfg.train.collapse, out_dim, group
        self.stop = cfg.train.stop_on_collapse
        self.window = max(1, round(self.cfg.window_epochs * steps_per_epoch))
        self.since: int | None = None  # first logged step of the current collapse regime
        self.warned = False

    def check(self, step: int, record: dict) -> None:
        """On a log step (`step`: steps done): warn once, or raise RepresentationCollapse (a collective of the
        group when stopping is on, so that every rank stops at the same step)."""
        if not self.cfg.window_epochs:
            return
        found = regime(record, self.cfg, self.out_dim)
        self.since = None if found is None else (self.since or step)
        alarm = found is not None and step - self.since >= self.window
        if self.stop:
            alarm = self._any_rank(alarm)
        if not alarm:
            return
        message = (
            f"representation collapse since step {self.since} (for {step - self.since} steps, window {self.window}): "
            f"{found or 'seen on another rank'}. See docs/how-to/watch.md."
        )
        if self.stop:
            raise RepresentationCollapse(f"stopped at step {step}: {message}")
        if not self.warned:
            log.warning(message)
            self.warned = True

    def _any_rank(self, alarm: bool) -> bool:
        if self.group is None or not dist.is_initialized():
            return alarm
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" else None
        flag = torch.tensor([float(alarm)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
