"""Pictures of what a backbone learned: self-attention maps (DINO Fig. 1/3/4) and matched regions (EsViT Fig. 8)."""
