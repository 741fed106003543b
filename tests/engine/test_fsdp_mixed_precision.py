"""FSDP2's mixed precision, two faults first seen on an H100 (torch 2.11), checked on the CPU:
- BatchNorm stays fp32 also when activation checkpointing recomputes its block in the backward. On an H100 a
  recomputed BatchNorm under FSDP2's own input cast saw bf16 where the forward had seen fp32, and checkpointing
  refused the backward (MoCo v3's ViT-BN under full AC); on the CPU FSDP2's cast reaches both passes, so the fault
  itself does not show here. scale casts with hooks of its own, and this test records the BatchNorm inputs of both
  passes (it fails without those hooks);
- the loss scaler (fp16) steps torch's fused AdamW, whose in-place update of its step counts by the inf flag needs
  the flag in GradScaler's shape."""

import pytest
import torch
import torch.nn.functional as F
from engine_toy import spawn
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from scale.engine.activation_checkpointing import apply_activation_checkpointing
from scale.engine.fsdp import FSDPEngine, ShardedScaler
from scale.engine.precision import Precision
from scale.models.vit import ViT

pytestmark = pytest.mark.slow


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = ViT(embed_dim=32, depth=2, num_heads=2, patch_size=8, img_size=16, bn_mlp=True, drop_path=0.0)


def batchnorm_input_dtypes() -> dict:
    seen = []
    original = F.batch_norm

    def spy(x, *args, **kwargs):
        seen.append(x.dtype)
        return original(x, *args, **kwargs)

    F.batch_norm = spy
    try:
        net = Net()
        assert apply_activation_checkpointing(net, "full", 1) == 2
        engine = FSDPEngine.__new__(FSDPEngine)  # only what shard() reads
        engine.mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
        engine.precision = Precision("bf16", "cpu")
        engine.shard(net, reshard_after_forward=True, root_reshard=None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net.backbone(torch.randn(4, 3, 16, 16))["pooled"]
        forward = len(seen)
        out.float().sum().backward()
    finally:
        F.batch_norm = original
    return {"forward": seen[:forward], "recomputed": seen[forward:], "out": out.dtype}


def test_batchnorm_stays_fp32_when_its_block_is_recomputed(tmp_path):
    seen = spawn(batchnorm_input_dtypes, world=1, tmp_path=tmp_path)
    assert seen["forward"] == [torch.float32] * 2  # one BatchNorm per block
    assert seen["recomputed"] == [torch.float32] * 2
    assert seen["out"] == torch.bfloat16


def scaled_fused_steps() -> list[float]:
    param = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([param], lr=0.1, weight_decay=0.0, fused=True)
    scaler = ShardedScaler("cpu")
    for _ in range(2):
        scaler.scale((param * param).sum()).backward()
        scaler.unscale_(optimizer)  # as TorchEngine.step: unscale, clip, then step
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return param.detach().tolist()


def test_the_loss_scaler_steps_a_fused_optimizer(tmp_path):
    weights = spawn(scaled_fused_steps, world=1, tmp_path=tmp_path)
    assert weights == pytest.approx([0.8] * 4, abs=1e-3)  # two Adam steps of lr 0.1 down the gradient
