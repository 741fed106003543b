"""DDP: the student is replicated and wrapped in DistributedDataParallel (left plain on one rank); the teacher (no gradients) stays a plain
replicated module, updated on every rank by the same EMA."""

import torch
from torch.nn.parallel import DistributedDataParallel

from scale.engine import torch_compat
from scale.engine.ema import copy_student_to_teacher
from scale.engine.materialize import materialize
from scale.engine.torch_engine import TorchEngine, broadcast_module
from scale.methods.base import Method


class DDPEngine(TorchEngine):
    kind = "ddp"

    def wrap(self, method: Method, meta: bool) -> None:
        if meta:
            for module in self.modules():
                materialize(module, self.device)
                broadcast_module(module, self.dist_info.dp_group)
            if method.teacher is not None:
                copy_student_to_teacher(method.teacher, method.student)
        if self.dist_info.dp_size == 1:
            # one replica has nothing to average: DDP would only copy every gradient into its buckets (a launch per
            # parameter per step) for an all-reduce of one rank
            return
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # buffers are not broadcast, as under FSDP2 and DeepSpeed (BatchNorm statistics are SyncBN's on GPU).
        # No init_sync: setup() has broadcast rank 0's parameters and buffers already; DDP's own sync would repeat it
        # through a flattened copy of the parameters that gloo's worker thread may free, where the CPU memory
        # profiler of scale.bench does not see it (it would then count that copy as alive in the measured step)
        method.student = torch_compat.ddp(
            method.student,
            sync_buffers=False,
            device_ids=device_ids,
            gradient_as_bucket_view=True,
            init_sync=False,
            process_group=self.dist_info.dp_group,
            find_unused_parameters=self.cfg.find_unused_parameters,
        )

    def set_gradient_sync(self, enabled: bool) -> None:
        # what DDP's no_sync() toggles; read at the next forward, so it is set right after the previous backward
        if isinstance(self.method.student, DistributedDataParallel):
            self.method.student.require_backward_grad_sync = enabled

    def make_scaler(self):
        return torch.amp.GradScaler(self.device.type, init_scale=2.0**self.cfg.loss_scale_power)
