"""Shared parts of the multi-stage backbones (CvT, PvT, ViL): stages of (convolutional embedding, blocks), attention
with relative position bias, and the backbone contract (forward dict, block_modules, forward_last_blocks, init).

Tokens travel between blocks as [B, P + h*w, D] with P prefix tokens (CvT-13's class token, ViL's global token) in
front of the h x w grid in row-major order; every block also receives the grid (h, w), so blocks are plain modules
that activation checkpointing and FSDP can wrap. Between stages the prefix tokens are dropped and the grid becomes
a feature map for the next embedding (CvT, ViL and PvT all do so).

Relative position bias tables that cover a whole feature map (PvT, ViL's full-attention stages) are sized for the
map at `model.img_size`; smaller maps (96 px local crops) read the entries of their own offsets, the rule the Swin
backbone applies to shrunk windows. Index tensors and masks are derived per input size and cached, never stored as
buffers, so a model built on the meta device is complete after `to_empty` + `init_weights`.
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, trunc_normal_, use_fused_attn
from torch import nn

from scale.errors import UserError

Grid = tuple[int, int]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, fused: bool, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v over the last two dims; the fused kernel when `fused` (the math path
    otherwise, which FLOP counting needs)."""
    if fused:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if bias is None else bias.to(q.dtype), scale=scale
        )
    logits = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    return logits.softmax(dim=-1) @ v


def grid_coords(h: int, w: int, device=None, stride: int = 1) -> torch.Tensor:
    """[h*w, 2] (row, col) * stride of an h x w grid in row-major order."""
    rows, cols = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], dim=1) * stride


def offset_index(queries: torch.Tensor, keys: torch.Tensor, radius: Grid) -> torch.Tensor:
    """[Nq, Nk] indices into a (2R_h+1)(2R_w+1) bias table of the offsets query - key (each within +-R)."""
    rel = queries[:, None, :] - keys[None, :, :]
    return (rel[..., 0] + radius[0]) * (2 * radius[1] + 1) + rel[..., 1] + radius[1]


