"""PvT against EsViT Table 4, and the spatial-reduction attention with relative position bias against an explicit
per-pair computation."""

import pytest
import torch

from scale.errors import UserError
from scale.models import build_backbone
from scale.models.complexity import count_params
from scale.models.config import ModelConfig
from scale.models.staged import MapAttention


def meta(name: str, **options):
    return build_backbone(ModelConfig(name=name, **options), device="meta")


def test_pvt_tiny_matches_esvit_table_4():
    model = meta("pvt_tiny")
    assert count_params(model) / 1e6 == pytest.approx(24.0, rel=0.02)  # EsViT Table 4: PvT 24M
    assert [stage.embed.proj.out_channels for stage in model.stages] == [64, 128, 320, 512]
    assert [stage.blocks[0].attn.sr for stage in model.stages] == [8, 4, 2, 1]
    assert not any("pos_embed" in name or "cls" in name for name, _ in model.named_parameters())
    assert model(torch.empty(1, 3, 224, 224, device="meta"))["grid"] == (7, 7)
    # the literal 2-2-6-2 reading of EsViT's text, with PvT-Small's widths
    assert count_params(meta("pvt_tiny_2262")) / 1e6 == pytest.approx(18.96, rel=0.01)


def test_spatial_reduction_attention_equals_explicit_pairs():
    torch.manual_seed(0)
    grid, sr, table = (4, 6), 2, (6, 6)
    attn = MapAttention(8, 2, table, sr=sr).eval()
    torch.nn.init.normal_(attn.relative_position_bias_table)
    x = torch.randn(1, grid[0] * grid[1], 8)
    with torch.no_grad():
        fmap = attn.sr_conv(x.transpose(1, 2).reshape(1, 8, *grid))
        reduced = attn.sr_norm(fmap.flatten(2).transpose(1, 2))  # keys and values of the 2x3 reduced map
        q = attn.q(x).reshape(1, -1, 2, 4).transpose(1, 2)
        k, v = attn.kv(reduced).reshape(1, -1, 2, 2, 4).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-2, -1)) * attn.scale
        for i in range(grid[0] * grid[1]):
            for j in range(6):
                dy, dx = i // grid[1] - (j // 3) * sr, i % grid[1] - (j % 3) * sr  # query - key cell origin
                logits[0, :, i, j] += attn.relative_position_bias_table[(dy + 5) * 11 + dx + 5]
        expected = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(1, -1, 8))
        torch.testing.assert_close(attn(x, grid), expected, rtol=1e-5, atol=1e-5)


def test_inputs_larger_than_the_bias_table_are_a_user_error():
    model = build_backbone(ModelConfig(name="pvt_nano", img_size=32), drop_path=0.0)
    with pytest.raises(UserError, match="model.img_size"):
        model(torch.randn(1, 3, 64, 64))
    with pytest.raises(UserError, match="total stride 16"):
        build_backbone(ModelConfig(name="pvt_nano", img_size=40))
