"""The supervised view (timm RandAugment inc1 + random erasing) runs on every image and leaves the training
process's random streams alone; the evaluation view and the fine-tuning recipes' views are the official code's."""

import io
import random

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from scale.config import load_recipe
from scale.data.config import ViewsConfig
from scale.data.views import build_views


def _jpeg(seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (48, 40, 3), generator=gen, dtype=torch.uint8).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def test_randaugment_inc1_at_high_magnitude_never_fails():
    # magnitude 10 asks for a 0-bit posterize, which Pillow 13 rejects (hence pillow<13 in setup.cfg)
    cfg = OmegaConf.structured(ViewsConfig(kind="supervised", global_size=32, auto_augment="rand-n3-m10-mstd1.0-inc1"))
    views = build_views(cfg)
    rng = random.Random(0)
    for i in range(60):
        crops = views(_jpeg(i), rng)
        assert crops[0][0].shape == (3, 32, 32)


def test_supervised_view_does_not_touch_global_rngs():
    cfg = OmegaConf.structured(ViewsConfig(kind="supervised", global_size=32))
    views = build_views(cfg)
    random.seed(123)
    torch.manual_seed(123)
    expected = (random.random(), torch.rand(1).item())
    random.seed(123)
    torch.manual_seed(123)
    views(_jpeg(0), random.Random(5))
    assert (random.random(), torch.rand(1).item()) == expected


def _png(width: int, height: int) -> tuple[bytes, Image.Image]:
    gen = torch.Generator().manual_seed(width)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue(), Image.fromarray(pixels)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_view_is_torchvisions_resize_and_center_crop(interpolation):
    """main_lincls.py / transfer/datasets.py: Resize(256) (bilinear); eval_linear.py / DeiT: interpolation=3."""
    from torchvision import transforms

    mode = {"bilinear": transforms.InterpolationMode.BILINEAR, "bicubic": transforms.InterpolationMode.BICUBIC}
    official = transforms.Compose(
        [transforms.Resize(64, interpolation=mode[interpolation]), transforms.CenterCrop(56), transforms.PILToTensor()]
    )
    cfg = OmegaConf.structured(ViewsConfig(kind="eval", eval_resize=64, eval_crop=56, eval_interpolation=interpolation))
    view = build_views(cfg)
    for width, height in [(96, 72), (80, 100), (91, 72), (99, 72)]:  # 80.9 and 88.0 px: torchvision truncates
        data, image = _png(width, height)
        assert torch.equal(view(data, random.Random(0))[0][0], official(image))


@pytest.mark.parametrize("recipe", ["mocov3/table5/vit_b_flowers102_mocov3", "mocov3/table5/vit_l_pets_random_init"])
def test_moco_v3_transfer_views_are_transfer_datasets_py(recipe):
    """transfer/datasets.py:19-30 (copied over DeiT's): RandomResizedCrop(scale (0.05, 1)) bilinear, a flip,
    ToTensor, Normalize, nothing else (no RandAugment, colour jitter or random erasing); the test view bilinear."""
    from timm.data.transforms import RandomResizedCropAndInterpolation
    from torchvision import transforms

    views = load_recipe(recipe).data.views
    ops = build_views(views).transform.transforms
    assert [type(op).__name__ for op in ops] == [
        "RandomResizedCropAndInterpolation",
        "RandomHorizontalFlip",
        "MaybeToTensor",
        "Normalize",
    ]
    crop = ops[0]
    assert isinstance(crop, RandomResizedCropAndInterpolation) and crop.scale == (0.05, 1.0)
    assert crop.interpolation == transforms.InterpolationMode.BILINEAR and ops[1].p == 0.5
    assert views.eval_interpolation == "bilinear" and (views.eval_resize, views.eval_crop) == (256, 224)


def test_dino_table6_views_are_deits():
    """DeiT ab57153 main.py defaults: RandAugment, bicubic, random erasing 0.25, repeated augmentation; the test
    view resized bicubically."""
    cfg = load_recipe("dino/table6/vit_s16_cifar10")
    names = [type(op).__name__ for op in build_views(cfg.data.views).transform.transforms]
    assert "RandAugment" in names and "RandomErasing" in names and "ColorJitter" not in names
    assert cfg.data.repeated_aug == 3 and cfg.data.views.eval_interpolation == "bicubic"
