"""T2T-ViT-14 against the T2T-ViT paper and DRLoc Table 2b; the Performer token layer's normalisation."""

import math

import pytest
import torch
from torch import nn

from scale.models import build_backbone, init_weights
from scale.models.complexity import count_macs, count_params
from scale.models.config import ModelConfig
from scale.models.t2t import TokenPerformer


def test_t2t_vit_14_matches_the_paper():
    model = build_backbone(ModelConfig(name="t2t_vit_14"), device="meta")
    # T2T-ViT Table 2 / DRLoc Table 2b: 21.5M parameters with the ImageNet-1K classifier, 4.8G MACs
    assert (count_params(model) + 385 * 1000) / 1e6 == pytest.approx(21.5, rel=0.02)
    assert count_macs(model, 224) / 1e9 == pytest.approx(4.8, rel=0.02)
    assert len(model.block_modules()) == 14 and model.embed_dim == 384
    assert model(torch.empty(1, 3, 224, 224, device="meta"))["grid"] == (14, 14)
    assert model(torch.empty(1, 3, 96, 96, device="meta"))["grid"] == (6, 6)


def test_performer_attention_is_a_normalised_average_of_values():
    torch.manual_seed(0)
    layer = TokenPerformer(12, 8)
    layer.draw_features()
    with torch.no_grad():
        layer.kqv.weight[16:].zero_()  # v = its bias for every token
        layer.kqv.bias[16:] = torch.arange(8.0)
        layer.proj = nn.Identity()
        for linear in (layer.mlp[0], layer.mlp[2]):
            linear.weight.zero_()
            linear.bias.zero_()
        out = layer(torch.randn(2, 5, 12))
    # x = v + attention(v): attention weights sum to one, so a constant v comes back unchanged
    torch.testing.assert_close(out, 2 * torch.arange(8.0).expand(2, 5, 8), rtol=1e-5, atol=1e-5)


def test_random_features_are_orthogonal_saved_and_redrawn_by_init():
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(name="t2t_vit_nano", img_size=32), drop_path=0.0)
    w = model.token_layers[0].w
    m = w.shape[0]
    torch.testing.assert_close(w @ w.t(), m * torch.eye(m), rtol=1e-4, atol=1e-4)  # rows orthogonal, norm sqrt(m)
    assert "token_layers.0.w" in model.state_dict()
    before = w.clone()
    init_weights(model)
    assert not torch.allclose(model.token_layers[0].w, before)
    assert math.isclose(model.token_layers[0].w.norm(dim=1).mean().item(), math.sqrt(m), rel_tol=1e-4)
