"""FSDP2 under bf16 keeps BatchNorm in fp32, also when activation checkpointing recomputes its block in the
backward: FSDP2 skips its own forward hooks in the recomputation, so its input cast alone left the recomputed
BatchNorm a bf16 input where the forward had an fp32 one, and checkpointing refused the backward (seen on an H100
with MoCo v3's ViT-BN under full AC). Here the BatchNorm inputs are recorded in both passes."""

import pytest
import torch
import torch.nn.functional as F
from engine_toy import spawn
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from scale.engine.activation import apply_activation_checkpointing
from scale.engine.fsdp import FSDPEngine
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
