"""The official DINO augmentation (DataAugmentationDINO), rebuilt from torchvision PIL transforms: the baseline of
`scale bench data`. Full-size decode, then per crop: RandomResizedCrop (bicubic), flip, ColorJitter p 0.8,
greyscale p 0.2, PIL Gaussian blur (p 1.0 / 0.1 / 0.5), solarize p 0.2 on global 2, ToTensor, Normalize."""

import io
import random

from PIL import Image, ImageFilter, ImageOps
from torchvision import transforms as T


class _Blur:
    def __init__(self, p: float):
        self.p = p

    def __call__(self, img):
        if random.random() > self.p:
            return img
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


class _Solarize:
    def __init__(self, p: float):
        self.p = p

    def __call__(self, img):
        return ImageOps.solarize(img) if random.random() < self.p else img


class ReferenceDino:
    def __init__(self, global_size=224, local_size=96, n_local=10, global_scale=(0.4, 1.0), local_scale=(0.05, 0.4)):
        bicubic = T.InterpolationMode.BICUBIC
        flip_jitter = T.Compose(
            [
                T.RandomHorizontalFlip(0.5),
                T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                T.RandomGrayscale(0.2),
            ]
        )
        norm = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        self.global1 = T.Compose(
            [T.RandomResizedCrop(global_size, global_scale, interpolation=bicubic), flip_jitter, _Blur(1.0), norm]
        )
        self.global2 = T.Compose(
            [
                T.RandomResizedCrop(global_size, global_scale, interpolation=bicubic),
                flip_jitter,
                _Blur(0.1),
                _Solarize(0.2),
                norm,
            ]
        )
        self.local = T.Compose(
            [T.RandomResizedCrop(local_size, local_scale, interpolation=bicubic), flip_jitter, _Blur(0.5), norm]
        )
        self.n_local = n_local

    def __call__(self, data: bytes) -> list:
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return [self.global1(img), self.global2(img)] + [self.local(img) for _ in range(self.n_local)]
