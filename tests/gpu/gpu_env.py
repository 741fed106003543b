"""Which device the GPU tests run on.

SCALE_GPU_TESTS_DEVICE=cpu runs the device-generic test bodies on the CPU (gloo, 2 processes for `multigpu`): a
self-check of the test code on a machine without a GPU. It says nothing about the GPU paths; tests that only mean
something on CUDA (fp16, fused kernels, SyncBatchNorm, DALI `mixed`, CUDA memory) skip in it."""

import os

import pytest
import torch

DEVICE = os.environ.get("SCALE_GPU_TESTS_DEVICE", "cuda")
SELF_CHECK = DEVICE == "cpu"


def device_count() -> int:
    if SELF_CHECK:
        return 2
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_cuda(what: str) -> None:
    """Skip in the CPU self-check: `what` exists on CUDA only."""
    if SELF_CHECK:
        pytest.skip(f"{what} needs CUDA (SCALE_GPU_TESTS_DEVICE=cpu self-check)")


def exact_fp32() -> None:
    """fp32 matmuls and convolutions in full fp32 (cuDNN allows TF32 by default), for comparisons with the CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
