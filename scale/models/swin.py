"""Swin backbones of EsViT and DRLoc: timm's SwinTransformer whose blocks adapt their windows to each input size.

One model serves 224 px global and 96 px local crops. Per input size and block, the window is the one timm builds
at `img_size` (224), shrunk to the feature map where the map is smaller (the rule Swin applies at construction),
and shifting stops where the map fits into one window. The relative-position-bias table is never resized: a
shrunk window reads the table entries of its (smaller) offsets. Where a map is not a multiple of the window
(at 96 px: the 24 and 12 maps with window 7, the 24 map with window 14) it is padded and the padded tokens are
masked out, and the shifted-window mask marks wrapped-around tokens on the real map, so every real token attends
exactly to the real tokens of its window and region. At 96 px, EsViT's window-14 model pads the stage maps
24/12/6/3 to 28/14/14/7; here only the first stage pads (to 28), the others use one 12x12, 6x6 and 3x3 window.
At 224 px the outputs are timm's (= Swin's) unchanged.
"""

import math

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, window_partition, window_reverse
from torch import nn

from scale.errors import UserError
from scale.models.registry import register
from scale.models.staged import cached_geometry

# name: (embed_dim, depths, num_heads)
SIZES = {
    "nano": (16, (2, 2, 2, 2), (1, 2, 4, 8)),  # tests and the CPU demo
    "tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    "small": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    "base": (128, (2, 2, 18, 2), (4, 8, 16, 32)),
}
MASKED = -100.0  # Swin's value for masked attention logits


def window_and_shift(size: tuple[int, int], table_window: tuple[int, int], shifted: bool):
    """Per axis: window = min(map, table window); shift = half the window unless the map fits in one window."""
    window = tuple(min(s, w) for s, w in zip(size, table_window))
    shift = tuple(w // 2 if shifted and s > w else 0 for s, w in zip(size, window))
    return window, shift


def relative_position_index(window: tuple[int, int], table_window: tuple[int, int], device=None) -> torch.Tensor:
    """[N, N] indices into a (2T_h-1)(2T_w-1) bias table for the token pairs of a (smaller or equal) window."""
    coords = torch.stack(
        torch.meshgrid(torch.arange(window[0], device=device), torch.arange(window[1], device=device), indexing="ij")
    ).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :]
    return (rel[0] + table_window[0] - 1) * (2 * table_window[1] - 1) + rel[1] + table_window[1] - 1


def shifted_window_mask(
    size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device=None
) -> torch.Tensor | None:
    """[num_windows, N, N] additive mask (0 / -100) for a map rolled by -shift and padded to whole windows.

    Per axis a token is original (0), wrapped around by the roll (1) or padding (2); tokens of a window attend
    only to tokens of the same kind. On maps that are multiples of the window this equals Swin's 3-slice mask."""
    if not any(shift) and all(s % w == 0 for s, w in zip(size, window)):
        return None
    labels = []
    for length, win, sh in zip(size, window, shift):
        padded = math.ceil(length / win) * win
        kind = torch.zeros(padded, dtype=torch.long, device=device)
        kind[length - sh : length] = 1
        kind[length:] = 2
        labels.append(kind)
    region = (labels[0][:, None] * 3 + labels[1][None, :]).float()
    region = window_partition(region[None, :, :, None], window).reshape(-1, window[0] * window[1])
    mask = region[:, None, :] - region[:, :, None]
    return mask.masked_fill(mask != 0, MASKED)


