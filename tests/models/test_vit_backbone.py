"""ViT options: pos-embed interpolation, MoCo v3 sin-cos and frozen patch projection, pooling, ViT-BN, probes."""

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import DropPath

from scale.errors import UserError
from scale.models import build_backbone, init_weights
from scale.models.config import ModelConfig
from scale.models.pos_embed import sincos_2d
from scale.models.vit import TokenBatchNorm


def vit(**options):
    torch.manual_seed(0)
    options.setdefault("img_size", 64)
    return build_backbone(ModelConfig(name=options.pop("name", "vit_nano"), **options), drop_path=0.0)


def test_output_contract_at_two_sizes():
    model = vit().eval()
    with torch.no_grad():
        big, small = model(torch.randn(2, 3, 64, 64)), model(torch.randn(3, 3, 32, 32))
    assert big["grid"] == (8, 8) and big["tokens"].shape == (2, 64, 64) and big["pooled"].shape == (2, 64)
    assert small["grid"] == (4, 4) and small["tokens"].shape == (3, 16, 64)
    assert model.embed_dim == model.token_dim == 64


def test_learned_pos_embed_is_resized_bicubically_per_grid():
    model = vit()
    x = torch.randn(1, 3, 32, 32)
    patches = model.patch_embed(x)  # [1, 4, 4, D]
    embedded = model._pos_embed(patches)
    grid = model.pos_embed[:, 1:].reshape(1, 8, 8, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(4, 4), mode="bicubic", align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(1, 16, -1)
    torch.testing.assert_close(embedded[:, 1:], patches.reshape(1, 16, -1) + expected)
    torch.testing.assert_close(embedded[:, :1], model.cls_token + model.pos_embed[:, :1])
    # at the native grid the table is used as it is
    native = model.patch_embed(torch.randn(1, 3, 64, 64))
    torch.testing.assert_close(model._pos_embed(native)[:, 1:], native.reshape(1, 64, -1) + model.pos_embed[:, 1:])


def test_interpolation_keeps_a_linear_ramp_linear():
    # bicubic resizing of a ramp across the grid stays a ramp: positions keep their meaning at other sizes
    model = vit()
    with torch.no_grad():
        ramp = torch.arange(8.0).repeat_interleave(8)  # row index of every token of the 8x8 grid
        model.pos_embed[:, 1:] = ramp[None, :, None].expand(1, 64, 64)
        embedded = model._pos_embed(torch.zeros(1, 4, 4, 64))[0, 1:, 0].reshape(4, 4)
    assert torch.all(embedded[1:] > embedded[:-1])
    torch.testing.assert_close(embedded[:, 0], embedded[:, 3])


def test_sincos_matches_the_moco_v3_formula():
    h, w, dim = 3, 5, 16
    table = sincos_2d(h, w, dim)[0]
    quarter = dim // 4
    for r in range(h):
        for c in range(w):
            for i in range(quarter):
                omega = 1.0 / 10000 ** (i / quarter)
                row = table[r * w + c]
                assert row[i].item() == pytest.approx(math.sin(r * omega), abs=1e-6)
                assert row[quarter + i].item() == pytest.approx(math.cos(r * omega), abs=1e-6)
                assert row[2 * quarter + i].item() == pytest.approx(math.sin(c * omega), abs=1e-6)
                assert row[3 * quarter + i].item() == pytest.approx(math.cos(c * omega), abs=1e-6)


def test_sincos_model_adds_fixed_embedding_and_zero_for_cls():
    model = vit(pos_embed="sincos")
    assert "pos_embed" not in dict(model.named_parameters())  # nothing to learn
    # a buffer in the state dict, like MoCo v3's frozen pos_embed: a zero row for the class token, then the table
    expected_table = torch.cat([torch.zeros(1, 1, 64), sincos_2d(8, 8, 64)], dim=1)
    torch.testing.assert_close(model.state_dict()["pos_embed"], expected_table)
    for h in (8, 4):  # the built grid, and another one (the formula on its own grid)
        patches = torch.randn(1, h, h, 64)
        embedded = model._pos_embed(patches)
        torch.testing.assert_close(embedded[:, 1:], patches.reshape(1, h * h, -1) + sincos_2d(h, h, 64))
        torch.testing.assert_close(embedded[:, :1], model.cls_token)


def test_trainable_sincos_starts_from_the_fixed_table_and_learns():
    """DeiT fine-tuning of a MoCo v3 checkpoint (transfer/README.md): its learned pos_embed loads the checkpoint's
    fixed sin-cos table, class-token row included, and trains it."""
    fixed, trainable = vit(pos_embed="sincos"), vit(pos_embed="sincos", pos_embed_trainable=True)
    torch.testing.assert_close(trainable.pos_embed.detach(), fixed.pos_embed)  # the same init
    trainable.load_state_dict(fixed.state_dict(), strict=True)  # a pre-training checkpoint loads as it is
    assert isinstance(trainable.pos_embed, torch.nn.Parameter) and trainable.pos_embed.requires_grad
    pooled = trainable(torch.randn(2, 3, 64, 64))["pooled"]
    (pooled * torch.randn_like(pooled)).sum().backward()  # (a plain sum of a LayerNorm output has no gradient)
    assert trainable.pos_embed.grad[0, 0].abs().sum() > 0  # the class token's row too
    with torch.no_grad():
        trainable.pos_embed.add_(1.0)
    patches = torch.randn(1, 8, 8, 64)
    embedded = trainable._pos_embed(patches)
    torch.testing.assert_close(embedded[:, 1:], patches.reshape(1, 64, -1) + sincos_2d(8, 8, 64) + 1.0)
    torch.testing.assert_close(embedded[:, :1], trainable.cls_token + 1.0)
    with pytest.raises(UserError, match="pos_embed_trainable"):
        vit(pos_embed="learned", pos_embed_trainable=True)


def test_frozen_patch_projection_gets_no_gradient_and_no_update():
    model = vit(frozen_patch_embed=True)
    proj = model.patch_embed.proj
    fan = 3 * 8 * 8 + 64
    assert proj.weight.abs().max() <= math.sqrt(6.0 / fan)  # MoCo v3's xavier-uniform bound
    assert not proj.weight.requires_grad and not proj.bias.requires_grad
    before = proj.weight.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1, weight_decay=0.1)
    model(torch.randn(2, 3, 32, 32))["pooled"].sum().backward()
    optimizer.step()
    assert proj.weight.grad is None and proj.bias.grad is None
    torch.testing.assert_close(proj.weight, before, rtol=0, atol=0)
    assert model.blocks[0].attn.qkv.weight.grad is not None


