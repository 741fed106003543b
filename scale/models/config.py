"""Recipe section `model`: the backbone, built by name from the registry."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    name: str = "vit_small"  # registry name: vit_small, vit_base, swin_tiny, resnet50, ... (`scale models table`)
    patch_size: int | None = None  # None: the family's default (ViT 16, vit_nano 8, Swin 4; unused by ResNet)
    img_size: int = 224  # size the learned pos-embed and Swin windows are built for; other sizes are interpolated
    num_heads: int | None = None  # None: the family's default (MoCo v3's ViT-S uses 12)
    drop_path: float = 0.1
    pos_embed: str = "learned"  # learned (bicubic-interpolated per grid) | sincos (fixed 2-D, MoCo v3) | none
    frozen_patch_embed: bool = False  # MoCo v3 random patch projection
    pooling: str = "cls"  # cls | avg (MoCo v3 ablation: no class token, global average pool)
    final_norm: bool = True
    bn_mlp: bool = False  # ViT-BN: BatchNorm instead of LayerNorm before the MLP of every block
    window_size: int = 7  # Swin: 7, or 14 (EsViT W14: 14 in stages 1-3, 7 in stage 4)
    weight_init: str = ""  # ViT: "" (timm/DINO trunc-normal 0.02) | moco (MoCo v3: xavier, per-q/k/v qkv)
