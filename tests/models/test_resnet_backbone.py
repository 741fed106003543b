"""ResNet backbones: the layer4 grid as tokens, probe features, meta build and re-initialisation."""

import torch

from scale.models import build_backbone, init_weights
from scale.models.config import ModelConfig


def test_layer4_grid_as_tokens():
    model = build_backbone(ModelConfig(name="resnet_nano")).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        grid = model.forward_features(x)
        feats = model.forward_last_blocks(x, 2)
    assert out["grid"] == (2, 2) and out["tokens"].shape == (2, 4, 128)
    torch.testing.assert_close(out["tokens"], grid.flatten(2).transpose(1, 2))
    torch.testing.assert_close(out["pooled"], grid.mean(dim=(2, 3)))
    assert [f.shape for f in feats] == [(2, 64), (2, 128)]
    assert model.embed_dim == model.token_dim == 128 and len(model.block_modules()) == 4


def test_resnet50_on_meta_exposes_a_2048_grid():
    model = build_backbone(ModelConfig(name="resnet50"), device="meta")
    out = model(torch.empty(1, 3, 224, 224, device="meta"))
    assert out["tokens"].shape == (1, 49, 2048) and len(model.block_modules()) == 16


def test_meta_then_to_empty_then_init_matches_a_fresh_build():
    for name in ("resnet_nano", "swin_nano"):
        model = build_backbone(ModelConfig(name=name), device="meta").to_empty(device="cpu")
        torch.manual_seed(1)
        init_weights(model)
        fresh = build_backbone(ModelConfig(name=name))
        torch.manual_seed(1)
        init_weights(fresh)
        for (key, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}: {key}")
        x = torch.randn(1, 3, 96, 96)
        torch.testing.assert_close(model.eval()(x)["tokens"], fresh.eval()(x)["tokens"])
