"""Pictures of what a backbone learned, `scale viz` (scale/viz/draw.py runs it): self-attention maps and the Jaccard
of their masks on PASCAL VOC12 (DINO Fig. 1/3/4: attention.py, voc.py, figures.py) and the matched regions between
two views (EsViT Fig. 8: correspondence_picture.py, drawing the matches of scale/eval/correspondence.py). Sits above
eval/, whose image reading (scale/eval/images.py) and backbone session it uses."""
