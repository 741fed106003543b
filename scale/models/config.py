"""Recipe section `model`: the backbone, built by name from the registry."""

from dataclasses import dataclass

from scale.config.fields import FIXED, above, at_least, choice, listed_in, plain, within
from scale.models import BACKBONES


@dataclass
class ModelConfig:
    name: str = choice(
        "vit_small", sorted(BACKBONES), resume=FIXED
    )  # vit_small, vit_base, swin_tiny, ... (`scale models table`)
    patch_size: int | None = at_least(
        None, 1, resume=FIXED
    )  # None: the family's default (ViT 16, vit_nano 8, Swin 4; unused by ResNet)
    img_size: int = at_least(
        224, 1, resume=FIXED
    )  # size the learned pos-embed and Swin windows are built for; other sizes are interpolated
    num_heads: int | None = at_least(None, 1, resume=FIXED)  # None: the family's default (MoCo v3's ViT-S uses 12)
    # stochastic depth: the drop rate of the last block (rising linearly from 0 over the blocks)
    drop_path: float = within(0.1, 0.0, 1.0)
    # learned (bicubic-interpolated) | sincos (fixed 2-D, MoCo v3) | none
    pos_embed: str = choice(
        "learned", listed_in("scale.models.vit", "POS_EMBEDS", ("learned", "sincos", "none")), resume=FIXED
    )
    # sincos only: a parameter initialised with the sin-cos table and trained, as DeiT's learned embedding is when it
    # loads a MoCo v3 checkpoint (MoCo v3 Table 5, transfer/README.md); False: fixed, a buffer checkpoints carry
    pos_embed_trainable: bool = plain(False, FIXED)
    frozen_patch_embed: bool = plain(False, FIXED)  # MoCo v3 random patch projection
    # cls | avg: MoCo v3 ablation, no class token, global average pool
    pooling: str = choice("cls", listed_in("scale.models.vit", "POOLINGS", ("cls", "avg")), resume=FIXED)
    # a norm after the last block
    final_norm: bool = plain(True, FIXED)
    bn_mlp: bool = plain(False, FIXED)  # ViT-BN: BatchNorm instead of LayerNorm before the MLP of every block
    # ViT: LayerScale (per-channel `ls1.gamma`/`ls2.gamma` after attention and MLP, as DINOv2's and CaiT's ViTs have),
    # started at this value (DINOv2: 1e-5); None: none, as DINO's and MoCo v3's ViTs
    layer_scale: float | None = above(None, 0.0, resume=FIXED)
    window_size: int = at_least(7, 1, resume=FIXED)  # Swin: 7, or 14 (EsViT W14: 14 in stages 1-3, 7 in stage 4)
    # ViT: "" timm/DINO trunc-normal 0.02 | moco: xavier per q/k/v
    weight_init: str = choice("", listed_in("scale.models.vit", "INIT_MODES", ("", "moco")))
