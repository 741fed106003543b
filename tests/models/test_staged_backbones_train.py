"""The CvT, PvT, ViL and T2T-ViT backbones (tiny variants) under the harness: output contract at global and local
crop sizes, meta build + init, activation checkpointing, and a few training steps under EsViT/DINO and DRLoc."""

import copy

import pytest
import torch
from torch.distributed._composable import checkpoint

from scale.methods.base import StepContext
from scale.models import build_backbone, init_weights
from scale.models.config import ModelConfig
from tests.methods.test_methods_train import STEPS_PER_EPOCH, assert_goes_down, build, make_batch, recipe, train

NANO = ["cvt_nano", "cvt_nano_w", "pvt_nano", "vil_nano", "t2t_vit_nano"]


def nano(name: str, img_size: int = 64):
    torch.manual_seed(0)
    return build_backbone(ModelConfig(name=name, img_size=img_size), drop_path=0.0)


@pytest.mark.parametrize("name", NANO)
def test_contract_at_global_and_local_sizes(name):
    model = nano(name).eval()
    for size, grid in ((64, (4, 4)), (32, (2, 2))):
        with torch.no_grad():
            out = model(torch.randn(2, 3, size, size))
        assert out["grid"] == grid
        assert out["tokens"].shape == (2, grid[0] * grid[1], model.token_dim)
        assert out["pooled"].shape == (2, model.embed_dim)
        assert torch.isfinite(out["tokens"]).all()


@pytest.mark.parametrize("name", NANO)
def test_meta_build_then_init_equals_a_direct_build(name):
    model = build_backbone(ModelConfig(name=name, img_size=64), drop_path=0.0, device="meta")
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    init_weights(model)
    direct = nano(name)
    torch.manual_seed(1)
    init_weights(direct)
    for (key, a), b in zip(model.state_dict().items(), direct.state_dict().values()):
        torch.testing.assert_close(a, b, msg=key)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x)["tokens"], direct.eval()(x)["tokens"])


@pytest.mark.parametrize("name", NANO)
def test_checkpointed_blocks_give_same_outputs_and_grads(name):
    model = nano(name)
    wrapped = copy.deepcopy(model)
    for block in wrapped.block_modules():
        checkpoint(block)
    x = torch.randn(2, 3, 32, 32)
    for net in (model, wrapped):
        out = net(x)
        (out["pooled"].square().sum() + out["tokens"].sum()).backward()
    for (key, a), b in zip(model.named_parameters(), wrapped.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=key)


@pytest.mark.parametrize("name", ["vil_nano", "cvt_nano_w", "pvt_nano"])
def test_esvit_trains_with_region_loss_and_local_crops(name):
    method = build(recipe("esvit", model=name))
    batch = make_batch(locals_=((2, 16),))  # 32 px globals (2x2 grid), 16 px locals (1x1)
    assert_goes_down(train(method, batch, 6))
    _, metrics = method.loss(batch, StepContext(6, 0, STEPS_PER_EPOCH, 1000))
    assert metrics["region_loss"] > 0


def test_dino_trains_on_t2t():
    method = build(recipe("dino", model="t2t_vit_nano", model__patch_size=None))
    assert_goes_down(train(method, make_batch(locals_=((2, 16),)), 6))


@pytest.mark.parametrize("name", ["cvt_nano", "t2t_vit_nano"])
def test_drloc_trains_on_the_pooled_grid(name):
    options = {"method__supervised__mixup": 0.0, "method__supervised__cutmix": 0.0, "method__drloc__grid": 2}
    method = build(recipe("drloc", model=name, model__img_size=64, **options))
    batch = make_batch(n_global=1, global_size=64)  # a 4x4 grid, average-pooled to 2x2 as DRLoc pools 14 to 7
    out = method.student(batch.crops[0], drloc_sampler=method.sampler)
    assert out["drloc_positions"][0][2] == 2
    losses = train(method, batch, 8)
    assert_goes_down(losses)
