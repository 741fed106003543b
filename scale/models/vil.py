"""Vision Longformer (ViL) [Zhang et al. 2021] as EsViT's ViL-T (Appendix A.2, Table 6): 4 stages, patch embedding
(conv, kernel = stride 4-2-2-2, LayerNorm) with one learned global token in stages 1-3, depths 2-2-6-2, dims
96-192-384-768, heads 3-3-6-12 (Table 6; the README's launch line uses 3-6-12-24), MLP ratio 4, relative position
bias and no absolute position embedding, LayerNorm eps 1e-6.

Stages 1-2 use ViL's sparse attention: the map is cut into 7x7 windows and every token of a window attends to the
tokens of its own and the 8 neighbouring windows (ViL's sliding-chunk form) and to the global tokens; global tokens
attend to everything. Keys outside the map (borders, padding of maps not a multiple of 7) are masked. The local
bias table covers the offsets -13..13 of a 3x3-window neighbourhood; global tokens have learned global-to-local,
local-to-global and global-to-global biases (ViL's). Stages 3-4 (14x14 and 7x7 at 224 px) use full attention
with a bias table over the whole map. ViL's training-time random sampling of one neighbour window (MODE 1,
VIL_MODE_SWITCH) is not implemented: all 8 neighbours are always used (its evaluation mode). The global tokens are
dropped between stages; stage 4 has none, so the pooled feature is the mean of its grid.
"""

import torch
import torch.nn.functional as F
from timm.layers import use_fused_attn
from torch import nn

from scale.models.registry import register
from scale.models.staged import (
    Block,
    ConvEmbed,
    GeometryCache,
    Grid,
    MapAttention,
    Stage,
    StagedBackbone,
    attend,
    check_fixed_options,
    grid_coords,
    lookup_bias,
    offset_index,
    plan_stages,
)
from scale.models.swin import MASKED

EPS = 1e-6


