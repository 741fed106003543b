"""Backbones (ViT, Swin, ResNet) built by name from the recipe's `model` section.

Every backbone maps images [B, 3, H, W] to a dict:
  "pooled" [B, embed_dim]   ViT: class token (or mean of patch tokens) after the final norm; Swin/ResNet: mean of
                            the last stage's tokens
  "tokens" [B, N, token_dim] the final feature grid as tokens (ViT patch tokens without CLS, Swin last stage
                            after its norm, ResNet layer4)
  "grid"   (h, w)           the grid of those tokens
and offers `embed_dim`, `token_dim`, `block_modules()` (FSDP and activation-checkpointing units),
`forward_last_blocks(x, n)` (linear probe features) and `init_weights()` (paper init, also after `to_empty`).
"""

import torch
from torch import nn

from scale.models import resnet, swin, vit  # noqa: F401  (register the families)
from scale.models.registry import available, build_backbone, register

__all__ = ["available", "build_backbone", "init_weights", "register"]


def init_weights(module: nn.Module) -> None:
    """(Re)initialise a backbone's parameters and buffers in place, e.g. after `to_empty` of a meta-built,
    sharded model; deterministic given the torch seed."""
    if not hasattr(module, "init_weights"):
        raise TypeError(f"{type(module).__name__} is not a scale backbone (no init_weights)")
    with torch.no_grad():
        module.init_weights()
