"""ViT backbones of DINO and MoCo v3: timm's VisionTransformer plus the papers' options.

- learned position embeddings resized bicubically to every input grid (DINO's 96 px locals, ViT-L/7 at 98 px);
- MoCo v3's fixed 2-D sin-cos embedding, frozen random patch projection, class token vs. global average pooling
  with or without the final LayerNorm, and ViT-BN (BatchNorm instead of LayerNorm before each block's MLP).
"""

import math

import torch
from timm.layers import DropPath, LayerScale
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from scale.errors import UserError
from scale.models.pos_embed import resize_grid_embed, sincos_2d
from scale.models.registry import register

# name: (embed_dim, depth, num_heads, default patch size); ViT-S has DeiT's 6 heads (MoCo v3 sets num_heads: 12)
SIZES = {
    "nano": (64, 3, 4, 8),  # tests and the CPU demo (32-64 px images)
    "tiny": (192, 12, 3, 16),
    "small": (384, 12, 6, 16),
    "base": (768, 12, 12, 16),
    "large": (1024, 24, 16, 16),
    "huge": (1280, 32, 16, 14),
}
POS_EMBEDS = ("learned", "sincos", "none")
POOLINGS = ("cls", "avg")
INIT_MODES = ("", "moco")


class TokenBatchNorm(nn.Module):
    """BatchNorm over all tokens of [B, N, D] (ViT-BN). A wrapped BatchNorm1d, so SyncBN conversion keeps working."""

    def __init__(self, dim: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # tokens as rows: the statistics of [B, D, N], without the transposes, whose output strides torch.compile's
        # aot_eager backend mispredicts (the next view fails)
        return self.bn(x.flatten(0, 1)).view_as(x)


class ViTBlock(Block):
    """timm's block, whose two drop paths may take their per-sample masks from the caller (`ViT.drop_masks`: one
    draw for every block of a pass) instead of drawing them one by one."""

    def forward(self, x: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        if masks is None:
            return super().forward(x)
        x = x + _dropped(self.ls1(self.attn(self.norm1(x))), masks[0])
        return x + _dropped(self.ls2(self.mlp(self.norm2(x))), masks[1])


def _dropped(branch: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """timm's `drop_path` with its scaled mask given: branch * (0 or 1/keep per sample). A mask drawn in another
    dtype is cast first, which rounds as timm's mask drawn in the branch's dtype does (1/keep is computed in fp32
    for both)."""
    return branch * mask.to(branch.dtype).view(-1, *(1,) * (branch.ndim - 1))


class BNMlpBlock(ViTBlock):
    """MoCo v3's ViT-BN block: BN replaces the LayerNorm in front of the MLP; attention keeps its LayerNorm."""

    def __init__(self, dim: int, **kwargs):
        super().__init__(dim, **kwargs)
        self.norm2 = TokenBatchNorm(dim)


class ViT(VisionTransformer):
    def __init__(
        self,
        *,
        embed_dim: int,
        depth: int,
        num_heads: int,
        patch_size: int,
        img_size: int,
        drop_path: float,
        pos_embed: str = "learned",
        pos_embed_trainable: bool = False,
        frozen_patch_embed: bool = False,
        pooling: str = "cls",
        final_norm: bool = True,
        bn_mlp: bool = False,
        weight_init: str = "",
        layer_scale: float | None = None,
    ):
        _check_choice("model.pos_embed", pos_embed, POS_EMBEDS)
        _check_choice("model.pooling", pooling, POOLINGS)
        _check_choice("model.weight_init", weight_init, INIT_MODES)
        if pos_embed_trainable and pos_embed != "sincos":
            raise UserError(f"model.pos_embed_trainable applies to pos_embed 'sincos', not '{pos_embed}'")
        if img_size % patch_size:
            raise UserError(f"model.img_size {img_size} is not a multiple of model.patch_size {patch_size}")
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            num_classes=0,
            global_pool="",
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            qkv_bias=True,
            class_token=pooling == "cls",
            pos_embed="none" if pos_embed == "none" else "learn",
            final_norm=final_norm,
            fc_norm=False,
            dynamic_img_size=True,
            drop_path_rate=drop_path,
            block_fn=BNMlpBlock if bn_mlp else ViTBlock,
            init_values=layer_scale,  # timm's LayerScale: ls1.gamma / ls2.gamma, DINOv2's names
            weight_init="skip",
        )
        self.pos_embed_kind = pos_embed
        self.pos_embed_fixed = pos_embed == "sincos" and not pos_embed_trainable
        if self.pos_embed_fixed:  # a buffer, so that checkpoints carry the table as MoCo v3's do (a frozen parameter)
            table = self.pos_embed.data
            del self.pos_embed
            self.register_buffer("pos_embed", table)
        self.frozen_patch_embed = frozen_patch_embed
        self.weight_init_mode = weight_init  # timm's own init() reads it; "skip" above only deferred the init
        self.token_dim = embed_dim
        if frozen_patch_embed:
            self.patch_embed.proj.requires_grad_(False)
        self._keep_on: dict[tuple, torch.Tensor] = {}  # stochastic depth's keep rates on a device, copied there once
        self.init_weights()

    def init_weights(self, mode: str = "", needs_reset: bool = True) -> None:
        """Paper init of every parameter and buffer; also valid after `to_empty` on a meta-built model."""
        super().init_weights(mode or self.weight_init_mode, needs_reset=True)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()
        if self.weight_init_mode == "moco" or self.frozen_patch_embed:
            # MoCo v3: xavier-uniform over the patch projection seen as a [D, 3*p*p] matrix; frozen, it stays so
            proj = self.patch_embed.proj
            bound = math.sqrt(6.0 / float(proj.weight[0].numel() + proj.weight.shape[0]))
            nn.init.uniform_(proj.weight, -bound, bound)
            nn.init.zeros_(proj.bias)
        if self.pos_embed_kind == "sincos":
            _copy_into(self.pos_embed, self._sincos_table())

    def _sincos_table(self) -> torch.Tensor:
        """MoCo v3's pos_embed: the sin-cos table of the built grid after a zero row per prefix (class) token."""
        h, w = self.patch_embed.grid_size
        table = sincos_2d(h, w, self.embed_dim, device=self.pos_embed.device)
        return torch.cat([table.new_zeros(1, self.num_prefix_tokens, self.embed_dim), table], dim=1)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """[B, h, w, D] patch embeddings -> [B, (1+)h*w, D] with position embeddings for this grid."""
        batch, h, w, dim = x.shape
        x = x.reshape(batch, h * w, dim)
        if self.pos_embed_fixed:  # other grids (crops of another size) get the formula: nothing to interpolate
            built = (h, w) == tuple(self.patch_embed.grid_size)
            grid = self.pos_embed[:, self.num_prefix_tokens :] if built else sincos_2d(h, w, dim, device=x.device)
            x = x + grid.to(x.dtype)
        elif self.pos_embed is not None:
            grid = self.pos_embed[:, self.num_prefix_tokens :]
            x = x + resize_grid_embed(grid, self.patch_embed.grid_size, (h, w))
        if self.cls_token is not None:
            cls = self.cls_token.expand(batch, -1, -1)
            if self.pos_embed is not None and not self.pos_embed_fixed:  # fixed: zero (MoCo v3's pe_token)
                cls = cls + self.pos_embed[:, :1]
            x = torch.cat([cls, x], dim=1)
        return self.pos_drop(x)

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.patch_embed(x)
        grid = (int(x.shape[1]), int(x.shape[2]))
        x = self.norm_pre(self.patch_drop(self._pos_embed(x)))
        return x, grid

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] if self.has_class_token else x[:, self.num_prefix_tokens :].mean(dim=1)

    def drop_masks(self, x: torch.Tensor) -> torch.Tensor | None:
        """The scaled stochastic-depth masks of every block of this pass, [blocks, 2 paths, batch] (a block of rate
        0 is given none: timm has no drop path there), or None when training is off or no block drops. One Bernoulli draw and one scaling for all
        paths, where timm draws and scales per path (two launches each, 44 per pass for ViT-S): the masks are
        timm's (per sample 1/keep with probability keep, else 0), drawn from the same generator in another order.
        They are drawn in the dtype the branches will have (the autocast dtype, promoted by a layer scale), so
        that applying one launches nothing but the product."""
        rates = self.keep_rates()
        if not self.training or min(rates) == 1.0:
            return None
        if torch.compiler.is_compiling():  # a constant of the graph; the cache's dict would be guarded on, and
            keep = torch.tensor(rates, device=x.device)[:, None, None]  # filling it recompiled a compiled net
        else:
            keep = self._keep_on.get((x.device, rates))
            if keep is None:
                keep = self._keep_on[x.device, rates] = torch.tensor(rates, device=x.device)[:, None, None]
        masks = torch.empty(len(rates), 2, x.shape[0], dtype=self._branch_dtype(x), device=x.device)
        return masks.bernoulli_(keep).div_(keep)

    def keep_rates(self) -> tuple[float, ...]:
        """Each block's probability of keeping its branches (timm's DropPath rate, set by its linear rule)."""
        return tuple(1.0 - b.drop_path1.drop_prob if isinstance(b.drop_path1, DropPath) else 1.0 for b in self.blocks)

    def _branch_dtype(self, x: torch.Tensor) -> torch.dtype:
        device, first = x.device.type, self.blocks[0]
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else first.attn.proj.weight.dtype
        return torch.promote_types(dtype, first.ls1.gamma.dtype) if isinstance(first.ls1, LayerScale) else dtype

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x, grid = self._embed(x)
        masks = self.drop_masks(x)
        for index, block in enumerate(self.blocks):
            x = block(x) if masks is None or isinstance(block.drop_path1, nn.Identity) else block(x, masks[index])
        x = self.norm(x)
        return {"pooled": self._pool(x), "tokens": x[:, self.num_prefix_tokens :], "grid": grid}

    def block_modules(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward_last_blocks(self, x: torch.Tensor, n: int, avgpool: bool = False) -> list[torch.Tensor]:
        """Pooled (CLS or mean) normed outputs of the last n blocks, as DINO's linear probe reads them.

        With `avgpool`, also the mean of the last block's normed patch tokens (DINO's --avgpool_patchtokens)."""
        _check_last_blocks(n, len(self.blocks))
        x, _ = self._embed(x)
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index >= len(self.blocks) - n:
                outputs.append(self.norm(x))
        features = [self._pool(out) for out in outputs]
        if avgpool:
            features.append(outputs[-1][:, self.num_prefix_tokens :].mean(dim=1))
        return features


def _check_choice(key: str, value: str, choices) -> None:
    if value not in choices:
        raise UserError(f"{key}: '{value}' is not one of {', '.join(repr(c) for c in choices)}")


@torch.no_grad()
def _copy_into(target: torch.Tensor, values: torch.Tensor) -> None:
    """target <- values, also when target is an FSDP2 shard (each rank slices its part: no communication)."""
    if isinstance(target, DTensor):
        values = distribute_tensor(values, target.device_mesh, target.placements, src_data_rank=None)
    target.copy_(values)


def _check_last_blocks(n: int, depth: int) -> None:
    if not 1 <= n <= depth:
        raise UserError(f"linear probe: n_last_blocks {n} must be between 1 and the model's {depth} blocks")


def _vit_factory(size: str, bn_mlp: bool):
    embed_dim, depth, heads, default_patch = SIZES[size]

    def build(cfg, drop_path: float) -> ViT:
        return ViT(
            embed_dim=embed_dim,
            depth=depth,
            num_heads=cfg.num_heads or heads,
            patch_size=cfg.patch_size or default_patch,
            img_size=cfg.img_size,
            drop_path=drop_path,
            pos_embed=cfg.pos_embed,
            pos_embed_trainable=cfg.pos_embed_trainable,
            frozen_patch_embed=cfg.frozen_patch_embed,
            pooling=cfg.pooling,
            final_norm=cfg.final_norm,
            bn_mlp=bn_mlp or cfg.bn_mlp,
            weight_init=cfg.weight_init,
            layer_scale=cfg.layer_scale,
        )

    return build


for _size in SIZES:
    register(f"vit_{_size}")(_vit_factory(_size, bn_mlp=False))
    register(f"vit_bn_{_size}")(_vit_factory(_size, bn_mlp=True))
