"""Self-attention of a ViT's last block (DINO Fig. 1/3) and masks that keep a share of its mass (Fig. 4).

DINO (visualize_attention.py) takes the class token's attention to the patch tokens in the last block, one map per
head. Masks keep the most-attended patches whose attention sums to `keep` (60%) of the map's mass; the paper scores
them against ground-truth foreground with the Jaccard index on PASCAL VOC12 val. A ViT built without a class token
(average pooling, as the demo's) has no such query: its analogue here is the mean over the patch queries, i.e. how
much each patch feeds the average-pooled output through the last attention. Other backbones (Swin, ResNet, CvT,
PvT, ViL, T2T) have no global self-attention over the image and are refused.
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from scale.errors import UserError
from scale.models.vit import ViT


def check_vit(backbone: nn.Module, model_name: str) -> None:
    if not isinstance(backbone, ViT):
        raise UserError(
            f"viz attention: model '{model_name}' is not a ViT; the maps are the class token's self-attention of a "
            f"ViT's last block, and {type(backbone).__name__} has no global attention with a class token"
        )


def query_kind(backbone: ViT) -> str:
    return "class token" if backbone.has_class_token else "mean patch query, no class token"


@torch.no_grad()
def last_block_attention(backbone: ViT, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """Softmax attention of the last block [B, heads, N, N] (prefix tokens first) and the patch grid."""
    attn = backbone.blocks[-1].attn
    captured = {}

    def keep_input(_module, args):
        captured["x"] = args[0]

    handle = attn.register_forward_pre_hook(keep_input)
    try:
        grid = backbone(images)["grid"]
    finally:
        handle.remove()
    x = captured["x"]
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1), grid


@torch.no_grad()
def attention_maps(backbone: ViT, images: torch.Tensor) -> torch.Tensor:
    """Per image and head, the attention the query (class token, else the mean patch query) pays to each patch:
    [B, heads, h, w] on the CPU, each map summing to at most 1."""
    attn, (height, width) = last_block_attention(backbone, images.to(next(backbone.parameters()).device))
    prefix = backbone.num_prefix_tokens
    if backbone.has_class_token:
        maps = attn[:, :, 0, prefix:]
    else:
        maps = attn[:, :, prefix:, prefix:].mean(dim=2)
    return maps.reshape(*maps.shape[:2], height, width).float().cpu()


def check_keep(keep: float) -> None:
    if not 0.0 < keep <= 1.0:
        raise UserError(f"--threshold (the share of attention mass a mask keeps) must be in (0, 1], got {keep}")


def mass_mask(maps: torch.Tensor, keep: float = 0.6) -> torch.Tensor:
    """Boolean masks [..., h, w] of the most-attended patches holding `keep` of each map's mass (DINO: sort
    ascending, normalise, keep where the cumulative mass exceeds 1 - keep)."""
    check_keep(keep)
    flat = maps.flatten(-2)
    values, order = flat.sort(dim=-1)
    cumulative = (values / values.sum(dim=-1, keepdim=True)).cumsum(dim=-1)
    kept_sorted = cumulative > 1 - keep
    kept = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
    return kept.reshape(maps.shape)


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[..., h, w] -> [..., H, W] by nearest neighbour (each patch covers its pixels, as DINO draws them)."""
    lead = maps.shape[:-2]
    out = F.interpolate(maps.reshape(1, -1, *maps.shape[-2:]).float(), size=size, mode="nearest")
    return out.reshape(*lead, *size)


def jaccard(mask: np.ndarray, truth: np.ndarray, void: np.ndarray | None = None) -> float:
    """|mask ∩ truth| / |mask ∪ truth| over the pixels that are not void; 1.0 when both are empty."""
    mask, truth = np.asarray(mask, bool), np.asarray(truth, bool)
    if void is not None:
        valid = ~np.asarray(void, bool)
        mask, truth = mask & valid, truth & valid
    union = np.logical_or(mask, truth).sum()
    return 1.0 if union == 0 else float(np.logical_and(mask, truth).sum() / union)