def lookup_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[heads, *index.shape] entries of a [entries, heads] relative position bias table."""
    return table[index.reshape(-1)].reshape(*index.shape, -1).permute(2, 0, 1)


def check_grid(grid: Grid, table_grid: Grid, what: str) -> None:
    if grid[0] > table_grid[0] or grid[1] > table_grid[1]:
        raise UserError(
            f"{what}: a {grid[0]}x{grid[1]} feature map exceeds the {table_grid[0]}x{table_grid[1]} map "
            f"its relative position bias covers; raise model.img_size to the largest input size"
        )


def cached_geometry(cache: dict, key, build):
    """`cache[key]`, built by `build()` on first use; under torch.compile built every call and not stored: traced into
    the block's graph instead (constants of its input size), as a cache write inside a compiled, checkpointed block is
    a side effect torch.compile refuses."""
    if torch.compiler.is_compiling():
        return build()
    if key not in cache:
        cache[key] = build()
    return cache[key]


class GeometryCache(nn.Module):
    """Per-input-size index and mask tensors, cached by (size, device) in eager mode; cleared by `clear_cache` (FLOP
    counting traces with fake tensors, `init_weights` after `to_empty`)."""

    def __init__(self):
        super().__init__()
        self.geometry_cache: dict = {}

    def cached(self, key, build):
        return cached_geometry(self.geometry_cache, key, build)

    def clear_cache(self) -> None:
        self.geometry_cache.clear()


class MapAttention(GeometryCache):
    """Multi-head attention of every token (prefix and grid) over keys from the whole map, with relative position
    bias: PvT's spatial-reduction attention (keys and values from the map reduced by a stride-`sr` convolution and
    a LayerNorm) and, with sr=1, ViL's full attention of its last stages.

    Grid-to-grid bias: table over the offsets between a query position and the top-left position of its key's
    (reduced) cell. Prefix tokens: ViL's three learned biases (prefix->prefix per pair, prefix->grid and
    grid->prefix per head and prefix token)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        table_grid: Grid,
        sr: int = 1,
        prefix: int = 0,
        qkv_bias: bool = True,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.num_heads, self.head_dim, self.scale = num_heads, dim // num_heads, (dim // num_heads) ** -0.5
        self.table_grid, self.sr, self.prefix = tuple(table_grid), sr, prefix
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        if sr > 1:
            self.sr_conv = nn.Conv2d(dim, dim, kernel_size=sr, stride=sr)
            self.sr_norm = nn.LayerNorm(dim, eps=eps)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * table_grid[0] - 1) * (2 * table_grid[1] - 1), num_heads)
        )
        if prefix:
            self.g2l_relative_position_bias = nn.Parameter(torch.zeros(2, num_heads, prefix))
            self.g2g_relative_position_bias = nn.Parameter(torch.zeros(num_heads, prefix, prefix))
        self.fused_attn = use_fused_attn()

    def _index(self, grid: Grid, reduced: Grid, device) -> torch.Tensor:
        def build():
            radius = (self.table_grid[0] - 1, self.table_grid[1] - 1)
            return offset_index(grid_coords(*grid, device), grid_coords(*reduced, device, stride=self.sr), radius)

        return self.cached((grid, reduced, device), build)

    def bias(self, grid: Grid, reduced: Grid, device) -> torch.Tensor:
        """[heads, P + N, P + N_keys] additive bias."""
        check_grid(grid, self.table_grid, type(self).__name__)
        index = self._index(grid, reduced, device)
        local = lookup_bias(self.relative_position_bias_table, index)
        if not self.prefix:
            return local
        heads, queries, keys = local.shape
        g2l = self.g2l_relative_position_bias
        top = torch.cat([self.g2g_relative_position_bias, g2l[0][:, :, None].expand(-1, -1, keys)], dim=2)
        bottom = torch.cat([g2l[1][:, None, :].expand(-1, queries, -1), local], dim=2)
        return torch.cat([top, bottom], dim=1)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        batch, tokens, dim = x.shape
        heads, head_dim = self.num_heads, self.head_dim
        q = self.q(x).reshape(batch, tokens, heads, head_dim).transpose(1, 2)
        source, reduced = x, grid
        if self.sr > 1:
            fmap = x[:, self.prefix :].transpose(1, 2).reshape(batch, dim, *grid)
            fmap = self.sr_conv(fmap)
            reduced = (int(fmap.shape[-2]), int(fmap.shape[-1]))
            source = torch.cat([x[:, : self.prefix], self.sr_norm(fmap.flatten(2).transpose(1, 2))], dim=1)
        k, v = self.kv(source).reshape(batch, -1, 2, heads, head_dim).permute(2, 0, 3, 1, 4)
        out = attend(q, k, v, self.bias(grid, reduced, x.device)[None], self.fused_attn, self.scale)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """Pre-norm transformer block over [B, P + h*w, D] tokens of a grid: attention, then MLP, each residual."""

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float, drop_path: float, eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), grid))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvEmbed(nn.Module):
    """Feature map [B, C, H, W] -> a strided convolution, LayerNorm over channels, optional learned prefix tokens
    (CvT's convolutional token embedding; ViL's and PvT's patch embedding with kernel = stride)."""

    def __init__(
        self, in_dim: int, dim: int, kernel: int, stride: int, padding: int = 0, prefix: int = 0, eps: float = 1e-5
    ):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, dim, kernel_size=kernel, stride=stride, padding=padding)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.prefix_tokens = nn.Parameter(torch.zeros(1, prefix, dim)) if prefix else None
        self.stride = stride

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        x = self.proj(x)
        grid = (int(x.shape[-2]), int(x.shape[-1]))
        x = self.norm(x.flatten(2).transpose(1, 2))
        if self.prefix_tokens is not None:
            x = torch.cat([self.prefix_tokens.expand(x.shape[0], -1, -1), x], dim=1)
        return x, grid


class Stage(nn.Module):
    def __init__(self, embed: ConvEmbed, blocks: Sequence[nn.Module], prefix: int = 0):
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.prefix = prefix


class StagePlan(NamedTuple):
    """What one stage of PvT or ViL (patch embeddings with kernel = stride) is built from."""

    in_dim: int
    dim: int
    patch: int  # kernel and stride of its embedding
    table_grid: Grid  # its map at model.img_size, which its relative position bias tables cover
    rates: list[float]  # drop-path rates of its blocks