def test_average_pooling_with_and_without_final_norm():
    x = torch.randn(2, 3, 32, 32)
    with_norm = vit(pooling="avg").eval()
    assert with_norm.cls_token is None  # MoCo v3's "w/o [CLS]" has no class token at all
    out = with_norm(x)
    torch.testing.assert_close(out["pooled"], out["tokens"].mean(dim=1))
    assert out["tokens"].shape == (2, 16, 64)
    without = vit(pooling="avg", final_norm=False).eval()
    assert isinstance(without.norm, torch.nn.Identity)
    raw = without(x)
    torch.testing.assert_close(raw["pooled"], raw["tokens"].mean(dim=1))


def test_vit_bn_puts_batchnorm_before_the_mlp_only():
    model = vit(name="vit_bn_nano")
    block = model.blocks[0]
    assert isinstance(block.norm2, TokenBatchNorm) and isinstance(block.norm1, torch.nn.LayerNorm)
    x = torch.randn(5, 7, 64) * 3 + 2
    y = block.norm2(x)  # train mode: batch statistics over all tokens of all images
    torch.testing.assert_close(y.mean(dim=(0, 1)), torch.zeros(64), atol=1e-5, rtol=0)
    model(torch.randn(2, 3, 32, 32))
    assert block.norm2.bn.num_batches_tracked.item() == 2  # the direct call above, then the forward


def test_forward_last_blocks():
    model = vit().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = model.forward_last_blocks(x, 2, avgpool=True)
        out = model(x)
    assert [f.shape for f in feats] == [(2, 64)] * 3
    torch.testing.assert_close(feats[1], out["pooled"])
    torch.testing.assert_close(feats[2], out["tokens"].mean(dim=1))
    with pytest.raises(UserError, match="n_last_blocks"):
        model.forward_last_blocks(x, 4)


def test_patch_7_at_98_px_and_num_heads_override():
    model = build_backbone(ModelConfig(name="vit_large", patch_size=7, num_heads=8), device="meta")
    out = model(torch.empty(1, 3, 98, 98, device="meta"))
    assert out["grid"] == (14, 14) and out["tokens"].shape == (1, 196, 1024)
    assert model.blocks[0].attn.num_heads == 8


def test_meta_build_then_materialise_and_init_is_deterministic():
    model = build_backbone(ModelConfig(name="vit_bn_nano", img_size=64, weight_init="moco"), device="meta")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    init_weights(model)
    twin = build_backbone(ModelConfig(name="vit_bn_nano", img_size=64, weight_init="moco"))
    torch.manual_seed(3)
    init_weights(twin)
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert model.blocks[0].norm2.bn.running_var.eq(1).all()


@pytest.mark.parametrize("key,value", [("pos_embed", "rope"), ("pooling", "max"), ("name", "vit_gigantic")])
def test_bad_options_are_user_errors(key, value):
    with pytest.raises(UserError, match=key if key != "name" else "model.name"):
        build_backbone(ModelConfig(**{"name": "vit_nano", key: value}), device="meta")


def test_drop_path_masks_are_timms_drawn_once_per_pass():
    """Stochastic depth draws one Bernoulli tensor for every block of a pass (timm draws per path: 2 launches
    each); each block's masks hold timm's values (0 or 1/keep rounded in the branch dtype, bf16 under autocast),
    and a block given masks computes timm's block (all kept: the eval-mode output, bit for bit)."""
    from scale.bench.host import OpCounter, Phases

    model = vit(img_size=32)
    for block, rate in zip(model.blocks[1:], (0.25, 0.5)):
        block.drop_path1 = block.drop_path2 = DropPath(rate)
    model.train()
    images = torch.randn(512, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        masks = model.drop_masks(images)
    assert masks.shape == (3, 2, 512) and masks.dtype == torch.bfloat16
    for keep, block_masks in zip((1.0, 0.75, 0.5), masks):
        scaled = torch.ones((), dtype=torch.bfloat16).div_(keep).item()  # timm: random_tensor.div_(keep_prob)
        assert set(block_masks.unique().tolist()) <= {0.0, scaled}
        assert abs((block_masks > 0).float().mean().item() - keep) < 0.05
    phases = Phases()
    with OpCounter(phases) as counter:
        model(images[:4])
    assert counter.launched["other"]["aten::bernoulli_"] == 1
    block, x = model.blocks[1], torch.randn(4, 17, 64)
    ones = torch.ones(2, 4)
    assert torch.equal(block(x, ones), block.eval()(x))
