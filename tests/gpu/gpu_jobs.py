"""What the GPU tests run inside spawned ranks (engine_toy.spawn): the CPU tests' jobs in full fp32 (and with
deterministic kernels), and SyncBatchNorm on each rank's part of one batch."""

import os

import torch
import torch.distributed as dist
from engine_toy import all_ranks
from gpu_env import exact_fp32
from torch import nn

from scale.engine.dist import detect, device_for

BN_BATCH, BN_CHANNELS = 8, 4


def cpu_draws(fn, *args):
    """fn(*args) with torch.randint drawing from the CPU's generator and moving its result to the asked device.
    DRLoc samples its token pairs with torch.randint on the loss's device, and CUDA's generator draws other numbers
    than the CPU's from the same seed: a GPU run would train on other pairs than the CPU run it is compared with
    (seen on an H100). Both runs of a comparison use it."""
    original = torch.randint

    def randint(*args, device=None, **kwargs):
        drawn = original(*args, **kwargs)
        return drawn if device is None else drawn.to(device)

    torch.randint = randint
    try:
        return fn(*args)
    finally:
        torch.randint = original


def in_fp32(fn, *args):
    """fn(*args) with TF32 off, so that fp32 results compare with the CPU's."""
    exact_fp32()
    return fn(*args)


def deterministic(fn, *args):
    """fn(*args) in full fp32 with torch's deterministic kernels where it has them (a warning where it has not) and
    cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG, read when its first handle is made), for bit-exact reruns."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    return in_fp32(fn, *args)


def bn_inputs() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One global batch, the weights of a loss over its outputs, and the BatchNorm's affine parameters."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BN_BATCH, BN_CHANNELS, 5, 5, generator=gen) * 3 + 1
    w = torch.randn(x.shape, generator=gen)
    affine = {"weight": torch.rand(BN_CHANNELS, generator=gen) + 0.5, "bias": torch.randn(BN_CHANNELS, generator=gen)}
    return x, w, affine


def bn_step(bn: nn.Module, x: torch.Tensor, w: torch.Tensor) -> dict:
    """Forward in training mode, backward of sum(w * out): outputs, input and parameter gradients, statistics."""
    affine = bn_inputs()[2]
    with torch.no_grad():
        bn.weight.copy_(affine["weight"])
        bn.bias.copy_(affine["bias"])
    x = x.clone().requires_grad_()
    out = bn(x)
    (w * out).sum().backward()
    return {
        "out": out.detach().cpu(),
        "grad": x.grad.cpu(),
        "weight_grad": bn.weight.grad,
        "bias_grad": bn.bias.grad,
        "running_mean": bn.running_mean.cpu(),
        "running_var": bn.running_var.cpu(),
    }


def syncbn_job() -> dict:
    """Each rank normalises its half of the batch with SyncBatchNorm; rank 0 returns every rank's outputs and
    input gradients in rank order, the parameter gradients summed over ranks (what DDP would average) and its
    running statistics."""
    info = detect()
    device = device_for(info)
    x, w, _ = bn_inputs()
    part = BN_BATCH // info.world_size
    rows = slice(info.rank * part, (info.rank + 1) * part)
    bn = nn.SyncBatchNorm(BN_CHANNELS).to(device)
    result = bn_step(bn, x[rows].to(device), w[rows].to(device))
    for key in ("weight_grad", "bias_grad"):
        dist.all_reduce(result[key])
        result[key] = result[key].cpu()
    for key in ("out", "grad"):
        result[key] = torch.cat(all_ranks(result[key]))
    return result


def batchnorm_reference() -> dict:
    """The same step with nn.BatchNorm2d over the whole batch on the CPU."""
    x, w, _ = bn_inputs()
    return bn_step(nn.BatchNorm2d(BN_CHANNELS), x, w)
