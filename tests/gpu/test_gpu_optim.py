"""The CUDA optimizers against the reference ones on the CPU, 20 steps on the same gradients: torch's fused AdamW
(what scale.optim builds on CUDA), and apex's FusedAdam and FusedLAMB (scale.optim's LAMB on CUDA when apex is
installed) when apex is importable."""

import pytest
import torch
from gpu_env import DEVICE, require_cuda
from timm.optim import Lamb

from scale.engine.config import OptimConfig
from scale.optim import apex_available, build_optimizer, param_groups

pytestmark = pytest.mark.gpu

STEPS, LR, WD = 20, 1e-2, 0.05
SHAPES = {"proj.weight": (16, 8), "proj.bias": (16,), "norm.weight": (8,), "head.weight": (4, 16)}


def params(device) -> list[tuple[str, torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(0)
    return [(n, torch.nn.Parameter(torch.randn(s, generator=gen).to(device))) for n, s in SHAPES.items()]


def run(make_optimizer, device) -> dict[str, torch.Tensor]:
    """STEPS steps on gradients drawn on the CPU (the same on every device), with DINO's two groups."""
    named = params(device)
    optimizer = make_optimizer(param_groups(named, OptimConfig()))
    for group in optimizer.param_groups:
        group["weight_decay"] = WD * group["wd_scale"]
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for _, p in named:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        optimizer.step()
    return {n: p.detach().cpu() for n, p in named}


def assert_same(got: dict, ref: dict, tol: float) -> None:
    initial = dict(params("cpu"))
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, atol=tol, rtol=0, msg=name)
        assert (value - initial[name]).abs().max() > 100 * tol, name  # the steps moved it well beyond tol


def reference_adamw(groups):
    return torch.optim.AdamW(groups, lr=LR, foreach=False, fused=False)


def test_fused_adamw_matches_the_reference():
    cfg = OptimConfig(lr=LR, weight_decay=WD)
    device = torch.device(DEVICE)
    built = run(lambda groups: build_optimizer(groups, cfg, device), device)
    if device.type == "cuda":
        assert build_optimizer(param_groups(params(device), cfg), cfg, device).defaults["fused"] is True
    assert_same(built, run(reference_adamw, "cpu"), tol=1e-5)


def test_apex_fused_adam_matches_adamw():
    require_cuda("apex")
    if not apex_available():
        pytest.skip("apex not installed")
    from apex.optimizers import FusedAdam

    got = run(lambda groups: FusedAdam(groups, lr=LR, adam_w_mode=True), "cuda")
    assert_same(got, run(reference_adamw, "cpu"), tol=1e-5)


def test_apex_fused_lamb_matches_timm_lamb():
    require_cuda("apex")
    if not apex_available():
        pytest.skip("apex not installed")
    from apex.optimizers import FusedLAMB

    cfg = OptimConfig(name="lamb", lr=LR, weight_decay=WD)
    device = torch.device("cuda")
    assert isinstance(build_optimizer(param_groups(params(device), cfg), cfg, device), FusedLAMB)
    got = run(lambda groups: build_optimizer(groups, cfg, device), device)
    ref = run(lambda groups: Lamb(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, max_grad_norm=None), "cpu")
    assert_same(got, ref, tol=1e-5)
