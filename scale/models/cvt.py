"""CvT [Wu et al. 2021]: convolutional token embedding per stage and convolutional projections, no position
embedding. Registered: `cvt_13` (DRLoc Tables 2-3) and EsViT's 4-stage windowed `cvt_tiny` (EsViT Table 6, CvT-T).

Convolutional projection (CvT Sec. 3.2): q, k and v each come from a depth-wise 3x3 convolution + BatchNorm over
the token map followed by a linear (point-wise) projection; CvT-13 uses stride 2 for k and v (squeezed projection)
and full attention; its class token joins in the last stage only, skipping the convolutions.

CvT-T (EsViT Appendix A.2, Table 6, official cvt_v4 s1 + REL_POS_EMBED): 4 stages 64-192-384-768, heads 1-3-6-12,
depths 2-2-6-2, embeddings 7x7/4 then 3x3/2, attention in non-overlapping 7x7 windows with a Swin relative position
bias; "features in neighboring windows are considered in the convolutional projection". Where a map is not a
multiple of the window it is padded and the padding masked; a map smaller than the window is one window (EsViT's
cvt_v4 shrinks the window the same way). The final 14x14 (CvT-13) or 7x7 (CvT-T) grid is "tokens".
"""

import torch
from timm.layers import use_fused_attn
from timm.models.swin_transformer import window_partition, window_reverse
from torch import nn

from scale.models.registry import register
from scale.models.staged import (
    Block,
    ConvEmbed,
    GeometryCache,
    Grid,
    Stage,
    StagedBackbone,
    attend,
    check_fixed_options,
    stochastic_depth,
)
from scale.models.swin import relative_position_index, shifted_window_mask, window_and_shift


def conv_projection(dim: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(dim, dim, kernel_size=3, stride=stride, padding=1, groups=dim, bias=False), nn.BatchNorm2d(dim)
    )


class ConvAttention(GeometryCache):
    """CvT attention: convolutional projections of the grid tokens, then full attention (`window` None, k/v with
    stride `kv_stride`) or attention within windows with a relative position bias (`window` set)."""

    def __init__(
        self, dim: int, num_heads: int, kv_stride: int = 1, window: int = 0, prefix: int = 0, qkv_bias: bool = True
    ):
        super().__init__()
        self.num_heads, self.head_dim, self.scale = num_heads, dim // num_heads, (dim // num_heads) ** -0.5
        self.prefix, self.window = prefix, (window, window)
        self.conv_q, self.conv_k, self.conv_v = (conv_projection(dim, s) for s in (1, kv_stride, kv_stride))
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=qkv_bias) for _ in range(3))
        self.proj = nn.Linear(dim, dim)
        if window:
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        self.fused_attn = use_fused_attn()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.num_heads, self.head_dim).transpose(-3, -2)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        batch, tokens, dim = x.shape
        prefix, fmap = x[:, : self.prefix], x[:, self.prefix :].transpose(1, 2).reshape(batch, dim, *grid)
        q, k, v = (conv(fmap).flatten(2).transpose(1, 2) for conv in (self.conv_q, self.conv_k, self.conv_v))
        q, k, v = (torch.cat([prefix, t], dim=1) for t in (q, k, v))
        q, k, v = self.q(q), self.k(k), self.v(v)
        if self.window[0]:
            out = self._windowed(q, k, v, grid)
        else:
            out = attend(self._heads(q), self._heads(k), self._heads(v), None, self.fused_attn, self.scale)
            out = out.transpose(1, 2).reshape(batch, tokens, dim)
        return self.proj(out)

    def _geometry(self, grid: Grid, device, dtype):
        def build():
            window, _ = window_and_shift(grid, self.window, shifted=False)
            mask = shifted_window_mask(grid, window, (0, 0), device=device)  # masks padding only
            return (
                window,
                relative_position_index(window, self.window, device),
                None if mask is None else mask.to(dtype),
            )

        return self.cached((grid, device, dtype), build)

    def _windowed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: Grid) -> torch.Tensor:
        batch, tokens, dim = q.shape
        window, index, mask = self._geometry(grid, q.device, q.dtype)
        pad_h, pad_w = (-grid[0]) % window[0], (-grid[1]) % window[1]
        padded = (grid[0] + pad_h, grid[1] + pad_w)

        def windows(t):  # [B, h*w, D] -> [B, windows, heads, N, head_dim]
            t = nn.functional.pad(t.reshape(batch, *grid, dim), (0, 0, 0, pad_w, 0, pad_h))
            t = window_partition(t, window).reshape(batch, -1, window[0] * window[1], dim)
            return self._heads(t)

        n = window[0] * window[1]
        bias = self.relative_position_bias_table[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
        bias = bias[None, None] if mask is None else bias[None, None] + mask[None, :, None]
        out = attend(windows(q), windows(k), windows(v), bias, self.fused_attn, self.scale)
        out = out.transpose(2, 3).reshape(-1, window[0], window[1], dim)
        out = window_reverse(out, window, *padded)[:, : grid[0], : grid[1]]
        return out.reshape(batch, tokens, dim)


# name: dims, depths, heads, (kernel, stride, padding) of each embedding, kv stride, window, class token
EMBED_4 = ((7, 4, 2), (3, 2, 1), (3, 2, 1), (3, 2, 1))
SIZES = {
    "13": ((64, 192, 384), (1, 2, 10), (1, 3, 6), EMBED_4[:3], 2, 0, True),
    "tiny": ((64, 192, 384, 768), (2, 2, 6, 2), (1, 3, 6, 12), EMBED_4, 1, 7, False),
    "nano": ((16, 32, 64), (1, 1, 1), (1, 2, 4), EMBED_4[:3], 2, 0, True),  # tests
    "nano_w": ((16, 32, 64), (1, 1, 1), (1, 2, 4), EMBED_4[:3], 1, 7, False),  # tests: windowed, as cvt_tiny
}


class CvT(StagedBackbone):
    def __init__(self, *, dims, depths, heads, embeds, kv_stride: int, window: int, cls_token: bool, drop_path: float):
        stages, in_dim = [], 3
        rates = stochastic_depth(drop_path, depths)
        for index, (dim, _depth, num_heads, (kernel, stride, padding)) in enumerate(zip(dims, depths, heads, embeds)):
            prefix = int(cls_token and index == len(dims) - 1)
            blocks = [
                Block(dim, ConvAttention(dim, num_heads, kv_stride, window, prefix), 4.0, rate) for rate in rates[index]
            ]
            stages.append(Stage(ConvEmbed(in_dim, dim, kernel, stride, padding, prefix), blocks, prefix))
            in_dim = dim
        super().__init__(stages)
        self.init_weights()


def _cvt_factory(size: str):
    dims, depths, heads, embeds, kv_stride, window, cls_token = SIZES[size]

    def build(cfg, drop_path: float) -> CvT:
        check_fixed_options(cfg, "CvT", embeds[0][1])
        return CvT(
            dims=dims,
            depths=depths,
            heads=heads,
            embeds=embeds,
            kv_stride=kv_stride,
            window=cfg.window_size if window else 0,
            cls_token=cls_token,
            drop_path=drop_path,
        )

    return build


for _size in SIZES:
    register(f"cvt_{_size}")(_cvt_factory(_size))
