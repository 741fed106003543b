"""Image files to normalised tensors for the pictures and dense evaluations (DINO: resize the shorter side, crop
the bottom and right edges to a multiple of the patch size)."""

from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from scale.errors import UserError


def read_rgb(path: str | Path) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"image not found: {path}")
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except OSError as err:
        raise UserError(f"{path}: cannot read the image ({err})") from None


def to_input(image: Image.Image | np.ndarray, short_side: int | None, multiple: int, mean, std) -> torch.Tensor:
    """[3, H, W] normalised, the shorter side resized to `short_side` (None: kept), H and W cut down to a multiple
    of `multiple` (the patch size)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image).convert("RGB")
    tensor = TF.to_dtype(TF.pil_to_tensor(image), torch.float32, scale=True)
    if short_side:
        tensor = TF.resize(tensor, [short_side], antialias=True)
    return TF.normalize(fit_to_patches(tensor, multiple), list(mean), list(std))


def fit_to_patches(images: torch.Tensor, multiple: int) -> torch.Tensor:
    """[..., H, W] with the bottom rows and right columns cut so that H and W are multiples of `multiple`."""
    height, width = images.shape[-2] - images.shape[-2] % multiple, images.shape[-1] - images.shape[-1] % multiple
    if height == 0 or width == 0:
        raise UserError(f"image of {tuple(images.shape[-2:])} px is smaller than one {multiple} px patch")
    return images[..., :height, :width]


def to_display(tensor: torch.Tensor, mean, std) -> np.ndarray:
    """A normalised [3, H, W] tensor back to an [H, W, 3] array in [0, 1] for matplotlib."""
    image = tensor * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    return image.clamp(0, 1).permute(1, 2, 0).numpy()


def patch_size(backbone) -> int:
    """The input side multiple a backbone needs: its patch size (1 without a patch embedding, e.g. ResNet)."""
    size = getattr(getattr(backbone, "patch_embed", None), "patch_size", 1)
    return int(size[0] if isinstance(size, (tuple, list)) else size)