class LongformerAttention(GeometryCache):
    """ViL's 2-D sliding-chunk attention with `prefix` global tokens (q and kv projections shared with them)."""

    def __init__(self, dim: int, num_heads: int, window: int, prefix: int, qkv_bias: bool = True):
        super().__init__()
        self.num_heads, self.head_dim, self.scale = num_heads, dim // num_heads, (dim // num_heads) ** -0.5
        self.window, self.prefix = window, prefix
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((4 * window - 1) ** 2, num_heads))
        if prefix:
            self.g2l_relative_position_bias = nn.Parameter(torch.zeros(2, num_heads, prefix))
            self.g2g_relative_position_bias = nn.Parameter(torch.zeros(num_heads, prefix, prefix))
        self.fused_attn = use_fused_attn()

    def _geometry(self, grid: Grid, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Local-to-local bias index [W^2, 9W^2] and key mask [chunks, 1, 9W^2] (0 / MASKED) for this grid."""

        def build():
            w = self.window
            queries = grid_coords(w, w, device)
            keys = grid_coords(3 * w, 3 * w, device) - w  # the neighbourhood, relative to the window's origin
            index = offset_index(queries, keys, (2 * w - 1, 2 * w - 1))
            real = torch.ones(1, 1, *grid, device=device)
            real = F.pad(real, self._padding(grid))
            real = F.unfold(real, kernel_size=3 * w, stride=w)[0].transpose(0, 1)  # [chunks, 9W^2]
            mask = torch.zeros(real.shape, device=device, dtype=dtype).masked_fill(real == 0, MASKED)
            return index, mask[:, None, :]

        return self.cached((grid, device, dtype), build)

    def _padding(self, grid: Grid) -> tuple[int, int, int, int]:
        """F.pad amounts (left, right, top, bottom): the map padded to whole windows, plus one window around."""
        w = self.window
        return (w, w + (-grid[1]) % w, w, w + (-grid[0]) % w)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        batch, tokens, dim = x.shape
        heads, head_dim, w, prefix = self.num_heads, self.head_dim, self.window, self.prefix
        index, mask = self._geometry(grid, x.device, x.dtype)
        q = self.q(x).reshape(batch, tokens, heads, head_dim).transpose(1, 2)  # [B, H, T, d]
        k, v = self.kv(x).reshape(batch, tokens, 2, heads, head_dim).permute(2, 0, 3, 1, 4)
        pad = self._padding(grid)
        padded = (grid[0] + pad[2] + pad[3] - 2 * w, grid[1] + pad[0] + pad[1] - 2 * w)
        chunks = (padded[0] // w) * (padded[1] // w)

        def neighbourhoods(t):  # [B, H, h*w, d] -> [B, H, chunks, 9W^2, d]
            fmap = t[:, :, prefix:].transpose(2, 3).reshape(batch * heads, head_dim, *grid)
            cols = F.unfold(F.pad(fmap, pad), kernel_size=3 * w, stride=w)
            return cols.reshape(batch, heads, head_dim, 9 * w * w, chunks).permute(0, 1, 4, 3, 2)

        q_local = q[:, :, prefix:].transpose(2, 3).reshape(batch * heads, head_dim, *grid)
        q_local = F.pad(q_local, (0, pad[1] - w, 0, pad[3] - w))
        q_local = F.unfold(q_local, kernel_size=w, stride=w)
        q_local = q_local.reshape(batch, heads, head_dim, w * w, chunks).permute(0, 1, 4, 3, 2)
        local_keys, local_values = neighbourhoods(k), neighbourhoods(v)
        bias = lookup_bias(self.relative_position_bias_table, index)[:, None] + mask  # [H, chunks, W^2, 9W^2]
        if prefix:
            global_keys = k[:, :, None, :prefix].expand(-1, -1, chunks, -1, -1)
            global_values = v[:, :, None, :prefix].expand(-1, -1, chunks, -1, -1)
            local_keys = torch.cat([global_keys, local_keys], dim=3)
            local_values = torch.cat([global_values, local_values], dim=3)
            to_global = self.g2l_relative_position_bias[1][:, None, None, :].expand(-1, chunks, w * w, -1)
            bias = torch.cat([to_global, bias], dim=3)
        out = attend(q_local, local_keys, local_values, bias[None], self.fused_attn, self.scale)
        out = out.permute(0, 1, 4, 3, 2).reshape(batch * heads, head_dim * w * w, chunks)
        out = F.fold(out, output_size=padded, kernel_size=w, stride=w)[:, :, : grid[0], : grid[1]]
        out = out.reshape(batch, heads, head_dim, grid[0] * grid[1]).permute(0, 3, 1, 2).reshape(batch, -1, dim)
        if prefix:
            g2l = self.g2l_relative_position_bias[0][:, :, None].expand(-1, -1, tokens - prefix)
            global_bias = torch.cat([self.g2g_relative_position_bias, g2l], dim=2)
            global_out = attend(q[:, :, :prefix], k, v, global_bias[None], self.fused_attn, self.scale)
            out = torch.cat([global_out.transpose(1, 2).reshape(batch, prefix, dim), out], dim=1)
        return self.proj(out)


# name: dims, depths, heads, global tokens per stage, sparse (Longformer) attention per stage
SIZES = {
    "tiny": ((96, 192, 384, 768), (2, 2, 6, 2), (3, 3, 6, 12), (1, 1, 1, 0), (True, True, False, False)),
    # tests and smoke runs (3 stages: a 1x1 map after stride 16 at 16 px): sparse + global, full + global, full
    "nano": ((16, 32, 64), (1, 1, 1), (1, 2, 4), (1, 1, 0), (True, False, False)),
}
PATCHES = (4, 2, 2, 2)


class ViL(StagedBackbone):
    def __init__(self, *, dims, depths, heads, globals_, sparse, window: int, img_size: int, drop_path: float):
        stages = []
        plans = plan_stages(img_size, dims, depths, PATCHES, drop_path, "ViL")
        for (in_dim, dim, patch, table, rates), num_heads, prefix, local in zip(plans, heads, globals_, sparse):

            def attention(dim=dim, num_heads=num_heads, table=table, prefix=prefix, local=local):
                if local:
                    return LongformerAttention(dim, num_heads, window, prefix)
                return MapAttention(dim, num_heads, table, prefix=prefix, eps=EPS)

            blocks = [Block(dim, attention(), 4.0, rate, eps=EPS) for rate in rates]
            stages.append(Stage(ConvEmbed(in_dim, dim, patch, patch, prefix=prefix, eps=EPS), blocks, prefix))
        super().__init__(stages, eps=EPS)
        self.init_weights()


def _vil_factory(size: str):
    dims, depths, heads, globals_, sparse = SIZES[size]

    def build(cfg, drop_path: float) -> ViL:
        check_fixed_options(cfg, "ViL", PATCHES[0])
        return ViL(
            dims=dims,
            depths=depths,
            heads=heads,
            globals_=globals_,
            sparse=sparse,
            window=cfg.window_size,
            img_size=cfg.img_size,
            drop_path=drop_path,
        )

    return build


for _size in SIZES:
    register(f"vil_{_size}")(_vil_factory(_size))
