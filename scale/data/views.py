"""Views of one image, built from the recipe's ViewsConfig (defaults: the papers and their official code).

- multicrop (DINO, EsViT): n_global crops of global_size (scale global_scale) and, per local size, n_local crops
  (scale local_scale); bicubic; flip 0.5; colour jitter (0.4, 0.4, 0.2, 0.1) with p 0.8 in a random order; greyscale
  p 0.2; Gaussian blur (PIL radius U[0.1, 2]) with p blur_p[i] for global view i and local_blur_p for locals;
  solarize (threshold 128) with p solarize_p[i] / local_solarize_p. Official: blur 1.0 / 0.1 / 0.5, solarize on
  global 2 with p 0.2.
- two_view (MoCo v3 / BYOL): the same ops with n_global 2, no locals, bilinear, scale (crop_min, 1).
- supervised (DRLoc, fine-tuning): timm's create_transform (RandAugment, random erasing); mixup/cutmix belongs to
  the supervised method, which mixes whole batches.
- eval: resize the short side to eval_resize (eval_interpolation: bicubic or bilinear), center crop eval_crop.

Speed without changing the distribution of crops (`scale bench data`: 2.3-2.5x the official pipeline per core on
500x375 photos; equivalence tests in tests/data/test_fast_ops.py): crop boxes are drawn first on the original size;
the JPEG is decoded once, at 1/2, 1/4 or 1/8 size in the DCT (PIL draft) when every crop is at least that much larger
than its output; crop+resize is torch's uint8 antialiased kernel (Pillow's filters, 3-4x faster than PIL); each crop
then stays a uint8 [H, W, 3] array through flip, jitter, greyscale, blur and solarize (scale/data/colour.py: the
arithmetic of torchvision's PIL ops, OpenCV for the costly hue shift and blur); the conversion to float and
normalisation happen once per batch on a stacked tensor (`normalize`).

photometric_on=device (scale/data/photometric.py): the same up to the resized uint8 crop; the flip, jitter,
greyscale, blur and solarize parameters are drawn here, from the same generator in the same order, and applied
batched on the device.

Every random choice comes from the `random.Random` passed in, so a sample's views depend only on its seed.
"""

import io
import math
import random

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from scale.data import colour
from scale.data.colour import gaussian_blur, solarize
from scale.data.photometric import Draw, blur_taps
from scale.errors import UserError

INTERPOLATION = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR}


def decode_rgb(data: bytes, min_size: tuple = (0, 0)) -> Image.Image:
    """Decode to RGB; with min_size, a JPEG is decoded at the smallest DCT scale that keeps at least that size."""
    img = Image.open(io.BytesIO(data))
    if min_size != (0, 0):
        img.draft("RGB", min_size)
    return img.convert("RGB")


