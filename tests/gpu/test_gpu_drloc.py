"""DRLoc's official pooling of the token grid (3x3, stride 2, padding 1, count_include_pad False) on the device:
forward and backward equal the CPU's pooling of the same grid in NCHW memory. token_grid's [B, D, h, w] is a
channels-last view, and torch 2.11's CUDA avg_pool2d backward of a channels-last input with padding sends gradients
to the wrong pixels (pytorch#188344; on an H200, 2026-11-28: max |grad - cpu| 0.59 channels-last, 0 NCHW): what the
device check's fp32 experiment found as DRLoc's pos_embed 3e-3 off the CPU (issue 46)."""

import pytest
import torch
import torch.nn.functional as F
from gpu_env import DEVICE

from scale.methods.drloc import pool_grid
from scale.methods.nets import token_grid

pytestmark = pytest.mark.gpu


def pooled_and_grad(tokens, upstream, side, k, device, reference=False):
    x = tokens.to(device).detach().requires_grad_()  # a leaf on every device, its own .grad
    grid = token_grid({"tokens": x, "grid": (side, side)})
    if reference:  # NCHW memory, the pooling's definition
        pooled = F.avg_pool2d(grid.contiguous(), 3, stride=2, padding=1, count_include_pad=False)
    else:
        pooled = pool_grid(grid, k, "avg3x3s2")
    pooled.backward(upstream.to(device))
    return pooled.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("side,k", [(4, 2), (14, 7)])
def test_token_grid_pooling_and_its_gradient_equal_the_cpus(side, k):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(2, side * side, 8, generator=gen, dtype=torch.float64)
    upstream = torch.randn(2, 8, k, k, generator=gen, dtype=torch.float64)
    got = pooled_and_grad(tokens, upstream, side, k, DEVICE)
    expected = pooled_and_grad(tokens, upstream, side, k, "cpu", reference=True)
    assert got[1].abs().sum() > 0
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-12)
