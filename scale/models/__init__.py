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

import importlib

# The families register their backbones on import. They import torch and timm (~2 s), so they are imported on first
# use of a backbone, one family at a time: the recipe schema (scale.models.config) reads the names declared here.
FAMILIES = ("cvt", "pvt", "resnet", "swin", "t2t", "vil", "vit")
# every value of model.name, with the family module that registers it (tests/models/test_backbone_registry.py: the
# families register exactly these)
BACKBONES = {
    **{f"cvt_{size}": "cvt" for size in ("13", "nano", "nano_w", "tiny")},
    **{f"pvt_{size}": "pvt" for size in ("nano", "tiny", "tiny_2262")},
    **{name: "resnet" for name in ("resnet50", "resnet_nano")},
    **{f"swin_{size}": "swin" for size in ("base", "nano", "small", "tiny")},
    **{f"t2t_vit_{size}": "t2t" for size in ("14", "nano")},
    **{f"vil_{size}": "vil" for size in ("nano", "tiny")},
    **{f"vit{bn}_{size}": "vit" for bn in ("", "_bn") for size in ("nano", "tiny", "small", "base", "large", "huge")},
}

__all__ = ["BACKBONES", "available", "build_backbone", "init_weights", "register"]


def load_families() -> None:
    """Import every backbone family (each registers its names)."""
    for family in FAMILIES:
        importlib.import_module(f"scale.models.{family}")


def available() -> list[str]:
    """The valid values of model.name (no family imported)."""
    return sorted(BACKBONES)


def __getattr__(name: str):
    if name in ("build_backbone", "register"):
        from scale.models import registry

        return getattr(registry, name)
    if name in FAMILIES:
        return importlib.import_module(f"scale.models.{name}")
    raise AttributeError(f"module 'scale.models' has no attribute '{name}'")


def init_weights(module) -> None:
    """(Re)initialise a backbone's parameters and buffers in place, e.g. after `to_empty` of a meta-built,
    sharded model; deterministic given the torch seed."""
    import torch

    if not hasattr(module, "init_weights"):
        raise TypeError(f"{type(module).__name__} is not a scale backbone (no init_weights)")
    with torch.no_grad():
        module.init_weights()