def random_resized_crop_box(rng: random.Random, width: int, height: int, scale, ratio) -> tuple:
    """torchvision RandomResizedCrop.get_params, drawn from rng: (left, top, right, bottom)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height  # fallback: central crop at the closest allowed ratio
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def draw_jitter(rng: random.Random, strength) -> tuple[list, list]:
    """torchvision ColorJitter(b, c, s, h).get_params from rng: the order of the four ops, then their factors."""
    b, c, s, h = strength
    order = [0, 1, 2, 3]
    rng.shuffle(order)
    factors = [
        rng.uniform(max(0.0, 1 - b), 1 + b),
        rng.uniform(max(0.0, 1 - c), 1 + c),
        rng.uniform(max(0.0, 1 - s), 1 + s),
        rng.uniform(-h, h),
    ]
    return order, factors


def color_jitter(rgb: np.ndarray, order, factors, strength) -> np.ndarray:
    """ColorJitter on uint8 [H, W, 3]: the four ops in `order`, each computed as torchvision's PIL op computes it
    (scale/data/colour.py); an op of strength 0 is skipped, as torchvision skips it."""
    for op in order:
        f = factors[op]
        if not strength[op]:
            continue
        if op == 0:
            rgb = colour.brightness(rgb, f)
        elif op == 1:
            rgb = colour.contrast(rgb, f)
        elif op == 2:
            rgb = colour.saturation(rgb, f)
        else:
            rgb = colour.shift_hue(rgb, int(f * 255) % 256)
    return rgb


def resize_crop(pixels: torch.Tensor, box, size: int, interpolation: str) -> torch.Tensor:
    """uint8 [3, H, W] -> the integer box (left, top, right, bottom) resized to [3, size, size], antialiased.

    torch's uint8 kernel is Pillow's resampling (same filters and support), 3-4x faster than PIL here; it only
    differs on the one-pixel border, where PIL also reads pixels outside the box (torchvision tensors do the same)."""
    left, top, right, bottom = box
    # channels-last in and out: torch's fastest uint8 path, and the result is a contiguous HWC array for PIL
    crop = pixels[None, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)
    return F.interpolate(crop, size=(size, size), mode=interpolation, antialias=True)[0]


class CropSpec:
    def __init__(self, size: int, scale, blur_p: float, solarize_p: float):
        self.size, self.scale, self.blur_p, self.solarize_p = int(size), tuple(scale), blur_p, solarize_p


class CropViews:
    """multicrop and two_view: groups of crops, each crop flipped, jittered, greyed, blurred, solarized, here
    (photometric_on "cpu") or on the device (photometric_on "device": scale/data/photometric.py)."""

    def __init__(self, cfg, photometric_on: str = "cpu"):
        self.photometric_on = photometric_on
        n_global = cfg.n_global if cfg.kind == "multicrop" else 2
        if len(cfg.blur_p) < n_global or len(cfg.solarize_p) < n_global:
            raise UserError(f"data.views.blur_p and solarize_p need one entry per global view ({n_global})")
        groups = [
            [CropSpec(cfg.global_size, cfg.global_scale, cfg.blur_p[i], cfg.solarize_p[i]) for i in range(n_global)]
        ]
        if cfg.kind == "multicrop":
            if len(cfg.local_sizes) != len(cfg.n_local):
                raise UserError("data.views.local_sizes and n_local must have the same length")
            groups += [
                [CropSpec(size, cfg.local_scale, cfg.local_blur_p, cfg.local_solarize_p)] * n
                for size, n in zip(cfg.local_sizes, cfg.n_local)
                if n > 0
            ]
        self.groups = groups
        self.ratio = tuple(cfg.ratio)
        if cfg.interpolation not in INTERPOLATION:
            raise UserError(
                f"data.views.interpolation must be one of {', '.join(INTERPOLATION)}, got '{cfg.interpolation}'"
            )
        self.interpolation = cfg.interpolation
        self.flip_p, self.jitter, self.jitter_p = cfg.flip_p, tuple(cfg.color_jitter), cfg.color_jitter_p
        self.grayscale_p, self.blur_sigma = cfg.grayscale_p, tuple(cfg.blur_sigma)
        self.blur_taps = blur_taps(max(self.blur_sigma))

    @property
    def views_per_group(self) -> list[int]:
        return [len(g) for g in self.groups]

    def __call__(self, data: bytes, rng: random.Random) -> list[list[torch.Tensor]]:
        head = Image.open(io.BytesIO(data))
        width, height = head.size
        boxes = [
            [random_resized_crop_box(rng, width, height, spec.scale, self.ratio) for spec in group]
            for group in self.groups
        ]
        # one decode, at the DCT reduction that every crop allows (a second decode costs more than it saves)
        k = 1
        if head.format == "JPEG":
            k = min(self._reduction(spec, box) for g, gb in zip(self.groups, boxes) for spec, box in zip(g, gb))
        img = decode_rgb(data, (0, 0) if k == 1 else (math.ceil(width / k), math.ceil(height / k)))
        pixels = torch.from_numpy(np.array(img)).permute(2, 0, 1) if k == 1 else None
        scale = (img.width / width, img.height / height)
        out = []
        for group, group_boxes in zip(self.groups, boxes):
            resized = [self._resize(img, pixels, scale, box, spec.size) for spec, box in zip(group, group_boxes)]
            out.append([self._augment(crop, spec, rng) for spec, crop in zip(group, resized)])
        return out

    @staticmethod
    def _reduction(spec: CropSpec, box) -> int:
        factor = min(box[2] - box[0], box[3] - box[1]) / spec.size
        return 8 if factor >= 8 else 4 if factor >= 4 else 2 if factor >= 2 else 1

    def _resize(self, img: Image.Image, pixels, scale, box, size: int) -> np.ndarray:
        """The crop box (original pixels) resized to uint8 [size, size, 3]: torch on the full decode (integer box),
        PIL on a reduced decode (the scaled box is fractional, which PIL's resize takes exactly)."""
        if pixels is not None:
            return resize_crop(pixels, box, size, self.interpolation).permute(1, 2, 0).numpy()
        scaled = (box[0] * scale[0], box[1] * scale[1], box[2] * scale[0], box[3] * scale[1])
        return np.array(img.resize((size, size), INTERPOLATION[self.interpolation], box=scaled))

    def draw(self, spec: CropSpec, rng: random.Random) -> Draw:
        """One crop's photometric parameters, in the order the official pipeline draws them."""
        flip = rng.random() < self.flip_p
        order, factors = draw_jitter(rng, self.jitter) if rng.random() < self.jitter_p else (None, None)
        grey = rng.random() < self.grayscale_p
        sigma = rng.uniform(*self.blur_sigma) if rng.random() < spec.blur_p else None
        return Draw(flip, order, factors, grey, sigma, rng.random() < spec.solarize_p)

    def _augment(self, rgb: np.ndarray, spec: CropSpec, rng: random.Random):
        """photometric_on=cpu: the augmented crop; device: the uint8 crop and its parameter row."""
        d = self.draw(spec, rng)
        if self.photometric_on == "device":
            return torch.from_numpy(rgb).permute(2, 0, 1), d.row()
        if d.flip:
            rgb = cv2.flip(rgb, 1)
        if d.order is not None:
            rgb = color_jitter(rgb, d.order, d.factors, self.jitter)
        if d.grey:
            rgb = colour.grayscale(rgb)
        if d.sigma is not None:
            rgb = gaussian_blur(rgb, d.sigma)
        if d.solarize:
            rgb = solarize(rgb)
        return torch.from_numpy(rgb).permute(2, 0, 1)


class EvalView:
    """Resize the short side to eval_resize (eval_interpolation), center crop eval_crop; one group of one view."""

    def __init__(self, cfg):
        self.resize, self.crop = int(cfg.eval_resize), int(cfg.eval_crop)
        if cfg.eval_interpolation not in INTERPOLATION:
            raise UserError(
                f"data.views.eval_interpolation must be one of {', '.join(INTERPOLATION)}, "
                f"got '{cfg.eval_interpolation}'"
            )
        self.interpolation = INTERPOLATION[cfg.eval_interpolation]
        self.views_per_group = [1]

    def __call__(self, data: bytes, rng: random.Random) -> list[list[torch.Tensor]]:
        head = Image.open(io.BytesIO(data))
        width, height = head.size
        scale = self.resize / min(width, height)
        # decoding at reduced DCT size is exact enough and free when the image is >= 2x the target
        img = decode_rgb(data, (math.ceil(width * scale), math.ceil(height * scale)))
        # torchvision's Resize(int): the short side to eval_resize, the long one int(eval_resize * long / short)
        short = min(width, height)
        out_w, out_h = max(self.resize, self.resize * width // short), max(self.resize, self.resize * height // short)
        img = img.resize((out_w, out_h), self.interpolation)
        left, top = int(round((out_w - self.crop) / 2)), int(round((out_h - self.crop) / 2))
        img = img.crop((left, top, left + self.crop, top + self.crop))
        return [[torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)]]


class SupervisedView:
    """timm's training transform (RandAugment, random erasing); returns normalised float crops."""

    normalized = True

    def __init__(self, cfg):
        from timm.data import create_transform

        self.transform = create_transform(
            input_size=cfg.global_size,
            is_training=True,
            scale=tuple(cfg.global_scale),
            ratio=tuple(cfg.ratio),
            hflip=cfg.flip_p,
            # timm ignores it under RandAugment (DeiT); none at 0 (MoCo v3 transfer/datasets.py has no jitter)
            color_jitter=cfg.color_jitter[0] or None,
            auto_augment=cfg.auto_augment or None,
            interpolation=cfg.interpolation,
            re_prob=cfg.random_erase_p,
            mean=tuple(cfg.mean),
            std=tuple(cfg.std),
        )
        self.views_per_group = [1]

    def __call__(self, data: bytes, rng: random.Random) -> list[list[torch.Tensor]]:
        # timm draws from the global random and torch generators: seed them from the sample's rng, and put the
        # training process's own streams back afterwards (with workers=0 this runs in the training process)
        seed = rng.getrandbits(63)
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            random.seed(seed)
            torch.manual_seed(seed)
            try:
                return [[self.transform(decode_rgb(data))]]
            finally:
                random.setstate(python_state)


def build_views(cfg, photometric_on: str = "cpu"):
    """The view maker for data.views.kind; `photometric_on` (cpu | device, resolved) for the crop views."""
    if cfg.kind in ("multicrop", "two_view"):
        return CropViews(cfg, photometric_on)
    if cfg.kind == "eval":
        return EvalView(cfg)
    if cfg.kind == "supervised":
        return SupervisedView(cfg)
    raise UserError(f"data.views.kind must be multicrop, two_view, supervised or eval, got '{cfg.kind}'")


def normalize(crops: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> float, (x/255 - mean) / std, in one pass over the stacked batch."""
    scale = torch.tensor([255.0 * s for s in std]).view(1, 3, 1, 1)
    shift = torch.tensor([255.0 * m for m in mean]).view(1, 3, 1, 1)
    return crops.float().sub_(shift).div_(scale)
