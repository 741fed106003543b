"""Module conversions, the first step of `scale.engine.parallelize`: BatchNorm -> SyncBatchNorm across GPUs and the
CPU bf16 convolution guard."""

from torch import nn

from scale.engine.cpu_bf16_conv import guard_cpu_bf16_convs
from scale.engine.parallel import ParallelContext
from scale.engine.precision import Precision
from scale.methods.base import Method


def convert_modules(method: Method, engine_cfg, precision: Precision, parallel: ParallelContext) -> None:
    if precision.device_type == "cuda" and parallel.dp_size > 1 and engine_cfg.sync_bn:
        # batch statistics over the data-parallel group: the ranks that see different samples
        method.student = nn.SyncBatchNorm.convert_sync_batchnorm(method.student, process_group=parallel.dp_group)
        if method.teacher is not None:
            method.teacher = nn.SyncBatchNorm.convert_sync_batchnorm(method.teacher, process_group=parallel.dp_group)
    if precision.device_type == "cpu" and precision.name == "bf16":
        guard_cpu_bf16_convs(method.student)  # only the student computes weight gradients