def plan_stages(
    img_size: int, dims: Sequence[int], depths: Sequence[int], patches: Sequence[int], drop_path: float, family: str
) -> list[StagePlan]:
    """The stages of widths `dims` behind embeddings of stride `patches`, the first on RGB; `img_size` must be a
    multiple of the total stride."""
    check_img_size(img_size, patches[: len(dims)], family)
    plans, in_dim, stride = [], 3, 1
    for dim, patch, rates in zip(dims, patches, stochastic_depth(drop_path, depths)):
        stride *= patch
        plans.append(StagePlan(in_dim, dim, patch, (img_size // stride, img_size // stride), rates))
        in_dim = dim
    return plans


def stochastic_depth(rate: float, depths: Sequence[int]) -> list[list[float]]:
    """Per stage, the drop-path rates of its blocks: linear from 0 to `rate` over all blocks."""
    rates = torch.linspace(0, rate, sum(depths), device="cpu").tolist()
    return [rates[sum(depths[:i]) : sum(depths[: i + 1])] for i in range(len(depths))]


def check_fixed_options(cfg, family: str, patch: int) -> None:
    """Heads are fixed per stage; model.patch_size may only restate the first embedding's stride (`patch`)."""
    if cfg.num_heads is not None:
        raise UserError(f"model.num_heads: {cfg.name} ({family}) fixes the heads per stage; leave it unset")
    if cfg.patch_size not in (None, patch):
        raise UserError(
            f"model.patch_size: {cfg.name} ({family}) embeds with stride {patch}; got {cfg.patch_size} (leave it unset)"
        )


def check_img_size(img_size: int, patches: Sequence[int], family: str) -> None:
    stride = 1
    for patch in patches:
        stride *= patch
    if img_size % stride:
        raise UserError(f"model.img_size {img_size} must be a multiple of {family}'s total stride {stride}")


class StagedBackbone(nn.Module):
    """Stages, then a final LayerNorm over the last stage's tokens. "pooled" is the last stage's first prefix token
    when it has one (CvT-13's class token), else the mean of its grid tokens; "tokens" are its normed grid tokens."""

    def __init__(self, stages: Sequence[Stage], eps: float = 1e-5):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        dim = stages[-1].embed.proj.out_channels
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.embed_dim = self.token_dim = dim

    @staticmethod
    def _to_map(x: torch.Tensor, prefix: int, grid: Grid) -> torch.Tensor:
        return x[:, prefix:].transpose(1, 2).reshape(x.shape[0], x.shape[2], *grid)

    @staticmethod
    def _pool(x: torch.Tensor, prefix: int) -> torch.Tensor:
        return x[:, 0] if prefix else x[:, prefix:].mean(dim=1)

    def _run(self, x: torch.Tensor, keep_blocks: int = 0):
        """Final tokens and grid, plus the outputs (and stage index) of the last `keep_blocks` blocks."""
        total, index, kept = len(self.block_modules()), 0, []
        grid = None
        for stage_index, stage in enumerate(self.stages):
            if grid is not None:
                x = self._to_map(x, self.stages[stage_index - 1].prefix, grid)
            x, grid = stage.embed(x)
            for block in stage.blocks:
                x = block(x, grid)
                index += 1
                if index > total - keep_blocks:
                    kept.append((stage_index, x))
        return x, grid, kept

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x, grid, _ = self._run(x)
        prefix = self.stages[-1].prefix
        x = self.norm(x)
        return {"pooled": self._pool(x, prefix), "tokens": x[:, prefix:], "grid": grid}

    def block_modules(self) -> list[nn.Module]:
        return [block for stage in self.stages for block in stage.blocks]

    def forward_last_blocks(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Pooled outputs of the last n blocks; only last-stage blocks get the final norm (EsViT's linear probe)."""
        total = len(self.block_modules())
        if not 1 <= n <= total:
            raise UserError(f"linear probe: n_last_blocks {n} must be between 1 and the model's {total} blocks")
        _, _, kept = self._run(x, keep_blocks=n)
        last = len(self.stages) - 1
        return [self._pool(self.norm(out) if stage == last else out, self.stages[stage].prefix) for stage, out in kept]

    def init_weights(self) -> None:
        """Default init of every layer, then trunc-normal(0.02) Linear weights, zero biases, unit norms and
        trunc-normal(0.02) bias tables and prefix tokens (CvT, PvT and ViL alike); valid after `to_empty`."""
        init_transformer(self)


def init_transformer(model: nn.Module) -> None:
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()  # convolutions (PyTorch default), norms, BN statistics
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        if hasattr(module, "clear_cache"):
            module.clear_cache()
    for name, param in model.named_parameters():
        if name.endswith(("relative_position_bias_table", "relative_position_bias", "prefix_tokens", "cls_token")):
            trunc_normal_(param, std=0.02)
