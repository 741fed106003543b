"""ViL-T against EsViT's Table 4/6; the sliding-chunk attention against a full-attention reference with ViL's rule:
a token attends to the tokens of its own and the 8 neighbouring windows and to the global tokens."""

import pytest
import torch

from scale.models import build_backbone
from scale.models.complexity import count_params
from scale.models.config import ModelConfig
from scale.models.staged import MapAttention
from scale.models.vil import LongformerAttention


def test_vil_tiny_matches_esvit_tables_4_and_6():
    model = build_backbone(ModelConfig(name="vil_tiny"), device="meta")
    assert count_params(model) / 1e6 == pytest.approx(28.0, rel=0.02)  # EsViT Table 4: ViL 28M
    assert [len(stage.blocks) for stage in model.stages] == [2, 2, 6, 2]
    assert [stage.embed.proj.out_channels for stage in model.stages] == [96, 192, 384, 768]
    assert [stage.blocks[0].attn.num_heads for stage in model.stages] == [3, 3, 6, 12]  # Table 6 ViL-T
    assert [stage.prefix for stage in model.stages] == [1, 1, 1, 0]
    kinds = [type(stage.blocks[0].attn) for stage in model.stages]
    assert kinds == [LongformerAttention, LongformerAttention, MapAttention, MapAttention]
    assert not any("pos_embed" in name for name, _ in model.named_parameters())  # relative bias only
    assert model(torch.empty(1, 3, 224, 224, device="meta"))["grid"] == (7, 7)


def reference_longformer(attn: LongformerAttention, x: torch.Tensor, grid) -> torch.Tensor:
    batch, tokens, dim = x.shape
    heads, w = attn.num_heads, attn.window
    q = attn.q(x).reshape(batch, tokens, heads, -1).transpose(1, 2)
    k, v = attn.kv(x).reshape(batch, tokens, 2, heads, -1).permute(2, 0, 3, 1, 4)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    near = ((rows[:, None] // w - rows[None] // w).abs() <= 1) & ((cols[:, None] // w - cols[None] // w).abs() <= 1)
    radius = 2 * w - 1
    index = (rows[:, None] - rows[None] + radius) * (2 * radius + 1) + cols[:, None] - cols[None] + radius
    local = attn.relative_position_bias_table[index.where(near, 0)].permute(2, 0, 1)
    local = local.masked_fill(~near, float("-inf"))
    g2l, g2g = attn.g2l_relative_position_bias, attn.g2g_relative_position_bias
    n = grid[0] * grid[1]
    bias = torch.cat(
        [
            torch.cat([g2g, g2l[0][:, :, None].expand(-1, -1, n)], dim=2),
            torch.cat([g2l[1][:, None].expand(-1, n, -1), local], dim=2),
        ],
        dim=1,
    )
    out = ((q @ k.transpose(-2, -1)) * attn.scale + bias).softmax(-1) @ v
    return attn.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


@pytest.mark.parametrize("grid", [(7, 8), (2, 2)])  # padded to whole windows; a map smaller than one window
def test_sliding_chunk_attention_equals_reference(grid):
    torch.manual_seed(0)
    attn = LongformerAttention(16, 2, window=3, prefix=1).eval()
    for name, param in attn.named_parameters():
        if "relative_position" in name:
            torch.nn.init.normal_(param)
    x = torch.randn(2, 1 + grid[0] * grid[1], 16)
    with torch.no_grad():
        expected = reference_longformer(attn, x, grid)
        for fused in (False, True):
            attn.fused_attn = fused
            torch.testing.assert_close(attn(x, grid), expected, rtol=1e-5, atol=1e-5)


def test_global_tokens_are_dropped_between_stages_and_last_stage_is_averaged():
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(name="vil_nano", img_size=64), drop_path=0.0).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        last = model.forward_last_blocks(x, 2)
    assert out["grid"] == (4, 4) and out["tokens"].shape == (2, 16, 64)
    torch.testing.assert_close(out["pooled"], out["tokens"].mean(1))
    torch.testing.assert_close(last[-1], out["pooled"])
    assert last[0].shape == (2, 32)  # stage 2 has a global token: its probe feature is that token
