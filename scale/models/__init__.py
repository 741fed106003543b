"""Backbones (ViT, Swin, ResNet, CvT, T2T-ViT, ViL, PvT) built by name from the recipe's `model` section.

Every backbone maps images [B, 3, H, W] to a dict:
  "pooled" [B, embed_dim]   ViT, T2T-ViT, CvT-13: class token (or mean of patch tokens) after the final norm;
                            Swin/ResNet/CvT-T/PvT/ViL: mean of the last stage's tokens
  "tokens" [B, N, token_dim] the final feature grid as tokens (ViT/T2T patch tokens without CLS, Swin/CvT/PvT/ViL
                            last stage after the final norm without prefix tokens, ResNet layer4)
  "grid"   (h, w)           the grid of those tokens
and offers `embed_dim`, `token_dim`, `block_modules()` (FSDP and activation-checkpointing units),
`forward_last_blocks(x, n)` (linear probe features) and `init_weights()` (paper init, also after `to_empty`).
CvT, PvT and ViL blocks take `(tokens, grid)` (see scale/models/staged.py); ViT-style blocks take tokens only.
"""

import torch
from torch import nn

from scale.models import cvt, pvt, resnet, swin, t2t, vil, vit  # noqa: F401  (register the families)
from scale.models.registry import available, build_backbone, register

__all__ = ["available", "build_backbone", "init_weights", "register"]


def init_weights(module: nn.Module) -> None:
    """(Re)initialise a backbone's parameters and buffers in place, e.g. after `to_empty` of a meta-built,
    sharded model; deterministic given the torch seed."""
    if not hasattr(module, "init_weights"):
        raise TypeError(f"{type(module).__name__} is not a scale backbone (no init_weights)")
    with torch.no_grad():
        module.init_weights()
