"""Swin: timm's outputs at 224 px, and an independent full-attention reference at 96 px (windows 7 and 14)."""

import pytest
import torch
from timm.models.swin_transformer import SwinTransformer

from scale.models import build_backbone
from scale.models.config import ModelConfig
from scale.models.swin import SIZES, shifted_window_mask


def nano(window_size: int):
    torch.manual_seed(0)
    return build_backbone(ModelConfig(name="swin_nano", window_size=window_size), drop_path=0.0).eval()


def timm_twin(model, window_size: int) -> SwinTransformer:
    embed_dim, depths, heads = SIZES["nano"]
    windows = (window_size,) * 3 + (7,)
    reference = SwinTransformer(
        img_size=224,
        patch_size=4,
        num_classes=0,
        embed_dim=embed_dim,
        depths=depths,
        num_heads=heads,
        window_size=windows,
        drop_path_rate=0.0,
    ).eval()
    reference.load_state_dict(model.state_dict())
    return reference


@pytest.mark.parametrize("window_size", [7, 14])
def test_224_equals_timm_swin_with_same_weights(window_size):
    model = nano(window_size)
    reference = timm_twin(model, window_size)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        out = model(x)
        expected = reference.forward_features(x)  # [B, 7, 7, C] after the final norm
    assert out["grid"] == (7, 7)
    torch.testing.assert_close(out["tokens"], expected.reshape(2, 49, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(out["pooled"], expected.mean(dim=(1, 2)), rtol=0, atol=1e-6)


def test_mask_equals_swin_mask_on_whole_windows():
    # Swin's 3-slice mask on a 56x56 map with window 7, shift 3, as timm builds it at construction
    reference = (
        SwinTransformer(img_size=224, embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), num_classes=0)
        .layers[0]
        .blocks[1]
        .attn_mask
    )
    torch.testing.assert_close(shifted_window_mask((56, 56), (7, 7), (3, 3)), reference)


def reference_block(block, x, window: int, shift: int):
    """One Swin block as full attention over the real tokens with an explicit allowed-pairs mask: token pairs in
    the same window of the map rolled by -shift and both wrapped around or both not (per axis)."""
    batch, height, width, channels = x.shape
    attn = block.attn
    table = attn.window_size[0]
    heads = attn.num_heads
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    rr, cc = ((rows - shift) % height).flatten(), ((cols - shift) % width).flatten()  # rolled coordinates
    same_window = (rr[:, None] // window == rr[None] // window) & (cc[:, None] // window == cc[None] // window)
    wrap_r, wrap_c = rr >= height - shift, cc >= width - shift
    same_region = (wrap_r[:, None] == wrap_r[None]) & (wrap_c[:, None] == wrap_c[None])
    allowed = same_window & same_region
    index = (rr[:, None] - rr[None] + table - 1) * (2 * table - 1) + cc[:, None] - cc[None] + table - 1
    bias = attn.relative_position_bias_table[index.where(allowed, 0)].permute(2, 0, 1)  # heads, N, N

    h = block.norm1(x).reshape(batch, height * width, channels)
    q, k, v = attn.qkv(h).reshape(batch, -1, 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    logits = (q * attn.scale) @ k.transpose(-2, -1) + bias
    logits = logits.masked_fill(~allowed, float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, height * width, channels)
    x = x + attn.proj(out).reshape(batch, height, width, channels)
    return x + block.mlp(block.norm2(x))


# per stage at 96 px (maps 24, 12, 6, 3): (window, shift of the odd blocks)
EXPECTED_96 = {
    7: [(7, 3), (7, 3), (6, 0), (3, 0)],  # stages 1-2 keep window 7 (24 is padded to 28), then shrink
    14: [(14, 7), (12, 0), (6, 0), (3, 0)],  # stage 1 pads 24 to 28; stage 2 is one 12x12 window
}


@pytest.mark.parametrize("window_size", [7, 14])
def test_96_px_against_full_attention_reference(window_size):
    model = nano(window_size)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        out = model(x)
        h = model.patch_embed(x)
        for stage, (window, shift) in zip(model.layers, EXPECTED_96[window_size]):
            h = stage.downsample(h)
            for index, block in enumerate(stage.blocks):
                h = reference_block(block, h, window, shift if index % 2 else 0)
        expected = model.norm(h)
    assert out["grid"] == (3, 3)
    torch.testing.assert_close(out["tokens"], expected.reshape(2, 9, -1), rtol=1e-5, atol=1e-5)


def test_forward_last_blocks_and_sizes():
    model = nano(7)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        feats = model.forward_last_blocks(x, 4)
        out = model(x)
    assert [f.shape for f in feats] == [(2, 64), (2, 64), (2, 128), (2, 128)]
    # the last block's pooled output has the final norm: it is the backbone's pooled feature
    torch.testing.assert_close(feats[-1], out["pooled"])
    assert model.embed_dim == model.token_dim == 128
    assert len(model.block_modules()) == 8


def test_fused_attention_path_matches_math_path():
    model = nano(14)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        math_out = model(x)["tokens"]
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = True
        fused_out = model(x)["tokens"]
    torch.testing.assert_close(fused_out, math_out, rtol=1e-4, atol=1e-5)
