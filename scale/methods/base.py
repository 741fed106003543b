"""The Method contract: a method owns its modules (student, teacher, heads), its loss and what one step computes.
It never imports an engine; the engine wraps `student` and `teacher` in place and steps the optimizer.

Rules that keep every engine working:
- `student` is an nn.Module whose direct children are its parts (backbone, head, projector, ...). Methods call only
  `self.student(...)` / `self.teacher(...)`, never a part directly: under DDP or DeepSpeed the attribute holds a
  wrapper whose forward is the only entry point that syncs gradients and gathers shards.
- `teacher`, when there is one, is an EMA of the student: its parameter names are a subset of the student's (e.g.
  MoCo's momentum encoder has no predictor), it has requires_grad False, and the engine shards it like the student.
- A class that declares `kind` registers itself under that name (scale/methods/registry.py): `method.kind` selects
  it, and what registry.KINDS declares of it (views, global_views, classifies) is what the recipe checks and the
  loop read of it (set on the class when it registers).
- Distributed math a loss needs (DINO's center all-reduce, MoCo's key all-gather) goes through
  scale.methods.distributed over `dp_group`, the data-parallel group of the run's parallel context.
"""

import abc
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from scale.data.batch import Batch
from scale.methods import registry


@dataclass(frozen=True)
class StepContext:
    step: int  # global optimizer step, 0-based
    epoch: int
    steps_per_epoch: int
    total_steps: int
    # a log step: the loop reads this step's record, so the monitors the record alone carries (DINO's teacher
    # entropy and teacher-student KL, which the collapse alarm reads) are computed; other steps skip them
    log: bool = True

    @property
    def epoch_float(self) -> float:
        return self.step / self.steps_per_epoch


class Method(abc.ABC):
    student: nn.Module
    teacher: nn.Module | None = None
    # backbone features (no grad) of the first view of the last loss() call's images, for the k-NN monitor
    monitor_features: torch.Tensor | None = None
    # the data-parallel group of the losses' collectives (build_method sets it); None: no process group
    dp_group: dist.ProcessGroup | None = None
    kind: str | None = None  # the value of method.kind that selects this class; None: not selectable (a base)
    # what registry.KINDS declares of `kind` (set when the class registers): the data.views.kind it trains on, the
    # data.views.n_global it needs (None: any), whether the student ends in a class head (validated on data.val)
    views: tuple[str, ...] = registry.CROPS
    global_views: int | None = None
    classifies = False
    # K of the teacher's output distribution (DINO, EsViT), whose entropy the collapse alarm watches; None: none
    teacher_classes: int | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            registry.register(cls)
            declared = registry.KINDS[cls.kind]
            cls.views, cls.global_views, cls.classifies = declared.views, declared.global_views, declared.classifies

    @abc.abstractmethod
    def loss(self, batch: Batch, ctx: StepContext) -> tuple[torch.Tensor, dict]:
        """The scalar loss of one (micro-)batch on this rank and the metrics to log: detached tensors (or host
        numbers), never read here, since the loop reads them on log steps only (the host must not wait for the
        device in between)."""

    def check_batch(self, batch: Batch) -> None:
        """Checks of a batch while it is still on the host (before the step copies it to the device, where a
        check would make the host wait); raises UserError naming the sample."""

    def val_logits(self, images: torch.Tensor) -> torch.Tensor:
        """The student's class logits [B, classes], for validation (methods with `classifies`)."""
        raise NotImplementedError(f"{type(self).__name__} has no class head")

    def ema_momentum(self, ctx: StepContext) -> float | None:
        """Teacher EMA momentum after this step; None when there is no teacher."""
        return None

    def frozen_params(self, ctx: StepContext) -> Callable[[str], bool] | None:
        """Which student parameters (by unwrapped name) get no update this step, e.g. DINO's last layer in the
        first epochs; None when all are trained."""
        return None

    def state_dict(self) -> dict:
        """Non-module state to checkpoint (DINO/EsViT centers, queues)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
