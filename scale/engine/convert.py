"""Module conversions, the first step of `scale.engine.parallelize`: BatchNorm -> SyncBatchNorm across GPUs and the
CPU bf16 convolution guard."""

from torch import nn

from scale.engine.cpu_bf16_conv import guard_cpu_bf16_convs
from scale.engine.precision import Precision
from scale.methods.base import Method


def convert_modules(method: Method, engine_cfg, precision: Precision, world_size: int) -> None:
    if precision.device_type == "cuda" and world_size > 1 and engine_cfg.sync_bn:
        method.student = nn.SyncBatchNorm.convert_sync_batchnorm(method.student)
        if method.teacher is not None:
            method.teacher = nn.SyncBatchNorm.convert_sync_batchnorm(method.teacher)
    if precision.device_type == "cpu" and precision.name == "bf16":
        guard_cpu_bf16_convs(method.student)  # only the student computes weight gradients
