"""Pictures of what a backbone learned: self-attention maps (DINO Fig. 1/3/4), the image reading and figure helpers
the evaluations share. The matched-regions picture (EsViT Fig. 8) draws eval's matches: scale/eval/correspondence_picture.py."""
