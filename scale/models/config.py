"""Recipe section `model`: the backbone, built by name from the registry."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class ModelConfig:
    name: str = "vit_small"  # registry name: vit_small, vit_base, swin_tiny, resnet50, ...
    patch_size: int = 16
    img_size: int = 224
    num_heads: Optional[int] = None  # None: the family's default (MoCo v3's ViT-S uses 12)
    drop_path: float = 0.1
    pos_embed: str = "learned"  # learned (bicubic-interpolated per grid) | sincos (fixed 2-D, MoCo v3)
    frozen_patch_embed: bool = False  # MoCo v3 random patch projection
    pooling: str = "cls"  # cls | avg
    final_norm: bool = True
    bn_mlp: bool = False  # ViT-BN: BatchNorm in the MLP blocks
    window_size: int = 7  # Swin: 7, or 14 (EsViT W14: 14 in stages 1-3, 7 in stage 4)