def window_attention(
    attn: nn.Module, x: torch.Tensor, rel_index: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """timm's WindowAttention.forward with the bias gathered through `rel_index` (the window may be shrunk)."""
    windows, tokens, channels = x.shape
    heads = attn.num_heads
    q, k, v = attn.qkv(x).reshape(windows, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    bias = attn.relative_position_bias_table[rel_index.reshape(-1)].reshape(tokens, tokens, heads)
    bias = bias.permute(2, 0, 1).unsqueeze(0)
    if attn.fused_attn:
        if mask is not None:
            per_image = mask.shape[0]
            mask = mask.view(1, per_image, 1, tokens, tokens).expand(windows // per_image, -1, heads, -1, -1)
            bias = bias + mask.reshape(-1, heads, tokens, tokens)
        x = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=attn.attn_drop.p if attn.training else 0.0
        )
    else:
        logits = (q * attn.scale) @ k.transpose(-2, -1) + bias
        if mask is not None:
            per_image = mask.shape[0]
            logits = logits.view(-1, per_image, heads, tokens, tokens) + mask.unsqueeze(1).unsqueeze(0)
            logits = logits.view(-1, heads, tokens, tokens)
        x = attn.attn_drop(attn.softmax(logits)) @ v
    x = x.transpose(1, 2).reshape(windows, tokens, -1)
    return attn.proj_drop(attn.proj(x))


class SizeAdaptiveSwinBlock(SwinTransformerBlock):
    """A timm Swin block whose window, shift, mask and bias index follow the input size (cached per size)."""

    @classmethod
    def adapt(cls, block: SwinTransformerBlock) -> "SizeAdaptiveSwinBlock":
        # timm's stages construct their blocks directly; re-classing keeps its parameters, names and init
        block.__class__ = cls
        block.geometry_cache = {}
        return block

    def geometry(self, size: tuple[int, int], device: torch.device, dtype: torch.dtype):
        return cached_geometry(
            self.geometry_cache, (size, device, dtype), lambda: self.build_geometry(size, device, dtype)
        )

    def build_geometry(self, size: tuple[int, int], device: torch.device, dtype: torch.dtype):
        table_window = self.attn.window_size
        window, shift = window_and_shift(size, table_window, shifted=any(self.target_shift_size))
        mask = shifted_window_mask(size, window, shift, device=device)
        return (
            window,
            shift,
            relative_position_index(window, table_window, device),
            None if mask is None else mask.to(dtype),
        )

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        window, shift, rel_index, mask = self.geometry((height, width), x.device, x.dtype)
        if any(shift):
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        pad_h, pad_w = (-height) % window[0], (-width) % window[1]
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        windows = window_partition(x, window).reshape(-1, window[0] * window[1], channels)
        windows = window_attention(self.attn, windows, rel_index, mask)
        x = window_reverse(windows.reshape(-1, window[0], window[1], channels), window, height + pad_h, width + pad_w)
        x = x[:, :height, :width, :].contiguous()
        if any(shift):
            x = torch.roll(x, shifts=shift, dims=(1, 2))
        return x


class Swin(SwinTransformer):
    def __init__(
        self, *, embed_dim: int, depths, num_heads, window_sizes, patch_size: int, img_size: int, drop_path: float
    ):
        if img_size % (patch_size * 2 ** (len(depths) - 1)):
            raise UserError(
                f"model.img_size {img_size} must be a multiple of {patch_size * 2 ** (len(depths) - 1)}"
                f" for a {len(depths)}-stage Swin with model.patch_size {patch_size}"
            )
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            num_classes=0,
            embed_dim=embed_dim,
            depths=depths,
            num_heads=num_heads,
            window_size=window_sizes,
            strict_img_size=False,
            drop_path_rate=drop_path,
        )
        for block in self.block_modules():
            SizeAdaptiveSwinBlock.adapt(block)
        self.embed_dim = self.token_dim = self.num_features

    def init_weights(self, mode: str = "", needs_reset: bool = True) -> None:
        """timm's Swin init of every parameter; also valid after `to_empty` on a meta-built model."""
        super().init_weights(mode, needs_reset=True)
        self.clear_cache()

    def clear_cache(self) -> None:
        for module in self.modules():  # also finds blocks inside activation-checkpoint wrappers
            if isinstance(module, SizeAdaptiveSwinBlock):
                module.geometry_cache.clear()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.norm(self.layers(self.patch_embed(x)))
        batch, height, width, channels = x.shape
        tokens = x.reshape(batch, height * width, channels)
        return {"pooled": tokens.mean(dim=1), "tokens": tokens, "grid": (int(height), int(width))}

    def block_modules(self) -> list[nn.Module]:
        return [block for stage in self.layers for block in stage.blocks]

    def forward_last_blocks(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Average-pooled outputs of the last n blocks; only last-stage blocks get the final norm (EsViT)."""
        total = len(self.block_modules())
        if not 1 <= n <= total:
            raise UserError(f"linear probe: n_last_blocks {n} must be between 1 and the model's {total} blocks")
        x = self.patch_embed(x)
        outputs = []
        last_stage = len(self.layers) - 1
        for index, stage in enumerate(self.layers):
            x = stage.downsample(x)
            for block in stage.blocks:
                x = block(x)
                outputs.append(self.norm(x) if index == last_stage else x)
        return [out.flatten(1, 2).mean(dim=1) for out in outputs[-n:]]


def stage_windows(window_size: int, stages: int) -> tuple[int, ...]:
    """EsViT's W14 models: the window in every stage but the last, which keeps 7 (its whole 7x7 map at 224)."""
    if window_size < 1:
        raise UserError(f"model.window_size must be positive, got {window_size}")
    return (window_size,) * (stages - 1) + (min(window_size, 7),)


def _swin_factory(size: str):
    embed_dim, depths, heads = SIZES[size]

    def build(cfg, drop_path: float) -> Swin:
        if cfg.num_heads is not None:
            raise UserError(f"model.num_heads: Swin ({cfg.name}) has per-stage heads {heads}; leave it unset")
        return Swin(
            embed_dim=embed_dim,
            depths=depths,
            num_heads=heads,
            window_sizes=stage_windows(cfg.window_size, len(depths)),
            patch_size=cfg.patch_size or 4,
            img_size=cfg.img_size,
            drop_path=drop_path,
        )

    return build


for _size in SIZES:
    register(f"swin_{_size}")(_swin_factory(_size))
