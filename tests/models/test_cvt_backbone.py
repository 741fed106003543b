"""CvT: CvT-13 and EsViT's CvT-T against the papers' counts, windowed attention against a full-attention reference."""

import pytest
import torch

from scale.models import build_backbone
from scale.models.complexity import count_macs, count_params
from scale.models.config import ModelConfig
from scale.models.cvt import ConvAttention

IN1K_HEAD = lambda dim: (dim + 1) * 1000  # noqa: E731  (CvT-13's 20M include its ImageNet-1K classifier)


def meta(name: str):
    return build_backbone(ModelConfig(name=name), device="meta")


def test_cvt_13_matches_the_paper():
    model = meta("cvt_13")
    # CvT paper Table 2 / DRLoc Table 2b: 20M parameters, 4.5 GFLOPs (multiply-adds) at 224 px
    assert (count_params(model) + IN1K_HEAD(384)) / 1e6 == pytest.approx(20.0, rel=0.02)
    assert count_macs(model, 224) / 1e9 == pytest.approx(4.5, rel=0.02)
    assert model(torch.empty(1, 3, 224, 224, device="meta"))["grid"] == (14, 14)  # DRLoc pools it to 7x7
    assert model(torch.empty(1, 3, 96, 96, device="meta"))["grid"] == (6, 6)
    assert not any("pos" in name for name, _ in model.named_parameters())  # CvT has no position embedding


def test_cvt_tiny_matches_esvit_table_4():
    model = meta("cvt_tiny")
    assert count_params(model) / 1e6 == pytest.approx(29.0, rel=0.02)  # EsViT Table 4: CvT 29M
    assert [len(stage.blocks) for stage in model.stages] == [2, 2, 6, 2]
    assert [stage.embed.proj.out_channels for stage in model.stages] == [64, 192, 384, 768]  # Table 6 CvT-T
    assert [stage.blocks[0].attn.num_heads for stage in model.stages] == [1, 3, 6, 12]
    assert model(torch.empty(1, 3, 224, 224, device="meta"))["grid"] == (7, 7)


def reference_windowed(attn: ConvAttention, x: torch.Tensor, grid, window: int) -> torch.Tensor:
    """Full attention over all tokens of the map, allowed only within the same window (tokens r // window equal
    per axis) with the Swin bias of the in-window offset."""
    batch, tokens, dim = x.shape
    fmap = x.transpose(1, 2).reshape(batch, dim, *grid)
    q, k, v = (
        lin(conv(fmap).flatten(2).transpose(1, 2))
        for conv, lin in ((attn.conv_q, attn.q), (attn.conv_k, attn.k), (attn.conv_v, attn.v))
    )
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    same = (rows[:, None] // window == rows[None] // window) & (cols[:, None] // window == cols[None] // window)
    table = attn.window[0]
    index = (rows[:, None] - rows[None] + table - 1) * (2 * table - 1) + cols[:, None] - cols[None] + table - 1
    bias = attn.relative_position_bias_table[index.where(same, 0)].permute(2, 0, 1)
    heads = attn.num_heads

    def split(t):
        return t.reshape(batch, tokens, heads, -1).transpose(1, 2)

    logits = (split(q) @ split(k).transpose(-2, -1)) * attn.scale + bias
    out = logits.masked_fill(~same, float("-inf")).softmax(-1) @ split(v)
    return attn.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


@pytest.mark.parametrize("grid,window", [((10, 9), 4), ((3, 3), 7)])  # padded windows; a map smaller than 7
def test_windowed_attention_equals_masked_full_attention(grid, window):
    torch.manual_seed(0)
    attn = ConvAttention(16, 2, window=window).eval()
    torch.nn.init.normal_(attn.relative_position_bias_table)
    x = torch.randn(2, grid[0] * grid[1], 16)
    with torch.no_grad():
        expected = reference_windowed(attn, x, grid, min(window, grid[0]))
        for fused in (False, True):
            attn.fused_attn = fused
            torch.testing.assert_close(attn(x, grid), expected, rtol=1e-5, atol=1e-5)


def test_class_token_is_pooled_and_skips_the_convolutions():
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(name="cvt_nano"), drop_path=0.0).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        features = model.forward_last_blocks(x, 1)
    assert out["grid"] == (4, 4) and out["tokens"].shape == (2, 16, 64)
    torch.testing.assert_close(features[0], out["pooled"])  # the normed class token of the last block
    assert not torch.allclose(out["pooled"], out["tokens"].mean(1))
