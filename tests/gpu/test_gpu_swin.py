"""EsViT's Swin backbone on CUDA: EsViT (view and region losses, EMA teacher) with a tiny Swin (patch 2, window 4:
16x16 tokens at the 32 px global crops, 8x8 at the 16 px local ones, three merges), 4 steps of the CPU tests'
engine_real on 1 GPU against the same run on the CPU:

- fp32 under DDP and FSDP2: losses and weights within 1e-4 of the CPU's (float summation order; TF32 off; one step
  moves the weights by about the learning rate, 1e-3), as test_gpu_engines for the ViT;
- bf16 under FSDP2: finite, the first loss (a forward only) within 2% and the weights within 1.5e-3 on average per
  tensor of the fp32 CPU run (test_gpu_engines' bounds and reasons). Swin's shifted windows take a mask, so on CUDA
  its attention runs SDPA's memory-efficient kernel rather than flash."""

import pytest
import torch
from engine_real import LR, real_jobs
from engine_toy import spawn
from gpu_env import DEVICE
from gpu_jobs import in_fp32
from test_gpu_engines import FP32_TOL, assert_close_to_cpu

pytestmark = pytest.mark.gpu

SWIN = {"name": "swin_nano", "patch_size": 2, "img_size": 32, "window_size": 4}
RUNS = {
    "fp32_ddp": {"kind": "ddp"},
    # FSDP2 itself on one device, which would run as DDP (scale.engine.kinds.runs_as)
    "fp32_fsdp2": {"kind": "fsdp2", "unsharded_ddp": False},
    "bf16_fsdp2": {"kind": "fsdp2", "precision": "bf16", "unsharded_ddp": False},
}


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    jobs = [("esvit", "esvit", {"kind": "ddp"}, 0, SWIN)]
    return spawn(real_jobs, jobs, world=1, tmp_path=tmp_path_factory.mktemp("swin_cpu"), device="cpu")["esvit"]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    jobs = [(label, "esvit", kw, 0, SWIN) for label, kw in RUNS.items()]
    return spawn(in_fp32, real_jobs, jobs, world=1, tmp_path=tmp_path_factory.mktemp("swin_gpu"), device=DEVICE)


def test_the_runs_train_a_swin(cpu):
    assert any(name.startswith("backbone.layers.3.") for name in cpu["student"]), list(cpu["student"])[:5]
    assert all(torch.isfinite(torch.tensor(cpu["losses"])))


@pytest.mark.parametrize("label", ["fp32_ddp", "fp32_fsdp2"])
def test_swin_fp32_on_one_gpu_equals_the_cpu(gpu, cpu, label):
    assert_close_to_cpu(gpu[label], cpu, FP32_TOL)


def test_swin_bf16_on_one_gpu_is_finite_and_close_to_fp32(gpu, cpu):
    run = gpu["bf16_fsdp2"]
    assert torch.isfinite(torch.tensor(run["losses"])).all()
    assert run["losses"][0] == pytest.approx(cpu["losses"][0], rel=2e-2)
    for part in ("student", "teacher"):
        for name, value in cpu[part].items():
            if value.is_floating_point():
                got = run[part][name]
                assert torch.isfinite(got).all(), f"{part} {name}"
                assert (got.float() - value).abs().mean() < 1.5 * LR, f"{part} {name}"
