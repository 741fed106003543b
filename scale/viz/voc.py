"""Fig. 4's table of DINO: Jaccard similarity between attention masks and the foreground of PASCAL VOC12 val.

Layout read (VOCdevkit/VOC2012 of the VOC2012 trainval tar):
  ROOT/ImageSets/Segmentation/<split>.txt   image ids, one per line
  ROOT/JPEGImages/<id>.jpg
  ROOT/SegmentationClass/<id>.png           palette PNG: 0 background, 1..20 classes, 255 void (object borders)
Foreground is every class pixel; void pixels count for neither side. The paper does not say how heads are
combined: per head we average the Jaccard over images and report every head, the best one (Fig. 4 shows "the best
head") and their mean.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from scale.errors import UserError
from scale.eval.images import patch_size, read_rgb, to_input
from scale.viz import attention as attn

VOID = 255


@dataclass
class VocSample:
    name: str
    image: Path
    mask: Path


def read_voc(root: str | Path, split: str = "val", limit: int | None = None) -> list[VocSample]:
    root = Path(root)
    listing = root / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not listing.is_file():
        raise UserError(f"--voc {root}: missing {listing} (expected the VOC2012 layout, see docs/how-to/evaluate.md)")
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()][:limit]
    if not names:
        raise UserError(f"{listing}: no image ids")
    samples = [VocSample(n, root / "JPEGImages" / f"{n}.jpg", root / "SegmentationClass" / f"{n}.png") for n in names]
    for sample in samples:
        for path in (sample.image, sample.mask):
            if not path.is_file():
                raise UserError(f"--voc {root}: missing {path} (listed in {listing})")
    return samples


def read_foreground(path: Path, short_side: int | None, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Foreground and void masks of a palette PNG on the image's grid: the shorter side resized to `short_side`
    (nearest; None keeps it) and cut to `size` (H, W), as `to_input` does to the image."""
    with Image.open(path) as png:
        if png.mode not in ("P", "L"):
            raise UserError(f"{path}: expected a palette (class index) PNG, got mode {png.mode}")
        labels = torch.from_numpy(np.array(png))[None]
    if short_side:
        labels = TF.resize(labels, [short_side], interpolation=TF.InterpolationMode.NEAREST)
    labels = labels[0, : size[0], : size[1]].numpy()
    return (labels != 0) & (labels != VOID), labels == VOID


@torch.no_grad()
def evaluate(backbone, samples: list[VocSample], keep: float, short_side: int | None, mean, std) -> dict:
    """Mean Jaccard per head over the samples, the best head and the mean over heads (in %)."""
    per_image = []
    for sample in samples:
        image = to_input(read_rgb(sample.image), short_side, patch_size(backbone), mean, std)
        size = tuple(image.shape[1:])
        masks = attn.upsample(attn.mass_mask(attn.attention_maps(backbone, image[None])[0], keep), size).bool()
        truth, void = read_foreground(sample.mask, short_side, size)
        per_image.append([attn.jaccard(m.numpy(), truth, void) for m in masks])
    per_head = 100.0 * np.asarray(per_image).mean(axis=0)
    return {
        "images": len(samples),
        "keep_mass": keep,
        "jaccard_per_head": per_head.tolist(),
        "best_head": int(per_head.argmax()),
        "jaccard_best_head": float(per_head.max()),
        "jaccard_mean_heads": float(per_head.mean()),
    }
