"""The linear-probe protocols of the papers: which feature, which batch, and what each paper's recipes carry."""

import pytest
import torch
from omegaconf import OmegaConf

from scale.config import load_recipe
from scale.config.schema import EvalConfig
from scale.errors import UserError
from scale.eval.linear import probe_batch, probe_feature
from scale.models import build_backbone
from scale.models.config import ModelConfig


def _eval(**kw):
    return OmegaConf.structured(EvalConfig(**kw))


@torch.no_grad()
def test_moco_v3_feature_is_the_class_token_after_the_last_block_and_final_norm():
    torch.manual_seed(0)
    vit = build_backbone(ModelConfig(name="vit_nano", img_size=32, patch_size=8)).eval()
    x = torch.randn(2, 3, 32, 32)
    feature = probe_feature(_eval(linear_feature="pooled"))(vit, x)
    assert feature.shape == (2, vit.embed_dim)
    assert torch.allclose(feature, vit.forward_last_blocks(x, 1)[0], atol=1e-6)  # the normed last-block class token
    dino = probe_feature(_eval(linear_feature="last_blocks", linear_n_last_blocks=2))(vit, x)
    assert dino.shape == (2, 2 * vit.embed_dim) and torch.allclose(dino[:, -vit.embed_dim :], feature, atol=1e-6)


@torch.no_grad()
def test_resnet_feature_is_the_final_pooled_one_not_four_stages():
    torch.manual_seed(0)
    net = build_backbone(ModelConfig(name="resnet_nano", img_size=32)).eval()
    x = torch.randn(2, 3, 32, 32)
    feature = probe_feature(_eval(linear_feature="pooled"))(net, x)
    final = net.forward_last_blocks(x, 1)[0]  # the last residual block, global-average-pooled (fc's input)
    assert torch.allclose(feature, final, atol=1e-6)
    concatenated = probe_feature(_eval(linear_feature="last_blocks", linear_n_last_blocks=4))(net, x)
    assert concatenated.shape[1] > feature.shape[1]


def test_probe_batch_is_the_protocols_global_batch():
    assert probe_batch(_eval(batch_size=128), world_size=8) == 1024  # DINO: 128 per GPU
    assert probe_batch(_eval(linear_batch=4096), world_size=8) == 4096  # MoCo v3
    with pytest.raises(UserError, match="does not split over 3 ranks"):
        probe_batch(_eval(linear_batch=4096), world_size=3)
    with pytest.raises(UserError, match="eval.linear_feature"):
        probe_feature(_eval(linear_feature="cls"))


@pytest.mark.parametrize(
    "recipe, protocol, feature, blocks, avgpool, epochs, batch",
    [
        ("dino/table2/vit_s16", "dino", "last_blocks", 4, False, 100, 1024),  # eval_linear.py, ViT-S
        ("dino/table2/vit_b16", "dino", "last_blocks", 1, True, 100, 1024),  # README: ViT-B n 1 + avgpool
        ("dino/fig5/vit_b16", "dino", "last_blocks", 1, True, 100, 1024),  # eval_linear.py help: ViT-B
        ("dino/fig5/vit_b8", "dino", "last_blocks", 1, True, 100, 1024),
        ("dino/fig5/vit_s16", "dino", "last_blocks", 4, False, 100, 1024),
        ("dino/table2/resnet50", "dino", "pooled", None, None, 100, 1024),  # fc = Identity
        ("mocov3/table1/vit_b", "mocov3", "pooled", None, None, 90, 4096),  # MoCo v3 Sec. 4, main_lincls.py
        ("mocov3/table4/r50_mocov3", "mocov3", "pooled", None, None, 90, 4096),
        ("esvit/table1/swin_t_w7_lvlr", "esvit", "last_blocks", 4, False, 100, 1024),  # EsViT App. C.3
        ("esvit/table4/r50_lvlr", "esvit", "pooled", None, None, 100, 1024),
        ("drloc/table3/swin_cifar10_drloc", "finetune", None, None, None, None, None),
        ("mocov3/table5/vit_b_cifar10_mocov3", "finetune", None, None, None, None, None),
    ],
)
def test_each_recipe_carries_its_papers_protocol(recipe, protocol, feature, blocks, avgpool, epochs, batch):
    ev = load_recipe(recipe).eval
    assert ev.protocol == protocol
    if feature is None:
        return
    assert (ev.linear_feature, ev.linear_epochs, ev.linear_batch) == (feature, epochs, batch)
    if blocks is not None:
        assert (ev.linear_n_last_blocks, ev.linear_avgpool) == (blocks, avgpool)


@pytest.mark.parametrize(
    "recipe, interpolation",
    [
        ("dino/table2/vit_s16", "bicubic"),  # eval_linear.py:66, eval_knn.py:33 Resize(256, interpolation=3)
        ("esvit/table1/swin_t_w7_lvlr", "bicubic"),  # esvit eval_linear.py:57
        ("mocov3/table1/vit_b", "bilinear"),  # main_lincls.py:290 Resize(256)
        ("mocov3/table4/r50_mocov3", "bilinear"),
        ("dino/table6/vit_b16_imagenet1k", "bicubic"),  # DeiT datasets.py:103
        ("mocov3/table5/vit_b_cifar10_mocov3", "bilinear"),  # transfer/datasets.py:26
    ],
)
def test_each_recipe_resizes_its_evaluation_view_as_its_official_script(recipe, interpolation):
    assert load_recipe(recipe).data.views.eval_interpolation == interpolation
