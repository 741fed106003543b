"""scale: self-supervised vision transformers at scale (DINO, MoCo v3, EsViT, DRLoc)."""

__version__ = "0.1.0"
